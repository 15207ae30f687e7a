//! The open-loop replay behind `stics bench replay`: each request of a trace is issued at its time
//! whatever the device's speed (seed 004 §4.3.2), and the response time of every one is kept.

use std::io::BufReader;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use stics_block::BlockDev;
use stics_report::{Column, Table};

use crate::load::LoadError;
use crate::trace::{self, Filter, Format, Parser, Request, Shape, TraceError};

/// Options of `stics bench replay`: the device and where its requests come from.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The device: an iscsi:// URL or any device spec stics opens (file:PATH, mem:1GiB, cache(…)).
    pub device: String,
    /// Replay this block trace: SNIA/MSR Cambridge CSV or blkparse text output.
    #[arg(long, value_name = "FILE", required_unless_present = "emc_tel", conflicts_with = "emc_tel")]
    pub trace: Option<PathBuf>,
    /// The trace's format (default: told from its first line).
    #[arg(long, value_enum, requires = "trace")]
    pub format: Option<Format>,
    /// MSR traces: only the requests of this DiskNumber.
    #[arg(long, requires = "trace")]
    pub disk: Option<u32>,
    /// blkparse traces: the action whose events are replayed (Q: queued, D: issued, C: completed).
    #[arg(long, default_value_t = 'Q')]
    pub action: char,
    /// Replay seed 004's EMC-tel-like trace: Poisson arrivals, 4 × 512 B, 89 % writes, uniform
    /// over 900 MB (or the device, if smaller).
    #[arg(long)]
    pub emc_tel: bool,
    /// Requests to replay (default: the whole trace; 230,370 with --emc-tel, as seed 004's).
    #[arg(long)]
    pub requests: Option<u64>,
    /// --emc-tel: mean requests per second (seed 004: 333).
    #[arg(long, default_value_t = 333.0)]
    pub rate: f64,
    /// --emc-tel: seed of the arrival times, addresses and directions.
    #[arg(long, default_value_t = 4)]
    pub seed: u64,
    /// Time scale: 2 issues the requests twice as fast as their time stamps say.
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,
}

/// The requests `a` asks for, on a device of `device_bytes`, as they are read or generated.
pub fn requests(
    a: &Args,
    device_bytes: u64,
) -> Result<Box<dyn Iterator<Item = Result<Request, TraceError>> + Send>, ReplayError> {
    let Some(path) = &a.trace else {
        let shape = Shape { span: Shape::EMC_TEL.span.min(device_bytes), ..Shape::EMC_TEL };
        let n = a.requests.unwrap_or(230_370);
        return Ok(Box::new(trace::emc_tel(n, a.rate, a.seed, shape)?.map(Ok)));
    };
    let file = std::fs::File::open(path).map_err(|source| ReplayError::Open { path: path.clone(), source })?;
    let reader = BufReader::with_capacity(1 << 16, file);
    let filter = Filter { disk: a.disk, action: a.action };
    let parser = match a.format {
        Some(f) => Parser::new(reader, f, filter),
        None => Parser::detect(reader, filter)?,
    };
    Ok(match a.requests {
        Some(n) => Box::new(parser.take(usize::try_from(n).unwrap_or(usize::MAX))),
        None => Box::new(parser),
    })
}

/// Responses slower than this are counted apart (seed 004 Fig. 8 reads its outliers against it).
pub const SLOW: f64 = 0.050;

/// The largest request replayed: a trace asking for more is corrupt rather than a workload.
pub const MAX_REQUEST: u64 = 64 << 20;

/// One request's fate, compactly: a trace may hold millions.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// When it was issued, in seconds from the start of the replay.
    pub at: f32,
    /// Seconds from when it was issued until it completed.
    pub rt: f32,
    pub write: bool,
}

/// What a replay measured; times in seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub requests: u64,
    pub writes: u64,
    /// From the first request due to the last completed.
    pub seconds: f64,
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    /// Responses slower than [`SLOW`].
    pub over_50ms: u64,
    /// Requests that lay past the device's end and were moved into it (offset modulo its size).
    pub folded: u64,
    /// The latest a request was issued after it was due: how far the client itself fell behind
    /// (response times count from the issue).
    pub max_issue_lag: f64,
    /// Every request in the order they were due.
    pub responses: Vec<Response>,
}

/// Why a replay could not go on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error("cannot open the trace {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A bad parameter or a failed request: the load generator's errors.
    #[error(transparent)]
    Load(#[from] LoadError),
}

impl ReplayError {
    fn spec(message: impl Into<String>) -> ReplayError {
        LoadError::Spec(message.into()).into()
    }
}

/// Where a request lands on a device of `num_blocks` blocks of `bs` bytes: `(lba, blocks,
/// folded)`.
fn place(q: &Request, bs: u64, num_blocks: u64) -> Result<(u64, u64, bool), ReplayError> {
    if q.len > MAX_REQUEST {
        return Err(ReplayError::spec(format!("a request of {} bytes is larger than {MAX_REQUEST}", q.len)));
    }
    let lba = q.offset / bs;
    // A request of no bytes still costs a round trip: it moves one block.
    let blocks = (q.offset % bs + q.len).div_ceil(bs).max(1);
    if blocks > num_blocks {
        return Err(ReplayError::spec(format!("a request of {blocks} blocks does not fit a device of {num_blocks}")));
    }
    let last_start = num_blocks - blocks;
    if lba > last_start {
        return Ok((lba % (last_start + 1), blocks, true));
    }
    Ok((lba, blocks, false))
}

/// Issues `requests` to `dev` at their times divided by `speed`, open loop, and measures each.
pub async fn run<I>(dev: Arc<dyn BlockDev>, requests: I, speed: f64) -> Result<Outcome, ReplayError>
where
    I: IntoIterator<Item = Result<Request, TraceError>> + Send + 'static,
{
    if !(speed.is_finite() && speed > 0.0) {
        return Err(ReplayError::spec(format!("the speed must be a positive number, not {speed}")));
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let issuer = {
        let (handle, stop) = (tokio::runtime::Handle::current(), Arc::clone(&stop));
        // A thread of its own: tokio's timer wakes up to a millisecond late, as much as the
        // gateway's whole response; a thread's sleep is tens of microseconds late.
        tokio::task::spawn_blocking(move || issue(&dev, requests, speed, start, &handle, &tx, &stop))
    };
    let mut responses = Vec::new();
    // Ends when the issuer is done and every request has answered (each holds a sender).
    while let Some(r) = rx.recv().await {
        match r {
            Ok(r) => responses.push(r),
            Err(e) => {
                stop.store(true, Relaxed);
                return Err(e);
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let (folded, max_lag) = issuer.await.map_err(|e| ReplayError::spec(format!("the issuer failed: {e}")))??;
    if responses.is_empty() {
        return Err(ReplayError::spec("the trace holds no requests"));
    }
    responses.sort_by(|a, b| a.at.total_cmp(&b.at));
    Ok(summarise(responses, seconds, folded, max_lag.as_secs_f64()))
}

type Sender = tokio::sync::mpsc::UnboundedSender<Result<Response, ReplayError>>;

/// The issuing loop: sleeps until each request is due and starts it on `handle`, whatever is
/// still in flight. Returns the requests folded into the device and the latest issue.
fn issue<I>(
    dev: &Arc<dyn BlockDev>,
    requests: I,
    speed: f64,
    start: Instant,
    handle: &tokio::runtime::Handle,
    tx: &Sender,
    stop: &AtomicBool,
) -> Result<(u64, Duration), ReplayError>
where
    I: IntoIterator<Item = Result<Request, TraceError>>,
{
    let g = dev.geometry();
    let bs = u64::from(g.block_size);
    let mut payload = Bytes::new();
    let (mut folded, mut max_lag) = (0u64, Duration::ZERO);
    for q in requests {
        if stop.load(Relaxed) {
            break;
        }
        let q = q?;
        let (lba, blocks, moved) = place(&q, bs, g.num_blocks)?;
        folded += u64::from(moved);
        let bytes = usize::try_from(blocks * bs).map_err(|_| ReplayError::spec("request too large"))?;
        let count = u32::try_from(blocks).map_err(|_| ReplayError::spec("request too large"))?;
        let data = if q.write {
            if payload.len() < bytes {
                payload = Bytes::from((0..bytes).map(|i| (i % 251) as u8 + 1).collect::<Vec<u8>>());
            }
            Some(payload.slice(..bytes))
        } else {
            None
        };
        let due_secs = if q.at.is_finite() { (q.at / speed).clamp(0.0, 1e9) } else { 0.0 };
        let due = start + Duration::from_secs_f64(due_secs);
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        let issued = Instant::now();
        max_lag = max_lag.max(issued.saturating_duration_since(due));
        let (dev, tx, write) = (Arc::clone(dev), tx.clone(), q.write);
        let at = issued.duration_since(start).as_secs_f32();
        handle.spawn(async move {
            let r = match data {
                Some(d) => dev.write(lba, d, false).await,
                None => dev.read(lba, count).await.map(drop),
            };
            let r = r.map(|()| Response { at, rt: issued.elapsed().as_secs_f32(), write });
            // The receiver is gone only when the replay already failed.
            let _ = tx.send(r.map_err(|source| ReplayError::Load(LoadError::Io { lba, source })));
        });
    }
    Ok((folded, max_lag))
}

/// The statistics of `responses` (at least one).
fn summarise(responses: Vec<Response>, seconds: f64, folded: u64, max_issue_lag: f64) -> Outcome {
    let mut rt: Vec<f64> = responses.iter().map(|r| f64::from(r.rt)).collect();
    rt.sort_by(f64::total_cmp);
    let n = rt.len();
    let rank = |q: f64| rt[((n as f64 * q).ceil() as usize).clamp(1, n) - 1];
    Outcome {
        requests: n as u64,
        writes: responses.iter().filter(|r| r.write).count() as u64,
        seconds,
        mean: rt.iter().sum::<f64>() / n as f64,
        p50: rank(0.5),
        p99: rank(0.99),
        max: rt[n - 1],
        over_50ms: rt.iter().filter(|&&t| t > SLOW).count() as u64,
        folded,
        max_issue_lag,
        responses,
    }
}

/// The summary of `o` as `stics bench replay` prints it without --json.
pub fn table(o: &Outcome) -> Result<Table, stics_report::Error> {
    let mut t = Table::new(vec![
        Column::new("requests", "requests", "", 1.0),
        Column::new("writes", "writes", "%", 100.0),
        Column::new("seconds", "seconds", "s", 1.0),
        Column::new("mean", "mean", "ms", 1e3),
        Column::new("p50", "p50", "ms", 1e3),
        Column::new("p99", "p99", "ms", 1e3),
        Column::new("max", "max", "ms", 1e3),
        Column::new("over_50ms", "> 50 ms", "", 1.0),
        Column::new("folded", "folded", "", 1.0),
        Column::new("max_issue_lag", "issue lag", "ms", 1e3),
    ])?;
    t.push(vec![
        (o.requests as f64).into(),
        (o.writes as f64 / o.requests.max(1) as f64).into(),
        o.seconds.into(),
        o.mean.into(),
        o.p50.into(),
        o.p99.into(),
        o.max.into(),
        (o.over_50ms as f64).into(),
        (o.folded as f64).into(),
        o.max_issue_lag.into(),
    ])?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use stics_block::MemDev;

    use super::*;
    use crate::trace::{emc_tel, Shape};

    #[tokio::test]
    async fn replays_every_request_open_loop() {
        let dev: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 4096));
        let shape = Shape { span: 2 << 20, ..Shape::EMC_TEL };
        let reqs = emc_tel(300, 3000.0, 4, shape).unwrap().map(Ok);
        let o = run(Arc::clone(&dev), reqs, 1.0).await.unwrap();
        assert_eq!(o.requests, 300);
        assert_eq!(o.responses.len(), 300);
        assert!(o.writes > 200 && o.writes < 300, "{}", o.writes);
        assert!(o.responses.windows(2).all(|w| w[0].at <= w[1].at));
        assert!(o.responses.iter().all(|r| r.rt > 0.0));
        assert!(o.p50 <= o.p99 && o.p99 <= o.max && o.mean > 0.0 && o.folded == 0);
        // About 0.1 s of arrivals: open loop keeps to the trace's clock, not the device's.
        assert!(o.seconds > 0.05 && o.seconds < 5.0, "{}", o.seconds);
        assert!(dev.read(0, 4096).await.unwrap().iter().any(|&b| b != 0));
    }

    #[tokio::test]
    async fn speed_scales_time_and_far_requests_fold_into_the_device() {
        let dev: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 16));
        let reqs = [
            Request { at: 0.0, write: true, offset: 0, len: 0 },
            Request { at: 10.0, write: false, offset: 1 << 40, len: 1000 },
            Request { at: 20.0, write: true, offset: 7 * 512 + 3, len: 512 },
        ];
        let o = run(dev, reqs.into_iter().map(Ok), 1000.0).await.unwrap();
        assert_eq!((o.requests, o.writes, o.folded), (3, 2, 1));
        assert!(o.seconds < 1.0 && (f64::from(o.responses[2].at) - 0.02).abs() < 5e-3, "{o:?}");
    }

    #[tokio::test]
    async fn refuses_what_cannot_be_replayed() {
        let dev: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 16));
        let none: [Result<Request, TraceError>; 0] = [];
        assert!(matches!(run(Arc::clone(&dev), none, 1.0).await, Err(ReplayError::Load(LoadError::Spec(_)))));
        let big = [Ok(Request { at: 0.0, write: false, offset: 0, len: 16 * 512 + 1 })];
        assert!(matches!(run(Arc::clone(&dev), big, 1.0).await, Err(ReplayError::Load(LoadError::Spec(_)))));
        let one = [Ok(Request { at: 0.0, write: false, offset: 0, len: 512 })];
        assert!(matches!(run(Arc::clone(&dev), one, 0.0).await, Err(ReplayError::Load(LoadError::Spec(_)))));
        let bad = [Ok(Request { at: 0.0, write: false, offset: 0, len: 512 }), Err(TraceError::UnknownFormat)];
        assert!(matches!(run(dev, bad, 1.0).await, Err(ReplayError::Trace(_))));
    }
}

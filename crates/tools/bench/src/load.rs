//! The load generator of `stics bench load`: closed-loop requests at a fixed depth against any
//! device stics can open (an `iscsi://` URL, `file:`, a cache stack), reads or writes, sequential,
//! random or always the same block, with the latency of every request in a histogram. It runs as
//! its own process so that an experiment can place it in a WAN namespace like any other client.
//! [`run_open`] is its open-loop mode: seed 003's traffic, served one at a time or interleaved.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use stics_block::BlockDev;
pub use stics_model::sim::Arrivals;
use stics_model::SizeDist;

/// Read or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Read,
    Write,
}

/// Where the requests go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Each worker walks its own slice of the span from its start, wrapping at its end.
    Seq,
    /// Uniformly over the span, aligned to the request size.
    Random,
    /// Always the first request-sized piece: one block that stays in every cache (seed 001).
    Same,
}

/// What to send.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Spec {
    /// Bytes per request; a whole number of the device's blocks.
    pub size: u64,
    /// Requests in flight.
    pub depth: usize,
    pub op: Op,
    pub pattern: Pattern,
    /// Stop after this many requests …
    pub count: Option<u64>,
    /// … or after this long (whichever comes first; at least one of them).
    pub seconds: Option<f64>,
    /// Bytes of the device the requests fall in, from `from` (0: all of the rest).
    pub span: u64,
    /// Where that span starts, in bytes (a whole number of requests).
    #[serde(default)]
    pub from: u64,
    pub seed: u64,
    /// Each worker flushes after every this many of its writes (0: never); a flush is not
    /// counted as a request.
    #[serde(default)]
    pub flush_every: u64,
}

/// What a run measured; times in seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub requests: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub iops: f64,
    pub bytes_per_sec: f64,
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    /// CPU seconds (user + system) of the generator's process over the run.
    pub cpu_seconds: f64,
    /// Requests sent before the measured ones and not counted (`--warmup`).
    #[serde(default)]
    pub warmup: u64,
    /// The iSCSI parameters the first session negotiated, for a remote LUN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub negotiated: Option<Negotiated>,
}

/// The iSCSI session parameters that shape a write (RFC 7143 §13), as negotiated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Negotiated {
    pub first_burst_length: u32,
    pub max_burst_length: u32,
    pub max_outstanding_r2t: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
}

impl Outcome {
    /// What `stics bench load --json` printed, for the experiments that run it as a client.
    pub fn from_json(stdout: &str) -> crate::Result<Outcome> {
        serde_json::from_str(stdout.trim()).map_err(|e| crate::Error::Output {
            what: "stics bench load".into(),
            detail: format!("{e}: {}", stdout.trim()),
        })
    }
}

/// Why a run could not go on.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}")]
    Spec(String),
    #[error("request at LBA {lba} failed: {source}")]
    Io {
        lba: u64,
        #[source]
        source: stics_block::BlockError,
    },
}

/// Sends `spec`'s requests to `dev` and measures them.
pub async fn run(dev: Arc<dyn BlockDev>, spec: &Spec) -> Result<Outcome, LoadError> {
    let g = dev.geometry();
    let bs = u64::from(g.block_size);
    if spec.size == 0 || !spec.size.is_multiple_of(bs) {
        return Err(LoadError::Spec(format!("request size {} is not a whole number of {bs}-byte blocks", spec.size)));
    }
    if spec.count.is_none() && spec.seconds.is_none() {
        return Err(LoadError::Spec("give a request count or a duration".into()));
    }
    let blocks = spec.size / bs;
    if !spec.from.is_multiple_of(spec.size) {
        return Err(LoadError::Spec(format!("the span's start {} is not a whole number of requests", spec.from)));
    }
    let dev_bytes = (g.num_blocks * bs).saturating_sub(spec.from);
    let span = if spec.span == 0 { dev_bytes } else { spec.span.min(dev_bytes) };
    let slots = span / spec.size;
    let first = spec.from / spec.size;
    let depth = spec.depth.max(1) as u64;
    if slots < depth {
        return Err(LoadError::Spec(format!(
            "the span holds {slots} requests of {} bytes, fewer than the depth",
            spec.size
        )));
    }
    let blocks_u32 = u32::try_from(blocks).map_err(|_| LoadError::Spec("request too large".into()))?;
    let size = usize::try_from(spec.size).map_err(|_| LoadError::Spec("request too large".into()))?;
    let hist = Arc::new(Mutex::new(
        hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3)
            .map_err(|e| LoadError::Spec(e.to_string()))?,
    ));
    let issued = Arc::new(AtomicU64::new(0));
    let deadline = spec.seconds.map(|s| Instant::now() + Duration::from_secs_f64(s));
    let limit = spec.count.unwrap_or(u64::MAX);
    let cpu0 = self_cpu();
    let t0 = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..depth {
        let (dev, hist, issued, spec) = (Arc::clone(&dev), Arc::clone(&hist), Arc::clone(&issued), spec.clone());
        workers.spawn(async move {
            let mut walk = worker_slots(spec.pattern, spec.seed, w, depth, slots);
            // The data comes from a stream of its own, so that the offsets do not depend on it.
            let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed ^ (w + 1).wrapping_mul(0xd1b5_4a32_d192_ed03));
            let mut writes = 0u64;
            let mut local = Vec::with_capacity(1024);
            loop {
                if deadline.is_some_and(|d| Instant::now() >= d) || issued.fetch_add(1, Relaxed) >= limit {
                    break;
                }
                let slot = walk.next().unwrap_or(0);
                let lba = (first + slot) * blocks;
                // Fresh random data for every write: a cache that compresses what it ships must
                // not find the same block again. It is made before the clock starts.
                let data = (spec.op == Op::Write).then(|| {
                    let mut fill = vec![0u8; size];
                    rng.fill(&mut fill[..]);
                    Bytes::from(fill)
                });
                let t = Instant::now();
                let r = match data {
                    None => dev.read(lba, blocks_u32).await.map(drop),
                    Some(data) => dev.write(lba, data, false).await,
                };
                r.map_err(|source| LoadError::Io { lba, source })?;
                local.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX).max(1));
                if spec.op == Op::Write && spec.flush_every > 0 {
                    writes += 1;
                    if writes.is_multiple_of(spec.flush_every) {
                        dev.flush().await.map_err(|source| LoadError::Io { lba, source })?;
                    }
                }
                if local.len() == local.capacity() {
                    record(&hist, &mut local);
                }
            }
            record(&hist, &mut local);
            Ok::<(), LoadError>(())
        });
    }
    while let Some(r) = workers.join_next().await {
        r.map_err(|e| LoadError::Spec(format!("worker failed: {e}")))??;
    }
    let seconds = t0.elapsed().as_secs_f64();
    let h = hist.lock().map_err(|_| LoadError::Spec("histogram lock poisoned".into()))?;
    let requests = h.len();
    let ns = |v: u64| v as f64 / 1e9;
    Ok(Outcome {
        requests,
        bytes: requests * spec.size,
        seconds,
        iops: requests as f64 / seconds,
        bytes_per_sec: (requests * spec.size) as f64 / seconds,
        mean: h.mean() / 1e9,
        p50: ns(h.value_at_quantile(0.5)),
        p99: ns(h.value_at_quantile(0.99)),
        max: ns(h.max()),
        cpu_seconds: self_cpu() - cpu0,
        warmup: 0,
        negotiated: None,
    })
}

/// The request slots (offsets in requests from the span's start) worker `w` of a closed-loop run
/// with `depth` workers visits, in order: what [`run`] sends, for checking a model against it.
pub fn worker_slots(pattern: Pattern, seed: u64, w: u64, depth: u64, slots: u64) -> impl Iterator<Item = u64> {
    let per = slots / depth.max(1);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (w + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut next = 0u64;
    std::iter::repeat_with(move || match pattern {
        Pattern::Same => 0,
        Pattern::Random => rng.gen_range(0..slots),
        Pattern::Seq => {
            let s = w * per + next % per.max(1);
            next += 1;
            s
        }
    })
}

/// An open-loop run: requests arrive at times drawn from `arrivals` whatever the device's speed,
/// with sizes drawn from `sizes`, and wait in arrival order for one of `depth` servers. Depth 1 is
/// seed 003's non-interleaved session (Fig. 2a: a FIFO queue in front of one write at a time);
/// more let several requests' bursts share the session (Fig. 2b). A request's time counts from
/// its arrival, queueing included.
#[derive(Debug, Clone)]
pub struct OpenSpec {
    pub arrivals: Arrivals,
    pub sizes: SizeDist,
    /// Requests in service at once.
    pub depth: usize,
    pub op: Op,
    /// Stop arrivals after this many requests …
    pub count: Option<u64>,
    /// … or after this long (whichever comes first); the requests that arrived are all served.
    pub seconds: Option<f64>,
    /// Bytes of the device the requests fall in, from its start (0: all of it).
    pub span: u64,
    pub seed: u64,
}

/// One arrival, handed to the servers in order.
struct Job {
    /// When the request arrived: when the client woke for it, which the timer's millisecond
    /// granularity puts up to a millisecond or two after its drawn time. Counting from the drawn
    /// time would charge that lag to the device.
    arrived: Instant,
    lba: u64,
    blocks: u32,
    bytes: usize,
}

/// Runs `spec`'s open-loop traffic against `dev` and measures each request from its arrival.
pub async fn run_open(dev: Arc<dyn BlockDev>, spec: &OpenSpec) -> Result<Outcome, LoadError> {
    let g = dev.geometry();
    let bs = u64::from(g.block_size);
    let dev_bytes = g.num_blocks * bs;
    let span = if spec.span == 0 { dev_bytes } else { spec.span.min(dev_bytes) };
    if spec.count.is_none() && spec.seconds.is_none() {
        return Err(LoadError::Spec("give a request count or a duration".into()));
    }
    check_arrivals(&spec.arrivals)?;
    let largest = spec.sizes.max() as u64;
    for &(size, _) in spec.sizes.points() {
        let size = size as u64;
        if size == 0 || !size.is_multiple_of(bs) || size > span {
            return Err(LoadError::Spec(format!(
                "request size {size} is not a whole number of {bs}-byte blocks within the span of {span} bytes"
            )));
        }
    }
    u32::try_from(largest / bs).map_err(|_| LoadError::Spec("request too large".into()))?;
    let mut fill = vec![0u8; usize::try_from(largest).unwrap_or(0)];
    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed);
    rng.fill(&mut fill[..]);
    let data = Bytes::from(fill);
    let hist = Arc::new(Mutex::new(
        hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3)
            .map_err(|e| LoadError::Spec(e.to_string()))?,
    ));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Job>();
    // The servers take jobs one at a time through a fair lock: in arrival order.
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let done_bytes = Arc::new(AtomicU64::new(0));
    let cpu0 = self_cpu();
    let t0 = Instant::now();
    let mut servers = tokio::task::JoinSet::new();
    for _ in 0..spec.depth.max(1) {
        let (dev, data, hist, rx, done_bytes, op) =
            (Arc::clone(&dev), data.clone(), Arc::clone(&hist), Arc::clone(&rx), Arc::clone(&done_bytes), spec.op);
        servers.spawn(async move {
            loop {
                let next = rx.lock().await.recv().await;
                let Some(job) = next else { break };
                let r = match op {
                    Op::Read => dev.read(job.lba, job.blocks).await.map(drop),
                    Op::Write => dev.write(job.lba, data.slice(..job.bytes), false).await,
                };
                r.map_err(|source| LoadError::Io { lba: job.lba, source })?;
                let ns = u64::try_from(job.arrived.elapsed().as_nanos()).unwrap_or(u64::MAX).max(1);
                if let Ok(mut h) = hist.lock() {
                    h.saturating_record(ns);
                }
                done_bytes.fetch_add(job.bytes as u64, Relaxed);
            }
            Ok::<(), LoadError>(())
        });
    }
    let limit = spec.count.unwrap_or(u64::MAX);
    let horizon = spec.seconds.unwrap_or(f64::INFINITY);
    let mut gaps = rand::rngs::StdRng::seed_from_u64(spec.seed ^ 0x5851_f42d_4c95_7f2d);
    let mut at = 0.0f64;
    for _ in 0..limit {
        at += gap(&spec.arrivals, &mut gaps);
        if at > horizon {
            break;
        }
        let size = spec.sizes.quantile(rng.gen::<f64>()) as u64;
        let blocks = size / bs;
        let lba = rng.gen_range(0..=(span / bs - blocks));
        let due = t0 + Duration::from_secs_f64(at.min(1e9));
        tokio::time::sleep_until(due.into()).await;
        let job = Job { arrived: Instant::now(), lba, blocks: blocks as u32, bytes: size as usize };
        if tx.send(job).is_err() {
            break;
        }
        // A server that failed ends the run now rather than at the end of the arrivals.
        if let Some(r) = servers.try_join_next() {
            r.map_err(|e| LoadError::Spec(format!("server failed: {e}")))??;
        }
    }
    drop(tx);
    while let Some(r) = servers.join_next().await {
        r.map_err(|e| LoadError::Spec(format!("server failed: {e}")))??;
    }
    let seconds = t0.elapsed().as_secs_f64();
    let h = hist.lock().map_err(|_| LoadError::Spec("histogram lock poisoned".into()))?;
    let requests = h.len();
    let bytes = done_bytes.load(Relaxed);
    let ns = |v: u64| v as f64 / 1e9;
    Ok(Outcome {
        requests,
        bytes,
        seconds,
        iops: requests as f64 / seconds,
        bytes_per_sec: bytes as f64 / seconds,
        mean: if requests == 0 { f64::NAN } else { h.mean() / 1e9 },
        p50: ns(h.value_at_quantile(0.5)),
        p99: ns(h.value_at_quantile(0.99)),
        max: ns(h.max()),
        cpu_seconds: self_cpu() - cpu0,
        warmup: 0,
        negotiated: None,
    })
}

fn check_arrivals(a: &Arrivals) -> Result<(), LoadError> {
    let ok = match *a {
        Arrivals::LogNormal { mu, sigma2 } => mu.is_finite() && sigma2.is_finite() && sigma2 >= 0.0,
        Arrivals::Poisson { rate } => rate.is_finite() && rate > 0.0,
    };
    if ok {
        Ok(())
    } else {
        Err(LoadError::Spec(format!("arrivals {a:?}: lognormal needs a finite μ and σ² ≥ 0, poisson a rate above 0")))
    }
}

/// One inter-arrival time, seconds.
fn gap(a: &Arrivals, rng: &mut impl Rng) -> f64 {
    match *a {
        Arrivals::LogNormal { mu, sigma2 } => {
            // Box–Muller; 1 − u lies in (0, 1], so its logarithm is finite.
            let (u, v) = (1.0 - rng.gen::<f64>(), rng.gen::<f64>());
            let z = (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos();
            (mu + sigma2.sqrt() * z).exp()
        }
        Arrivals::Poisson { rate } => -(1.0 - rng.gen::<f64>()).ln() / rate,
    }
}

/// Reads `seed003` (lognormal μ = −4.5, σ² = 6.25, seed 003's empirical model), `lognormal:MU,SIGMA2`
/// or `poisson:RATE` (requests per second).
pub fn parse_arrivals(text: &str) -> Result<Arrivals, String> {
    let bad = || format!("{text:?}: use seed003, lognormal:MU,SIGMA2 (e.g. lognormal:-4.5,6.25) or poisson:RATE");
    let a = match text.split_once(':') {
        None if text == "seed003" => Arrivals::SEED003,
        Some(("lognormal", v)) => {
            let (mu, sigma2) = v.split_once(',').ok_or_else(bad)?;
            let num = |x: &str| x.trim().parse::<f64>().map_err(|_| bad());
            Arrivals::LogNormal { mu: num(mu)?, sigma2: num(sigma2)? }
        }
        Some(("poisson", v)) => Arrivals::Poisson { rate: v.trim().parse().map_err(|_| bad())? },
        _ => return Err(bad()),
    };
    check_arrivals(&a).map_err(|e| e.to_string())?;
    Ok(a)
}

/// Every request of `size` bytes, as an open-loop size distribution.
pub fn fixed_size(size: u64) -> Result<SizeDist, LoadError> {
    SizeDist::fixed(size as f64).map_err(|e| LoadError::Spec(e.to_string()))
}

/// Reads `seed003` (stics model's shipped distribution, mean 6 KiB) or a file of `size weight`
/// lines.
pub fn parse_size_dist(text: &str) -> Result<SizeDist, String> {
    if text == "seed003" {
        return Ok(SizeDist::seed003());
    }
    let body = std::fs::read_to_string(text).map_err(|e| format!("cannot read {text}: {e}"))?;
    SizeDist::parse(&body).map_err(|e| format!("{text}: {e}"))
}

fn record(hist: &Mutex<hdrhistogram::Histogram<u64>>, local: &mut Vec<u64>) {
    if let Ok(mut h) = hist.lock() {
        for v in local.drain(..) {
            h.saturating_record(v);
        }
    }
}

fn self_cpu() -> f64 {
    stics_procs::child::cpu_secs_of(std::process::id()).unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use stics_block::MemDev;

    use super::*;

    fn spec(op: Op, pattern: Pattern) -> Spec {
        Spec {
            size: 4096,
            depth: 4,
            op,
            pattern,
            count: Some(400),
            seconds: None,
            span: 0,
            from: 0,
            seed: 1,
            flush_every: 0,
        }
    }

    #[tokio::test]
    async fn sends_exactly_the_requests_asked_for() {
        let dev: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 2048));
        for p in [Pattern::Seq, Pattern::Random, Pattern::Same] {
            let o = run(Arc::clone(&dev), &spec(Op::Write, p)).await.unwrap();
            assert_eq!((o.requests, o.bytes), (400, 400 * 4096));
            assert!(o.p50 <= o.p99 && o.p99 <= o.max && o.mean > 0.0, "{o:?}");
        }
        // Writes left the pattern's bytes where they went; reads get them back.
        let o = run(Arc::clone(&dev), &spec(Op::Read, Pattern::Seq)).await.unwrap();
        assert_eq!(o.requests, 400);
        assert!(dev.read(0, 1).await.unwrap().iter().any(|&b| b != 0));
    }

    #[tokio::test]
    async fn requests_stay_in_the_span_from_its_start() {
        let dev: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 4096));
        let s = Spec { from: 1 << 20, span: 64 << 10, ..spec(Op::Write, Pattern::Random) };
        run(Arc::clone(&dev), &s).await.unwrap();
        assert!(dev.read(0, 2048).await.unwrap().iter().all(|&b| b == 0), "nothing before the span");
        assert!(dev.read(2048 + 128, 1024).await.unwrap().iter().all(|&b| b == 0), "nothing after it");
        assert!(dev.read(2048, 128).await.unwrap().iter().any(|&b| b != 0));
        let odd = Spec { from: 1000, ..spec(Op::Read, Pattern::Seq) };
        assert!(run(dev, &odd).await.is_err());
    }

    fn open(depth: usize) -> OpenSpec {
        OpenSpec {
            arrivals: Arrivals::Poisson { rate: 20_000.0 },
            sizes: SizeDist::seed003(),
            depth,
            op: Op::Write,
            count: Some(300),
            seconds: None,
            span: 0,
            seed: 7,
        }
    }

    #[tokio::test]
    async fn open_loop_serves_every_arrival_one_at_a_time_or_interleaved() {
        let dev: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 8192));
        let one = run_open(Arc::clone(&dev), &open(1)).await.unwrap();
        let many = run_open(Arc::clone(&dev), &open(16)).await.unwrap();
        // The same seed draws the same requests for both.
        assert_eq!((one.requests, one.bytes), (many.requests, many.bytes));
        assert_eq!(one.requests, 300);
        assert!(one.bytes % 512 == 0 && one.bytes > 300 * 512, "{one:?}");
        assert!(one.p50 <= one.max && one.mean > 0.0, "{one:?}");
        // A horizon ends the arrivals; those that came are all served.
        let s = OpenSpec { count: None, seconds: Some(0.005), ..open(2) };
        let o = run_open(Arc::clone(&dev), &s).await.unwrap();
        assert!(o.requests > 0 && o.requests < 1000, "{o:?}");
        let s = OpenSpec { sizes: SizeDist::fixed(1000.0).unwrap(), ..open(1) };
        assert!(matches!(run_open(Arc::clone(&dev), &s).await, Err(LoadError::Spec(_))));
        let s = OpenSpec { arrivals: Arrivals::Poisson { rate: 0.0 }, ..open(1) };
        assert!(matches!(run_open(dev, &s).await, Err(LoadError::Spec(_))));
    }

    #[test]
    fn arrivals_and_size_distributions_parse() {
        assert_eq!(parse_arrivals("seed003"), Ok(Arrivals::SEED003));
        assert_eq!(parse_arrivals("lognormal:-4.5, 6.25"), Ok(Arrivals::LogNormal { mu: -4.5, sigma2: 6.25 }));
        assert_eq!(parse_arrivals("poisson:333"), Ok(Arrivals::Poisson { rate: 333.0 }));
        for bad in ["", "lognormal:-4.5", "poisson:fast", "poisson:-1", "uniform:1", "lognormal:1,-2"] {
            assert!(parse_arrivals(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_size_dist("seed003").map(|d| d.mean()), Ok(6144.0));
        assert!(parse_size_dist("/no/such/file").unwrap_err().contains("/no/such/file"));
        // Seed 003's lognormal: the median gap is e^μ.
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let mut g: Vec<f64> = (0..20_001).map(|_| gap(&Arrivals::SEED003, &mut rng)).collect();
        g.sort_by(f64::total_cmp);
        let median = g[10_000];
        assert!((median / (-4.5f64).exp() - 1.0).abs() < 0.1, "{median}");
    }

    #[tokio::test]
    async fn refuses_sizes_and_spans_that_do_not_fit() {
        let dev: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 16));
        let mut s = spec(Op::Read, Pattern::Random);
        s.size = 1000;
        assert!(matches!(run(Arc::clone(&dev), &s).await, Err(LoadError::Spec(_))));
        let s = spec(Op::Read, Pattern::Random); // 2 slots of 4 KiB, depth 4
        assert!(matches!(run(Arc::clone(&dev), &s).await, Err(LoadError::Spec(_))));
        let mut s = spec(Op::Read, Pattern::Same);
        s.count = None;
        assert!(matches!(run(dev, &s).await, Err(LoadError::Spec(_))));
    }
}

//! The load generator of `stics bench load`: closed-loop requests at a fixed depth against any
//! device stics can open (an `iscsi://` URL, `file:`, a cache stack), reads or writes, sequential,
//! random or always the same block, with the latency of every request in a histogram. It runs as
//! its own process so that an experiment can place it in a WAN namespace like any other client.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use stics_block::BlockDev;

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
    /// Bytes of the device the requests fall in, from its start (0: all of it).
    pub span: u64,
    pub seed: u64,
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
    let dev_bytes = g.num_blocks * bs;
    let span = if spec.span == 0 { dev_bytes } else { spec.span.min(dev_bytes) };
    let slots = span / spec.size;
    let depth = spec.depth.max(1) as u64;
    if slots < depth {
        return Err(LoadError::Spec(format!(
            "the span holds {slots} requests of {} bytes, fewer than the depth",
            spec.size
        )));
    }
    let blocks_u32 = u32::try_from(blocks).map_err(|_| LoadError::Spec("request too large".into()))?;
    let mut fill = vec![0u8; usize::try_from(spec.size).unwrap_or(0)];
    rand::rngs::StdRng::seed_from_u64(spec.seed).fill(&mut fill[..]);
    let data = Bytes::from(fill);
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
        let (dev, data, hist, issued, spec) =
            (Arc::clone(&dev), data.clone(), Arc::clone(&hist), Arc::clone(&issued), spec.clone());
        workers.spawn(async move {
            let per = slots / depth;
            let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed ^ (w + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let mut next = 0u64;
            let mut local = Vec::with_capacity(1024);
            loop {
                if deadline.is_some_and(|d| Instant::now() >= d) || issued.fetch_add(1, Relaxed) >= limit {
                    break;
                }
                let slot = match spec.pattern {
                    Pattern::Same => 0,
                    Pattern::Random => rng.gen_range(0..slots),
                    Pattern::Seq => {
                        let s = w * per + next % per;
                        next += 1;
                        s
                    }
                };
                let lba = slot * blocks;
                let t = Instant::now();
                let r = match spec.op {
                    Op::Read => dev.read(lba, blocks_u32).await.map(drop),
                    Op::Write => dev.write(lba, data.clone(), false).await,
                };
                r.map_err(|source| LoadError::Io { lba, source })?;
                local.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX).max(1));
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
    })
}

fn record(hist: &Mutex<hdrhistogram::Histogram<u64>>, local: &mut Vec<u64>) {
    if let Ok(mut h) = hist.lock() {
        for v in local.drain(..) {
            h.saturating_record(v);
        }
    }
}

fn self_cpu() -> f64 {
    crate::env::proc_cpu(std::process::id()).unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use stics_block::MemDev;

    use super::*;

    fn spec(op: Op, pattern: Pattern) -> Spec {
        Spec { size: 4096, depth: 4, op, pattern, count: Some(400), seconds: None, span: 0, seed: 1 }
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

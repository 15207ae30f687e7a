//! The stamped-block checker: a client writes random stamped runs to a LUN and remembers which
//! versions each block may hold and which must survive; any image of those blocks (through a
//! gateway, on its remote, after a crash) is then checked against it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use stics_block::{BlockDev, BlockError};

use crate::pattern::{check_at, stamp_run};

/// When a write the LUN acknowledged must survive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durable {
    /// Once acknowledged (a LUN without a volatile cache: the gateway's `log` mode, and
    /// `write-through` in front of a remote without one).
    OnAck,
    /// Once an acknowledged SYNCHRONIZE CACHE followed it (a volatile cache: `immediate`, and
    /// `write-through` in front of a remote with one, whose WCE the gateway reports as its own).
    OnFlush,
}

impl Durable {
    /// What `stics gateway --mode MODE` promises, in front of a remote with a volatile cache
    /// when `remote_volatile`.
    pub fn of_mode(mode: &str, remote_volatile: bool) -> Durable {
        match mode {
            "immediate" => Durable::OnFlush,
            "write-through" if remote_volatile => Durable::OnFlush,
            _ => Durable::OnAck,
        }
    }
}

/// How [`Ledger::run`] writes.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// A pause after each write (keeps a long run within a log).
    pub pause: Option<Duration>,
    /// With [`Durable::OnFlush`], one flush per this many writes on average.
    pub flush_one_in: u32,
    /// A write or flush still unanswered after this long stops the run as hung.
    pub timeout: Option<Duration>,
}

impl Pace {
    /// As fast as the LUN answers, a flush every 20 writes, no bound.
    pub const FAST: Pace = Pace { pause: None, flush_one_in: 20, timeout: None };
}

/// Why [`Ledger::run`] stopped before it was told to.
#[derive(Debug)]
pub enum Failure {
    /// A write of `blocks` blocks at `lba` failed (it may still have landed, in part).
    Write { lba: u64, blocks: u64, error: BlockError },
    /// A flush failed: the writes it was to cover are not known to be durable.
    Flush(BlockError),
    /// A write or flush went unanswered for [`Pace::timeout`].
    Hung { what: &'static str, after: Duration },
}

impl Failure {
    /// The device's error, unless the command hung.
    pub fn error(&self) -> Option<&BlockError> {
        match self {
            Failure::Write { error, .. } | Failure::Flush(error) => Some(error),
            Failure::Hung { .. } => None,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Write { lba, blocks, error } => write!(f, "write of {blocks} blocks at {lba}: {error}"),
            Failure::Flush(e) => write!(f, "flush: {e}"),
            Failure::Hung { what, after } => write!(f, "{what} unanswered after {after:?}"),
        }
    }
}

/// A write acknowledged since the last flush: where, which version, and the device's reset
/// count when it was acknowledged.
#[derive(Debug, Clone, Copy)]
struct Pending {
    lba: u64,
    blocks: u64,
    version: u64,
    resets: u64,
}

/// What a client wrote to blocks `0..blocks` in stamped runs and which of it must survive:
/// every version written to each block (a write never acknowledged may still land) and the
/// newest durable one.
#[derive(Debug)]
pub struct Ledger {
    blocks: u64,
    block_size: usize,
    durable_on: Durable,
    version: u64,
    written: Vec<Vec<u64>>,
    durable: Vec<u64>,
    since_flush: Vec<Pending>,
    acked: Arc<AtomicU64>,
    flushes: u64,
}

impl Ledger {
    /// A ledger of blocks `0..blocks` of `block_size` bytes, all blank so far.
    pub fn new(blocks: u64, block_size: usize, durable_on: Durable) -> Ledger {
        Ledger {
            blocks,
            block_size,
            durable_on,
            version: 0,
            written: vec![Vec::new(); blocks as usize],
            durable: vec![0; blocks as usize],
            since_flush: Vec::new(),
            acked: Arc::default(),
            flushes: 0,
        }
    }

    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// Writes acknowledged so far, readable from another thread while the ledger runs.
    pub fn acked(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.acked)
    }

    /// Flushes acknowledged so far.
    pub fn flushes(&self) -> u64 {
        self.flushes
    }

    /// The newest version written (to any block).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Random writes of 1 to 16 blocks (and flushes, with [`Durable::OnFlush`]) until `stop`
    /// says so or a command fails or hangs; why it stopped early, if it did. Called again
    /// after a failure, it goes on where it was.
    pub async fn run(
        &mut self,
        dev: &dyn BlockDev,
        rng: &mut StdRng,
        pace: Pace,
        stop: impl Fn() -> bool,
    ) -> Option<Failure> {
        while !stop() {
            let blocks = rng.gen_range(1..=16);
            let lba = rng.gen_range(0..=self.blocks - blocks);
            self.version += 1;
            let v = self.version;
            for b in lba..lba + blocks {
                self.written[b as usize].push(v);
            }
            let data = stamp_run(lba, blocks, v, self.block_size);
            match bounded(pace.timeout, "a write", dev.write(lba, data, false)).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => return Some(Failure::Write { lba, blocks, error }),
                Err(hung) => return Some(hung),
            }
            self.acked.fetch_add(1, Ordering::Relaxed);
            match self.durable_on {
                Durable::OnAck => self.durable[lba as usize..(lba + blocks) as usize].fill(v),
                Durable::OnFlush => {
                    self.since_flush.push(Pending { lba, blocks, version: v, resets: dev.resets() });
                    if rng.gen_range(0..pace.flush_one_in) == 0 {
                        let resets = dev.resets();
                        match bounded(pace.timeout, "a flush", dev.flush()).await {
                            Ok(Ok(())) => self.flushed(resets, dev.resets()),
                            Ok(Err(e)) => return Some(Failure::Flush(e)),
                            Err(hung) => return Some(hung),
                        }
                    }
                }
            }
            if let Some(p) = pace.pause {
                tokio::time::sleep(p).await;
            }
        }
        None
    }

    /// A flush that started at reset count `before` and ended at `after` succeeded: it covers
    /// the writes acknowledged since the device last reset, none if it reset meanwhile. A write
    /// acknowledged before a reset is never covered (the reset may have lost it).
    fn flushed(&mut self, before: u64, after: u64) {
        self.flushes += 1;
        for p in std::mem::take(&mut self.since_flush) {
            if p.resets == before && before == after {
                self.durable[p.lba as usize..(p.lba + p.blocks) as usize].fill(p.version);
            } else if p.resets >= after {
                self.since_flush.push(p);
            }
        }
    }

    /// Checks an image of blocks `0..blocks`: each block blank or a whole stamp of its own LBA,
    /// at a version written to it and no older than its durable one. Returns the versions seen;
    /// panics naming `what` and the block otherwise.
    pub fn check(&self, image: &[u8], what: &str) -> Vec<u64> {
        let bs = self.block_size;
        assert!(image.len() >= self.blocks as usize * bs, "{what}: an image of {} bytes is short", image.len());
        (0..self.blocks)
            .map(|b| {
                let i = b as usize;
                let buf = &image[i * bs..(i + 1) * bs];
                let v = check_at(buf, b, self.durable[i]..=self.version)
                    .unwrap_or_else(|e| panic!("{what}: block {b}: {e} (durable version {})", self.durable[i]));
                assert!(
                    v == 0 || self.written[i].contains(&v),
                    "{what}: block {b} holds version {v}, never written to it"
                );
                v
            })
            .collect()
    }

    /// Takes `seen` (what [`Ledger::check`] returned) as durable from now on: it came back from
    /// a log after a crash, or it is on the remote.
    pub fn accept(&mut self, seen: &[u64]) {
        self.durable.copy_from_slice(seen);
        self.since_flush.clear();
    }

    /// Reads blocks `0..blocks` of `dev`, checks them and takes them as durable; the versions.
    pub async fn verify(&mut self, dev: &dyn BlockDev, what: &str) -> Vec<u64> {
        let image = dev.read(0, self.blocks as u32).await.unwrap_or_else(|e| panic!("{what}: read: {e}"));
        let seen = self.check(&image, what);
        self.accept(&seen);
        seen
    }
}

/// `op`, or [`Failure::Hung`] once it took longer than `limit`.
async fn bounded<T>(
    limit: Option<Duration>,
    what: &'static str,
    op: impl std::future::Future<Output = T>,
) -> Result<T, Failure> {
    match limit {
        None => Ok(op.await),
        Some(after) => tokio::time::timeout(after, op).await.map_err(|_| Failure::Hung { what, after }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::{ErrorKind, FaultDev, Op, Rule};
    use rand::SeedableRng;

    const BLOCKS: u64 = 256;

    fn run_until(n: u64) -> impl Fn() -> bool {
        let start = std::time::Instant::now();
        move || start.elapsed() > Duration::from_secs(n)
    }

    #[tokio::test]
    async fn acknowledged_writes_are_durable_and_what_a_crash_drops_is_told_apart() {
        let d = FaultDev::new(512, BLOCKS, 1);
        d.set_volatile_cache(false);
        let mut l = Ledger::new(BLOCKS, 512, Durable::OnAck);
        let mut rng = StdRng::seed_from_u64(3);
        let n = std::sync::atomic::AtomicU64::new(0);
        assert!(l.run(&d, &mut rng, Pace::FAST, || n.fetch_add(1, Ordering::Relaxed) >= 300).await.is_none());
        assert_eq!(l.acked().load(Ordering::Relaxed), 300);
        let seen = l.verify(&d, "the device").await;
        assert_eq!(seen.iter().max(), Some(&l.version()));
        // A block rolled back to an older version than acknowledged is stale.
        let b = seen.iter().position(|&v| v > 0).unwrap() as u64;
        d.write(b, bytes::Bytes::from(vec![0u8; 512]), true).await.unwrap();
        let image = d.read(0, BLOCKS as u32).await.unwrap();
        let e = std::panic::catch_unwind(|| l.check(&image, "rolled back")).unwrap_err();
        let msg = e.downcast_ref::<String>().unwrap();
        assert!(msg.contains(&format!("block {b}")), "{msg}");
    }

    #[tokio::test]
    async fn with_a_volatile_cache_only_flushed_writes_must_survive() {
        let d = FaultDev::new(512, BLOCKS, 1);
        let mut l = Ledger::new(BLOCKS, 512, Durable::OnFlush);
        let mut rng = StdRng::seed_from_u64(5);
        let pace = Pace { flush_one_in: 4, ..Pace::FAST };
        let n = std::sync::atomic::AtomicU64::new(0);
        assert!(l.run(&d, &mut rng, pace, || n.fetch_add(1, Ordering::Relaxed) >= 200).await.is_none());
        assert!(l.flushes() > 10);
        d.crash();
        let r = d.reopen();
        // Whatever the crash dropped, every block still holds a version the ledger allows.
        l.verify(&r, "after the crash").await;
    }

    #[tokio::test]
    async fn a_refused_write_stops_the_run_and_the_next_run_goes_on() {
        let d = FaultDev::new(512, BLOCKS, 1);
        let mut l = Ledger::new(BLOCKS, 512, Durable::OnAck);
        let mut rng = StdRng::seed_from_u64(7);
        d.add_rule(Rule::error(Op::Write, ErrorKind::NoSpace).after(10).times(1));
        let stop = run_until(10);
        let f = l.run(&d, &mut rng, Pace::FAST, &stop).await.unwrap();
        assert!(matches!(f, Failure::Write { error: BlockError::NoSpace(_), .. }), "{f}");
        assert_eq!(l.acked().load(Ordering::Relaxed), 10);
        let n = std::sync::atomic::AtomicU64::new(0);
        assert!(l.run(&d, &mut rng, Pace::FAST, || n.fetch_add(1, Ordering::Relaxed) >= 10).await.is_none());
        l.verify(&d, "after the refusal").await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_past_its_bound_is_reported_hung() {
        let d = FaultDev::new(512, BLOCKS, 1);
        d.add_rule(Rule::delay(Op::Write, Duration::from_secs(60)));
        let mut l = Ledger::new(BLOCKS, 512, Durable::OnAck);
        let mut rng = StdRng::seed_from_u64(9);
        let pace = Pace { timeout: Some(Duration::from_secs(5)), ..Pace::FAST };
        let f = l.run(&d, &mut rng, pace, || false).await.unwrap();
        assert!(matches!(f, Failure::Hung { what: "a write", .. }), "{f}");
        assert!(f.error().is_none());
    }

    #[test]
    fn a_flush_covers_no_write_acknowledged_before_a_reset() {
        let mut l = Ledger::new(BLOCKS, 512, Durable::OnFlush);
        l.version = 3;
        for (lba, version, resets) in [(0, 1, 0), (1, 2, 1), (2, 3, 1)] {
            l.written[lba as usize].push(version);
            l.since_flush.push(Pending { lba, blocks: 1, version, resets });
        }
        l.flushed(1, 1);
        assert_eq!(&l.durable[..3], &[0, 2, 3], "the write before the reset is not covered");
        assert!(l.since_flush.is_empty());
        l.written[0].push(4);
        l.since_flush.push(Pending { lba: 0, blocks: 1, version: 4, resets: 1 });
        l.flushed(1, 2);
        assert_eq!(l.durable[0], 0, "a reset during the flush: it covers nothing");
    }
}

//! What the target counts for whoever exports its metrics: sessions per target and, per LUN,
//! commands by kind with their latency, the failed ones, and the data bytes in and out.
//!
//! Plain atomics bumped on the command path (a few relaxed adds per command, no lock), read at
//! any time by [`Stats`]'s getters; the target knows nothing of any metrics format.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stics_sam::op;

/// Upper bounds of the latency buckets, in seconds: 25 µs to 10 s, about three per decade, so
/// that a memory LUN on loopback, a local disk and a remote LUN across a WAN each spread over
/// several buckets.
pub const LATENCY_BOUNDS: [f64; 19] = [
    25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0, 2.5,
    5.0, 10.0, 30.0,
];

/// The same bounds in nanoseconds, which is how a sample is placed.
const BOUNDS_NS: [u64; 19] = {
    let mut ns = [0u64; 19];
    let mut i = 0;
    while i < ns.len() {
        ns[i] = (LATENCY_BOUNDS[i] * 1e9) as u64;
        i += 1;
    }
    ns
};

/// What a SCSI command does, as the metrics tell commands apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// READ(6/10/12/16).
    Read,
    /// WRITE(6/10/12/16), WRITE AND VERIFY, COMPARE AND WRITE, ORWRITE, WRITE SAME and UNMAP:
    /// everything that changes the medium.
    Write,
    /// SYNCHRONIZE CACHE(10/16).
    Flush,
    /// Everything else (INQUIRY, TEST UNIT READY, reservations, ...).
    Other,
}

impl Kind {
    /// Every kind, in the order [`LunStats`] keeps them.
    pub const ALL: [Kind; 4] = [Kind::Read, Kind::Write, Kind::Flush, Kind::Other];

    /// The kind of the command whose CDB starts with `opcode`.
    pub fn of(opcode: u8) -> Kind {
        match opcode {
            op::READ_6 | op::READ_10 | op::READ_12 | op::READ_16 => Kind::Read,
            op::WRITE_6
            | op::WRITE_10
            | op::WRITE_12
            | op::WRITE_16
            | op::WRITE_VERIFY_10
            | op::WRITE_VERIFY_12
            | op::WRITE_VERIFY_16
            | op::COMPARE_AND_WRITE
            | op::ORWRITE_16
            | op::WRITE_SAME_10
            | op::WRITE_SAME_16
            | op::UNMAP => Kind::Write,
            op::SYNC_CACHE_10 | op::SYNC_CACHE_16 => Kind::Flush,
            _ => Kind::Other,
        }
    }

    /// Its name in metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Read => "read",
            Kind::Write => "write",
            Kind::Flush => "flush",
            Kind::Other => "other",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A latency histogram over [`LATENCY_BOUNDS`] (and one bucket beyond the last bound).
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; 20],
    sum_ns: AtomicU64,
}

/// A histogram as read at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// Seconds of all samples together.
    pub sum: f64,
    /// Samples.
    pub count: u64,
    /// Samples per bucket (not cumulative), each with its upper bound in seconds, the last
    /// bound infinite.
    pub buckets: Vec<(f64, u64)>,
}

impl Histogram {
    /// Counts one sample.
    pub fn observe(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let i = BOUNDS_NS.partition_point(|&b| b < ns);
        if let Some(b) = self.buckets.get(i) {
            b.fetch_add(1, Ordering::Relaxed);
        }
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The counts so far.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut total = 0;
        let mut buckets = Vec::with_capacity(self.buckets.len());
        for (i, b) in self.buckets.iter().enumerate() {
            let n = b.load(Ordering::Relaxed);
            total += n;
            buckets.push((LATENCY_BOUNDS.get(i).copied().unwrap_or(f64::INFINITY), n));
        }
        HistogramSnapshot { sum: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9, count: total, buckets }
    }
}

/// One kind of command on one LUN.
#[derive(Debug, Default)]
struct KindStats {
    /// Commands that did not end with GOOD status.
    failed: AtomicU64,
    /// From the command's start on the device (all its data in) to its response.
    latency: Histogram,
}

/// The counts of one LUN.
#[derive(Debug, Default)]
pub struct LunStats {
    kinds: [KindStats; 4],
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
}

impl LunStats {
    /// Counts one command that took `took`, carried `data_in` bytes from the initiator and
    /// `data_out` to it, and ended with SCSI `status`.
    pub fn record(&self, kind: Kind, took: Duration, data_in: usize, data_out: usize, status: u8) {
        let Some(k) = self.kinds.get(kind.index()) else { return };
        k.latency.observe(took);
        if status != 0 {
            k.failed.fetch_add(1, Ordering::Relaxed);
        }
        if data_in > 0 {
            self.bytes_in.fetch_add(data_in as u64, Ordering::Relaxed);
        }
        if data_out > 0 {
            self.bytes_out.fetch_add(data_out as u64, Ordering::Relaxed);
        }
    }

    /// Commands of `kind` so far.
    pub fn commands(&self, kind: Kind) -> u64 {
        self.kinds.get(kind.index()).map_or(0, |k| k.latency.snapshot().count)
    }

    /// Commands of `kind` that ended with a status other than GOOD.
    pub fn failed(&self, kind: Kind) -> u64 {
        self.kinds.get(kind.index()).map_or(0, |k| k.failed.load(Ordering::Relaxed))
    }

    /// The latency of commands of `kind`.
    pub fn latency(&self, kind: Kind) -> HistogramSnapshot {
        self.kinds.get(kind.index()).map_or_else(|| Histogram::default().snapshot(), |k| k.latency.snapshot())
    }

    /// Data bytes initiators sent (write data).
    pub fn bytes_in(&self) -> u64 {
        self.bytes_in.load(Ordering::Relaxed)
    }

    /// Data bytes sent to initiators (read data).
    pub fn bytes_out(&self) -> u64 {
        self.bytes_out.load(Ordering::Relaxed)
    }
}

/// The counts of one target.
#[derive(Debug)]
pub struct TargetStats {
    iqn: String,
    sessions: AtomicU64,
    logins: AtomicU64,
    luns: Vec<LunStats>,
}

impl TargetStats {
    pub(crate) fn new(iqn: String, luns: usize) -> TargetStats {
        TargetStats {
            iqn,
            sessions: AtomicU64::new(0),
            logins: AtomicU64::new(0),
            luns: (0..luns).map(|_| LunStats::default()).collect(),
        }
    }

    /// The target's name.
    pub fn iqn(&self) -> &str {
        &self.iqn
    }

    /// Sessions in full feature phase now.
    pub fn sessions(&self) -> u64 {
        self.sessions.load(Ordering::Relaxed)
    }

    /// Sessions that logged in so far.
    pub fn logins(&self) -> u64 {
        self.logins.load(Ordering::Relaxed)
    }

    /// The LUNs' counts, LUN n at n.
    pub fn luns(&self) -> &[LunStats] {
        &self.luns
    }

    /// The counts of LUN `lun`, if the target has it.
    pub fn lun(&self, lun: u64) -> Option<&LunStats> {
        usize::try_from(lun).ok().and_then(|i| self.luns.get(i))
    }

    pub(crate) fn session_started(&self) {
        self.logins.fetch_add(1, Ordering::Relaxed);
        self.sessions.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn session_ended(&self) {
        self.sessions.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Everything a server counts.
#[derive(Debug)]
pub struct Stats {
    targets: Vec<Arc<TargetStats>>,
    discovery_sessions: AtomicU64,
    refused_logins: AtomicU64,
}

impl Stats {
    pub(crate) fn new(targets: Vec<Arc<TargetStats>>) -> Stats {
        Stats { targets, discovery_sessions: AtomicU64::new(0), refused_logins: AtomicU64::new(0) }
    }

    /// The targets' counts, in the order the server was given them.
    pub fn targets(&self) -> &[Arc<TargetStats>] {
        &self.targets
    }

    /// Discovery sessions now.
    pub fn discovery_sessions(&self) -> u64 {
        self.discovery_sessions.load(Ordering::Relaxed)
    }

    /// Logins the target refused (bad CHAP, an initiator not allowed, an unknown target, no
    /// session slot...).
    pub fn refused_logins(&self) -> u64 {
        self.refused_logins.load(Ordering::Relaxed)
    }

    pub(crate) fn discovery_started(&self) {
        self.discovery_sessions.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn discovery_ended(&self) {
        self.discovery_sessions.fetch_sub(1, Ordering::Relaxed);
    }

    pub(crate) fn login_refused(&self) {
        self.refused_logins.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn latency_lands_in_the_first_bucket_whose_bound_it_does_not_exceed() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(10));
        h.observe(Duration::from_micros(25));
        h.observe(Duration::from_micros(26));
        h.observe(Duration::from_secs(60));
        let s = h.snapshot();
        assert_eq!(s.count, 4);
        assert_eq!(s.buckets[0], (25e-6, 2));
        assert_eq!(s.buckets[1], (50e-6, 1));
        assert_eq!(s.buckets[18], (30.0, 0));
        assert_eq!(*s.buckets.last().unwrap(), (f64::INFINITY, 1));
        assert!((s.sum - 60.000_061).abs() < 1e-9, "{}", s.sum);
    }

    #[test]
    fn commands_are_told_apart_by_opcode() {
        assert_eq!(Kind::of(op::READ_16), Kind::Read);
        assert_eq!(Kind::of(op::WRITE_10), Kind::Write);
        assert_eq!(Kind::of(op::UNMAP), Kind::Write);
        assert_eq!(Kind::of(op::SYNC_CACHE_16), Kind::Flush);
        assert_eq!(Kind::of(op::INQUIRY), Kind::Other);
        let l = LunStats::default();
        l.record(Kind::Write, Duration::from_millis(1), 4096, 0, 0);
        l.record(Kind::Read, Duration::from_millis(1), 0, 512, 2);
        assert_eq!((l.commands(Kind::Write), l.commands(Kind::Read), l.commands(Kind::Flush)), (1, 1, 0));
        assert_eq!((l.failed(Kind::Read), l.failed(Kind::Write)), (1, 0));
        assert_eq!((l.bytes_in(), l.bytes_out()), (4096, 512));
    }
}

//! The delay line: a release queue that holds packet ids until their departure time, in FIFO
//! order, and hands back the newest due id so one batch verdict releases all due packets; plus
//! the two timing corrections that make its departures punctual: when a packet really arrived
//! ([`arrival_ns`]) and how early to wake for a departure ([`WakeMargin`]).
//!
//! Time is a plain nanosecond count supplied by the caller, so tests drive it with a fake clock.

use std::collections::VecDeque;

use crate::rng::Rng;

/// Draws each packet's one-way delay: `delay` ± `jitter`, uniform, never negative.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DelaySampler {
    pub delay_ns: u64,
    pub jitter_ns: u64,
}

impl DelaySampler {
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        if self.jitter_ns == 0 {
            return self.delay_ns;
        }
        let span = 2 * self.jitter_ns;
        let offset = (rng.f64() * (span + 1) as f64) as u64;
        (self.delay_ns + offset.min(span)).saturating_sub(self.jitter_ns)
    }
}

#[derive(Debug, Clone, Copy)]
struct Held {
    id: u32,
    release_ns: u64,
    len: u32,
}

/// What [`DelayLine::pop_due`] released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// The newest id released; every older id held is released with it.
    pub last_id: u32,
    pub packets: u64,
    pub bytes: u64,
}

/// Packets waiting for their departure time. Departures never overtake each other: a packet whose
/// jittered time falls before its predecessor's leaves right after it, so TCP sees no reordering.
#[derive(Debug, Default)]
pub struct DelayLine {
    q: VecDeque<Held>,
    last_release_ns: u64,
    bytes: u64,
    max_len: usize,
}

impl DelayLine {
    pub fn new() -> DelayLine {
        DelayLine::default()
    }

    /// Holds packet `id` of `len` bytes that arrived at `now_ns`, for `delay_ns`; returns its
    /// departure time.
    pub fn push(&mut self, id: u32, len: u32, now_ns: u64, delay_ns: u64) -> u64 {
        let release_ns = (now_ns + delay_ns).max(self.last_release_ns);
        self.last_release_ns = release_ns;
        self.q.push_back(Held { id, release_ns, len });
        self.bytes += u64::from(len);
        self.max_len = self.max_len.max(self.q.len());
        release_ns
    }

    /// Releases every packet due at `now_ns`.
    pub fn pop_due(&mut self, now_ns: u64) -> Option<Released> {
        let mut out: Option<Released> = None;
        while let Some(h) = self.q.front().copied() {
            if h.release_ns > now_ns {
                break;
            }
            self.q.pop_front();
            self.bytes -= u64::from(h.len);
            let r = out.get_or_insert(Released { last_id: h.id, packets: 0, bytes: 0 });
            r.last_id = h.id;
            r.packets += 1;
            r.bytes += u64::from(h.len);
        }
        out
    }

    /// Releases everything (shutdown).
    pub fn pop_all(&mut self) -> Option<Released> {
        self.pop_due(u64::MAX)
    }

    /// When the oldest held packet is due.
    pub fn next_release(&self) -> Option<u64> {
        self.q.front().map(|h| h.release_ns)
    }

    pub fn len(&self) -> usize {
        self.q.len()
    }

    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The most packets held at once since creation.
    pub fn max_len(&self) -> usize {
        self.max_len
    }
}

/// The longest a kernel arrival stamp may lie before the moment it was read and still be
/// believed. A thread that falls further behind (or a step of the wall clock, on which the stamps
/// are taken) costs only extra delay: the arrival is then taken as this long before the read.
pub const MAX_STAMP_AGE_NS: u64 = 20_000_000;

/// A packet's arrival on the monotonic clock, from the kernel's `CLOCK_REALTIME` stamp (whole
/// microseconds) when there is one, else the moment it was read (`read_ns`). `real_minus_mono_ns`
/// is `CLOCK_REALTIME - CLOCK_MONOTONIC` (wrapping), sampled at the read.
///
/// The stamp is rounded up to the end of its microsecond, so a packet is never released before
/// its full delay, and it is clamped to `[read_ns - MAX_STAMP_AGE_NS, read_ns]`.
pub fn arrival_ns(read_ns: u64, stamp_ns: Option<u64>, real_minus_mono_ns: u64) -> u64 {
    let Some(stamp) = stamp_ns else { return read_ns };
    // Wrapping, so a wall clock behind the monotonic one (never set since boot) still works; a
    // nonsense stamp lands anywhere and the clamp below bounds it.
    let mono = stamp.wrapping_add(999).wrapping_sub(real_minus_mono_ns);
    mono.clamp(read_ns.saturating_sub(MAX_STAMP_AGE_NS), read_ns)
}

/// How long before a departure the thread should ask to be woken, learnt from how late its
/// timers have fired: the wake-up latency of a sleeping thread (an idle virtual CPU is woken by
/// its host) is tens to hundreds of microseconds, far more than the precision wanted. The thread
/// sleeps until the departure minus this margin and spins for the rest.
///
/// The margin tracks the mean lateness plus three mean deviations (exponentially weighted,
/// 1/8 per sample), clamped to `[MIN_NS, MAX_NS]`, so the spin stays short when wake-ups are
/// steady and grows only as far as they scatter.
#[derive(Debug, Clone)]
pub struct WakeMargin {
    mean_ns: i64,
    dev_ns: i64,
}

impl Default for WakeMargin {
    fn default() -> Self {
        WakeMargin::new()
    }
}

impl WakeMargin {
    pub const MIN_NS: u64 = 10_000;
    pub const MAX_NS: u64 = 500_000;

    /// Starts from a typical virtual machine's wake-up latency; samples soon replace it.
    pub fn new() -> WakeMargin {
        WakeMargin { mean_ns: 50_000, dev_ns: 20_000 }
    }

    /// Records one timer that was due at some instant and woke the thread `late_ns` after it.
    pub fn observe(&mut self, late_ns: u64) {
        // A single huge sample (the thread was preempted) must not throw the estimate away.
        let x = late_ns.min(2 * Self::MAX_NS) as i64;
        let err = x - self.mean_ns;
        self.mean_ns += err / 8;
        self.dev_ns += (err.abs() - self.dev_ns) / 8;
    }

    /// How long before a deadline to be woken.
    pub fn margin_ns(&self) -> u64 {
        let m = self.mean_ns.max(0) + 3 * self.dev_ns.max(0);
        (m as u64).clamp(Self::MIN_NS, Self::MAX_NS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packet_is_released_exactly_at_its_delay() {
        let mut line = DelayLine::new();
        line.push(1, 100, 1_000, 5_000_000);
        assert_eq!(line.next_release(), Some(5_001_000));
        assert_eq!(line.pop_due(5_000_999), None);
        let r = line.pop_due(5_001_000).unwrap();
        assert_eq!(r, Released { last_id: 1, packets: 1, bytes: 100 });
        assert!(line.is_empty());
    }

    #[test]
    fn one_release_covers_all_due_packets_and_reports_the_newest_id() {
        let mut line = DelayLine::new();
        for (i, t) in [0u64, 10, 20, 30].iter().enumerate() {
            line.push(i as u32 + 1, 1500, *t, 1000);
        }
        let r = line.pop_due(1025).unwrap();
        assert_eq!((r.last_id, r.packets, r.bytes), (3, 3, 4500));
        assert_eq!(line.len(), 1);
        assert_eq!(line.bytes(), 1500);
        assert_eq!(line.next_release(), Some(1030));
    }

    #[test]
    fn jittered_packets_never_overtake() {
        let mut line = DelayLine::new();
        let sampler = DelaySampler { delay_ns: 1_000_000, jitter_ns: 900_000 };
        let mut rng = Rng::new(1, 0);
        let mut last = 0;
        for i in 0..10_000u32 {
            let t = line.push(i, 64, u64::from(i) * 1000, sampler.sample(&mut rng));
            assert!(t >= last);
            last = t;
        }
        let mut prev = None;
        let mut now = 0;
        while !line.is_empty() {
            now += 50_000;
            if let Some(r) = line.pop_due(now) {
                if let Some(p) = prev {
                    assert!(r.last_id > p);
                }
                prev = Some(r.last_id);
            }
        }
        assert_eq!(prev, Some(9999));
    }

    #[test]
    fn jitter_stays_within_bounds_and_centres_on_the_delay() {
        let s = DelaySampler { delay_ns: 1000, jitter_ns: 200 };
        let mut rng = Rng::new(2, 0);
        let n = 100_000;
        let mut sum = 0u64;
        for _ in 0..n {
            let d = s.sample(&mut rng);
            assert!((800..=1200).contains(&d));
            sum += d;
        }
        let mean = sum as f64 / f64::from(n);
        assert!((mean - 1000.0).abs() < 2.0, "mean {mean}");
    }

    #[test]
    fn jitter_larger_than_delay_never_goes_negative() {
        let s = DelaySampler { delay_ns: 100, jitter_ns: 1000 };
        let mut rng = Rng::new(3, 0);
        assert!((0..10_000).all(|_| s.sample(&mut rng) <= 1100));
    }

    #[test]
    fn arrival_is_the_kernel_stamp_on_the_monotonic_clock() {
        // Real time runs 1e18 ns ahead of monotonic time; the stamp is 71 us before the read.
        let off = 1_000_000_000_000_000_000;
        let read = 5_000_000_000;
        // Rounded up to the end of its microsecond: never early.
        assert_eq!(arrival_ns(read, Some(off + read - 71_000), off), read - 71_000 + 999);
        assert_eq!(arrival_ns(read, None, off), read);
    }

    #[test]
    fn arrival_stamp_is_clamped_to_the_read_time_and_the_maximum_age() {
        let off = 1_000_000_000;
        let read = 5_000_000_000;
        // A stamp from the future (the wall clock stepped back) counts from the read.
        assert_eq!(arrival_ns(read, Some(off + read + 3_000_000), off), read);
        // One far in the past (stepped forward, or a thread far behind) is believed only so far.
        assert_eq!(arrival_ns(read, Some(off + read - 900_000_000), off), read - MAX_STAMP_AGE_NS);
        // Nonsense stays within the bounds.
        for stamp in [0, 1, u64::MAX, off, off + read + 1_000_000_000_000] {
            let a = arrival_ns(read, Some(stamp), off);
            assert!((read - MAX_STAMP_AGE_NS..=read).contains(&a), "{stamp}: {a}");
        }
        assert!(arrival_ns(10, Some(0), off) <= 10);
    }

    #[test]
    fn arrival_works_with_a_wall_clock_behind_the_monotonic_clock() {
        // Real time 1 s behind monotonic time: the difference wraps, the arithmetic still holds.
        let read = 5_000_000_000u64;
        let off = 0u64.wrapping_sub(1_000_000_000);
        let stamp = read - 1_000_000_000 - 40_000;
        assert_eq!(arrival_ns(read, Some(stamp), off), read - 40_000 + 999);
    }

    #[test]
    fn wake_margin_follows_steady_latency_closely() {
        let mut m = WakeMargin::new();
        for _ in 0..200 {
            m.observe(30_000);
        }
        // Steady wake-ups: the margin sits at the latency (plus a vanishing deviation).
        assert!((30_000..=31_000).contains(&m.margin_ns()), "{}", m.margin_ns());
    }

    #[test]
    fn wake_margin_widens_with_scatter_and_stays_within_bounds() {
        let mut m = WakeMargin::new();
        for i in 0..400u64 {
            m.observe(if i % 2 == 0 { 20_000 } else { 120_000 });
        }
        // Mean 70 us, mean deviation 50 us: about 220 us.
        assert!((150_000..=300_000).contains(&m.margin_ns()), "{}", m.margin_ns());
        for _ in 0..200 {
            m.observe(u64::MAX);
        }
        assert_eq!(m.margin_ns(), WakeMargin::MAX_NS);
        for _ in 0..400 {
            m.observe(0);
        }
        assert_eq!(m.margin_ns(), WakeMargin::MIN_NS);
    }

    #[test]
    fn max_len_tracks_the_peak() {
        let mut line = DelayLine::new();
        for i in 0..5 {
            line.push(i, 1, 0, 10);
        }
        line.pop_all();
        line.push(9, 1, 20, 10);
        assert_eq!(line.max_len(), 5);
        assert_eq!(line.len(), 1);
    }
}

//! The delay line: a release queue that holds packet ids until their departure time, in FIFO
//! order, and hands back the newest due id so one batch verdict releases all due packets.
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
        let mean = sum as f64 / n as f64;
        assert!((mean - 1000.0).abs() < 2.0, "mean {mean}");
    }

    #[test]
    fn jitter_larger_than_delay_never_goes_negative() {
        let s = DelaySampler { delay_ns: 100, jitter_ns: 1000 };
        let mut rng = Rng::new(3, 0);
        assert!((0..10_000).all(|_| s.sample(&mut rng) <= 1100));
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

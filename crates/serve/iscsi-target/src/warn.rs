//! Rate limits for the log lines a peer can cause: a few per peer and kind in each interval, then
//! silence, and the count of what was left out on the next line that goes through. Pure: the
//! driver passes `now` and logs what it is told to.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Lines of one kind from one peer logged in full in each interval.
pub const BURST: u32 = 5;
/// Peers and kinds tracked at once; beyond that, entries whose interval has passed are dropped
/// (their counts go to the catch-all entry) so that many peers cannot grow the table.
const MAX_KEYS: usize = 4096;

/// What to do with one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Log it, saying how many lines of this kind from this peer were left out before it.
    Log { suppressed: u64 },
    /// Leave it out (it is counted).
    Suppress,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    since: Instant,
    logged: u32,
    suppressed: u64,
}

/// Per-(peer, kind) counters.
#[derive(Debug)]
pub struct Limiter {
    interval: Duration,
    entries: HashMap<(IpAddr, &'static str), Entry>,
}

/// Stands for peers whose entries were evicted from a full table.
const OTHERS: IpAddr = IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);

impl Limiter {
    /// At most [`BURST`] lines per peer and kind in each `interval`.
    pub fn new(interval: Duration) -> Limiter {
        Limiter { interval, entries: HashMap::new() }
    }

    /// Decides about one line of `kind` caused by `peer` at `now`.
    pub fn check(&mut self, peer: IpAddr, kind: &'static str, now: Instant) -> Verdict {
        if self.entries.len() >= MAX_KEYS && !self.entries.contains_key(&(peer, kind)) {
            self.evict(now);
        }
        let key = if self.entries.len() >= MAX_KEYS && !self.entries.contains_key(&(peer, kind)) {
            (OTHERS, kind)
        } else {
            (peer, kind)
        };
        let e = self.entries.entry(key).or_insert(Entry { since: now, logged: 0, suppressed: 0 });
        if now.saturating_duration_since(e.since) >= self.interval {
            e.since = now;
            e.logged = 0;
        }
        if e.logged < BURST {
            e.logged += 1;
            let suppressed = std::mem::take(&mut e.suppressed);
            Verdict::Log { suppressed }
        } else {
            e.suppressed += 1;
            Verdict::Suppress
        }
    }

    fn evict(&mut self, now: Instant) {
        let interval = self.interval;
        let mut carried: HashMap<&'static str, u64> = HashMap::new();
        self.entries.retain(|(ip, kind), e| {
            let keep = *ip == OTHERS || now.saturating_duration_since(e.since) < interval;
            if !keep {
                *carried.entry(kind).or_default() += e.suppressed;
            }
            keep
        });
        for (kind, n) in carried {
            if let Some(e) = self.entries.get_mut(&(OTHERS, kind)) {
                e.suppressed += n;
            } else if n > 0 {
                self.entries.insert((OTHERS, kind), Entry { since: now, logged: 0, suppressed: n });
            }
        }
    }

    /// Entries tracked now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is tracked.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn ip(n: u8) -> IpAddr {
        IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, n))
    }

    #[test]
    fn a_burst_goes_through_then_lines_are_counted_and_reported_with_the_next_interval() {
        let mut l = Limiter::new(60 * S);
        let t0 = Instant::now();
        for _ in 0..BURST {
            assert_eq!(l.check(ip(1), "digest", t0), Verdict::Log { suppressed: 0 });
        }
        for _ in 0..37 {
            assert_eq!(l.check(ip(1), "digest", t0 + S), Verdict::Suppress);
        }
        assert_eq!(l.check(ip(1), "digest", t0 + 60 * S), Verdict::Log { suppressed: 37 });
        assert_eq!(l.check(ip(1), "digest", t0 + 61 * S), Verdict::Log { suppressed: 0 });
    }

    #[test]
    fn peers_and_kinds_are_counted_apart() {
        let mut l = Limiter::new(60 * S);
        let t0 = Instant::now();
        for _ in 0..BURST {
            l.check(ip(1), "digest", t0);
        }
        assert_eq!(l.check(ip(1), "digest", t0), Verdict::Suppress);
        assert_eq!(l.check(ip(2), "digest", t0), Verdict::Log { suppressed: 0 });
        assert_eq!(l.check(ip(1), "header", t0), Verdict::Log { suppressed: 0 });
    }

    #[test]
    fn the_table_stays_bounded_however_many_peers_there_are() {
        let mut l = Limiter::new(60 * S);
        let t0 = Instant::now();
        for i in 0..12_288u32 {
            let peer = IpAddr::V6(std::net::Ipv6Addr::from(u128::from(i)));
            for _ in 0..=BURST {
                l.check(peer, "bad", t0);
            }
        }
        assert!(l.len() <= MAX_KEYS + 1, "{}", l.len());
        // Once their interval has passed, old peers make room and their counts are carried.
        let later = t0 + 61 * S;
        assert_eq!(l.check(ip(9), "bad", later), Verdict::Log { suppressed: 0 });
        assert!(l.len() <= 3, "{}", l.len());
    }
}

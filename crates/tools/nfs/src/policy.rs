//! Caching decisions, free of I/O: attribute-cache timeouts, sequential-read detection and the
//! grouping of pages into READs and WRITEs. The file system in `fs` asks these and does what they say.

use std::time::{Duration, Instant};

/// Size of a cached data page.
pub const PAGE: u64 = 4096;

/// What identifies a version of a file's contents: Linux treats a change of any of these as a
/// change made by someone else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub mtime: (u32, u32),
    pub ctime: (u32, u32),
    pub size: u64,
}

/// The attribute timeout bounds of one inode (`acregmin`/`acregmax` or `acdirmin`/`acdirmax`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub min: Duration,
    pub max: Duration,
}

/// The attribute-cache clock of one inode, as `nfs_update_inode` keeps it: attributes are fresh
/// for `timeo` after they were read; `timeo` doubles (to `max`) each time attributes arrive
/// unchanged after a full `timeo` has passed, and falls back to `min` on a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttrTimer {
    pub timeo: Duration,
    /// When `timeo` last changed.
    pub timeo_stamp: Instant,
    /// When the cached attributes arrived.
    pub read_at: Instant,
    /// Set when something we did (or forgetting caches) means the next use must ask the server.
    pub forced_stale: bool,
}

/// What fresh attributes mean for the caches built on the old ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Update {
    /// Same version: cached data, lookups and listings stay.
    Unchanged,
    /// Someone changed the object: drop cached data (files) or lookups and listings (dirs).
    Changed,
}

impl AttrTimer {
    pub fn new(bounds: Bounds, now: Instant) -> Self {
        AttrTimer { timeo: bounds.min, timeo_stamp: now, read_at: now, forced_stale: false }
    }

    /// True while cached attributes may be used without asking the server.
    pub fn fresh(&self, now: Instant) -> bool {
        !self.forced_stale && now.saturating_duration_since(self.read_at) < self.timeo
    }

    /// Takes attributes that just arrived (from GETATTR or the post-op attributes of any reply).
    pub fn update(&mut self, bounds: Bounds, old: Stamp, new: Stamp, now: Instant) -> Update {
        self.read_at = now;
        self.forced_stale = false;
        if old == new {
            if now.saturating_duration_since(self.timeo_stamp) >= self.timeo {
                self.timeo = (self.timeo * 2).clamp(bounds.min, bounds.max);
                self.timeo_stamp = now;
            }
            // A timeout above the bounds (the options changed) is pulled back in.
            self.timeo = self.timeo.clamp(bounds.min, bounds.max);
            Update::Unchanged
        } else {
            self.timeo = bounds.min;
            self.timeo_stamp = now;
            Update::Changed
        }
    }
}

/// Weak cache consistency: when the attributes before our own operation are the ones we had
/// cached, the change in the attributes after it is ours and must not invalidate anything.
pub fn wcc_expected(cached: Stamp, before: Option<Stamp>, after: Stamp) -> Stamp {
    match before {
        Some(b) if b == cached => after,
        _ => cached,
    }
}

/// Sequential-read detection for read-ahead, per open file like the kernel's `file_ra_state`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadAhead {
    /// Where the previous read ended.
    pub next: u64,
    /// Read-ahead has been issued up to here.
    pub ahead_to: u64,
}

impl ReadAhead {
    /// Records a read of `[off, off+len)` and returns the range to fetch in the background, if
    /// any, when the read continues the previous one (or starts the file): a whole `window` at a
    /// time, the next one once the reader is within half a window of where read-ahead got to (as
    /// Linux's asynchronous read-ahead starts at its marked page), clipped to `size`. A window
    /// that slid with every read would send one READ per page.
    pub fn on_read(&mut self, off: u64, len: u64, window: u64, size: u64) -> Option<(u64, u64)> {
        let sequential = off == self.next || off == 0;
        let end = off.saturating_add(len);
        self.next = end;
        if !sequential || window == 0 {
            self.ahead_to = end;
            return None;
        }
        if self.ahead_to > end && self.ahead_to - end > window / 2 {
            return None;
        }
        let from = self.ahead_to.max(end);
        let to = from.saturating_add(window).min(size);
        if from >= to {
            return None;
        }
        self.ahead_to = to;
        Some((from, to))
    }
}

/// The pages a read needs (ascending page numbers) grouped into READs: a READ takes a run of
/// consecutive pages, at most `per_read` of them (rsize), as Linux's page I/O coalesces the pages
/// of one request. Returns `(first page, page count)`.
pub fn read_runs(pages: &[u64], per_read: u64) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &idx in pages {
        match runs.last_mut() {
            Some((first, count)) if *first + *count == idx && *count < per_read.max(1) => *count += 1,
            _ => runs.push((idx, 1)),
        }
    }
    runs
}

/// The dirty byte range of each page, in page order, grouped into WRITEs: a WRITE continues
/// across a page boundary only when both sides are dirty up to it, and never exceeds `wsize`
/// or crosses a `wsize` boundary. Returns `(offset, length, first page, page count)`.
pub fn write_runs(pages: &[(u64, u16, u16)], wsize: u64, size: u64) -> Vec<(u64, u64, u64, usize)> {
    let mut out: Vec<(u64, u64, u64, usize)> = Vec::new();
    for &(idx, s, e) in pages {
        let start = idx * PAGE + u64::from(s);
        let end = (idx * PAGE + u64::from(e)).min(size.max(start));
        if let Some(last) = out.last_mut() {
            let last_end = last.0 + last.1;
            let prev_idx = last.2 + last.3 as u64 - 1;
            let joins = idx == prev_idx + 1
                && last_end == idx * PAGE
                && s == 0
                && last_end % wsize != 0
                && end - last.0 <= wsize;
            if joins {
                last.1 = end - last.0;
                last.3 += 1;
                continue;
            }
        }
        out.push((start, end - start, idx, 1));
    }
    out.retain(|r| r.1 > 0);
    out
}

/// Byte budget: true when a writer must wait for write-back before dirtying more.
pub fn must_throttle(dirty_bytes: u64, limit: u64) -> bool {
    dirty_bytes >= limit
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const REG: Bounds = Bounds { min: Duration::from_secs(3), max: Duration::from_secs(60) };

    fn stamp(m: u32, size: u64) -> Stamp {
        Stamp { mtime: (m, 0), ctime: (m, 0), size }
    }

    #[test]
    fn attributes_are_fresh_for_acregmin_then_the_timeout_doubles_while_unchanged() {
        let t0 = Instant::now();
        let mut t = AttrTimer::new(REG, t0);
        assert!(t.fresh(t0 + Duration::from_millis(2999)));
        assert!(!t.fresh(t0 + Duration::from_secs(3)));
        let s = stamp(1, 10);
        let t1 = t0 + Duration::from_secs(3);
        assert_eq!(t.update(REG, s, s, t1), Update::Unchanged);
        assert_eq!(t.timeo, Duration::from_secs(6));
        assert!(t.fresh(t1 + Duration::from_secs(5)));
        let t2 = t1 + Duration::from_secs(6);
        t.update(REG, s, s, t2);
        assert_eq!(t.timeo, Duration::from_secs(12));
    }

    #[test]
    fn an_early_unchanged_reply_does_not_double_the_timeout() {
        let t0 = Instant::now();
        let mut t = AttrTimer::new(REG, t0);
        let s = stamp(1, 10);
        t.update(REG, s, s, t0 + Duration::from_secs(1));
        assert_eq!(t.timeo, Duration::from_secs(3));
    }

    #[test]
    fn a_change_resets_the_timeout_to_the_minimum() {
        let t0 = Instant::now();
        let mut t = AttrTimer::new(REG, t0);
        let mut now = t0;
        for _ in 0..10 {
            now += Duration::from_secs(61);
            t.update(REG, stamp(1, 1), stamp(1, 1), now);
        }
        assert_eq!(t.timeo, Duration::from_secs(60));
        assert_eq!(t.update(REG, stamp(1, 1), stamp(2, 1), now), Update::Changed);
        assert_eq!(t.timeo, Duration::from_secs(3));
    }

    #[test]
    fn forcing_staleness_lasts_until_the_next_update() {
        let t0 = Instant::now();
        let mut t = AttrTimer::new(REG, t0);
        t.forced_stale = true;
        assert!(!t.fresh(t0));
        t.update(REG, stamp(1, 1), stamp(1, 1), t0);
        assert!(t.fresh(t0));
    }

    #[test]
    fn our_own_change_is_expected_only_when_the_before_attributes_match() {
        let (a, b) = (stamp(1, 1), stamp(2, 9));
        assert_eq!(wcc_expected(a, Some(a), b), b);
        assert_eq!(wcc_expected(a, Some(stamp(5, 5)), b), a);
        assert_eq!(wcc_expected(a, None, b), a);
    }

    #[test]
    fn sequential_reads_fetch_a_window_ahead_once() {
        let mut ra = ReadAhead::default();
        assert_eq!(ra.on_read(0, 4096, 131072, 1 << 20), Some((4096, 4096 + 131072)));
        // Well ahead: nothing more until the reader is within half a window, then a whole one.
        for off in (4096..65536).step_by(4096) {
            assert_eq!(ra.on_read(off, 4096, 131072, 1 << 20), None, "{off}");
        }
        assert_eq!(ra.on_read(65536, 4096, 131072, 1 << 20), Some((135168, 135168 + 131072)));
        assert_eq!(ra.on_read(500_000, 4096, 131072, 1 << 20), None);
        assert_eq!(ra.on_read(0, 10, 131072, 5), None);
    }

    #[test]
    fn a_read_asks_for_its_own_pages_in_runs_of_at_most_rsize() {
        assert_eq!(read_runs(&[7], 256), vec![(7, 1)]);
        assert_eq!(read_runs(&[1, 2, 3, 5, 6], 256), vec![(1, 3), (5, 2)]);
        assert_eq!(read_runs(&[0, 1, 2, 3, 4], 2), vec![(0, 2), (2, 2), (4, 1)]);
        assert_eq!(read_runs(&[], 2), vec![]);
    }

    #[test]
    fn write_runs_join_only_contiguous_dirty_bytes() {
        let pages = [(0, 0, 4096), (1, 0, 100), (2, 0, 4096), (3, 50, 4096), (4, 0, 4096)];
        let runs = write_runs(&pages, 1 << 20, 1 << 30);
        assert_eq!(runs, vec![(0, 4196, 0, 2), (8192, 4096, 2, 1), (12338, 4096 + 4046, 3, 2)]);
        let full: Vec<_> = (0..4).map(|i| (i, 0, 4096)).collect();
        assert_eq!(write_runs(&full, 8192, 1 << 30), vec![(0, 8192, 0, 2), (8192, 8192, 2, 2)]);
        assert_eq!(write_runs(&[(0, 0, 4096)], 8192, 10), vec![(0, 10, 0, 1)]);
    }

    proptest! {
        #[test]
        fn the_timeout_stays_within_bounds_and_fresh_means_recent(
            steps in proptest::collection::vec((0u64..200_000, any::<bool>()), 1..60)
        ) {
            let t0 = Instant::now();
            let mut t = AttrTimer::new(REG, t0);
            let mut now = t0;
            for (ms, changed) in steps {
                now += Duration::from_millis(ms);
                let old = stamp(1, 1);
                let new = if changed { stamp(2, 1) } else { old };
                let u = t.update(REG, old, new, now);
                prop_assert!(t.timeo >= REG.min && t.timeo <= REG.max);
                prop_assert_eq!(u == Update::Changed, changed);
                if changed { prop_assert_eq!(t.timeo, REG.min); }
                prop_assert!(t.fresh(now));
                prop_assert!(!t.fresh(now + REG.max));
            }
        }

        #[test]
        fn read_runs_cover_each_page_once_in_order(pages in proptest::collection::btree_set(0u64..500, 0..120),
                                                   per_read in 1u64..40) {
            let pages: Vec<u64> = pages.into_iter().collect();
            let runs = read_runs(&pages, per_read);
            let covered: Vec<u64> = runs.iter().flat_map(|&(f, n)| f..f + n).collect();
            prop_assert_eq!(&covered, &pages);
            for &(_, n) in &runs { prop_assert!(n >= 1 && n <= per_read); }
            // Runs break only where pages are missing or a READ is full.
            for w in runs.windows(2) { prop_assert!(w[0].0 + w[0].1 < w[1].0 || w[0].1 == per_read); }
        }

        #[test]
        fn write_runs_send_every_dirty_byte_once(
            dirty in proptest::collection::btree_map(0u64..64, (0u16..4096, 1u16..=4096), 0..40),
            wshift in 12u32..16,
        ) {
            let pages: Vec<(u64, u16, u16)> = dirty.iter()
                .map(|(&i, &(a, b))| { let (s, e) = if a < b { (a, b) } else { (b - 1, b) }; (i, s, e) })
                .collect();
            let wsize = 1u64 << wshift;
            let runs = write_runs(&pages, wsize, u64::MAX);
            let mut want: Vec<u64> = Vec::new();
            for &(i, s, e) in &pages { want.extend((u64::from(s)..u64::from(e)).map(|b| i * PAGE + b)); }
            let mut got: Vec<u64> = Vec::new();
            for r in &runs {
                prop_assert!(r.1 <= wsize);
                prop_assert_eq!(r.0 / wsize, (r.0 + r.1 - 1) / wsize);
                got.extend(r.0..r.0 + r.1);
            }
            prop_assert_eq!(got, want);
        }
    }
}

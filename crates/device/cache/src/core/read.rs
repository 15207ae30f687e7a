//! Read planning: where each block of a host read is (RAM, the log, zeros, the read cache or the
//! remote), read-ahead for sequential readers, and which remote data may enter the read cache.
//! The read cache also holds copies of logged writes while they are the newest (`relocate`), so
//! it is asked before the log as well as before the remote.
//!
//! Remote data read for a plan may be stale by the time it arrives: the block may have been
//! written and destaged meanwhile. Each run of blocks that leaves the dirty index (or that a
//! write-through write changed) is stamped with a clock; data for a block stamped after its
//! plan is dropped, so one destage never costs the read-ahead of unrelated blocks.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::{Core, CoreError, Loc};
use crate::readcache::ReadCache;
use stics_block::extent::ExtentMap;

/// Where one run of a read comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// These bytes.
    Ram(Bytes),
    /// A log slot range: `blocks` blocks at device offset `offset` (consecutive slots).
    Log { offset: u64, blocks: u32 },
    /// Zeros.
    Zero { blocks: u32 },
    /// Clean: read from the remote.
    Remote { lba: u64, blocks: u32 },
}

impl Piece {
    /// Blocks the piece covers, for blocks of `block_size` bytes.
    pub fn blocks(&self, block_size: u32) -> u64 {
        match self {
            Piece::Ram(b) => (b.len() / block_size as usize) as u64,
            Piece::Log { blocks, .. } | Piece::Zero { blocks } | Piece::Remote { blocks, .. } => u64::from(*blocks),
        }
    }
}

/// A read's plan, and the pin that keeps its log slots from reuse until [`Core::unpin`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadPlan {
    /// Pieces in LBA order.
    pub pieces: Vec<Piece>,
    /// Records whose slots the plan reads; pass back to [`Core::unpin`].
    pub pinned: Vec<u64>,
    /// The plan's place on the invalidation clock: hand the remote data read for it to
    /// [`Core::finish_read`] with this, once for the read when it has remote pieces and once
    /// for its read-ahead when it has one.
    pub generation: u64,
    /// Blocks to read ahead from the remote into the read cache.
    pub prefetch: Option<(u64, u32)>,
}

impl ReadPlan {
    /// True when some of the read comes from the remote.
    pub fn has_remote(&self) -> bool {
        self.pieces.iter().any(|p| matches!(p, Piece::Remote { .. }))
    }
}

/// Most runs the invalidation record keeps while reads are outstanding; beyond it, every read
/// planned before is refused the read cache instead.
const RECENT_MAX: usize = 1 << 16;

/// The read side's state.
#[derive(Debug)]
pub(crate) struct ReadState {
    pub(crate) cache: ReadCache,
    /// Ticks once per invalidation.
    clock: u64,
    /// Runs of blocks invalidated while reads were outstanding, with the clock when they were.
    recent: ExtentMap<u64>,
    /// Outstanding plans with remote data to come, by their clock.
    plans: BTreeMap<u64, u32>,
    /// Plans that went to the remote so far (destage notices new ones by this count).
    pub(crate) remote_plans: u64,
    /// Plans older than this are refused the read cache (the record above was cut short).
    floor: u64,
    /// Where the last read ended, the read-ahead window and how far read-ahead has gone.
    last_read_end: u64,
    ra_window: u64,
    ra_end: u64,
}

impl ReadState {
    pub(crate) fn new(cache: ReadCache) -> ReadState {
        ReadState {
            cache,
            clock: 0,
            recent: ExtentMap::new(512),
            plans: BTreeMap::new(),
            remote_plans: 0,
            floor: 0,
            last_read_end: u64::MAX,
            ra_window: 0,
            ra_end: 0,
        }
    }

    fn expect(&mut self, generation: u64) {
        *self.plans.entry(generation).or_default() += 1;
        self.remote_plans += 1;
    }

    /// True while a host read (or its read-ahead) waits for the remote.
    pub(crate) fn waiting(&self) -> bool {
        !self.plans.is_empty()
    }

    fn done(&mut self, generation: u64) {
        if let Some(n) = self.plans.get_mut(&generation) {
            *n -= 1;
            if *n == 0 {
                self.plans.remove(&generation);
            }
        }
        match self.plans.first_key_value() {
            None => self.recent.clear(),
            Some((&oldest, _)) if self.recent.len() > 1024 => self.recent.retain(|&c| c > oldest),
            Some(_) => {}
        }
    }
}

impl Core {
    /// Plans a host read of `blocks` blocks at `lba`.
    pub fn read(&mut self, lba: u64, blocks: u64) -> Result<ReadPlan, CoreError> {
        self.check(lba, blocks)?;
        let bs = u64::from(self.layout.block_size);
        let end = lba + blocks;
        let Core { newest, read, log, .. } = self;
        let mut pieces: Vec<Piece> = Vec::new();
        let mut pinned: Vec<u64> = Vec::new();
        let mut at = lba;
        for (s, e, v) in newest.overlapping(lba, end) {
            let (from, to) = (s.max(lba), e.min(end));
            clean(&mut read.cache, &mut pieces, at, from);
            let n = (to - from) as u32;
            match &v.loc {
                Loc::Ram(b) => {
                    let (a, z) = (((from - s) * bs) as usize, ((to - s) * bs) as usize);
                    pieces.push(Piece::Ram(b.slice(a..z)));
                }
                Loc::Zero => match pieces.last_mut() {
                    Some(Piece::Zero { blocks }) => *blocks += n,
                    _ => pieces.push(Piece::Zero { blocks: n }),
                },
                // The read cache holds a copy of a logged write while it is the newest (see
                // `relocate`): DRAM answers before the log device does.
                Loc::Log(off) => {
                    for b in from..to {
                        if let Some(block) = read.cache.get(b) {
                            pieces.push(Piece::Ram(block));
                            continue;
                        }
                        let off = off + (b - s) * bs;
                        match pieces.last_mut() {
                            Some(Piece::Log { offset, blocks }) if *offset + u64::from(*blocks) * bs == off => {
                                *blocks += 1;
                            }
                            _ => {
                                // Records are separated by their headers, so a run of adjacent
                                // slots lies in one record: it is looked up once per run.
                                pieces.push(Piece::Log { offset: off, blocks: 1 });
                                pinned.extend(log.record_of(off));
                            }
                        }
                    }
                }
            }
            at = to;
        }
        clean(&mut read.cache, &mut pieces, at, end);
        pinned.sort_unstable();
        pinned.dedup();
        for &seq in &pinned {
            log.pin(seq);
        }
        let prefetch = self.read_ahead(lba, blocks);
        let generation = self.read.clock;
        let plan = ReadPlan { pieces, pinned, generation, prefetch };
        if plan.has_remote() {
            self.read.expect(generation);
        }
        if plan.prefetch.is_some() {
            self.read.expect(generation);
        }
        Ok(plan)
    }

    /// Sequential reads grow a read-ahead window (doubling up to the limit); the next stretch is
    /// fetched when the reader comes within half a window of where read-ahead has got to.
    fn read_ahead(&mut self, lba: u64, blocks: u64) -> Option<(u64, u32)> {
        let limit = self.cfg.read_ahead_bytes / u64::from(self.layout.block_size);
        let r = &mut self.read;
        let end = lba + blocks;
        let sequential = lba == r.last_read_end;
        r.last_read_end = end;
        if !sequential || limit == 0 {
            r.ra_window = 0;
            r.ra_end = 0;
            return None;
        }
        r.ra_window = (r.ra_window * 2).max(blocks * 4).min(limit);
        if r.ra_end > end + r.ra_window / 2 {
            return None;
        }
        let from = r.ra_end.max(end);
        let to = (end + r.ra_window).min(self.layout.num_blocks);
        if from >= to {
            return None;
        }
        r.ra_end = to;
        Some((from, (to - from).min(u64::from(u32::MAX)) as u32))
    }

    /// The remote answered for a plan of `generation` (its read, or its read-ahead; `fetched`
    /// is empty when the remote failed): each block goes into the read cache unless it is dirty
    /// now or was invalidated after the plan (it may predate a destaged or written-through
    /// write). Each block is copied: a slice would keep the whole remote buffer alive.
    pub fn finish_read(&mut self, generation: u64, fetched: &[(u64, Bytes)]) {
        let bs = self.layout.block_size as usize;
        if generation >= self.read.floor {
            for (lba, data) in fetched {
                for (i, chunk) in data.chunks_exact(bs).enumerate() {
                    let b = lba + i as u64;
                    let stale = self.read.recent.get(b).is_some_and(|(_, _, &c)| c > generation);
                    if !stale && self.newest.get(b).is_none() {
                        self.read.cache.insert(b, Bytes::copy_from_slice(chunk));
                    }
                }
            }
        }
        self.read.done(generation);
    }

    /// `data`, blocks from `lba` on that the remote holds now (they came with a token), goes into
    /// the read cache, but for blocks dirty here (newer).
    pub fn fill(&mut self, lba: u64, data: &[u8]) {
        let bs = self.layout.block_size as usize;
        for (i, chunk) in data.chunks_exact(bs).enumerate() {
            let b = lba + i as u64;
            if b < self.layout.num_blocks && self.newest.get(b).is_none() {
                self.read.cache.insert(b, Bytes::copy_from_slice(chunk));
            }
        }
    }

    /// Remote data for blocks `start..end` read before now may be stale: it never enters the
    /// read cache, and the read cache forgets them.
    pub(crate) fn invalidate(&mut self, start: u64, end: u64) {
        self.read.cache.remove_range(start, end);
        self.stamp(start, end);
    }

    /// Remote data for blocks `start..end` read before now may be stale: it never enters the
    /// read cache. What the read cache holds of them stays: that is for a write's blocks that
    /// just reached the remote, where the cache can only hold that write's copy or a newer one.
    pub(crate) fn stamp(&mut self, start: u64, end: u64) {
        let r = &mut self.read;
        r.clock += 1;
        if !r.waiting() {
            return;
        }
        r.recent.insert(start, end, r.clock);
        if r.recent.len() > RECENT_MAX {
            r.floor = r.clock;
            r.recent.clear();
        }
    }

    /// Read cache lookups that hit and missed.
    pub fn read_cache_hits(&self) -> (u64, u64) {
        self.read.cache.hits_and_misses()
    }
}

/// Appends the clean blocks `from..to` to a plan: each from the read cache, or in runs from the
/// remote.
fn clean(cache: &mut ReadCache, pieces: &mut Vec<Piece>, from: u64, to: u64) {
    for b in from..to {
        match cache.get(b) {
            Some(block) => pieces.push(Piece::Ram(block)),
            None => match pieces.last_mut() {
                Some(Piece::Remote { lba, blocks }) if *lba + u64::from(*blocks) == b && *blocks < u32::MAX => {
                    *blocks += 1;
                }
                _ => pieces.push(Piece::Remote { lba: b, blocks: 1 }),
            },
        }
    }
}

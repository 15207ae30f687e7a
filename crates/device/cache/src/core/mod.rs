//! The cache's decisions as a pure state machine: which writes go into the next log record, when
//! a host write or flush may be acknowledged, where a read finds each block, which blocks the
//! next destage batch writes to the remote, when log space is free again, how healthy the remote
//! and the log are and whether a host write may come in. No I/O, no clock reads, no tasks: a
//! driver feeds it events with `now` and carries out what it returns.
//!
//! Epochs keep the remote crash-consistent. A host flush ends an epoch, and so does a FUA write
//! in `immediate` mode; in `log` mode (WCE=0, where a completed write is durable and the host may
//! issue dependent writes without flushing) the first new write after any write of the epoch was
//! acknowledged does. Destage may merge and reorder writes inside an epoch, never across one:
//! epoch `k + 1` reaches the remote only after every write of epoch `k` completed there and a
//! SYNCHRONIZE CACHE after them did. Log records are freed only when all their epochs are on the
//! remote.
//!
//! The parts: [`log`] (group commit and acknowledgements), [`read`] (read plans, read-ahead, the
//! read cache), [`destage`] (epochs to the remote, failures, recovery's read-back), [`admit`]
//! (whether a host write may come in) and [`health`] (what failed, since when). The dirty index
//! is kept by runs of blocks ([`stics_block::extent`]), so its memory follows what is dirty, never the
//! LUN's size.

use std::collections::BTreeMap;
use std::time::Instant;

use bytes::Bytes;

use crate::config::{Config, Layout, Mode};
use crate::format::{Checkpoint, ExtentKind, RecordHeader};
use crate::readcache::ReadCache;
use stics_block::extent::{ExtentMap, Run};

pub mod admit;
pub mod destage;
pub mod group;
pub mod health;
pub mod log;
pub mod read;

pub use admit::Admit;
pub use destage::{reached_epoch, DestageIo, Probe, ProbeVersion};
pub use group::{GroupPlan, GroupStats, SgHolds};
pub use health::{Change, ErrorKind, Failure, Health, State};
pub use log::RecordWrite;
pub use read::{Piece, ReadPlan};

/// A host request waiting for its acknowledgement.
pub type Ticket = u64;

/// Where the newest version of a run of blocks is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loc {
    /// In RAM, not yet in the log: the run's bytes.
    Ram(Bytes),
    /// In consecutive log slots from this device offset.
    Log(u64),
    /// Zeros (written as zeros or discarded).
    Zero,
}

/// Blocks of `runs` that hold data (not zeros).
pub(crate) fn data_blocks<'a>(runs: impl IntoIterator<Item = (u64, u64, &'a Version)>) -> u64 {
    runs.into_iter().filter(|(_, _, v)| !matches!(v.loc, Loc::Zero)).map(|(s, e, _)| e - s).sum()
}

/// One version of a run of blocks: which write made it, in which epoch, where it is.
#[derive(Debug, Clone)]
pub(crate) struct Version {
    pub(crate) loc: Loc,
    pub(crate) write_seq: u64,
    pub(crate) epoch: u64,
    pub(crate) discard: bool,
}

impl Run for Version {
    fn cut(&self, from: u64, to: u64, block_size: u64) -> Version {
        let loc = match &self.loc {
            Loc::Ram(b) => Loc::Ram(b.slice((from * block_size) as usize..(to * block_size) as usize)),
            Loc::Log(off) => Loc::Log(off + from * block_size),
            Loc::Zero => Loc::Zero,
        };
        Version { loc, ..*self }
    }
}

impl Version {
    fn new(loc: Loc, write_seq: u64, epoch: u64, discard: bool) -> Version {
        Version { loc, write_seq, epoch, discard }
    }
}

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    /// Outside the device.
    #[error("blocks {lba}+{blocks} outside a device of {num_blocks} blocks")]
    OutOfRange { lba: u64, blocks: u64, num_blocks: u64 },
    /// Not a whole number of blocks, or empty.
    #[error("a write of {len} bytes is not a whole, non-zero number of {block_size}-byte blocks")]
    Misaligned { len: usize, block_size: u32 },
}

/// Counters for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Host write blocks absorbed by a later write before they reached the remote.
    pub blocks_absorbed: u64,
    /// Blocks written to the remote by destage.
    pub blocks_destaged: u64,
    /// Records written to the log.
    pub records: u64,
    /// Epochs destaged and synchronised.
    pub epochs_destaged: u64,
    /// Epochs sent again whole because something failed, or the remote was reset or
    /// reconnected, before their flush completed.
    pub epochs_resent: u64,
    /// Host writes carried out on the remote directly (write-through with nothing dirty).
    pub direct_writes: u64,
}

/// What a host write or flush needs before it is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submitted {
    /// Acknowledge now.
    Done,
    /// Acknowledge when [`Core::record_durable`] or [`Core::take_acks`] returns this ticket.
    Wait(Ticket),
    /// Write-through with nothing dirty: carry the request out on the remote yourself, then
    /// report it with [`Core::direct_done`] (a write or zeroing) and acknowledge when the remote
    /// has.
    Remote,
}

/// The cache's state.
#[derive(Debug)]
pub struct Core {
    pub(crate) cfg: Config,
    pub(crate) layout: Layout,
    pub(crate) log_uuid: [u8; 16],
    pub(crate) log: log::LogState,
    /// The newest version of every dirty block.
    pub(crate) newest: ExtentMap<Version>,
    /// Blocks of `newest` that hold data (not zeros): what destage still has to ship.
    pub(crate) newest_data: u64,
    /// Each epoch's versions, until the epoch is on the remote.
    pub(crate) epochs: BTreeMap<u64, ExtentMap<Version>>,
    /// Runs held by all of `epochs` together (the index's other half).
    pub(crate) epoch_extents: usize,
    /// Every epoch up to this one is on the remote.
    pub(crate) destaged_epoch: u64,
    pub(crate) destage: destage::Destage,
    pub(crate) read: read::ReadState,
    pub(crate) health: Health,
    /// State changes for the driver to log (see [`Core::take_changes`]).
    pub(crate) changes: Vec<Change>,
    /// Write-through writes that waited for destage and are on the remote now.
    pub(crate) acks: Vec<Ticket>,
    pub(crate) admit: admit::AdmitState,
    pub(crate) stats: Stats,
    pub(crate) group_stats: GroupStats,
}

impl Core {
    /// A cache over an empty log whose next record goes to the checkpoint's head.
    pub fn new(cfg: Config, layout: Layout, log_uuid: [u8; 16], checkpoint: Checkpoint) -> Core {
        let bs = layout.block_size;
        Core {
            log: log::LogState::new(checkpoint),
            newest: ExtentMap::new(bs),
            newest_data: 0,
            epochs: BTreeMap::new(),
            epoch_extents: 0,
            destaged_epoch: checkpoint.destaged_epoch,
            destage: destage::Destage::default(),
            read: read::ReadState::new(ReadCache::new(
                cfg.read_cache_policy,
                (cfg.read_cache_bytes / u64::from(bs)) as usize,
            )),
            health: Health::default(),
            changes: Vec::new(),
            acks: Vec::new(),
            admit: admit::AdmitState::default(),
            stats: Stats::default(),
            group_stats: GroupStats::default(),
            log_uuid,
            cfg,
            layout,
        }
    }

    /// Rebuilds the state from the records recovery found intact (in sequence order), after
    /// which destage resumes with the oldest epoch not yet on the remote.
    pub fn recover(
        cfg: Config,
        layout: Layout,
        log_uuid: [u8; 16],
        checkpoint: Checkpoint,
        records: &[(u64, RecordHeader)],
        tail: u64,
        next_seq: u64,
    ) -> Core {
        let mut c = Core::new(cfg, layout, log_uuid, checkpoint);
        let mut max_epoch = checkpoint.destaged_epoch;
        let mut max_write = 0;
        for (offset, h) in records {
            let mut rec_max = 0;
            for (i, e) in h.entries.iter().enumerate() {
                rec_max = rec_max.max(e.epoch);
                max_write = max_write.max(e.write_seq);
                if e.epoch <= checkpoint.destaged_epoch {
                    continue;
                }
                max_epoch = max_epoch.max(e.epoch);
                let loc = match e.kind {
                    ExtentKind::Data => Loc::Log(offset + h.slot_offset(i)),
                    ExtentKind::Zero | ExtentKind::Discard => Loc::Zero,
                    ExtentKind::Forget => {
                        c.drop_dirty(e.lba, u64::from(e.blocks), e.epoch);
                        continue;
                    }
                };
                let v = Version::new(loc, e.write_seq, e.epoch, e.kind == ExtentKind::Discard);
                c.install(e.lba, u64::from(e.blocks), v);
            }
            c.log.push_record(*offset, h.seq, h.record_len(), rec_max, rec_max <= checkpoint.destaged_epoch);
        }
        c.log.resume(max_epoch + 1, max_write + 1, tail, next_seq);
        c.release_freed();
        if c.layout.max_group.is_some() {
            // The SG's status says which epochs it holds; plain destage's read-back, if any is
            // needed, comes after it.
            c.groups_after_recovery();
        } else {
            c.start_recovery_probe(checkpoint.destaged_epoch);
        }
        c
    }

    /// Puts a version of `blocks` blocks at `lba` into the index: the newest, and its epoch's.
    pub(crate) fn install(&mut self, lba: u64, blocks: u64, v: Version) {
        let end = lba + blocks;
        self.read.cache.remove_range(lba, end);
        self.epoch_born(v.epoch);
        let replaced = self.newest.insert(lba, end, v.clone());
        let replaced_data = data_blocks(replaced.iter().map(|(s, e, v)| (*s, *e, v)));
        if !matches!(v.loc, Loc::Zero) {
            self.newest_data += blocks;
        }
        debug_assert!(self.newest_data >= replaced_data);
        self.newest_data = self.newest_data.saturating_sub(replaced_data);
        let bs = self.layout.block_size;
        let per_epoch = self.epochs.entry(v.epoch).or_insert_with(|| ExtentMap::new(bs));
        let before = per_epoch.len();
        let replaced = per_epoch.insert(lba, end, v);
        self.stats.blocks_absorbed += replaced.iter().map(|(s, e, _)| e - s).sum::<u64>();
        self.epoch_extents = self.epoch_extents + per_epoch.len() - before;
    }

    /// What blocks `start..end` hold dirty, in LBA order: (first block, blocks, where), and the
    /// log records pinned for it (pass them to [`Core::unpin`] once read).
    pub fn dirty_runs(&mut self, start: u64, end: u64) -> (Vec<(u64, u64, Loc)>, Vec<u64>) {
        let bs = u64::from(self.layout.block_size);
        let runs: Vec<(u64, u64, Loc)> = self
            .newest
            .overlapping(start, end)
            .map(|(s, e, v)| {
                let (from, to) = (s.max(start), e.min(end));
                (from, to - from, v.cut(from - s, to - s, bs).loc)
            })
            .collect();
        let mut pinned = Vec::new();
        for (_, _, loc) in &runs {
            if let Loc::Log(off) = loc {
                if let Some(seq) = self.log.record_of(*off) {
                    self.log.pin(seq);
                    pinned.push(seq);
                }
            }
        }
        (runs, pinned)
    }

    /// Takes blocks `lba..lba + blocks` out of the dirty index (every version, every epoch's),
    /// so that destage never ships them and reads find the remote's; `epoch` (the drop's own)
    /// is kept in the index, empty, so that destage passes it and frees its record.
    pub(crate) fn drop_dirty(&mut self, lba: u64, blocks: u64, epoch: u64) {
        let end = lba + blocks;
        let removed = self.newest.remove(lba, end);
        let data: u64 = removed.iter().filter(|(_, _, v)| !matches!(v.loc, Loc::Zero)).map(|(s, e, _)| e - s).sum();
        self.newest_data = self.newest_data.saturating_sub(data);
        for m in self.epochs.values_mut() {
            let before = m.len();
            m.remove(lba, end);
            self.epoch_extents = (self.epoch_extents + m.len()).saturating_sub(before);
        }
        let bs = self.layout.block_size;
        self.epochs.entry(epoch).or_insert_with(|| ExtentMap::new(bs));
        self.invalidate(lba, end);
    }

    /// Points the parts of a write (`data` at `lba`) still indexed at its log slots once its
    /// record is durable, and puts a copy of the parts that are still the newest into the read
    /// cache (seed 004's DRAM cache holds what was written as well as what was read): reads of
    /// them are answered from DRAM, before destage and after it.
    pub(crate) fn relocate(&mut self, lba: u64, data: &Bytes, write_seq: u64, epoch: u64, slot: u64) {
        let bs = u64::from(self.layout.block_size);
        let end = lba + data.len() as u64 / bs;
        // True for this write's parts, which it points at their slots.
        let to_log = |s: u64, v: &mut Version| {
            let ours = v.write_seq == write_seq;
            if ours {
                v.loc = Loc::Log(slot + (s.max(lba) - lba) * bs);
            }
            ours
        };
        let mut newest: Vec<(u64, u64)> = Vec::new();
        self.newest.update(lba, end, |s, e, v| {
            if to_log(s, v) {
                newest.push((s.max(lba), e.min(end)));
            }
        });
        if let Some(m) = self.epochs.get_mut(&epoch) {
            m.update(lba, end, |s, _e, v| {
                to_log(s, v);
            });
        }
        if self.read.cache.capacity() == 0 {
            return;
        }
        // One copy per block: a slice would keep the whole write's buffer alive.
        for (s, e) in newest {
            for (i, chunk) in
                data[((s - lba) * bs) as usize..((e - lba) * bs) as usize].chunks_exact(bs as usize).enumerate()
            {
                self.read.cache.insert(s + i as u64, Bytes::copy_from_slice(chunk));
            }
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The devices' layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Blocks held dirty (not yet on the remote).
    pub fn dirty_blocks(&self) -> u64 {
        self.newest.blocks()
    }

    /// Runs of blocks the dirty index holds (newest versions and every epoch's).
    pub fn index_extents(&self) -> u64 {
        (self.newest.len() + self.epoch_extents) as u64
    }

    /// The open epoch and the newest epoch fully on the remote.
    pub fn epochs(&self) -> (u64, u64) {
        (self.log.epoch, self.destaged_epoch)
    }

    /// The health of the remote and the log.
    pub fn health(&self) -> &Health {
        &self.health
    }

    /// State changes since the last call, for the driver to log (one line each).
    pub fn take_changes(&mut self) -> Vec<Change> {
        std::mem::take(&mut self.changes)
    }

    /// The failure in force, when it is due to be logged again at `now`.
    pub fn reminder(&mut self, now: Instant) -> Option<Failure> {
        self.health.reminder(now)
    }

    /// Write-through writes that waited for destage and are on the remote now.
    pub fn take_acks(&mut self) -> Vec<Ticket> {
        std::mem::take(&mut self.acks)
    }

    /// The local log device failed at `now` (the driver retries the same write).
    pub fn log_failed(&mut self, error: String, now: Instant) -> std::time::Duration {
        let (wait, change) =
            self.health.failed(ErrorKind::Log, error, None, now, self.cfg.retry_delay, self.cfg.retry_max);
        self.changes.extend(change);
        wait
    }

    /// The local log device took a write at `now`.
    pub fn log_ok(&mut self, now: Instant) {
        let change = self.health.succeeded(true, now);
        self.changes.extend(change);
    }

    /// Closes the epoch under way and returns the newest epoch that holds writes so far.
    pub fn mark(&mut self) -> u64 {
        self.close_epoch();
        self.log.epoch.saturating_sub(1)
    }

    /// The newest epoch that holds a write to blocks `start..end` not yet on the remote, if any
    /// (the epoch under way is closed when it is that one): settling through it puts every
    /// write to those blocks on the remote, behind every older epoch.
    pub fn dirty_through(&mut self, start: u64, end: u64) -> Option<u64> {
        let newest = self.newest.overlapping(start, end).map(|(_, _, v)| v.epoch).max()?;
        if newest >= self.log.epoch {
            self.close_epoch();
        }
        Some(newest)
    }

    /// True when no version of an epoch up to `through` is left off the remote.
    pub fn settled(&self, through: u64) -> bool {
        self.epochs.keys().next().is_none_or(|&e| e > through)
    }

    /// True when nothing is dirty, pending or in flight: the remote holds everything.
    pub fn is_clean(&self) -> bool {
        self.newest.is_empty() && self.log.is_idle() && self.epochs.is_empty()
    }

    /// Write-through requests go to the remote directly: nothing is dirty, and the log as it is
    /// on disk would recover nothing (a checkpoint that lags would replay older data over them).
    pub(crate) fn direct_writes(&self) -> bool {
        self.cfg.mode == Mode::WriteThrough && self.is_clean() && self.log.durable_destaged_epoch >= self.destaged_epoch
    }

    pub(crate) fn check(&self, lba: u64, blocks: u64) -> Result<(), CoreError> {
        match lba.checked_add(blocks) {
            Some(end) if end <= self.layout.num_blocks && blocks > 0 => Ok(()),
            _ => Err(CoreError::OutOfRange { lba, blocks, num_blocks: self.layout.num_blocks }),
        }
    }

    /// The acknowledgement rule in force.
    pub fn mode(&self) -> Mode {
        self.cfg.mode
    }
}

#[cfg(test)]
mod tests;

//! The cache's decisions as a pure state machine: which writes go into the next log record, when
//! a host write or flush may be acknowledged, where a read finds each block, which blocks the
//! next destage batch writes to the remote and when log space is free again. No I/O, no clock
//! reads, no tasks: a driver feeds it events and carries out what it returns.
//!
//! Epochs keep the remote crash-consistent. A host flush ends an epoch, and so does a FUA write
//! in `immediate` mode; in `log` mode (WCE=0, where a completed write is durable and the host may
//! issue dependent writes without flushing) the first new write after any write of the epoch
//! was acknowledged does. Destage
//! may merge and reorder writes inside an epoch, never across one: epoch `k + 1` reaches the
//! remote only after every write of epoch `k` completed there and a SYNCHRONIZE CACHE after them
//! did. Log records are freed only when all their epochs are on the remote.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;

use crate::format::{Checkpoint, Entry, ExtentKind, RecordHeader, LOG_BLOCK};
use crate::readcache::{Policy, ReadCache};

/// When a host write is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Once it is on stable local storage (seed 004's "report after complete"; WCE=0).
    Log,
    /// Once it is in RAM (seed 004's "immediate report"; WCE=1): FUA writes and flushes wait
    /// for stable local storage.
    Immediate,
}

/// How many epochs past the durable checkpoint destage may have on an ordered remote at once.
/// Single-write epochs (a `log`-mode host at depth one, or the host at steady state) need many
/// in flight to keep a long path busy.
pub const PIPELINE_EPOCHS: usize = 128;

/// How many bytes of blocks those epochs may hold (beyond two, which may hold any): recovery
/// reads this much back from the remote.
pub const PIPELINE_BYTES: u64 = 16 << 20;

/// Fixed parameters of a cache.
#[derive(Debug, Clone)]
pub struct Config {
    /// Remote (and slot) block size.
    pub block_size: u32,
    /// Remote capacity in blocks.
    pub num_blocks: u64,
    /// Acknowledgement rule.
    pub mode: Mode,
    /// Most bytes of host writes held in RAM waiting for the log.
    pub ram_bytes: u64,
    /// Where the log's ring of records starts and ends (device byte offsets).
    pub ring_start: u64,
    /// End of the ring.
    pub ring_end: u64,
    /// Largest log record (header and data).
    pub max_record_bytes: u64,
    /// Largest single remote write destage issues.
    pub destage_io_bytes: u64,
    /// Most remote writes destage keeps in flight.
    pub destage_inflight: usize,
    /// The remote keeps the order of commands around an ORDERED SYNCHRONIZE CACHE: destage then
    /// queues an epoch's writes, its flush and the next epoch's writes at once, instead of
    /// waiting a round trip for each (see [`DestageIo::Sync`]).
    pub ordered_remote: bool,
    /// Most epochs past the durable checkpoint that destage may have sent (see
    /// [`Core::pipeline_allows`]); recovery reads back what the remote holds of that many. It
    /// must not shrink between runs on one log: [`PIPELINE_EPOCHS`] unless a test asks less.
    pub pipeline_epochs: usize,
    /// Most bytes of blocks in those epochs, beyond the first two ([`PIPELINE_BYTES`]).
    pub pipeline_bytes: u64,
    /// Log fill (0–1) below which destage keeps two epochs in flight, not the whole pipeline,
    /// unless asked to hurry ([`Core::hurry`]): while the log has room, destage is background
    /// work and leaves the machine to the host.
    pub deep_from: f64,
    /// An epoch ends after this many host writes, so that no epoch outgrows the log (destage
    /// frees space one whole epoch at a time) and destage never waits long for one to end.
    pub epoch_max_writes: u64,
    /// An epoch ends after this many bytes of host writes.
    pub epoch_max_bytes: u64,
    /// Clean blocks kept in RAM for reads.
    pub read_cache_blocks: usize,
    /// How the read cache evicts.
    pub read_cache_policy: Policy,
    /// Largest read-ahead window in blocks (0: none); it doubles while reads stay sequential.
    pub read_ahead_blocks: u64,
}

impl Config {
    /// The most log bytes one epoch can take: each write may sit alone in a record (a header
    /// block and its data rounded up to a log block), plus the write that crosses the limits.
    pub fn epoch_log_bound(&self) -> u64 {
        let largest_write = self.ram_bytes.max(self.max_record_bytes);
        (self.epoch_max_writes + 1) * 2 * LOG_BLOCK + self.epoch_max_bytes + largest_write
    }

    /// Checks that the log can always make progress: it holds the epoch being destaged, the
    /// one being written and a record lost to the ring's wrap.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let ring = self.ring_end.saturating_sub(self.ring_start);
        let need = 2 * self.epoch_log_bound() + self.max_record_bytes;
        if ring < need {
            return Err(ConfigError::LogTooSmall { ring, need });
        }
        if self.epoch_max_writes == 0
            || self.epoch_max_bytes == 0
            || self.destage_inflight == 0
            || self.pipeline_epochs < 2
        {
            return Err(ConfigError::Zero);
        }
        Ok(())
    }
}

/// A configuration the cache cannot run with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The log's ring cannot hold two epochs and a record.
    #[error("the log holds {ring} bytes of records but needs at least {need} for these RAM and epoch limits")]
    LogTooSmall { ring: u64, need: u64 },
    /// A limit of zero.
    #[error("epoch limits and destage concurrency must be at least 1, the pipeline at least 2 epochs")]
    Zero,
}

/// A host request waiting for its acknowledgement.
pub type Ticket = u64;

/// Where the newest version of a block is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loc {
    /// In RAM, not yet in the log.
    Ram(Bytes),
    /// In a log slot at this device offset.
    Log(u64),
    /// Zeros (written as zeros or discarded).
    Zero,
}

#[derive(Debug, Clone)]
struct Version {
    loc: Loc,
    write_seq: u64,
    epoch: u64,
    discard: bool,
}

/// One host write waiting for the log.
#[derive(Debug, Clone)]
struct Pending {
    lba: u64,
    blocks: u32,
    kind: ExtentKind,
    data: Bytes,
    write_seq: u64,
    epoch: u64,
}

/// A live (or pinned) record on the ring.
#[derive(Debug, Clone)]
struct RecInfo {
    seq: u64,
    offset: u64,
    len: u64,
    max_epoch: u64,
    /// Destaged and synchronised: kept only while a read may still be using its slots.
    freed: bool,
    pins: u32,
}

/// A request that waits for writes to be durable.
#[derive(Debug, Clone, Copy)]
struct Waiter {
    ticket: Ticket,
    /// Done once every write with a lower write sequence number is durable in the log.
    until_write: u64,
}

/// What the driver writes to the log next: one record at `offset`, then a flush of the log.
#[derive(Debug, Clone)]
pub struct RecordWrite {
    /// Sequence number, to report back in [`Core::record_durable`].
    pub seq: u64,
    /// Device offset.
    pub offset: u64,
    /// Header followed by the slots, padded to the log block.
    pub bytes: Vec<u8>,
}

/// Where one run of a read comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// These bytes.
    Ram(Bytes),
    /// A log slot range: `blocks` blocks at device offset `offset` (consecutive slots).
    Log { offset: u64, blocks: u32 },
    /// Zeros.
    Zero { blocks: u32 },
    /// Clean: read from the remote (or the read cache).
    Remote { lba: u64, blocks: u32 },
}

/// A read's plan, and the pin that keeps its log slots from reuse until [`Core::unpin`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadPlan {
    /// Pieces in LBA order.
    pub pieces: Vec<Piece>,
    /// Records whose slots the plan reads; pass back to [`Core::unpin`].
    pub pinned: Vec<u64>,
    /// The cache's invalidation generation when planned: remote data read for this plan may go
    /// into the read cache only if [`Core::invalidations`] still returns it.
    pub generation: u64,
    /// Blocks to read ahead from the remote into the read cache (see [`Core::fill`]).
    pub prefetch: Option<(u64, u32)>,
}

/// One remote operation of a destage batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DestageIo {
    /// Write `blocks` blocks at `lba` from these sources (in order).
    Write { id: u64, lba: u64, blocks: u32, sources: Vec<Piece> },
    /// Zero or discard `blocks` blocks at `lba`.
    Zero { id: u64, lba: u64, blocks: u32, discard: bool },
    /// Synchronise the remote's cache after the writes of `epoch`. Without `barrier` they have
    /// all completed; with it (an ordered remote) some may still be in flight, and the flush
    /// must go out now as an ORDERED task, before anything destage hands out later.
    Sync { epoch: u64, barrier: bool },
    /// Read back what the remote holds of the epochs that may be partly there, to find where
    /// destage resumes; answer with [`Core::probed`] or [`Core::probe_failed`].
    Probe(Probe),
}

/// The blocks of the epochs that destage may have left partly on the remote (after a crash, or
/// a failure with more than two epochs sent), each with the version each epoch wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The epochs, oldest first; every epoch before them is on the remote.
    pub epochs: Vec<u64>,
    /// One entry per block and epoch that wrote it.
    pub versions: Vec<ProbeVersion>,
}

/// One epoch's version of one block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeVersion {
    /// The block.
    pub lba: u64,
    /// The epoch that wrote it.
    pub epoch: u64,
    /// Its content: a log slot ([`Piece::Log`] of one block) or zeros ([`Piece::Zero`]).
    pub source: Piece,
    /// Discarded: the remote may hold anything there (unless it zeroes what it unmaps).
    pub discard: bool,
}

impl Probe {
    /// The blocks to read from the remote, as runs of at most `max_blocks`.
    pub fn runs(&self, max_blocks: u32) -> Vec<(u64, u32)> {
        let lbas: std::collections::BTreeSet<u64> = self.versions.iter().map(|v| v.lba).collect();
        let mut runs: Vec<(u64, u32)> = Vec::new();
        for lba in lbas {
            match runs.last_mut() {
                Some((at, n)) if *at + u64::from(*n) == lba && *n < max_blocks.max(1) => *n += 1,
                _ => runs.push((lba, 1)),
            }
        }
        runs
    }
}

/// The newest epoch of a probe's window that the remote holds whole, in content: the remote
/// equals the image after it plus some of the next epoch's writes. `matches[i]` says whether the
/// remote holds `versions[i]`. The remote is in such a state for the epoch it really reached,
/// and for any later one it passes this test it holds the same bytes, so the newest that passes
/// is safe to resume after; `base` (the epoch before the window) always passes.
pub fn reached_epoch(base: u64, probe: &Probe, matches: &[bool]) -> u64 {
    // Per block: (epoch, holds) for every epoch of the window that wrote it, oldest first.
    let mut per_block: BTreeMap<u64, Vec<(u64, bool)>> = BTreeMap::new();
    for (v, &m) in probe.versions.iter().zip(matches.iter().chain(std::iter::repeat(&false))) {
        per_block.entry(v.lba).or_default().push((v.epoch, m));
    }
    for list in per_block.values_mut() {
        list.sort_unstable_by_key(|(e, _)| *e);
    }
    for (i, &j) in probe.epochs.iter().enumerate().rev() {
        let next = probe.epochs.get(i + 1).copied();
        let holds = per_block.values().all(|list| {
            // The block's version after epoch `j`, if the window wrote it by then.
            let Some(&(_, at_j)) = list.iter().rev().find(|(e, _)| *e <= j) else { return true };
            at_j || next.is_some_and(|n| list.iter().any(|&(e, m)| e == n && m))
        });
        if holds {
            return j;
        }
    }
    base
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
}

/// Where an epoch's flush of the remote stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SyncState {
    Unsent,
    Sent,
    Done,
}

/// One epoch on its way to the remote.
#[derive(Debug)]
struct EpochDestage {
    epoch: u64,
    /// Remote operations not yet handed out, in LBA order.
    queue: VecDeque<DestageIo>,
    /// Handed out, not yet completed.
    inflight: BTreeMap<u64, DestageIo>,
    sync: SyncState,
    /// A write of this epoch failed: its flush proves nothing.
    failed: bool,
    /// Earlier epochs the remote was found to hold already: they leave the dirty index with
    /// this one, once its flush makes them durable there.
    covers: Vec<u64>,
    /// Blocks in this epoch and those it covers (for [`Core::pipeline_allows`]).
    blocks: u64,
}

/// Destage in progress: one epoch at a time, or many in a row on an ordered remote.
///
/// Replaying epoch `k` over a remote that already holds some of epoch `k + 1` only moves it
/// back inside `k + 1`, a state it may be in anyway; over one that holds some of `k + 2` it
/// would mix `k` with `k + 2`, a state the host never saw. So with at most two epochs past the
/// durable checkpoint sent, recovery simply destages again from the checkpoint on. With more,
/// it first reads back what the remote holds of them ([`DestageIo::Probe`]) and resumes after
/// the newest it holds whole ([`reached_epoch`]); so does destage after a failure.
/// A read-back of the remote that destage waits for.
#[derive(Debug)]
struct PendingProbe {
    probe: Probe,
    /// The epoch before the probe's window: the remote holds it and all before it.
    base: u64,
    /// Handed out to the driver.
    sent: bool,
}

#[derive(Debug, Default)]
struct Destage {
    active: VecDeque<EpochDestage>,
    /// Epochs synchronised whose checkpoint is not durable yet, with their block counts (they
    /// count towards the pipeline's limits).
    undurable: VecDeque<(u64, u64)>,
    /// The remote must be read back before anything more goes out.
    probe: Option<PendingProbe>,
    /// Where a probe found the remote: the next epoch destaged is this one, standing for the
    /// epochs of the window before it.
    resume: Option<(u64, Vec<u64>)>,
    /// Something failed while epochs were pipelined: the remote may have run later commands
    /// past the failure. Nothing more goes out until everything in flight has ended; then
    /// destage starts again, whole, from the oldest epoch not synchronised.
    failed: bool,
}

impl Destage {
    fn inflight(&self) -> usize {
        self.active.iter().map(|e| e.inflight.len()).sum()
    }

    /// True when no answer is outstanding.
    fn quiet(&self) -> bool {
        self.active.iter().all(|e| e.inflight.is_empty() && e.sync != SyncState::Sent)
    }

    fn epoch_of(&mut self, id: u64) -> Option<&mut EpochDestage> {
        self.active.iter_mut().find(|e| e.inflight.contains_key(&id))
    }
}

/// The cache's state.
#[derive(Debug)]
pub struct Core {
    cfg: Config,
    log_uuid: [u8; 16],
    next_write_seq: u64,
    /// The open epoch.
    epoch: u64,
    epoch_has_writes: bool,
    epoch_acked: bool,
    epoch_writes: u64,
    epoch_bytes: u64,
    /// Every epoch up to this one is on the remote.
    destaged_epoch: u64,
    pending: VecDeque<Pending>,
    pending_bytes: u64,
    in_flight: Option<(u64, Vec<Pending>, u64)>,
    next_seq: u64,
    tail: u64,
    records: VecDeque<RecInfo>,
    newest: BTreeMap<u64, Version>,
    epochs: BTreeMap<u64, BTreeMap<u64, Version>>,
    waiters: Vec<Waiter>,
    destage: Destage,
    next_io: u64,
    next_ticket: Ticket,
    /// Destage runs the whole pipeline whatever the log's fill (a drain waits for it).
    hurry: bool,
    /// Bumped whenever blocks leave the dirty index: remote reads planned before may be stale.
    invalidations: u64,
    /// The checkpoint last handed out by [`Core::take_checkpoint`].
    last_checkpoint: Checkpoint,
    /// Head sequence number of the newest checkpoint known durable: records before it may be
    /// overwritten (before that, a crash would scan from an older head into reused space).
    durable_head_seq: u64,
    /// The destaged epoch of the newest checkpoint known durable. The next epoch's destage waits
    /// for it: were epoch `k` replayed after a crash on top of epoch `k + 1`'s writes, the
    /// remote would go back to a state the host never saw.
    durable_destaged_epoch: u64,
    stats: Stats,
    read_cache: ReadCache,
    /// Where the last read ended, the read-ahead window and how far read-ahead has gone.
    last_read_end: u64,
    ra_window: u64,
    ra_end: u64,
}

/// What a host write or flush needs before it is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submitted {
    /// Acknowledge now.
    Done,
    /// Acknowledge when [`Core::record_durable`] returns this ticket.
    Wait(Ticket),
}

impl Core {
    /// A cache over an empty log whose next record goes to `tail` with sequence `next_seq`.
    pub fn new(cfg: Config, log_uuid: [u8; 16], checkpoint: Checkpoint) -> Core {
        Core {
            log_uuid,
            next_write_seq: 1,
            epoch: checkpoint.destaged_epoch + 1,
            epoch_has_writes: false,
            epoch_acked: false,
            epoch_writes: 0,
            epoch_bytes: 0,
            destaged_epoch: checkpoint.destaged_epoch,
            pending: VecDeque::new(),
            pending_bytes: 0,
            in_flight: None,
            next_seq: checkpoint.head_seq,
            tail: checkpoint.head_offset,
            records: VecDeque::new(),
            newest: BTreeMap::new(),
            epochs: BTreeMap::new(),
            waiters: Vec::new(),
            destage: Destage::default(),
            next_io: 1,
            next_ticket: 1,
            hurry: false,
            invalidations: 0,
            last_checkpoint: checkpoint,
            durable_head_seq: checkpoint.head_seq,
            durable_destaged_epoch: checkpoint.destaged_epoch,
            stats: Stats::default(),
            read_cache: ReadCache::new(cfg.read_cache_policy, cfg.read_cache_blocks),
            last_read_end: u64::MAX,
            ra_window: 0,
            ra_end: 0,
            cfg,
        }
    }

    /// Rebuilds the state from the records recovery found intact (in sequence order), after
    /// which destage resumes with the oldest epoch not yet on the remote.
    pub fn recover(
        cfg: Config,
        log_uuid: [u8; 16],
        checkpoint: Checkpoint,
        records: &[(u64, RecordHeader)],
        tail: u64,
        next_seq: u64,
    ) -> Core {
        let mut c = Core::new(cfg, log_uuid, checkpoint);
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
                let slot0 = offset + h.slot_offset(i);
                for b in 0..u64::from(e.blocks) {
                    let loc = match e.kind {
                        ExtentKind::Data => Loc::Log(slot0 + b * u64::from(h.block_size)),
                        ExtentKind::Zero | ExtentKind::Discard => Loc::Zero,
                    };
                    let v =
                        Version { loc, write_seq: e.write_seq, epoch: e.epoch, discard: e.kind == ExtentKind::Discard };
                    c.install(e.lba + b, v);
                }
            }
            c.records.push_back(RecInfo {
                seq: h.seq,
                offset: *offset,
                len: h.record_len(),
                max_epoch: rec_max,
                freed: rec_max <= checkpoint.destaged_epoch,
                pins: 0,
            });
        }
        c.epoch = max_epoch + 1;
        c.next_write_seq = max_write + 1;
        c.next_seq = next_seq;
        c.tail = tail;
        c.release_freed();
        // Destage may have sent any epoch the pipeline's limits allowed past this checkpoint.
        let mut window = Vec::new();
        let mut bytes = 0;
        for (&epoch, blocks) in &c.epochs {
            bytes += blocks.len() as u64 * u64::from(c.cfg.block_size);
            if !c.pipeline_allows(window.len() + 1, bytes) {
                break;
            }
            window.push(epoch);
        }
        if window.len() > 2 {
            c.start_probe(checkpoint.destaged_epoch, window);
        }
        c
    }

    /// Destage at full depth whatever the log's fill (for a drain), or not.
    pub fn hurry(&mut self, on: bool) {
        self.hurry = on;
    }

    /// Whether destage may send the `n`-th epoch past the durable checkpoint when those `n`
    /// epochs hold `bytes` bytes of blocks. Recovery applies the same rule to the log, so it
    /// reads back every epoch destage may have sent.
    pub fn pipeline_allows(&self, n: usize, bytes: u64) -> bool {
        n <= 2 || (n <= self.cfg.pipeline_epochs && bytes <= self.cfg.pipeline_bytes)
    }

    /// Nothing more goes out until the remote's hold on these epochs is read back.
    fn start_probe(&mut self, base: u64, window: Vec<u64>) {
        let mut versions = Vec::new();
        for &epoch in &window {
            let Some(blocks) = self.epochs.get(&epoch) else { continue };
            for (&lba, v) in blocks {
                let source = match v.loc {
                    Loc::Log(offset) => Piece::Log { offset, blocks: 1 },
                    Loc::Zero => Piece::Zero { blocks: 1 },
                    // Destaged epochs are durable in the log; a version still in RAM was never
                    // sent, and its epoch is after any the remote may hold.
                    Loc::Ram(_) => continue,
                };
                versions.push(ProbeVersion { lba, epoch, source, discard: v.discard });
            }
        }
        self.destage.active.clear();
        self.destage.resume = None;
        self.destage.probe = Some(PendingProbe { probe: Probe { epochs: window, versions }, base, sent: false });
    }

    /// What a [`DestageIo::Probe`] read back: `matches[i]` is true when the remote holds
    /// `versions[i]`. Destage resumes after the newest epoch the remote holds whole.
    pub fn probed(&mut self, matches: &[bool]) {
        let Some(PendingProbe { probe, base, sent: true }) = self.destage.probe.take() else { return };
        let reached = reached_epoch(base, &probe, matches);
        if reached > base {
            // Epoch `reached` is sent again: over a remote holding some of the next epoch it
            // stays consistent, and its flush makes the ones before it durable there too.
            let covered = probe.epochs.iter().copied().filter(|&e| e < reached).collect();
            self.destage.resume = Some((reached, covered));
        }
    }

    /// A [`DestageIo::Probe`] failed: it is handed out again.
    pub fn probe_failed(&mut self) {
        if let Some(p) = self.destage.probe.as_mut() {
            p.sent = false;
        }
    }

    fn install(&mut self, lba: u64, v: Version) {
        self.read_cache.remove(lba);
        let keep_newest = self.newest.get(&lba).is_none_or(|old| old.write_seq <= v.write_seq);
        let per_epoch = self.epochs.entry(v.epoch).or_default();
        if let Some(old) = per_epoch.get(&lba) {
            if old.write_seq > v.write_seq {
                return;
            }
            self.stats.blocks_absorbed += 1;
        }
        per_epoch.insert(lba, v.clone());
        if keep_newest {
            self.newest.insert(lba, v);
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Blocks held dirty (not yet on the remote).
    pub fn dirty_blocks(&self) -> usize {
        self.newest.len()
    }

    /// Bytes of the ring in use by live or pinned records.
    pub fn log_used(&self) -> u64 {
        self.records.iter().map(|r| r.len).sum::<u64>()
    }

    /// Fraction of the ring in use, 0.0–1.0.
    pub fn log_fill(&self) -> f64 {
        self.log_used() as f64 / (self.cfg.ring_end - self.cfg.ring_start).max(1) as f64
    }

    /// Bytes of host writes in RAM waiting for the log.
    pub fn ram_used(&self) -> u64 {
        self.pending_bytes
    }

    /// The open epoch and the newest epoch fully on the remote.
    pub fn epochs(&self) -> (u64, u64) {
        (self.epoch, self.destaged_epoch)
    }

    /// The invalidation generation (see [`ReadPlan::generation`]).
    pub fn invalidations(&self) -> u64 {
        self.invalidations
    }

    /// True when a write of `bytes` fits in RAM now; otherwise the driver waits for the log.
    pub fn ram_has_room(&self, bytes: u64) -> bool {
        self.pending_bytes == 0 || self.pending_bytes + bytes <= self.cfg.ram_bytes
    }

    fn check(&self, lba: u64, blocks: u64) -> Result<(), CoreError> {
        match lba.checked_add(blocks) {
            Some(end) if end <= self.cfg.num_blocks && blocks > 0 => Ok(()),
            _ => Err(CoreError::OutOfRange { lba, blocks, num_blocks: self.cfg.num_blocks }),
        }
    }

    /// Starts a new epoch if the rules ask for one before a write arrives.
    fn before_write(&mut self, bytes: u64) {
        let full = self.epoch_writes >= self.cfg.epoch_max_writes || self.epoch_bytes >= self.cfg.epoch_max_bytes;
        if full || self.cfg.mode == Mode::Log && self.epoch_acked {
            self.close_epoch();
        }
        self.epoch_writes += 1;
        self.epoch_bytes += bytes;
    }

    fn close_epoch(&mut self) {
        if self.epoch_has_writes {
            self.epoch += 1;
            self.epoch_has_writes = false;
            self.epoch_acked = false;
            self.epoch_writes = 0;
            self.epoch_bytes = 0;
        }
    }

    fn ticket(&mut self) -> Ticket {
        let t = self.next_ticket;
        self.next_ticket += 1;
        t
    }

    fn wait_for_all(&mut self) -> Submitted {
        let until_write = self.next_write_seq;
        if self.durable_write() >= until_write {
            return Submitted::Done;
        }
        let ticket = self.ticket();
        self.waiters.push(Waiter { ticket, until_write });
        Submitted::Wait(ticket)
    }

    /// The lowest write sequence number not yet durable in the log: records are written one at
    /// a time and in order, so it is the first write in flight, else the first still in RAM.
    fn durable_write(&self) -> u64 {
        if let Some(p) = self.in_flight.as_ref().and_then(|(_, w, _)| w.first()) {
            return p.write_seq;
        }
        self.pending.front().map_or(self.next_write_seq, |p| p.write_seq)
    }

    /// A host write of whole blocks at `lba`.
    pub fn write(&mut self, lba: u64, data: Bytes, fua: bool) -> Result<Submitted, CoreError> {
        let bs = self.cfg.block_size as usize;
        if data.is_empty() || !data.len().is_multiple_of(bs) {
            return Err(CoreError::Misaligned { len: data.len(), block_size: self.cfg.block_size });
        }
        let blocks = (data.len() / bs) as u64;
        self.check(lba, blocks)?;
        self.before_write(data.len() as u64);
        let epoch = self.epoch;
        let write_seq = self.next_write_seq;
        self.next_write_seq += 1;
        for b in 0..blocks {
            let slice = data.slice((b as usize) * bs..(b as usize + 1) * bs);
            self.install(lba + b, Version { loc: Loc::Ram(slice), write_seq, epoch, discard: false });
        }
        self.pending_bytes += data.len() as u64;
        self.push_pending(lba, blocks, ExtentKind::Data, data, write_seq, epoch);
        Ok(self.after_write(fua))
    }

    /// A host request to zero (or, with `discard`, deallocate) blocks: they read as zeros.
    pub fn zero(&mut self, lba: u64, blocks: u64, discard: bool) -> Result<Submitted, CoreError> {
        self.check(lba, blocks)?;
        self.before_write(0);
        let epoch = self.epoch;
        let write_seq = self.next_write_seq;
        self.next_write_seq += 1;
        for b in 0..blocks {
            self.install(lba + b, Version { loc: Loc::Zero, write_seq, epoch, discard });
        }
        let kind = if discard { ExtentKind::Discard } else { ExtentKind::Zero };
        // Extents of at most u32::MAX blocks each.
        let mut at = lba;
        while at < lba + blocks {
            let n = (lba + blocks - at).min(u64::from(u32::MAX));
            self.push_pending(at, n, kind, Bytes::new(), write_seq, epoch);
            at += n;
        }
        Ok(self.after_write(false))
    }

    fn push_pending(&mut self, lba: u64, blocks: u64, kind: ExtentKind, data: Bytes, write_seq: u64, epoch: u64) {
        self.epoch_has_writes = true;
        self.pending.push_back(Pending { lba, blocks: blocks as u32, kind, data, write_seq, epoch });
    }

    fn after_write(&mut self, fua: bool) -> Submitted {
        let r = match (self.cfg.mode, fua) {
            (Mode::Immediate, false) => Submitted::Done,
            _ => self.wait_for_all(),
        };
        // In `log` mode every write is durable once acknowledged, FUA or not (a target with
        // WCE=0 sends every write with FUA): the acknowledgement ends the epoch for whatever
        // the host issues after it, and closing it here would give each write an epoch of its
        // own, with a remote flush of its own.
        if fua && self.cfg.mode == Mode::Immediate {
            self.close_epoch();
        }
        if r == Submitted::Done {
            self.epoch_acked = true;
        }
        r
    }

    /// A host flush: every write acknowledged before it becomes durable; ends the epoch.
    pub fn flush(&mut self) -> Submitted {
        self.close_epoch();
        self.wait_for_all()
    }

    /// The next record to write to the log, when none is in flight, writes are waiting and the
    /// ring has room. The driver writes it, flushes the log device, then calls
    /// [`Core::record_durable`].
    pub fn next_record(&mut self) -> Option<RecordWrite> {
        if self.in_flight.is_some() || self.pending.is_empty() {
            return None;
        }
        let bs = u64::from(self.cfg.block_size);
        // Take writes while the record stays under the limit (always at least one).
        let mut take = 0usize;
        let mut data = 0u64;
        for p in &self.pending {
            let d = if p.kind.has_slots() { u64::from(p.blocks) * bs } else { 0 };
            let len = RecordHeader::header_len(take + 1) + (data + d).div_ceil(LOG_BLOCK) * LOG_BLOCK;
            if take > 0 && len > self.cfg.max_record_bytes {
                break;
            }
            take += 1;
            data += d;
        }
        let len = RecordHeader::header_len(take) + data.div_ceil(LOG_BLOCK) * LOG_BLOCK;
        let offset = self.place(len)?;
        let writes: Vec<Pending> = self.pending.drain(..take).collect();
        let entries = writes
            .iter()
            .map(|p| Entry {
                lba: p.lba,
                blocks: p.blocks,
                kind: p.kind,
                write_seq: p.write_seq,
                epoch: p.epoch,
                data_crc: 0,
            })
            .collect();
        let header = RecordHeader {
            log_uuid: self.log_uuid,
            seq: self.next_seq,
            offset,
            block_size: self.cfg.block_size,
            entries,
        };
        let bufs: Vec<&[u8]> = writes.iter().map(|p| p.data.as_ref()).collect();
        let (_, bytes) = crate::format::encode_record(header, &bufs).ok()?;
        let seq = self.next_seq;
        self.next_seq += 1;
        self.tail = offset + len;
        let max_epoch = writes.iter().map(|p| p.epoch).max().unwrap_or(0);
        self.records.push_back(RecInfo { seq, offset, len, max_epoch, freed: false, pins: 0 });
        self.in_flight = Some((seq, writes, offset));
        self.stats.records += 1;
        Some(RecordWrite { seq, offset, bytes })
    }

    /// Where a record of `len` bytes goes, if the ring has room for it.
    fn place(&self, len: u64) -> Option<u64> {
        let (start, end) = (self.cfg.ring_start, self.cfg.ring_end);
        if len > end - start {
            return None;
        }
        let Some(head) = self.records.front().map(|r| r.offset) else {
            return Some(crate::scan::place(self.tail, len, end));
        };
        if self.tail > head {
            if self.tail + len <= end {
                return Some(self.tail);
            }
            return (start + len <= head).then_some(start);
        }
        // Wrapped: the free space is between the tail and the head.
        (self.tail + len <= head).then_some(self.tail)
    }

    /// The record `seq` and everything before it are durable on the log: returns the tickets
    /// to acknowledge.
    pub fn record_durable(&mut self, seq: u64) -> Vec<Ticket> {
        if let Some((_, writes, offset)) = self.in_flight.take_if(|(s, _, _)| *s == seq) {
            let bs = u64::from(self.cfg.block_size);
            let header_len = RecordHeader::header_len(writes.len());
            let mut slot = offset + header_len;
            for p in &writes {
                if p.kind.has_slots() {
                    self.pending_bytes -= p.data.len() as u64;
                    for b in 0..u64::from(p.blocks) {
                        self.relocate(p.lba + b, p.write_seq, p.epoch, Loc::Log(slot + b * bs));
                    }
                    slot += u64::from(p.blocks) * bs;
                }
            }
        }
        let durable = self.durable_write();
        let mut done = Vec::new();
        self.waiters.retain(|w| {
            let ok = durable >= w.until_write;
            if ok {
                done.push(w.ticket);
            }
            !ok
        });
        if !done.is_empty() {
            self.epoch_acked = true;
        }
        done
    }

    /// Points a block's version at its log slot once its record is durable (if that version is
    /// still the one indexed).
    fn relocate(&mut self, lba: u64, write_seq: u64, epoch: u64, loc: Loc) {
        if let Some(v) = self.newest.get_mut(&lba) {
            if v.write_seq == write_seq {
                v.loc = loc.clone();
            }
        }
        if let Some(v) = self.epochs.get_mut(&epoch).and_then(|m| m.get_mut(&lba)) {
            if v.write_seq == write_seq {
                v.loc = loc;
            }
        }
    }

    /// The log write of record `seq` failed: its writes go back to the front of the queue.
    pub fn record_failed(&mut self, seq: u64) {
        if let Some((_, writes, _)) = self.in_flight.take_if(|(s, _, _)| *s == seq) {
            if let Some(r) = self.records.back() {
                if r.seq == seq {
                    self.tail = r.offset;
                    self.records.pop_back();
                }
            }
            self.next_seq = seq;
            for p in writes.into_iter().rev() {
                self.pending.push_front(p);
            }
        }
    }

    /// Plans a host read of `blocks` blocks at `lba`.
    pub fn read(&mut self, lba: u64, blocks: u64) -> Result<ReadPlan, CoreError> {
        self.check(lba, blocks)?;
        let bs = u64::from(self.cfg.block_size);
        let mut pieces: Vec<Piece> = Vec::new();
        let mut pinned: Vec<u64> = Vec::new();
        let mut it = self.newest.range(lba..lba + blocks).peekable();
        let mut at = lba;
        while at < lba + blocks {
            let next_dirty = it.peek().map_or(lba + blocks, |(l, _)| **l);
            if next_dirty > at {
                for b in at..next_dirty {
                    match self.read_cache.get(b) {
                        Some(block) => pieces.push(Piece::Ram(block)),
                        None => match pieces.last_mut() {
                            Some(Piece::Remote { lba, blocks })
                                if *lba + u64::from(*blocks) == b && *blocks < u32::MAX =>
                            {
                                *blocks += 1;
                            }
                            _ => pieces.push(Piece::Remote { lba: b, blocks: 1 }),
                        },
                    }
                }
                at = next_dirty;
                continue;
            }
            let Some((_, v)) = it.next() else { break };
            match &v.loc {
                Loc::Ram(b) => pieces.push(Piece::Ram(b.clone())),
                Loc::Zero => match pieces.last_mut() {
                    Some(Piece::Zero { blocks }) => *blocks += 1,
                    _ => pieces.push(Piece::Zero { blocks: 1 }),
                },
                Loc::Log(off) => {
                    let off = *off;
                    match pieces.last_mut() {
                        Some(Piece::Log { offset, blocks }) if *offset + u64::from(*blocks) * bs == off => *blocks += 1,
                        _ => {
                            // Records are separated by their headers, so a run of adjacent slots
                            // lies in one record: it is looked up once per run, not per block.
                            pieces.push(Piece::Log { offset: off, blocks: 1 });
                            if let Some(r) = self.record_of(off) {
                                pinned.push(r);
                            }
                        }
                    }
                }
            }
            at += 1;
        }
        pinned.sort_unstable();
        pinned.dedup();
        for seq in &pinned {
            if let Some(r) = self.records.iter_mut().find(|r| r.seq == *seq) {
                r.pins += 1;
            }
        }
        let prefetch = self.read_ahead(lba, blocks);
        Ok(ReadPlan { pieces, pinned, generation: self.invalidations, prefetch })
    }

    /// Sequential reads grow a read-ahead window (doubling up to the limit); the next stretch is
    /// fetched when the reader comes within half a window of where read-ahead has got to.
    fn read_ahead(&mut self, lba: u64, blocks: u64) -> Option<(u64, u32)> {
        let end = lba + blocks;
        let sequential = lba == self.last_read_end;
        self.last_read_end = end;
        if !sequential || self.cfg.read_ahead_blocks == 0 {
            self.ra_window = 0;
            self.ra_end = 0;
            return None;
        }
        self.ra_window = (self.ra_window * 2).max(blocks * 4).min(self.cfg.read_ahead_blocks);
        if self.ra_end > end + self.ra_window / 2 {
            return None;
        }
        let from = self.ra_end.max(end);
        let to = (end + self.ra_window).min(self.cfg.num_blocks);
        if from >= to {
            return None;
        }
        self.ra_end = to;
        Some((from, (to - from).min(u64::from(u32::MAX)) as u32))
    }

    /// Remote data read for a plan of generation `generation` (a read or a read-ahead): kept in
    /// the read cache unless blocks left the dirty index since (the data may then predate a
    /// destaged write) or the block is dirty now.
    pub fn fill(&mut self, lba: u64, data: &Bytes, generation: u64) {
        if generation != self.invalidations {
            return;
        }
        let bs = self.cfg.block_size as usize;
        for (i, chunk) in (0..data.len() / bs).map(|i| (i, data.slice(i * bs..(i + 1) * bs))) {
            let b = lba + i as u64;
            if !self.newest.contains_key(&b) {
                self.read_cache.insert(b, chunk);
            }
        }
    }

    /// Read cache lookups that hit and missed.
    pub fn read_cache_hits(&self) -> (u64, u64) {
        self.read_cache.hits_and_misses()
    }

    fn record_of(&self, offset: u64) -> Option<u64> {
        self.records.iter().find(|r| r.offset <= offset && offset < r.offset + r.len).map(|r| r.seq)
    }

    /// A read that pinned these records has finished with the log.
    pub fn unpin(&mut self, pinned: &[u64]) {
        for seq in pinned {
            if let Some(r) = self.records.iter_mut().find(|r| r.seq == *seq) {
                r.pins = r.pins.saturating_sub(1);
            }
        }
        self.release_freed();
    }

    /// Gives the space of freed records back to the ring: those no read uses and that a durable
    /// checkpoint has left behind.
    fn release_freed(&mut self) {
        while self.records.front().is_some_and(|r| r.freed && r.pins == 0 && r.seq < self.durable_head_seq) {
            self.records.pop_front();
        }
    }

    /// The next remote operations of destage, up to the in-flight limit. Destage takes the
    /// oldest epoch whose writes are all durable in the log; when that is the open epoch, the
    /// epoch is closed first (an extra boundary is always safe). On an ordered remote the next
    /// epoch follows as soon as the previous one's flush is handed out.
    pub fn next_destage(&mut self) -> Vec<DestageIo> {
        let mut out = Vec::new();
        if self.destage.failed {
            if !self.destage.quiet() {
                return out;
            }
            // Everything ended. The remote holds every epoch synchronised; of those sent after,
            // any order-respecting part. Two at most: start over from the oldest not
            // synchronised; more: find out first how far it got.
            self.destage.failed = false;
            let window: Vec<u64> =
                self.destage.active.iter().flat_map(|e| e.covers.iter().copied().chain([e.epoch])).collect();
            self.destage.active.clear();
            if window.len() > 2 {
                self.start_probe(self.destaged_epoch, window);
            }
        }
        if let Some(p) = self.destage.probe.as_mut() {
            if !p.sent {
                p.sent = true;
                out.push(DestageIo::Probe(p.probe.clone()));
            }
            return out;
        }
        let ordered = self.cfg.ordered_remote;
        let limit = self.cfg.destage_inflight.max(1);
        let mut inflight = self.destage.inflight();
        let mut i = 0;
        loop {
            if i == self.destage.active.len() {
                // An ordered remote takes the next epoch at once, within the pipeline's limits.
                let may_start =
                    ordered || self.destage.active.is_empty() && self.durable_destaged_epoch >= self.destaged_epoch;
                if !may_start || !self.start_epoch() {
                    break;
                }
            }
            let e = &mut self.destage.active[i];
            while inflight < limit {
                let Some(io) = e.queue.pop_front() else { break };
                if let DestageIo::Write { id, .. } | DestageIo::Zero { id, .. } = &io {
                    e.inflight.insert(*id, io.clone());
                }
                inflight += 1;
                out.push(io);
            }
            if e.queue.is_empty() && e.sync == SyncState::Unsent && (ordered || e.inflight.is_empty()) {
                e.sync = SyncState::Sent;
                out.push(DestageIo::Sync { epoch: e.epoch, barrier: ordered });
            }
            if e.sync == SyncState::Unsent {
                // Nothing of a later epoch may go out before this one's flush.
                break;
            }
            i += 1;
        }
        out
    }

    fn start_epoch(&mut self) -> bool {
        let after = self.destage.active.back().map_or(0, |e| e.epoch + 1);
        // Where a probe said to resume (kept until that epoch starts), else the next epoch.
        let (epoch, covers): (u64, &[u64]) = match &self.destage.resume {
            Some((epoch, covers)) if self.epochs.contains_key(epoch) => (*epoch, covers),
            _ => match self.epochs.range(after..).next() {
                Some((&epoch, _)) => (epoch, &[]),
                None => return false,
            },
        };
        let bs = u64::from(self.cfg.block_size);
        let total_blocks: u64 =
            covers.iter().chain([&epoch]).filter_map(|e| self.epochs.get(e)).map(|m| m.len() as u64).sum();
        if self.cfg.ordered_remote {
            // Within the pipeline's limits, counted from the durable checkpoint: every epoch
            // synchronised since is still in `undurable`.
            let n = self.destage.undurable.len()
                + self.destage.active.iter().map(|e| e.covers.len() + 1).sum::<usize>()
                + covers.len()
                + 1;
            let sent = self.destage.undurable.iter().map(|(_, b)| b).sum::<u64>()
                + self.destage.active.iter().map(|e| e.blocks).sum::<u64>();
            let shallow = !self.hurry && self.log_fill() < self.cfg.deep_from;
            if !self.pipeline_allows(n, (sent + total_blocks) * bs) || shallow && n > 2 {
                return false;
            }
        }
        // Only writes that are durable in the log are destaged.
        let first_unlogged = self.durable_write();
        let not_durable =
            self.epochs[&epoch].values().any(|v| v.write_seq >= first_unlogged || matches!(v.loc, Loc::Ram(_)));
        if not_durable {
            return false;
        }
        let covers = match self.destage.resume.take() {
            Some((e, covers)) if e == epoch => covers,
            _ => Vec::new(),
        };
        if epoch == self.epoch {
            self.close_epoch();
        }
        let blocks = &self.epochs[&epoch];
        let per_io = (self.cfg.destage_io_bytes / bs).clamp(1, u64::from(u32::MAX)) as u32;
        let mut queue = VecDeque::new();
        let mut run: Option<(u64, u32, Vec<Piece>, Option<bool>)> = None;
        let mut flush_run = |run: &mut Option<(u64, u32, Vec<Piece>, Option<bool>)>, next_io: &mut u64| {
            if let Some((lba, blocks, sources, zero)) = run.take() {
                let id = *next_io;
                *next_io += 1;
                queue.push_back(match zero {
                    Some(discard) => DestageIo::Zero { id, lba, blocks, discard },
                    None => DestageIo::Write { id, lba, blocks, sources },
                });
            }
        };
        for (&lba, v) in blocks {
            let zero = match v.loc {
                Loc::Zero => Some(v.discard),
                _ => None,
            };
            let extends =
                run.as_ref().is_some_and(|(l, n, _, z)| *l + u64::from(*n) == lba && *z == zero && *n < per_io);
            if !extends {
                flush_run(&mut run, &mut self.next_io);
                run = Some((lba, 0, Vec::new(), zero));
            }
            if let Some((_, n, sources, _)) = run.as_mut() {
                *n += 1;
                match &v.loc {
                    Loc::Log(off) => match sources.last_mut() {
                        Some(Piece::Log { offset, blocks }) if *offset + u64::from(*blocks) * bs == *off => {
                            *blocks += 1;
                        }
                        _ => sources.push(Piece::Log { offset: *off, blocks: 1 }),
                    },
                    Loc::Ram(b) => sources.push(Piece::Ram(b.clone())),
                    Loc::Zero => {}
                }
            }
        }
        flush_run(&mut run, &mut self.next_io);
        self.destage.active.push_back(EpochDestage {
            epoch,
            queue,
            inflight: BTreeMap::new(),
            sync: SyncState::Unsent,
            failed: false,
            covers,
            blocks: total_blocks,
        });
        true
    }

    /// A destage write (or zeroing) completed on the remote. Its epoch's flush may have been
    /// reported first (answers are not taken in the order they came); then the epoch is on the
    /// remote now, and this returns true, as [`Core::synced`] does.
    pub fn destage_done(&mut self, id: u64) -> bool {
        if let Some(e) = self.destage.epoch_of(id) {
            if let Some(DestageIo::Write { blocks, .. } | DestageIo::Zero { blocks, .. }) = e.inflight.remove(&id) {
                self.stats.blocks_destaged += u64::from(blocks);
            }
        }
        self.retire()
    }

    /// A destage write failed (the remote is unreachable or refused it): it is tried again; on
    /// an ordered remote, with everything after it.
    pub fn destage_failed(&mut self, id: u64) {
        let ordered = self.cfg.ordered_remote;
        let Some(e) = self.destage.epoch_of(id) else { return };
        if let Some(io) = e.inflight.remove(&id) {
            if ordered {
                e.failed = true;
                self.destage.failed = true;
            } else {
                e.queue.push_front(io);
            }
        }
    }

    /// The SYNCHRONIZE CACHE after epoch `epoch` failed: it is sent again (on an ordered
    /// remote, after everything from that epoch on).
    pub fn sync_failed(&mut self, epoch: u64) {
        let ordered = self.cfg.ordered_remote;
        if let Some(e) = self.destage.active.iter_mut().find(|e| e.epoch == epoch && e.sync == SyncState::Sent) {
            e.sync = SyncState::Unsent;
            if ordered {
                e.failed = true;
                self.destage.failed = true;
            }
        }
    }

    /// The remote synchronised epoch `epoch`. Once it and every epoch before it are on the
    /// remote, their blocks leave the dirty index and the records that held only destaged
    /// epochs are freed. Returns true when the checkpoint moved.
    pub fn synced(&mut self, epoch: u64) -> bool {
        let Some(e) = self.destage.active.iter_mut().find(|e| e.epoch == epoch && e.sync == SyncState::Sent) else {
            return false;
        };
        e.sync = SyncState::Done;
        self.retire()
    }

    /// Takes the epochs at the front that are wholly on the remote off the dirty index; true if
    /// there were any.
    fn retire(&mut self) -> bool {
        let mut moved = false;
        while let Some(front) = self.destage.active.front() {
            let complete =
                front.sync == SyncState::Done && !front.failed && front.queue.is_empty() && front.inflight.is_empty();
            if !complete {
                break;
            }
            let (epoch, covers) = (front.epoch, front.covers.clone());
            self.destage.active.pop_front();
            for e in covers {
                self.epoch_on_remote(e);
            }
            self.epoch_on_remote(epoch);
            moved = true;
        }
        moved
    }

    fn epoch_on_remote(&mut self, epoch: u64) {
        let mut count = 0;
        if let Some(blocks) = self.epochs.remove(&epoch) {
            count = blocks.len() as u64;
            for (lba, v) in blocks {
                if self.newest.get(&lba).is_some_and(|n| n.write_seq == v.write_seq) {
                    self.newest.remove(&lba);
                }
                // A fill planned before the write may have slipped in; the block is clean now.
                self.read_cache.remove(lba);
            }
        }
        self.invalidations += 1;
        self.destaged_epoch = epoch;
        self.destage.undurable.push_back((epoch, count));
        self.stats.epochs_destaged += 1;
        for r in &mut self.records {
            if r.max_epoch <= epoch {
                r.freed = true;
            }
        }
        // The record in flight (if any) holds newer writes, so it is never freed here.
    }

    /// The checkpoint to write to the superblock (then flush the log and report it with
    /// [`Core::checkpoint_durable`]), if it changed since the last call.
    pub fn take_checkpoint(&mut self) -> Option<Checkpoint> {
        let cp = self.checkpoint();
        if cp == self.last_checkpoint {
            return None;
        }
        self.last_checkpoint = cp;
        Some(cp)
    }

    /// The checkpoint as of now: the oldest record not yet freed and the newest destaged epoch.
    pub fn checkpoint(&self) -> Checkpoint {
        let (head_offset, head_seq) = match self.records.iter().find(|r| !r.freed) {
            Some(r) => (r.offset, r.seq),
            None => (self.tail, self.next_seq),
        };
        Checkpoint { head_offset, head_seq, destaged_epoch: self.destaged_epoch }
    }

    /// A checkpoint is durable on the log: the space before its head may be reused.
    pub fn checkpoint_durable(&mut self, cp: Checkpoint) {
        self.durable_head_seq = self.durable_head_seq.max(cp.head_seq);
        self.durable_destaged_epoch = self.durable_destaged_epoch.max(cp.destaged_epoch);
        while self.destage.undurable.front().is_some_and(|&(e, _)| e <= self.durable_destaged_epoch) {
            self.destage.undurable.pop_front();
        }
        self.release_freed();
    }

    /// True when nothing is dirty, pending or in flight: the remote holds everything.
    pub fn is_clean(&self) -> bool {
        self.newest.is_empty() && self.pending.is_empty() && self.in_flight.is_none() && self.epochs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::RING_START;

    fn cfg(mode: Mode) -> Config {
        Config {
            block_size: 512,
            num_blocks: 1024,
            mode,
            ram_bytes: 1 << 20,
            ring_start: RING_START,
            ring_end: RING_START + (64 << 20),
            max_record_bytes: 1 << 20,
            destage_io_bytes: 4096,
            destage_inflight: 4,
            ordered_remote: false,
            pipeline_epochs: PIPELINE_EPOCHS,
            pipeline_bytes: PIPELINE_BYTES,
            deep_from: 0.0,
            epoch_max_writes: 1000,
            epoch_max_bytes: 8 << 20,
            read_cache_blocks: 64,
            read_cache_policy: Policy::Lru,
            read_ahead_blocks: 64,
        }
    }

    fn core(mode: Mode) -> Core {
        Core::new(cfg(mode), [1; 16], Checkpoint { head_offset: RING_START, head_seq: 1, destaged_epoch: 0 })
    }

    fn blocks(n: usize, fill: u8) -> Bytes {
        Bytes::from(vec![fill; n * 512])
    }

    /// Writes the pending record and reports it durable; returns the acknowledged tickets.
    fn log_all(c: &mut Core) -> Vec<Ticket> {
        let mut acked = Vec::new();
        while let Some(r) = c.next_record() {
            acked.extend(c.record_durable(r.seq));
        }
        acked
    }

    /// Runs destage of one epoch to its SYNCHRONIZE CACHE; returns the writes (lba, blocks).
    fn destage_epoch(c: &mut Core) -> (Vec<(u64, u32)>, Option<u64>) {
        let mut writes = Vec::new();
        let mut sync = None;
        for _ in 0..100 {
            let ios = c.next_destage();
            if ios.is_empty() {
                break;
            }
            for io in ios {
                match io {
                    DestageIo::Write { id, lba, blocks, .. } | DestageIo::Zero { id, lba, blocks, .. } => {
                        writes.push((lba, blocks));
                        c.destage_done(id);
                    }
                    DestageIo::Sync { epoch, .. } => sync = Some(epoch),
                    DestageIo::Probe(_) => panic!("nothing to read back on a fresh log"),
                }
            }
            if sync.is_some() {
                break;
            }
        }
        (writes, sync)
    }

    #[test]
    fn a_block_overwritten_within_an_epoch_crosses_to_the_remote_once() {
        let mut c = core(Mode::Immediate);
        for i in 0..10 {
            assert_eq!(c.write(7, blocks(1, i), false), Ok(Submitted::Done));
        }
        log_all(&mut c);
        let (writes, sync) = destage_epoch(&mut c);
        assert_eq!(writes, vec![(7, 1)]);
        assert_eq!(sync, Some(1));
        assert_eq!(c.stats().blocks_absorbed, 9);
    }

    #[test]
    fn immediate_mode_acknowledges_at_once_and_a_flush_waits_for_the_log() {
        let mut c = core(Mode::Immediate);
        assert_eq!(c.write(0, blocks(2, 1), false), Ok(Submitted::Done));
        let Submitted::Wait(t) = c.flush() else { panic!("a flush with a write in RAM must wait") };
        assert_eq!(log_all(&mut c), vec![t]);
        assert_eq!(c.flush(), Submitted::Done);
    }

    #[test]
    fn fua_waits_for_the_log_even_in_immediate_mode() {
        let mut c = core(Mode::Immediate);
        let Ok(Submitted::Wait(t)) = c.write(0, blocks(1, 1), true) else { panic!("FUA must wait") };
        assert_eq!(log_all(&mut c), vec![t]);
    }

    #[test]
    fn log_mode_acknowledges_when_the_record_is_durable() {
        let mut c = core(Mode::Log);
        let Ok(Submitted::Wait(a)) = c.write(0, blocks(1, 1), false) else { panic!("log mode waits") };
        let Ok(Submitted::Wait(b)) = c.write(1, blocks(1, 2), false) else { panic!("log mode waits") };
        let r = c.next_record().expect("a record");
        assert!(c.next_record().is_none(), "one record in flight at a time");
        assert_eq!(c.record_durable(r.seq), vec![a, b]);
    }

    #[test]
    fn in_log_mode_a_write_after_an_acknowledgement_starts_a_new_epoch() {
        let mut c = core(Mode::Log);
        c.write(0, blocks(1, 1), false).expect("write");
        c.write(1, blocks(1, 1), false).expect("write");
        assert_eq!(c.epochs().0, 1);
        log_all(&mut c);
        c.write(2, blocks(1, 1), false).expect("write");
        assert_eq!(c.epochs().0, 2, "the host may have issued this write because the others completed");
    }

    #[test]
    fn in_log_mode_fua_writes_share_an_epoch_until_one_is_acknowledged() {
        // A target with WCE=0 sends every write with FUA; all are durable once acknowledged.
        let mut c = core(Mode::Log);
        c.write(0, blocks(1, 1), true).expect("write");
        c.write(1, blocks(1, 1), true).expect("write");
        assert_eq!(c.epochs().0, 1);
        log_all(&mut c);
        c.write(2, blocks(1, 1), true).expect("write");
        assert_eq!(c.epochs().0, 2);
        // In `immediate` mode a FUA write is what makes earlier writes durable: it ends its epoch.
        let mut c = core(Mode::Immediate);
        c.write(0, blocks(1, 1), true).expect("write");
        c.write(1, blocks(1, 1), false).expect("write");
        assert_eq!(c.epochs().0, 2);
    }

    #[test]
    fn destage_coalesces_neighbours_up_to_the_io_limit_and_never_mixes_epochs() {
        let mut c = core(Mode::Immediate);
        c.write(10, blocks(3, 1), false).expect("write");
        c.write(13, blocks(10, 1), false).expect("write");
        c.write(40, blocks(1, 1), false).expect("write");
        c.flush();
        c.write(14, blocks(1, 2), false).expect("write");
        log_all(&mut c);
        let (writes, sync) = destage_epoch(&mut c);
        // 13 neighbouring blocks in 8-block (4 KiB) writes, then the lone block; not block 14's
        // second version, which belongs to the next epoch.
        assert_eq!(writes, vec![(10, 8), (18, 5), (40, 1)]);
        assert_eq!(sync, Some(1));
    }

    #[test]
    fn the_next_epoch_is_destaged_only_after_the_checkpoint_is_durable() {
        let mut c = core(Mode::Immediate);
        c.write(0, blocks(1, 1), false).expect("write");
        c.flush();
        c.write(1, blocks(1, 2), false).expect("write");
        log_all(&mut c);
        let (_, sync) = destage_epoch(&mut c);
        assert!(c.synced(sync.expect("sync")));
        assert!(c.next_destage().is_empty(), "epoch 2 must wait for the checkpoint naming epoch 1");
        let cp = c.take_checkpoint().expect("checkpoint moved");
        assert_eq!(cp.destaged_epoch, 1);
        c.checkpoint_durable(cp);
        let (writes, _) = destage_epoch(&mut c);
        assert_eq!(writes, vec![(1, 1)]);
    }

    #[test]
    fn reads_merge_ram_log_zeros_and_remote_in_block_order() {
        let mut c = core(Mode::Immediate);
        c.write(2, blocks(2, 1), false).expect("write");
        log_all(&mut c);
        c.write(4, blocks(1, 2), false).expect("write");
        c.zero(5, 2, true).expect("zero");
        let plan = c.read(0, 8).expect("plan");
        assert_eq!(plan.pieces.len(), 5);
        assert_eq!(plan.pieces[0], Piece::Remote { lba: 0, blocks: 2 });
        assert!(matches!(plan.pieces[1], Piece::Log { blocks: 2, .. }));
        assert!(matches!(&plan.pieces[2], Piece::Ram(b) if b.len() == 512));
        assert_eq!(plan.pieces[3], Piece::Zero { blocks: 2 });
        assert_eq!(plan.pieces[4], Piece::Remote { lba: 7, blocks: 1 });
        assert_eq!(plan.pinned.len(), 1);
        c.unpin(&plan.pinned);
    }

    #[test]
    fn remote_data_is_cached_unless_a_destage_raced_it() {
        let mut c = core(Mode::Immediate);
        let plan = c.read(0, 4).expect("plan");
        assert_eq!(plan.pieces, vec![Piece::Remote { lba: 0, blocks: 4 }]);
        c.fill(0, &blocks(4, 7), plan.generation);
        let again = c.read(0, 4).expect("plan");
        assert!(again.pieces.iter().all(|p| matches!(p, Piece::Ram(b) if b[0] == 7)));
        // A read planned, then block 9 written and destaged, then the stale data arrives.
        let stale = c.read(8, 2).expect("plan");
        c.write(9, blocks(1, 1), false).expect("write");
        log_all(&mut c);
        let (_, sync) = destage_epoch(&mut c);
        assert!(c.synced(sync.expect("sync")));
        c.fill(8, &blocks(2, 0), stale.generation);
        assert_eq!(c.read(9, 1).expect("plan").pieces, vec![Piece::Remote { lba: 9, blocks: 1 }]);
    }

    #[test]
    fn sequential_reads_grow_a_read_ahead_window_and_random_reads_stop_it() {
        let mut c = core(Mode::Immediate);
        assert_eq!(c.read(100, 2).expect("plan").prefetch, None);
        assert_eq!(c.read(102, 2).expect("plan").prefetch, Some((104, 8)));
        // The window doubles (16, then 32) and read-ahead keeps at least half of it ahead.
        assert_eq!(c.read(104, 2).expect("plan").prefetch, Some((112, 10)));
        assert_eq!(c.read(106, 2).expect("plan").prefetch, Some((122, 18)));
        assert_eq!(c.read(108, 2).expect("plan").prefetch, Some((140, 34)));
        assert_eq!(c.read(110, 2).expect("plan").prefetch, None, "a full window is already ahead");
        assert_eq!(c.read(500, 2).expect("plan").prefetch, None);
        assert_eq!(c.read(502, 2).expect("plan").prefetch, Some((504, 8)));
    }

    #[test]
    fn out_of_range_and_misaligned_requests_are_refused() {
        let mut c = core(Mode::Log);
        assert!(matches!(c.write(1024, blocks(1, 0), false), Err(CoreError::OutOfRange { .. })));
        assert!(matches!(c.write(0, Bytes::from(vec![0; 100]), false), Err(CoreError::Misaligned { .. })));
        assert!(matches!(c.read(1000, 100), Err(CoreError::OutOfRange { .. })));
        assert!(matches!(c.zero(u64::MAX, 2, false), Err(CoreError::OutOfRange { .. })));
    }

    fn probe(versions: &[(u64, u64)]) -> Probe {
        let mut epochs: Vec<u64> = versions.iter().map(|v| v.1).collect();
        epochs.sort_unstable();
        epochs.dedup();
        Probe {
            epochs,
            versions: versions
                .iter()
                .map(|&(lba, epoch)| ProbeVersion { lba, epoch, source: Piece::Zero { blocks: 1 }, discard: false })
                .collect(),
        }
    }

    #[test]
    fn the_remote_is_found_after_the_newest_epoch_it_holds_whole() {
        // Epoch 1 writes block 10; epoch 2 blocks 10 and 11; epoch 3 blocks 11 and 12.
        let p = probe(&[(10, 1), (10, 2), (11, 2), (11, 3), (12, 3)]);
        // All of epoch 2 and block 11 of epoch 3.
        assert_eq!(reached_epoch(0, &p, &[false, true, false, true, false]), 2);
        // Everything.
        assert_eq!(reached_epoch(0, &p, &[false, true, false, true, true]), 3);
        // Nothing: block 10 holds neither epoch 1's nor epoch 2's version.
        assert_eq!(reached_epoch(0, &p, &[false, false, false, false, false]), 0);
        // Epoch 1 and part of epoch 2.
        assert_eq!(reached_epoch(0, &p, &[true, false, true, false, false]), 1);
        // Epoch 3's block 12 without epoch 2's block 10: no state after epoch 1 explains it.
        assert_eq!(reached_epoch(0, &p, &[true, false, false, false, true]), 1);
    }

    #[test]
    fn after_a_failure_with_many_epochs_sent_destage_reads_back_before_it_resumes() {
        let mut c = core(Mode::Log);
        c.cfg.ordered_remote = true;
        c.cfg.destage_inflight = 16;
        for i in 0..5u64 {
            c.write(i, blocks(1, i as u8 + 1), false).expect("write");
            log_all(&mut c);
        }
        let ios = c.next_destage();
        let syncs = ios.iter().filter(|io| matches!(io, DestageIo::Sync { .. })).count();
        assert_eq!(syncs, 5, "five single-write epochs are pipelined: {ios:?}");
        for io in &ios {
            match io {
                DestageIo::Write { id, .. } => c.destage_failed(*id),
                DestageIo::Sync { epoch, .. } => c.sync_failed(*epoch),
                _ => {}
            }
        }
        let ios = c.next_destage();
        let [DestageIo::Probe(p)] = ios.as_slice() else { panic!("a probe first: {ios:?}") };
        assert_eq!(p.epochs, vec![1, 2, 3, 4, 5]);
        assert!(c.next_destage().is_empty(), "nothing else while the probe is out");
        // The remote got epochs 1 and 2: destage sends epoch 2 again, then 3 to 5.
        c.probed(&[true, true, false, false, false]);
        let ios = c.next_destage();
        let lbas: Vec<u64> =
            ios.iter().filter_map(|io| if let DestageIo::Write { lba, .. } = io { Some(*lba) } else { None }).collect();
        assert_eq!(lbas, vec![1, 2, 3, 4]);
        for io in ios {
            match io {
                DestageIo::Write { id, .. } => {
                    c.destage_done(id);
                }
                DestageIo::Sync { epoch, .. } => {
                    c.synced(epoch);
                }
                _ => {}
            }
        }
        assert_eq!(c.epochs().1, 5, "epochs 1 to 5 are on the remote");
    }

    #[test]
    fn a_log_too_small_for_two_epochs_is_refused() {
        let mut small = cfg(Mode::Log);
        small.ring_end = RING_START + (1 << 20);
        assert!(matches!(small.validate(), Err(ConfigError::LogTooSmall { .. })));
        assert_eq!(cfg(Mode::Log).validate(), Ok(()));
    }
}

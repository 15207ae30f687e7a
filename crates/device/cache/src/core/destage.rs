//! Destage: epochs to the remote in order, each closed by a SYNCHRONIZE CACHE before the next is
//! retired; pipelined on a remote that keeps order around barriers; and what happens when
//! something fails or the remote may have lost what it was given.
//!
//! A flush is trusted only when nothing failed in its epoch and the remote was neither reset nor
//! reconnected since the epoch began ([`stics_block::BlockDev::resets`]): a SYNCHRONIZE CACHE
//! answered GOOD after a power loss of the remote's volatile cache, or after an fdatasync error
//! the next fsync forgets, proves nothing for writes made before. So after a failed flush or a
//! reset the epoch goes again whole. On an ordered remote, a failure stops the pipeline (the
//! remote runs later commands past a failed one) until everything in flight has ended; then the
//! oldest epoch not synchronised goes again, alone, until it is synchronised. With more than
//! two epochs sent, what the remote holds of them is read back first ([`DestageIo::Probe`]).
//!
//! Replaying epoch `k` over a remote that already holds some of epoch `k + 1` only moves it back
//! inside `k + 1`, a state it may be in anyway; over one that holds some of `k + 2` it would mix
//! `k` with `k + 2`, a state the host never saw. Hence the read-back, and the resumption after
//! the newest epoch the remote holds whole ([`reached_epoch`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use stics_block::BlockError;

use super::{Core, ErrorKind, Loc, Piece};

/// How long after the last host read that went to the remote destage still gives way to reads
/// (see [`Core::destage_limit`]).
pub(crate) const READS_RECENT: Duration = Duration::from_secs(1);

/// Oldest a write the remote lacks may get while destage sends nothing in front of reads: past
/// it destage keeps one write in flight however much room the log has, as the kernel writes back
/// pages dirty for longer than `dirty_expire_centisecs` (30 s) however busy the disk is.
pub(crate) const HOLD_MAX: Duration = Duration::from_secs(30);

/// Shortest stretch plain destage's rate is measured over.
const RATE_WINDOW: Duration = Duration::from_millis(250);

/// One remote operation of destage.
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
    /// Ship this group to the SG; answer with [`Core::group_committed`] or
    /// [`Core::group_failed`].
    Group(super::GroupPlan),
    /// Read what the SG holds of this log; answer with [`Core::group_status`] or
    /// [`Core::group_status_failed`].
    GroupStatus,
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
    /// Its content: a log slot ([`Piece::Log`] of one block) or zeros ([`Piece::Zero`], for a
    /// zeroing or a discard: a remote that unmaps reads unmapped blocks as zeros, which is what
    /// the cache promises the host, so a discard is held only where the remote reads zeros).
    pub source: Piece,
}

impl Probe {
    /// The blocks to read from the remote, as runs of at most `max_blocks`.
    pub fn runs(&self, max_blocks: u32) -> Vec<(u64, u32)> {
        let lbas: BTreeSet<u64> = self.versions.iter().map(|v| v.lba).collect();
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

/// The epochs a probe reads back for epochs sent (each with the epochs before it that it stands
/// for and the later ones the remote may hold part of), in order, each once.
fn probe_window<'a>(sent: impl IntoIterator<Item = (&'a Vec<u64>, u64, &'a Vec<u64>)>) -> Vec<u64> {
    let mut window: Vec<u64> = sent
        .into_iter()
        .flat_map(|(covers, epoch, beyond)| covers.iter().chain(beyond).copied().chain([epoch]))
        .collect();
    window.sort_unstable();
    window.dedup();
    window
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
    /// Something of this epoch failed, or the remote was reset since it began: its flush
    /// proves nothing, and it goes again whole.
    failed: bool,
    /// Earlier epochs the remote was found to hold already: they leave the dirty index with
    /// this one, once its flush makes them durable there.
    covers: Vec<u64>,
    /// Later epochs the remote was found to hold part of (this one is sent again over them):
    /// if this one fails, the remote may still hold that part.
    beyond: Vec<u64>,
    /// Blocks in this epoch and those it covers (for [`Core::pipeline_allows`]).
    blocks: u64,
    /// Of those, the ones that hold data (not zeros): what the destage rate counts.
    data: u64,
    /// The remote's reset count when the epoch began: a flush answered after it changed
    /// proves nothing.
    resets: u64,
    /// Its flush is a barrier queued behind writes still in flight (an ordered remote, not
    /// after a failure).
    pipelined: bool,
}

/// A read-back of the remote that destage waits for.
#[derive(Debug)]
struct PendingProbe {
    probe: Probe,
    /// The epoch before the probe's window: the remote holds it and all before it.
    base: u64,
    /// Handed out to the driver, with the remote's reset count then.
    sent: Option<u64>,
}

/// Where a probe said destage resumes: this epoch, standing for the `covers` before it, trusted
/// only if the remote is not reset after `resets` (its count when the probe read it).
#[derive(Debug)]
struct Resume {
    epoch: u64,
    covers: Vec<u64>,
    /// The probe's epochs after it, which the remote may hold part of.
    beyond: Vec<u64>,
    resets: u64,
}

/// Plain destage's rate being measured: data retired over the time destage had work out.
#[derive(Debug, Default)]
struct RateWindow {
    bytes: u64,
    busy: Duration,
    /// Since when destage has had work out (`None`: idle).
    since: Option<Instant>,
}

/// Destage in progress: one epoch at a time, or many in a row on an ordered remote.
#[derive(Debug, Default)]
pub(crate) struct Destage {
    active: VecDeque<EpochDestage>,
    /// Epochs synchronised whose checkpoint is not durable yet, with their block counts (they
    /// count towards the pipeline's limits).
    pub(crate) undurable: VecDeque<(u64, u64)>,
    /// The remote must be read back before anything more goes out.
    probe: Option<PendingProbe>,
    resume: Option<Resume>,
    /// Something failed: nothing more goes out until everything in flight has ended; then
    /// destage starts again from the oldest epoch not synchronised.
    failed: bool,
    /// After a failure: the next epoch goes alone, its flush after its writes, until it is
    /// synchronised.
    solo: bool,
    /// Nothing goes out before this (backoff after a failure).
    retry_at: Option<Instant>,
    /// When the remote last answered anything, or something went out with nothing outstanding.
    pub(crate) heard: Option<Instant>,
    next_io: u64,
    /// Drains and settles waiting: destage runs the whole pipeline whatever the log's fill.
    hurries: u32,
    /// The read side's count of remote reads when destage last looked, and when it last saw
    /// one outstanding or new.
    reads_seen: u64,
    reads_at: Option<Instant>,
    /// Data bytes per second plain destage moved while it had work out (smoothed): what a lag
    /// bound's backlog drains at.
    pub(crate) rate: Option<f64>,
    /// The measurement under way.
    window: RateWindow,
    /// Shipping groups to an SG.
    pub(crate) groups: super::group::Groups,
}

impl Destage {
    fn inflight(&self) -> usize {
        self.active.iter().map(|e| e.inflight.len()).sum()
    }

    /// True when no answer is outstanding.
    fn quiet(&self) -> bool {
        self.active.iter().all(|e| e.inflight.is_empty() && e.sync != SyncState::Sent)
            && self.probe.as_ref().is_none_or(|p| p.sent.is_none())
            && self.groups.quiet()
    }

    fn epoch_of(&mut self, id: u64) -> Option<&mut EpochDestage> {
        self.active.iter_mut().find(|e| e.inflight.contains_key(&id))
    }
}

impl Core {
    /// A drain or a settle starts waiting (`on`), or ends: while any waits, destage runs at
    /// full depth whatever the log's fill.
    pub fn hurry(&mut self, on: bool) {
        let h = &mut self.destage.hurries;
        *h = if on { h.saturating_add(1) } else { h.saturating_sub(1) };
    }

    /// A drain or a settle waits for destage.
    pub(crate) fn hurried(&self) -> bool {
        self.destage.hurries > 0
    }

    /// When destage may go on after a failure (`None`: now).
    pub fn retry_at(&self) -> Option<Instant> {
        self.destage.retry_at
    }

    /// Whether destage may send the `n`-th epoch past the durable checkpoint when those `n`
    /// epochs hold `bytes` bytes of blocks. Recovery applies the same rule to the log, so it
    /// reads back every epoch destage may have sent.
    pub fn pipeline_allows(&self, n: usize, bytes: u64) -> bool {
        n <= 2 || (n <= self.cfg.pipeline_epochs && bytes <= self.cfg.pipeline_bytes)
    }

    /// After recovery: destage may have sent any epoch the pipeline's limits allowed past the
    /// checkpoint; with more than two, the remote is read back first.
    pub(crate) fn start_recovery_probe(&mut self, base: u64) {
        let bs = u64::from(self.layout.block_size);
        let mut window = Vec::new();
        let mut bytes = 0;
        for (&epoch, m) in &self.epochs {
            bytes += m.blocks() * bs;
            if !self.pipeline_allows(window.len() + 1, bytes) {
                break;
            }
            window.push(epoch);
        }
        if window.len() > 2 {
            self.start_probe(base, window);
        }
    }

    /// Nothing more goes out until the remote's hold on these epochs is read back. The window
    /// is at most two epochs of any size or the pipeline's byte limit, so it is expanded to
    /// blocks.
    fn start_probe(&mut self, base: u64, window: Vec<u64>) {
        let bs = u64::from(self.layout.block_size);
        let mut versions = Vec::new();
        for &epoch in &window {
            let Some(m) = self.epochs.get(&epoch) else { continue };
            for (s, e, v) in m.iter() {
                for b in s..e {
                    let source = match v.loc {
                        Loc::Log(off) => Piece::Log { offset: off + (b - s) * bs, blocks: 1 },
                        Loc::Zero => Piece::Zero { blocks: 1 },
                        // Destaged epochs are durable in the log; a version still in RAM was
                        // never sent, and its epoch is after any the remote may hold.
                        Loc::Ram(_) => continue,
                    };
                    versions.push(ProbeVersion { lba: b, epoch, source });
                }
            }
        }
        self.destage.active.clear();
        self.destage.resume = None;
        self.destage.probe = Some(PendingProbe { probe: Probe { epochs: window, versions }, base, sent: None });
    }

    /// What a [`DestageIo::Probe`] read back: `matches[i]` is true when the remote holds
    /// `versions[i]`. Destage resumes after the newest epoch the remote holds whole.
    pub fn probed(&mut self, matches: &[bool], now: Instant) {
        self.destage.heard = Some(now);
        let Some(PendingProbe { probe, base, sent: Some(resets) }) = self.destage.probe.take() else { return };
        let reached = reached_epoch(base, &probe, matches);
        if reached > base {
            // Epoch `reached` is sent again: over a remote holding some of the next epoch it
            // stays consistent, and its flush makes the ones before it durable there too.
            let covers = probe.epochs.iter().copied().filter(|&e| e < reached).collect();
            let beyond = probe.epochs.iter().copied().filter(|&e| e > reached).collect();
            self.destage.resume = Some(Resume { epoch: reached, covers, beyond, resets });
        }
    }

    /// A [`DestageIo::Probe`] failed at `now`: it is handed out again after a pause.
    pub fn probe_failed(&mut self, err: &BlockError, now: Instant) {
        if let Some(p) = self.destage.probe.as_mut() {
            p.sent = None;
        }
        self.remote_failed(err, None, now);
    }

    /// Books a failure of the remote at `now` (about block `lba`, when it was): health, and the
    /// pause before anything more goes out.
    pub fn remote_failed(&mut self, err: &BlockError, lba: Option<u64>, now: Instant) {
        self.destage.heard = Some(now);
        let (first, max) = (self.cfg.retry_delay, self.cfg.retry_max);
        let (wait, change) = self.health.failed(ErrorKind::of(err), err.to_string(), lba, now, first, max);
        self.changes.extend(change);
        self.destage.retry_at = Some(now + wait);
    }

    /// The next remote operations of destage, up to the in-flight limit; `resets` is the
    /// remote's reset count now. Destage takes the oldest epoch whose writes are all durable in
    /// the log; when that is the open epoch, the epoch is closed first (an extra boundary is
    /// always safe). On an ordered remote the next epoch follows as soon as the previous one's
    /// flush is handed out.
    pub fn next_destage(&mut self, resets: u64, now: Instant) -> Vec<DestageIo> {
        let mut out = Vec::new();
        self.tick(now);
        if self.destage.retry_at.is_some_and(|t| now < t) {
            return out;
        }
        self.destage.retry_at = None;
        // The remote was reset or reconnected since an epoch in flight began: what it took of
        // it may be gone, and nothing more may be queued behind it.
        if let Some(e) = self.destage.active.iter_mut().find(|e| e.resets != resets) {
            e.failed = true;
            self.destage.failed = true;
        }
        if self.destage.failed {
            if !self.destage.quiet() {
                return out;
            }
            // Everything ended. The remote holds every epoch synchronised; of those sent after,
            // any order-respecting part, and of an epoch past one a probe resumed from, the
            // part the probe found. Two at most: start over from the oldest not synchronised
            // (sent again, it leaves the remote at its end plus part of the next); more: find
            // out first how far it got.
            self.destage.failed = false;
            let window = probe_window(self.destage.active.iter().map(|e| (&e.covers, e.epoch, &e.beyond)));
            self.stats.epochs_resent += self.destage.active.len() as u64;
            self.destage.active.clear();
            self.destage.solo = true;
            if window.len() > 2 {
                self.start_probe(self.destaged_epoch, window);
            }
        }
        // What a probe found holds only until the remote is reset (a power loss may take what
        // it read since its last flush): read the same epochs back again.
        if let Some(r) = self.destage.resume.as_ref().filter(|r| r.resets != resets) {
            let window = probe_window([(&r.covers, r.epoch, &r.beyond)]);
            self.start_probe(self.destaged_epoch, window);
        }
        if let Some(p) = self.destage.probe.as_mut() {
            if p.sent.is_none() {
                p.sent = Some(resets);
                out.push(DestageIo::Probe(p.probe.clone()));
            }
            return out;
        }
        let was_quiet = self.destage.quiet();
        if self.groups_on() && self.destage.active.is_empty() {
            let mut plain = false;
            self.next_groups(&mut plain, &mut out);
            if was_quiet && !out.is_empty() {
                self.destage.heard = Some(now);
            }
            // Groups may have turned off just now: plain destage goes on in the same look.
            if !plain && self.groups_on() {
                return out;
            }
            if plain {
                // The next epoch is too large for any group: it goes alone as plain writes.
                self.destage.solo = true;
            }
        }
        let limit = self.destage_limit(now);
        let mut inflight = self.destage.inflight();
        let mut i = 0;
        loop {
            if i == self.destage.active.len() {
                // An epoch started now could send nothing, and starting it closes the open one
                // early: it waits for the next look.
                if inflight >= limit {
                    break;
                }
                let pipelining = self.layout.ordered_remote && !self.destage.solo;
                let may_start = pipelining
                    || self.destage.active.is_empty() && self.log.durable_destaged_epoch >= self.destaged_epoch;
                if !may_start || !self.start_epoch(resets) {
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
            if e.queue.is_empty() && e.sync == SyncState::Unsent && (e.pipelined || e.inflight.is_empty()) {
                e.sync = SyncState::Sent;
                out.push(DestageIo::Sync { epoch: e.epoch, barrier: e.pipelined });
            }
            if e.sync == SyncState::Unsent {
                // Nothing of a later epoch may go out before this one's flush.
                break;
            }
            i += 1;
        }
        if was_quiet && !out.is_empty() {
            self.destage.heard = Some(now);
        }
        if !out.is_empty() {
            self.destage.window.since.get_or_insert(now);
        }
        out
    }

    /// How many destage writes may be in flight at `now`. Seed 004's level-2 destage is background
    /// work that a new request interrupts: reads that miss share the remote's disk with destage's
    /// writes, a disk does not stop a write it has begun, and one that serves in arrival order
    /// makes each read wait behind every write queued before it. So while host reads have gone to
    /// the remote within [`READS_RECENT`] and nothing hurries destage (no drain, no lag bound),
    /// destage gives way in proportion to the log's room, as bcache's writeback keeps a share of
    /// its cache dirty: below half of `deep_destage_from` it sends nothing new (the log takes the
    /// writes, and reads of them never reach the remote; once a write has waited [`HOLD_MAX`],
    /// one), up to `deep_destage_from` one write at a time (a read waits behind one at most, and
    /// destage still moves), and past it the whole pipeline. The dirty index's fill counts as the
    /// log's does: host writes wait when either is full, and only destage empties them. Groups to
    /// an SG are not held back: the SG's journal, not its disk, takes them.
    fn destage_limit(&mut self, now: Instant) -> usize {
        let full = self.cfg.destage_inflight.max(1);
        let d = &mut self.destage;
        if self.read.waiting() || self.read.remote_plans != d.reads_seen {
            d.reads_seen = self.read.remote_plans;
            d.reads_at = Some(now);
        }
        let recent = d.reads_at.is_some_and(|t| now.saturating_duration_since(t) < READS_RECENT);
        if !recent || self.cfg.max_lag.is_some() || !self.shallow() {
            return full;
        }
        // Nothing new below half of the deep fill (while no write waited too long), one write
        // at a time above it.
        usize::from(self.dirty_fill() >= self.cfg.deep_destage_from / 2.0 || self.lag(now) >= HOLD_MAX)
    }

    /// Destage is background work now: the log and the dirty index are below
    /// `deep_destage_from` and nothing hurries it. Then it keeps two epochs in flight, not its
    /// whole pipeline.
    fn shallow(&self) -> bool {
        !self.hurried() && self.dirty_fill() < self.cfg.deep_destage_from
    }

    /// The larger of the log's fill and the dirty index's (0–1): destage alone empties both,
    /// and host writes wait when either is full.
    fn dirty_fill(&self) -> f64 {
        let index = self.index_extents() as f64 / self.cfg.max_extents() as f64;
        self.log_fill().max(index)
    }

    /// At `now`, with commands outstanding that the remote has left unanswered for longer than
    /// the answer timeout: the remote counts unreachable (its connection is lost and not yet
    /// restored, or it hangs), until destage makes progress again.
    pub fn check_answers(&mut self, now: Instant) {
        let Some(heard) = self.destage.heard else { return };
        let silent = now.saturating_duration_since(heard);
        if self.destage.quiet() || silent < self.cfg.answer_timeout || self.health.failure().is_some() {
            return;
        }
        self.remote_silent(silent, now);
    }

    /// The remote has not answered for `silent`: a failure that may go away by itself.
    pub fn remote_silent(&mut self, silent: std::time::Duration, now: Instant) {
        let err = BlockError::Unreachable(format!("no answer from the remote for {:.0} s", silent.as_secs_f64()));
        let (_, change) = self.health.failed(
            ErrorKind::of(&err),
            err.to_string(),
            None,
            now,
            self.cfg.retry_delay,
            self.cfg.retry_max,
        );
        self.changes.extend(change);
    }

    /// A host's read found the remote unreachable or busy (`err`), or has waited on it past the
    /// answer timeout: the cache is degraded, unless a failure is in force already (destage's,
    /// which says more). A read's other errors concern its blocks, not the remote.
    pub fn read_failed(&mut self, err: &BlockError, now: Instant) {
        let kind = ErrorKind::of(err);
        if !kind.transient() || self.health.failure().is_some() {
            return;
        }
        let (_, change) =
            self.health.failed(kind, err.to_string(), None, now, self.cfg.retry_delay, self.cfg.retry_max);
        self.changes.extend(change);
    }

    /// The remote answered a host's read at `now`. With nothing to destage, nothing else would
    /// show that the remote is back, so the answer ends an unreachable or busy failure; with
    /// dirty data, destage's own progress does.
    pub fn read_answered(&mut self, now: Instant) {
        let transient = self.health.failure().is_some_and(|f| f.kind.transient());
        if transient && self.destage.quiet() && self.is_clean() {
            let change = self.health.succeeded(false, now);
            self.changes.extend(change);
        }
    }

    /// A write-through request the remote answered at `now`: progress, as an epoch is.
    pub fn remote_answered(&mut self, now: Instant) {
        let change = self.health.succeeded(false, now);
        self.changes.extend(change);
    }

    fn start_epoch(&mut self, resets: u64) -> bool {
        let after = self.destage.active.back().map_or(0, |e| e.epoch + 1);
        // Where a probe said to resume (kept until that epoch starts), else the next epoch.
        let (epoch, covers): (u64, &[u64]) = match &self.destage.resume {
            Some(r) if self.epochs.contains_key(&r.epoch) => (r.epoch, &r.covers),
            _ => match self.epochs.range(after..).next() {
                Some((&epoch, _)) => (epoch, &[]),
                None => return false,
            },
        };
        let bs = u64::from(self.layout.block_size);
        let maps = || covers.iter().chain([&epoch]).filter_map(|e| self.epochs.get(e));
        let total_blocks: u64 = maps().map(stics_block::extent::ExtentMap::blocks).sum();
        let data: u64 = maps().map(|m| super::data_blocks(m.iter())).sum();
        let pipelined = self.layout.ordered_remote && !self.destage.solo;
        if pipelined {
            // Within the pipeline's limits, counted from the durable checkpoint: every epoch
            // synchronised since is still in `undurable`.
            let d = &self.destage;
            let n = d.undurable.len() + d.active.iter().map(|e| e.covers.len() + 1).sum::<usize>() + covers.len() + 1;
            let sent = d.undurable.iter().map(|(_, b)| b).sum::<u64>() + d.active.iter().map(|e| e.blocks).sum::<u64>();
            if !self.pipeline_allows(n, (sent + total_blocks) * bs) || self.shallow() && n > 2 {
                return false;
            }
        }
        // Only writes that are durable in the log are destaged.
        let first_unlogged = self.log.durable_write();
        let not_durable =
            self.epochs[&epoch].iter().any(|(_, _, v)| v.write_seq >= first_unlogged || matches!(v.loc, Loc::Ram(_)));
        if not_durable {
            return false;
        }
        let (covers, beyond, resets) = match self.destage.resume.take() {
            Some(r) if r.epoch == epoch => (r.covers, r.beyond, r.resets),
            _ => (Vec::new(), Vec::new(), resets),
        };
        if epoch == self.log.epoch {
            self.close_epoch();
        }
        let queue = self.plan_epoch(epoch);
        self.destage.active.push_back(EpochDestage {
            epoch,
            queue,
            inflight: BTreeMap::new(),
            sync: SyncState::Unsent,
            failed: false,
            covers,
            beyond,
            blocks: total_blocks,
            data,
            resets,
            pipelined,
        });
        true
    }

    /// The remote operations that put epoch `epoch` on the remote, in LBA order: neighbouring
    /// runs coalesced, data in writes of at most the destage I/O size, zeroing in as few
    /// commands as a block count allows.
    fn plan_epoch(&mut self, epoch: u64) -> VecDeque<DestageIo> {
        let bs = u64::from(self.layout.block_size);
        let per_io = (self.cfg.destage_io_bytes / bs).clamp(1, u64::from(u32::MAX));
        let mut queue = VecDeque::new();
        let next_io = &mut self.destage.next_io;
        // (lba, blocks, sources, Some(discard) for zeroing)
        let mut run: Option<(u64, u64, Vec<Piece>, Option<bool>)> = None;
        let mut flush = |run: &mut Option<(u64, u64, Vec<Piece>, Option<bool>)>| {
            if let Some((lba, blocks, sources, zero)) = run.take() {
                *next_io += 1;
                let (id, blocks) = (*next_io, blocks as u32);
                queue.push_back(match zero {
                    Some(discard) => DestageIo::Zero { id, lba, blocks, discard },
                    None => DestageIo::Write { id, lba, blocks, sources },
                });
            }
        };
        for (s, e, v) in self.epochs[&epoch].iter() {
            let zero = matches!(v.loc, Loc::Zero).then_some(v.discard);
            let cap = if zero.is_some() { u64::from(u32::MAX) } else { per_io };
            let mut at = s;
            while at < e {
                let extends = run.as_ref().is_some_and(|(l, n, _, z)| l + n == at && *z == zero && *n < cap);
                if !extends {
                    flush(&mut run);
                    run = Some((at, 0, Vec::new(), zero));
                }
                let Some((_, n, sources, _)) = run.as_mut() else { break };
                let take = (e - at).min(cap - *n);
                let (from, to) = (at - s, at - s + take);
                match &v.loc {
                    Loc::Log(off) => {
                        let off = off + from * bs;
                        match sources.last_mut() {
                            Some(Piece::Log { offset, blocks }) if *offset + u64::from(*blocks) * bs == off => {
                                *blocks += take as u32;
                            }
                            _ => sources.push(Piece::Log { offset: off, blocks: take as u32 }),
                        }
                    }
                    Loc::Ram(b) => sources.push(Piece::Ram(b.slice((from * bs) as usize..(to * bs) as usize))),
                    Loc::Zero => {}
                }
                *n += take;
                at += take;
            }
        }
        flush(&mut run);
        queue
    }

    /// A destage write (or zeroing) completed on the remote at `now`. Its epoch's flush may
    /// have been reported first (answers are not taken in the order they came); then the epoch
    /// is on the remote now, and this returns true, as [`Core::synced`] does.
    pub fn destage_done(&mut self, id: u64, now: Instant) -> bool {
        self.destage.heard = Some(now);
        if let Some(e) = self.destage.epoch_of(id) {
            if let Some(DestageIo::Write { blocks, .. } | DestageIo::Zero { blocks, .. }) = e.inflight.remove(&id) {
                self.stats.blocks_destaged += u64::from(blocks);
            }
        }
        self.retire(now)
    }

    /// A destage write or zeroing failed at `now`. Pipelined, everything stops until what is in
    /// flight has ended and the epoch then goes again (the remote may have run later commands
    /// past this one); otherwise the one command is tried again after a pause.
    pub fn destage_failed(&mut self, id: u64, err: &BlockError, now: Instant) {
        let Some(e) = self.destage.epoch_of(id) else { return };
        let Some(io) = e.inflight.remove(&id) else { return };
        let lba = match &io {
            DestageIo::Write { lba, .. } | DestageIo::Zero { lba, .. } => Some(*lba),
            _ => None,
        };
        if e.pipelined {
            e.failed = true;
            self.destage.failed = true;
        } else {
            e.queue.push_front(io);
        }
        self.remote_failed(err, lba, now);
    }

    /// The SYNCHRONIZE CACHE after epoch `epoch` failed at `now`: the remote may have dropped
    /// what it held of the epoch, which goes again whole.
    pub fn sync_failed(&mut self, epoch: u64, err: &BlockError, now: Instant) {
        if let Some(e) = self.destage.active.iter_mut().find(|e| e.epoch == epoch && e.sync == SyncState::Sent) {
            e.sync = SyncState::Unsent;
            e.failed = true;
            self.destage.failed = true;
        }
        self.remote_failed(err, None, now);
    }

    /// The remote synchronised epoch `epoch`, answering at `now` with its reset count at
    /// `resets`. Trusted when the remote was not reset since the epoch began; then, once it and
    /// every epoch before it are on the remote, their blocks leave the dirty index and the
    /// records that held only destaged epochs are freed. Returns true when the checkpoint
    /// moved.
    pub fn synced(&mut self, epoch: u64, resets: u64, now: Instant) -> bool {
        self.destage.heard = Some(now);
        let Some(e) = self.destage.active.iter_mut().find(|e| e.epoch == epoch && e.sync == SyncState::Sent) else {
            return false;
        };
        if resets != e.resets {
            e.sync = SyncState::Unsent;
            e.failed = true;
            self.destage.failed = true;
            return false;
        }
        e.sync = SyncState::Done;
        self.retire(now)
    }

    /// Takes the epochs at the front that are wholly on the remote off the dirty index; true if
    /// there were any.
    fn retire(&mut self, now: Instant) -> bool {
        let mut moved = false;
        while let Some(front) = self.destage.active.front() {
            let complete =
                front.sync == SyncState::Done && !front.failed && front.queue.is_empty() && front.inflight.is_empty();
            if !complete {
                break;
            }
            let Some(done) = self.destage.active.pop_front() else { break };
            if !done.pipelined {
                self.destage.solo = false;
            }
            self.measure_destage(done.data, now);
            if self.groups_on() {
                self.plain_epoch_done();
            }
            for e in done.covers {
                self.epoch_on_remote(e);
            }
            self.epoch_on_remote(done.epoch);
            moved = true;
        }
        if moved {
            let change = self.health.succeeded(false, now);
            self.changes.extend(change);
        }
        moved
    }

    /// Counts `data` blocks retired at `now` into the destage rate: data over the time destage
    /// had epochs out, in windows of at least [`RATE_WINDOW`] (epochs in a pipeline retire in
    /// bursts, and one epoch alone says little; an idle destage is not slow).
    fn measure_destage(&mut self, data: u64, now: Instant) {
        let bs = u64::from(self.layout.block_size);
        let d = &mut self.destage;
        let w = &mut d.window;
        w.bytes += data * bs;
        if let Some(since) = w.since {
            w.busy += now.saturating_duration_since(since);
            w.since = (!d.active.is_empty()).then_some(now);
        }
        if w.busy >= RATE_WINDOW {
            let r = w.bytes as f64 / w.busy.as_secs_f64();
            d.rate = Some(d.rate.map_or(r, |old| 0.7 * old + 0.3 * r));
            (w.bytes, w.busy) = (0, Duration::ZERO);
        }
    }

    pub(crate) fn epoch_on_remote(&mut self, epoch: u64) {
        let mut count = 0;
        if let Some(m) = self.epochs.remove(&epoch) {
            count = m.blocks();
            self.epoch_extents -= m.len();
            for (s, e, v) in m.iter() {
                let seq = v.write_seq;
                let gone = self.newest.remove_where(s, e, |n| n.write_seq == seq);
                let gone = super::data_blocks(gone.iter().map(|(s, e, v)| (*s, *e, v)));
                debug_assert!(self.newest_data >= gone);
                self.newest_data = self.newest_data.saturating_sub(gone);
                // Remote data read before this may predate the write now on the remote. The read
                // cache's copy of these blocks, if any, is this write's or a newer one's: every
                // write empties its range there, and remote data never enters it for a dirty block.
                self.stamp(s, e);
            }
        }
        self.destaged_epoch = epoch;
        self.destage.groups.born.remove(&epoch);
        self.destage.undurable.push_back((epoch, count));
        self.stats.epochs_destaged += 1;
        self.log.free_up_to(epoch);
        self.remote_reached(epoch);
    }
}

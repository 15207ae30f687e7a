//! Destage to a stics SG (a remote that takes groups, [`stics_block::GroupSink`]): whole epochs
//! `a..=b` merged into one group (last write wins per block, neighbours coalesced), shipped as
//! one unit that the SG makes durable before it answers and applies whole. One group is in
//! flight at a time, two while a drain or a settle waits (a gateway giving up a token) on an SG
//! that takes groups strictly in sequence; while one travels the next one grows, so groups are
//! large exactly when the link is the bottleneck, bounded by the SG's largest group, by the
//! `max_lag` budget (a group should take at most a quarter of it to ship at the rate measured,
//! and host writes wait while the data not on the SG would take more than half of it) and by
//! the log: destage never waits for more.
//!
//! What the SG holds is what its status says: at start, and after a group it refused, the
//! gateway reads it and retires every epoch up to the newest the SG committed, instead of
//! reading back blocks. A group sent again after a lost answer carries the same number and
//! epochs, and the SG takes it without effect. With two out, the SG's answer to the second
//! says the first is there too; a failure of either waits until neither is out, then the older
//! failure decides what comes next. An epoch too large for any group goes as plain writes and a
//! flush (the plain destage of [`super::destage`]), alone, with no group out.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use stics_block::extent::ExtentMap;
use stics_block::BlockError;
use stics_link::group::{Extent, ExtentKind, CHUNK_BYTES};

use super::{Core, Loc, Piece, Version};

/// Bytes of a group's header; each extent and chunk adds its table entry (see `stics_link`).
const HEADER_BYTES: u64 = 88;
const EXTENT_BYTES: u64 = 16;
const CHUNK_ENTRY_BYTES: u64 = 12;

/// Refusals in a row after which destage gives up on groups and goes on with plain writes.
const MAX_REFUSALS: u32 = 3;

/// Smallest group the lag budget may ask for.
const MIN_GROUP_BYTES: u64 = 1 << 20;

/// One group as destage hands it out: the driver reads `sources` (the data extents' blocks,
/// in order), encodes the group and commits it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupPlan {
    pub seq: u64,
    pub first_epoch: u64,
    pub last_epoch: u64,
    /// Sorted, non-overlapping, coalesced.
    pub extents: Vec<Extent>,
    /// The data extents' blocks: log slots and RAM.
    pub sources: Vec<Piece>,
    /// Bytes of data extents.
    pub raw_bytes: u64,
    /// Blocks the merge absorbed: written in an epoch of the group and again in a later one.
    pub absorbed_blocks: u64,
}

/// What the SG said it holds of this cache's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SgHolds {
    /// The newest group it committed, and the newest epoch in it (0: none).
    pub committed_seq: u64,
    pub committed_epoch: u64,
}

/// Group destage state.
#[derive(Debug, Default)]
pub(crate) struct Groups {
    /// Groups are off: the remote takes none, or refused them too often.
    pub(crate) off: bool,
    /// Groups only, never plain writes: other gateways share the remote, and a plain write
    /// carries no token generation for the SG to check.
    only: bool,
    /// The number the next group gets; `None` until the SG's status was read.
    next_seq: Option<u64>,
    /// A status read is out.
    status_sent: bool,
    /// The groups out or to be sent again, oldest first.
    flights: VecDeque<Flight>,
    /// Groups planned so far (a group's place in this count stays when it goes again).
    planned: u64,
    /// The oldest group that failed since the last look, and how: acted on once none is out.
    broken: Option<(u64, Failure)>,
    /// Refusals in a row.
    refusals: u32,
    /// After recovery: the read-back of plain destage's epochs comes once the status is known.
    recovery_probe: bool,
    /// Shipping rate measured (encoded bytes per second, smoothed).
    rate: Option<f64>,
    /// The same in the blocks' own bytes (before compression): what the backlog drains at.
    raw_rate: Option<f64>,
    /// When each epoch not yet on the SG got its first write (for the lag).
    pub(crate) born: std::collections::BTreeMap<u64, Instant>,
    /// The clock last seen.
    pub(crate) now: Option<Instant>,
}

/// A group handed out.
#[derive(Debug)]
struct Flight {
    plan: GroupPlan,
    /// Which plan it was, counted from the start ([`Core::groups_planned`]).
    n: u64,
    /// It is out now (else it waits to be sent again).
    sent: bool,
}

/// How a group failed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Failure {
    /// Lost on the way, or the SG could not take it now: the same group goes again.
    Again,
    /// The SG refused it.
    Refused(String),
    /// The remote takes no groups (any more).
    Unsupported(String),
}

/// Metrics of group destage.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GroupStats {
    pub groups: u64,
    pub group_epochs: u64,
    /// Bytes of the epochs' blocks before merging, of the merged data, and as shipped.
    pub bytes_before_merge: u64,
    pub bytes_merged: u64,
    pub bytes_shipped: u64,
    pub groups_resent: u64,
    /// Groups sent while the one before was still out (a settle waited).
    pub groups_overlapped: u64,
    /// Epochs too large for a group, sent as plain writes.
    pub plain_epochs: u64,
    /// Shipping rate measured, bytes per second.
    pub rate: f64,
}

impl Core {
    /// True when destage ships groups.
    pub fn groups_on(&self) -> bool {
        self.layout.max_group.is_some() && !self.destage.groups.off
    }

    /// After recovery on a remote that takes groups: the SG's status first, then any read-back.
    pub(crate) fn groups_after_recovery(&mut self) {
        self.destage.groups.recovery_probe = true;
    }

    /// The clock, as seen by any call that takes it.
    pub(crate) fn tick(&mut self, now: Instant) {
        self.destage.groups.now = Some(now);
    }

    /// An epoch got its first write.
    pub(crate) fn epoch_born(&mut self, epoch: u64) {
        if let Some(now) = self.destage.groups.now {
            self.destage.groups.born.entry(epoch).or_insert(now);
        }
    }

    /// The age at `now` of the oldest write the remote does not hold.
    pub fn lag(&self, now: Instant) -> Duration {
        let oldest = self.epochs.keys().next().and_then(|e| self.destage.groups.born.range(e..).next());
        oldest.map_or(Duration::ZERO, |(_, t)| now.saturating_duration_since(*t))
    }

    /// Over the lag the configuration allows, or a write of `bytes` would be: host writes wait.
    ///
    /// The age of the oldest write alone comes too late: by the time it passes the bound, the
    /// host has written as much as the log takes while the link ships a fraction of it, and the
    /// lag goes on growing for as long as that backlog takes to ship. So the backlog itself is
    /// bounded: a write comes in only while what is not on the remote yet ships in half the
    /// budget at the rate measured (groups' to an SG, plain destage's to any other remote;
    /// before the first measurement, while it is under two of the smallest groups); a group
    /// takes at most a quarter more ([`Core::group_cap`]), an epoch what its limits allow.
    pub(crate) fn over_lag(&self, bytes: u64, now: Instant) -> bool {
        let Some(max) = self.cfg.max_lag else { return false };
        if self.lag(now) > max {
            return true;
        }
        let backlog = self.newest_data * u64::from(self.layout.block_size);
        backlog > 0 && backlog + bytes > self.backlog_budget(max)
    }

    /// Bytes of data not on the remote that ship within half of `max_lag`.
    pub(crate) fn backlog_budget(&self, max_lag: Duration) -> u64 {
        let rate = if self.groups_on() { self.destage.groups.raw_rate } else { self.destage.rate };
        match rate {
            Some(r) => ((r * max_lag.as_secs_f64() / 2.0) as u64).max(MIN_GROUP_BYTES),
            None => 2 * MIN_GROUP_BYTES,
        }
    }

    /// Group destage's metrics.
    pub fn group_stats(&self) -> GroupStats {
        GroupStats { rate: self.destage.groups.rate.unwrap_or(0.0), ..self.group_stats }
    }

    /// The next group operations: the status read, groups sent again in order and a new one
    /// while there is room, or nothing (the ones out fill the pipeline, or the next epoch is too
    /// large for a group and plain destage takes it: then `plain` is set).
    pub(crate) fn next_groups(&mut self, plain: &mut bool, out: &mut Vec<super::DestageIo>) {
        let g = &mut self.destage.groups;
        if g.next_seq.is_none() {
            if !g.status_sent {
                g.status_sent = true;
                out.push(super::DestageIo::GroupStatus);
            }
            return;
        }
        if g.broken.is_some() {
            if g.flights.iter().any(|f| f.sent) {
                return;
            }
            self.after_failure();
            if !self.groups_on() {
                return;
            }
            if self.destage.groups.next_seq.is_none() {
                return self.next_groups(plain, out);
            }
        }
        let g = &mut self.destage.groups;
        for f in g.flights.iter_mut().filter(|f| !f.sent) {
            f.sent = true;
            self.group_stats.groups_resent += 1;
            out.push(super::DestageIo::Group(f.plan.clone()));
        }
        let depth = if self.hurried() { self.layout.groups_in_flight.max(1) as usize } else { 1 };
        if self.destage.groups.flights.len() >= depth {
            return;
        }
        // Plain writes never go while a group is out: they could land before it.
        let mut behind = false;
        let alone = if self.destage.groups.flights.is_empty() { plain } else { &mut behind };
        if let Some(plan) = self.plan_group(alone) {
            if !self.destage.groups.flights.is_empty() {
                self.group_stats.groups_overlapped += 1;
            }
            out.push(super::DestageIo::Group(plan.clone()));
            let g = &mut self.destage.groups;
            g.planned += 1;
            g.flights.push_back(Flight { plan, n: g.planned, sent: true });
        }
    }

    /// Every group out has answered since one failed: the first that failed decides.
    fn after_failure(&mut self) {
        let g = &mut self.destage.groups;
        let Some((_, failure)) = g.broken.take() else { return };
        let why = match failure {
            Failure::Again => return,
            // A fenced cache never turns to plain writes: it tries again, after the status.
            Failure::Refused(why) | Failure::Unsupported(why) if g.only => why,
            Failure::Unsupported(why) => return self.groups_off(why),
            Failure::Refused(why) => why,
        };
        g.refusals += 1;
        if g.refusals >= MAX_REFUSALS && !g.only {
            return self.groups_off(why);
        }
        g.next_seq = None;
        g.status_sent = false;
        g.flights.clear();
    }

    /// The largest group to form now: under a lag bound, one that ships in a quarter of it at
    /// the rate measured (the smallest until a group was measured).
    fn group_cap(&self) -> u64 {
        let max = u64::from(self.layout.max_group.unwrap_or(0));
        let least = MIN_GROUP_BYTES.min(max);
        match (self.cfg.max_lag, self.destage.groups.rate) {
            (Some(lag), Some(rate)) => ((rate * lag.as_secs_f64() / 4.0) as u64).clamp(least, max),
            (Some(_), None) => least,
            (None, _) => max,
        }
    }

    /// Merges the oldest epochs whose writes are all durable in the log into one group, as
    /// many as fit the cap. None when there is nothing to send, or when the first epoch alone
    /// does not fit (then `plain` is set).
    fn plan_group(&mut self, plain: &mut bool) -> Option<GroupPlan> {
        let bs = u64::from(self.layout.block_size);
        let cap = self.group_cap();
        let first_unlogged = self.log.durable_write();
        let durable = |m: &ExtentMap<Version>| {
            !m.iter().any(|(_, _, v)| v.write_seq >= first_unlogged || matches!(v.loc, Loc::Ram(_)))
        };
        let bound = |m: &ExtentMap<Version>| {
            let raw = super::data_blocks(m.iter()) * bs;
            HEADER_BYTES + EXTENT_BYTES * m.len() as u64 + CHUNK_ENTRY_BYTES * raw.div_ceil(CHUNK_BYTES as u64) + raw
        };
        let mut merged: ExtentMap<Version> = ExtentMap::new(self.layout.block_size);
        let (mut first, mut last) = (None, 0);
        let mut before = 0u64;
        let mut additive = 0u64;
        let after = self.destage.groups.flights.back().map_or(self.destaged_epoch, |f| f.plan.last_epoch);
        let epochs: Vec<u64> = self.epochs.range(after + 1..).map(|(e, _)| *e).collect();
        for epoch in epochs {
            let Some(m) = self.epochs.get(&epoch) else { break };
            if !durable(m) {
                break;
            }
            let own = bound(m);
            if first.is_none() && own > cap {
                if !self.destage.groups.only {
                    *plain = true;
                    return None;
                }
                // Fenced: the epoch goes alone, past the cap. Under a lag bound it still fits
                // the SG's largest group, which epochs are kept to half of at open; one past
                // even that is refused by the SG, and tried again, rather than sent unfenced.
                merged = m.clone();
                before = m.blocks();
                first = Some(epoch);
                last = epoch;
                break;
            }
            // The sum of the epochs' own bounds is past the merged one: only near the cap is the
            // merged size checked on a copy.
            additive += own;
            let mut next = merged.clone();
            for (s, e, v) in m.iter() {
                next.insert(s, e, v.clone());
            }
            if additive > cap && bound(&next) > cap {
                break;
            }
            merged = next;
            before += m.blocks();
            first.get_or_insert(epoch);
            last = epoch;
        }
        let first = first?;
        if last == self.log.epoch {
            self.close_epoch();
        }
        let g = &self.destage.groups;
        let seq = g.flights.back().map_or(g.next_seq, |f| Some(f.plan.seq + 1))?;
        let mut extents: Vec<Extent> = Vec::new();
        let mut sources: Vec<Piece> = Vec::new();
        let mut raw_blocks = 0u64;
        for (s, e, v) in merged.iter() {
            let kind = match (&v.loc, v.discard) {
                (Loc::Zero, true) => ExtentKind::Discard,
                (Loc::Zero, false) => ExtentKind::Zero,
                _ => ExtentKind::Data,
            };
            let mut at = s;
            while at < e {
                let n = (e - at).min(u64::from(u32::MAX));
                match extents.last_mut() {
                    Some(x)
                        if x.kind == kind
                            && x.lba + u64::from(x.blocks) == at
                            && u32::try_from(u64::from(x.blocks) + n).is_ok() =>
                    {
                        x.blocks += n as u32;
                    }
                    _ => extents.push(Extent { lba: at, blocks: n as u32, kind }),
                }
                at += n;
            }
            match &v.loc {
                Loc::Log(off) => {
                    raw_blocks += e - s;
                    match sources.last_mut() {
                        Some(Piece::Log { offset, blocks })
                            if *offset + u64::from(*blocks) * bs == *off
                                && u32::try_from(u64::from(*blocks) + (e - s)).is_ok() =>
                        {
                            *blocks += (e - s) as u32;
                        }
                        _ => sources.push(Piece::Log { offset: *off, blocks: (e - s) as u32 }),
                    }
                }
                Loc::Ram(b) => {
                    raw_blocks += e - s;
                    sources.push(Piece::Ram(b.clone()));
                }
                Loc::Zero => {}
            }
        }
        let merged_blocks = merged.blocks();
        Some(GroupPlan {
            seq,
            first_epoch: first,
            last_epoch: last,
            extents,
            sources,
            raw_bytes: raw_blocks * bs,
            absorbed_blocks: before - merged_blocks,
        })
    }

    /// The SG took group `seq` (`encoded` bytes, shipped in `took`) at `now`: its epochs are on
    /// the remote, and those of any group before it (the SG takes them in sequence). True when
    /// epochs were retired.
    pub fn group_committed(&mut self, seq: u64, encoded: u64, took: Duration, now: Instant) -> bool {
        self.destage.heard = Some(now);
        let g = &mut self.destage.groups;
        let Some(at) = g.flights.iter().position(|f| f.plan.seq == seq) else {
            // Its answer came after the next group's, which said it was there.
            if g.next_seq.is_some_and(|n| seq < n) {
                self.group_stats.bytes_shipped += encoded;
            }
            return false;
        };
        let done: Vec<Flight> = g.flights.drain(..=at).collect();
        g.refusals = 0;
        g.next_seq = Some(seq + 1);
        if g.broken.as_ref().is_some_and(|(s, _)| *s <= seq) {
            g.broken = None;
        }
        if took > Duration::ZERO {
            let raw = done.last().map_or(0, |f| f.plan.raw_bytes);
            let smooth = |old: Option<f64>, r: f64| Some(old.map_or(r, |old| 0.7 * old + 0.3 * r));
            g.rate = smooth(g.rate, encoded as f64 / took.as_secs_f64());
            g.raw_rate = smooth(g.raw_rate, raw.max(encoded) as f64 / took.as_secs_f64());
        }
        let bs = u64::from(self.layout.block_size);
        let s = &mut self.group_stats;
        s.bytes_shipped += encoded;
        let mut last = 0;
        for f in done {
            let plan = f.plan;
            s.groups += 1;
            s.group_epochs += plan.last_epoch - plan.first_epoch + 1;
            s.bytes_merged += plan.raw_bytes;
            s.bytes_before_merge += plan.raw_bytes + plan.absorbed_blocks * bs;
            last = plan.last_epoch;
        }
        self.retire_through(last, now)
    }

    /// Committing group `seq` failed at `now`. Once no group is out, the oldest that failed
    /// decides: a refused group makes destage read the SG's status again (the SG may have taken
    /// it under this number already, or lost track); refused too often, or on a remote that no
    /// longer takes groups, destage goes on with plain writes. Anything else sends the same
    /// groups again after a pause.
    pub fn group_failed(&mut self, seq: u64, err: &BlockError, now: Instant) {
        let g = &mut self.destage.groups;
        let Some(f) = g.flights.iter_mut().find(|f| f.plan.seq == seq) else { return };
        f.sent = false;
        let failure = match err {
            BlockError::Unsupported(_) => Failure::Unsupported(err.to_string()),
            BlockError::Rejected(_) => Failure::Refused(err.to_string()),
            _ => Failure::Again,
        };
        if g.broken.as_ref().is_none_or(|(s, _)| seq < *s) {
            g.broken = Some((seq, failure));
        }
        self.remote_failed(err, None, now);
    }

    /// How many groups were planned so far: a mark for [`Core::groups_ended`].
    pub fn groups_planned(&self) -> u64 {
        self.destage.groups.planned
    }

    /// True once no group among the first `mark` planned is out or waits to go again (each was
    /// taken by the SG, or refused and dropped): whatever they carried can no longer land.
    pub fn groups_ended(&self, mark: u64) -> bool {
        !self.destage.groups.flights.iter().any(|f| f.n <= mark)
    }

    /// Ships groups only, never plain writes, whatever the SG answers (a cache of a LUN other
    /// gateways share: see [`crate::driver::Fencer`]).
    pub fn groups_only(&mut self) {
        self.destage.groups.only = true;
    }

    fn groups_off(&mut self, why: String) {
        let g = &mut self.destage.groups;
        g.off = true;
        g.flights.clear();
        g.broken = None;
        self.changes.push(super::Change::GroupsOff { why });
    }

    /// What the SG holds of this log, read at `now`: every epoch up to the newest it committed
    /// is on the remote. True when epochs were retired.
    pub fn group_status(&mut self, holds: SgHolds, now: Instant) -> bool {
        self.destage.heard = Some(now);
        let g = &mut self.destage.groups;
        g.status_sent = false;
        g.next_seq = Some(holds.committed_seq + 1);
        // Groups out under numbers the SG has not used go again as they are, if they follow
        // on from the newest it took; the rest are planned afresh.
        g.flights.retain(|f| f.plan.seq > holds.committed_seq);
        if g.flights.front().is_some_and(|f| f.plan.seq != holds.committed_seq + 1) {
            g.flights.clear();
        }
        if holds.committed_seq > 0 && holds.committed_epoch < self.destaged_epoch {
            tracing::warn!(
                sg_epoch = holds.committed_epoch,
                destaged = self.destaged_epoch,
                "the SG holds fewer epochs of this log than were retired: its journal was replaced or lost"
            );
        }
        let moved = self.retire_through(holds.committed_epoch, now);
        if std::mem::take(&mut self.destage.groups.recovery_probe) {
            self.start_recovery_probe(self.destaged_epoch);
        }
        moved
    }

    /// Reading the SG's status failed at `now`: asked again after a pause.
    pub fn group_status_failed(&mut self, err: &BlockError, now: Instant) {
        self.destage.groups.status_sent = false;
        if matches!(err, BlockError::Unsupported(_)) {
            self.groups_off(err.to_string());
        }
        self.remote_failed(err, None, now);
    }

    /// Retires every epoch up to `epoch` (they are on the remote).
    fn retire_through(&mut self, epoch: u64, now: Instant) -> bool {
        let done: Vec<u64> = self.epochs.range(..=epoch).map(|(e, _)| *e).collect();
        let moved = !done.is_empty();
        for e in done {
            self.epoch_on_remote(e);
        }
        if moved {
            let change = self.health.succeeded(false, now);
            self.changes.extend(change);
        }
        moved
    }

    /// An epoch too large for a group went as plain writes.
    pub(crate) fn plain_epoch_done(&mut self) {
        self.group_stats.plain_epochs += 1;
    }
}

impl Groups {
    /// True when nothing of group destage is out.
    pub(crate) fn quiet(&self) -> bool {
        !(self.status_sent || self.flights.iter().any(|f| f.sent))
    }
}

//! The journal's decisions, pure: whether a group is taken (checked against the medium and its
//! source's sequence), where its record goes in the ring, what each read finds (the newest
//! committed group over the medium), which group is applied next, when ring space is free, and
//! when the lock server's table is written whole again so that the ring's head may pass the last
//! whole copy.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use stics_block::extent::{ExtentMap, Run};
use stics_link::group::{self, Chunk, ExtentKind, GroupHead};

use crate::format::{SourceMark, BLOCK, RING_START};
use crate::{JournalError, Result};

/// Where the newest committed version of a run of blocks is.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ov {
    /// The record (group) that wrote it.
    seq: u64,
    /// Its place in that group's raw stream; zeros when none.
    raw: Option<u64>,
}

impl Run for Ov {
    fn cut(&self, from: u64, _to: u64, block_size: u64) -> Ov {
        Ov { seq: self.seq, raw: self.raw.map(|r| r + from * block_size) }
    }
}

/// A live record: a committed group, applied to the medium or not yet, or a tokens record
/// (nothing to apply).
#[derive(Debug, Clone)]
struct Rec {
    seq: u64,
    offset: u64,
    len: u64,
    group: Option<GroupRec>,
    applied: bool,
}

#[derive(Debug, Clone)]
struct GroupRec {
    head: GroupHead,
    placed: Vec<(group::Extent, Option<u64>)>,
    /// Its payload (the encoded group past its tables) and how the payload is cut in chunks.
    data: Stored,
}

/// A committed group's data as a reader needs it: the payload and its chunk table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub payload: Bytes,
    pub chunks: Arc<[Chunk]>,
}

/// A group to apply to the medium.
#[derive(Debug, Clone)]
pub struct Apply {
    pub seq: u64,
    pub placed: Vec<(group::Extent, Option<u64>)>,
    pub data: Stored,
}

/// What one source's groups have come to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Source {
    pub committed_seq: u64,
    pub committed_epoch: u64,
    pub applied_seq: u64,
    pub applied_epoch: u64,
}

/// Where one run of a read comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// The medium.
    Medium { lba: u64, blocks: u32 },
    /// Zeros.
    Zero { blocks: u32 },
    /// A committed group not yet on the medium: `len` bytes of its raw stream from `raw`.
    Group { data: Stored, raw: u64, len: usize },
}

/// A group checked and ready to commit.
#[derive(Debug, Clone)]
pub struct Checked {
    pub head: GroupHead,
    /// Extents with their place in the raw stream (data extents only).
    placed: Vec<(group::Extent, Option<u64>)>,
    chunks: Arc<[Chunk]>,
    payload_offset: usize,
    /// Bytes of data the group writes, and of the whole encoded group.
    pub raw_len: u64,
    pub encoded_len: u64,
    /// The token generations its writes were made under, when it carries them.
    pub fences: Option<group::Fences>,
}

impl Checked {
    /// The segments of `segment_bytes` the group writes, in order.
    pub fn segments(&self, segment_bytes: u32) -> Vec<u64> {
        let extents: Vec<group::Extent> = self.placed.iter().map(|(e, _)| *e).collect();
        group::segments_touched(&extents, self.head.block_size, segment_bytes).collect()
    }
}

/// What [`Core::check`] decided.
#[derive(Debug)]
pub enum Take {
    /// Commit it.
    New(Checked),
    /// The journal already holds it (sent again after a lost answer): answer GOOD.
    Again,
}

/// The journal's state.
#[derive(Debug)]
pub struct Core {
    uuid: [u8; 16],
    ring_end: u64,
    block_size: u32,
    medium_blocks: u64,
    max_raw: u64,
    next_seq: u64,
    tail: u64,
    records: VecDeque<Rec>,
    used: u64,
    /// Records before this one may be overwritten: a durable checkpoint left them.
    durable_head: u64,
    sources: BTreeMap<[u8; 16], Source>,
    overlay: ExtentMap<Ov>,
    applying: Option<u64>,
    /// The newest whole copy of the token table (replay starts from it, so the ring's head
    /// stays at or before it) and its length, and bytes of tokens records written after it.
    snapshot: Option<(u64, u64)>,
    since_snapshot: u64,
}

impl Core {
    /// An empty journal whose next record goes to `head_offset` with number `head_seq`;
    /// `sources` are the checkpoint's marks; one group may expand to at most `max_raw` bytes.
    pub fn new(
        uuid: [u8; 16],
        ring_end: u64,
        block_size: u32,
        medium_blocks: u64,
        (head_offset, head_seq): (u64, u64),
        sources: &[SourceMark],
        max_raw: u64,
    ) -> Core {
        let sources = sources
            .iter()
            .map(|m| {
                // The records behind the checkpoint raise what was committed again as the
                // scan takes them.
                let s = Source {
                    committed_seq: m.applied_seq,
                    committed_epoch: m.applied_epoch,
                    applied_seq: m.applied_seq,
                    applied_epoch: m.applied_epoch,
                };
                (m.source, s)
            })
            .collect();
        Core {
            uuid,
            ring_end,
            block_size,
            medium_blocks,
            max_raw,
            next_seq: head_seq,
            tail: head_offset,
            records: VecDeque::new(),
            used: 0,
            durable_head: head_seq,
            sources,
            overlay: ExtentMap::new(block_size),
            applying: None,
            snapshot: None,
            since_snapshot: 0,
        }
    }

    /// The journal's identity (every record carries it).
    pub fn uuid(&self) -> [u8; 16] {
        self.uuid
    }

    /// Checks a group against the medium and its source: it must fit the medium, and be the
    /// next of its source's groups, right after the newest the journal holds (unless
    /// `recovering`: the scan takes every record behind the checkpoint again).
    pub fn check(&self, bytes: &[u8], recovering: bool) -> Result<Take> {
        let v = group::parse(bytes, self.max_raw)?;
        if v.head.block_size != self.block_size {
            return Err(JournalError::Refused(format!(
                "a group of {}-byte blocks for a medium of {}-byte blocks",
                v.head.block_size, self.block_size
            )));
        }
        if let Some(last) = v.extents.last() {
            if last.lba + u64::from(last.blocks) > self.medium_blocks {
                return Err(JournalError::Refused(format!(
                    "blocks {}+{} outside a medium of {} blocks",
                    last.lba, last.blocks, self.medium_blocks
                )));
            }
        }
        let known = self.sources.get(&v.head.source).copied().unwrap_or_default();
        if !recovering && known.committed_seq > 0 && v.head.seq <= known.committed_seq {
            // The newest group sent again after a lost answer is taken without effect. Anything
            // else under a number already used is a gateway that lost track (restarted while its
            // last commit was still landing): refused, so that it reads the status and moves on
            // from there instead of believing epochs held that are not.
            if v.head.seq == known.committed_seq && v.head.last_epoch == known.committed_epoch {
                return Ok(Take::Again);
            }
            return Err(JournalError::Refused(format!(
                "group {} (epochs {}..={}) under a number already used: the newest taken from this source is group {} up to epoch {}",
                v.head.seq, v.head.first_epoch, v.head.last_epoch, known.committed_seq, known.committed_epoch
            )));
        }
        // Strictly in sequence: a gateway with two groups out must never have the second land
        // first, or a refusal of the first would leave its epochs counted as held.
        if !recovering && v.head.seq > known.committed_seq + 1 {
            return Err(JournalError::Ahead { seq: v.head.seq, missing: known.committed_seq + 1 });
        }
        Ok(Take::New(Checked {
            head: v.head,
            placed: v.placed(),
            chunks: v.chunks.clone().into(),
            payload_offset: v.payload_offset(),
            raw_len: v.raw_len,
            encoded_len: v.encoded_len(),
            fences: v.fences.clone(),
        }))
    }

    /// Where a record of `len` bytes goes, if the ring has room for it now.
    pub fn place(&self, len: u64) -> Option<u64> {
        if len > self.ring_end - RING_START {
            return None;
        }
        let Some(head) = self.records.front().map(|r| r.offset) else {
            return Some(if self.tail + len <= self.ring_end { self.tail } else { RING_START });
        };
        if self.tail > head {
            if self.tail + len <= self.ring_end {
                return Some(self.tail);
            }
            return (RING_START + len <= head).then_some(RING_START);
        }
        (self.tail + len <= head).then_some(self.tail)
    }

    /// True once the token table has a copy in the ring.
    pub fn has_snapshot(&self) -> bool {
        self.snapshot.is_some()
    }

    /// The number the next record gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// True when a group of `len` encoded bytes can never fit.
    pub fn too_large(&self, len: u64) -> bool {
        BLOCK + len.div_ceil(BLOCK) * BLOCK > self.ring_end - RING_START
    }

    /// Record `seq` holding `group` is durable at `offset` (`len` bytes): what it wrote is what
    /// reads find now, and its source's newest group is it.
    pub fn committed(&mut self, seq: u64, offset: u64, len: u64, checked: Checked, group: &Bytes) {
        let data = Stored { payload: group.slice(checked.payload_offset..), chunks: checked.chunks };
        for (e, raw) in &checked.placed {
            let end = e.lba + u64::from(e.blocks);
            let raw = if e.kind == ExtentKind::Data { *raw } else { None };
            self.overlay.insert(e.lba, end, Ov { seq, raw });
        }
        let s = self.sources.entry(checked.head.source).or_default();
        s.committed_seq = checked.head.seq;
        s.committed_epoch = checked.head.last_epoch;
        self.records.push_back(Rec {
            seq,
            offset,
            len,
            group: Some(GroupRec { head: checked.head, placed: checked.placed, data }),
            applied: false,
        });
        self.used += len;
        self.next_seq = seq + 1;
        self.tail = offset + len;
    }

    /// Record `seq`, a tokens record (`snapshot`: the whole table), is durable at `offset`.
    pub fn tokens_committed(&mut self, seq: u64, offset: u64, len: u64, snapshot: bool) {
        self.records.push_back(Rec { seq, offset, len, group: None, applied: true });
        self.used += len;
        self.next_seq = seq + 1;
        self.tail = offset + len;
        if snapshot {
            self.snapshot = Some((seq, len));
            self.since_snapshot = 0;
        } else {
            self.since_snapshot += len;
        }
    }

    /// Whether the next tokens record should be the whole table, given that what changed takes
    /// `delta_len` bytes: when there is no whole copy yet, when replay would read more changes
    /// than a copy, or when the copy holds back the ring's head while the records behind it use
    /// an eighth of the ring (the head may then move on to the new copy).
    pub fn wants_snapshot(&self, delta_len: u64) -> bool {
        let Some((seq, len)) = self.snapshot else { return true };
        if self.since_snapshot + delta_len > 4 * len + (1 << 20) {
            return true;
        }
        self.snapshot_holds_the_head(seq)
    }

    fn snapshot_holds_the_head(&self, seq: u64) -> bool {
        let first = self.records.iter().find(|r| !r.applied || r.seq == seq);
        if first.is_none_or(|r| r.seq != seq) {
            return false;
        }
        let behind: u64 = self.records.iter().filter(|r| r.seq > seq).map(|r| r.len).sum();
        behind > (self.ring_end - RING_START) / 8
    }

    /// Whether a whole copy of the table should be written before the next record: it holds
    /// back the ring's head (see [`Core::wants_snapshot`]).
    pub fn snapshot_due(&self) -> bool {
        self.snapshot.is_some_and(|(seq, _)| self.snapshot_holds_the_head(seq))
    }

    /// The oldest group not on the medium yet, when none is being applied: its record number,
    /// what it writes (each extent with its place in the raw stream) and its data.
    pub fn next_apply(&mut self) -> Option<Apply> {
        if self.applying.is_some() {
            return None;
        }
        let r = self.records.iter().find(|r| !r.applied)?;
        let g = r.group.as_ref()?;
        self.applying = Some(r.seq);
        Some(Apply { seq: r.seq, placed: g.placed.clone(), data: g.data.clone() })
    }

    /// Group `seq` is on the medium and the medium flushed: reads go there for its blocks
    /// (where no later group wrote them).
    pub fn applied(&mut self, seq: u64) {
        self.applying = None;
        let Some(r) = self.records.iter_mut().find(|r| r.seq == seq) else { return };
        r.applied = true;
        let Some(head) = r.group.as_ref().map(|g| g.head) else { return };
        self.overlay.retain(|o| o.seq != seq);
        let s = self.sources.entry(head.source).or_default();
        s.applied_seq = s.applied_seq.max(head.seq);
        s.applied_epoch = s.applied_epoch.max(head.last_epoch);
    }

    /// Applying group `seq` failed: it is tried again.
    pub fn apply_failed(&mut self) {
        self.applying = None;
    }

    /// The checkpoint as of now: the oldest record not applied or the token table's newest whole
    /// copy (or where the next goes), and what the medium holds of each source.
    pub fn checkpoint(&self) -> (u64, u64, Vec<SourceMark>) {
        let snapshot = self.snapshot.map(|(seq, _)| seq);
        let (offset, seq) = match self.records.iter().find(|r| !r.applied || Some(r.seq) == snapshot) {
            Some(r) => (r.offset, r.seq),
            None => (self.tail, self.next_seq),
        };
        let marks = self
            .sources
            .iter()
            .map(|(source, s)| SourceMark {
                source: *source,
                applied_seq: s.applied_seq,
                applied_epoch: s.applied_epoch,
                committed_seq: s.committed_seq,
            })
            .collect();
        (offset, seq, marks)
    }

    /// A checkpoint naming `head_seq` is durable: the space of applied records before it may be
    /// reused.
    pub fn checkpoint_durable(&mut self, head_seq: u64) {
        self.durable_head = self.durable_head.max(head_seq);
        while self.records.front().is_some_and(|r| r.applied && r.seq < self.durable_head) {
            if let Some(r) = self.records.pop_front() {
                self.used -= r.len;
            }
        }
    }

    /// Plans a read of `blocks` blocks at `lba`.
    pub fn read(&self, lba: u64, blocks: u64) -> Vec<Piece> {
        let bs = u64::from(self.block_size);
        let end = lba + blocks;
        let mut out = Vec::new();
        let mut at = lba;
        for (s, e, o) in self.overlay.overlapping(lba, end) {
            let (from, to) = (s.max(lba), e.min(end));
            if at < from {
                out.push(Piece::Medium { lba: at, blocks: (from - at) as u32 });
            }
            let n = to - from;
            match o.raw {
                None => out.push(Piece::Zero { blocks: n as u32 }),
                Some(raw) => {
                    let data = self
                        .records
                        .iter()
                        .find(|r| r.seq == o.seq)
                        .and_then(|r| r.group.as_ref())
                        .map(|g| g.data.clone());
                    match data {
                        Some(data) => {
                            let piece = Piece::Group { data, raw: raw + (from - s) * bs, len: (n * bs) as usize };
                            out.push(piece);
                        }
                        None => out.push(Piece::Medium { lba: from, blocks: n as u32 }),
                    }
                }
            }
            at = to;
        }
        if at < end {
            out.push(Piece::Medium { lba: at, blocks: (end - at) as u32 });
        }
        out
    }

    /// True when a group not yet on the medium writes some block of `lba..lba + blocks`.
    pub fn overlaps(&self, lba: u64, blocks: u64) -> bool {
        self.overlay.overlaps(lba, lba + blocks)
    }

    /// What the journal holds of each source.
    pub fn sources(&self) -> impl Iterator<Item = (&[u8; 16], &Source)> {
        self.sources.iter()
    }

    /// The newest epoch of `source` in a committed group (0 for a source it has none of).
    pub fn committed_epoch(&self, source: &[u8; 16]) -> u64 {
        self.sources.get(source).map_or(0, |s| s.committed_epoch)
    }

    /// Bytes of the ring in use, and its size.
    pub fn fill(&self) -> (u64, u64) {
        (self.used, self.ring_end - RING_START)
    }

    /// Groups committed and not yet on the medium.
    pub fn unapplied(&self) -> usize {
        self.records.iter().filter(|r| !r.applied).count()
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::*;
    use stics_link::group::{encode, Extent};

    fn core() -> Core {
        Core::new([1; 16], RING_START + 64 * BLOCK, 512, 1024, (RING_START, 1), &[], 1 << 20)
    }

    /// A group of noise (it does not compress) from source 9.
    fn grp(seq: u64, extents: &[Extent], fill: u8) -> Bytes {
        let raw: usize = extents.iter().filter(|e| e.kind == ExtentKind::Data).map(|e| e.blocks as usize * 512).sum();
        let head = GroupHead { source: [9; 16], seq, first_epoch: seq, last_epoch: seq, block_size: 512 };
        let data = stics_testkit::pattern::noise(u64::from(fill), raw);
        Bytes::from(encode(&head, extents, &data, 1).unwrap())
    }

    fn commit(c: &mut Core, g: Bytes) {
        let Take::New(checked) = c.check(&g, false).unwrap() else { panic!("new") };
        let len = BLOCK + (g.len() as u64).div_ceil(BLOCK) * BLOCK;
        let at = c.place(len).unwrap();
        let seq = c.next_seq();
        c.committed(seq, at, len, checked, &g);
    }

    #[test]
    fn reads_see_the_newest_committed_group_over_the_medium_until_it_is_applied() {
        let mut c = core();
        let d = |lba, blocks| Extent { lba, blocks, kind: ExtentKind::Data };
        commit(&mut c, grp(1, &[d(10, 4)], 1));
        commit(&mut c, grp(2, &[d(12, 4), Extent { lba: 20, blocks: 2, kind: ExtentKind::Discard }], 2));
        let p = c.read(8, 16);
        assert_eq!(p[0], Piece::Medium { lba: 8, blocks: 2 });
        assert!(matches!(&p[1], Piece::Group { raw: 0, len: 1024, .. }));
        assert!(matches!(&p[2], Piece::Group { raw: 0, len: 2048, .. }));
        assert_eq!(p[3], Piece::Medium { lba: 16, blocks: 4 });
        assert_eq!(p[4], Piece::Zero { blocks: 2 });
        assert!(c.overlaps(11, 1) && !c.overlaps(0, 10));
        let seq = c.next_apply().unwrap().seq;
        assert!(c.next_apply().is_none(), "one at a time");
        c.applied(seq);
        assert_eq!(c.read(10, 2), vec![Piece::Medium { lba: 10, blocks: 2 }]);
        assert!(matches!(&c.read(12, 1)[0], Piece::Group { .. }), "group 2 still wins there");
        assert_eq!(c.sources().next().map(|(_, s)| (s.committed_seq, s.applied_seq)), Some((2, 1)));
    }

    #[test]
    fn a_group_sent_again_is_taken_without_effect_one_ahead_of_its_turn_waits_and_one_past_the_medium_is_refused() {
        let mut c = core();
        let d = |lba, blocks| Extent { lba, blocks, kind: ExtentKind::Data };
        assert!(
            matches!(c.check(&grp(2, &[d(0, 1)], 1), false), Err(JournalError::Ahead { seq: 2, missing: 1 })),
            "a source's first group is its group 1"
        );
        for seq in 1..=5 {
            commit(&mut c, grp(seq, &[d(0, 1)], 1));
        }
        assert!(matches!(c.check(&grp(5, &[d(0, 1)], 1), false).unwrap(), Take::Again));
        assert!(
            matches!(c.check(&grp(7, &[d(0, 1)], 1), false), Err(JournalError::Ahead { seq: 7, missing: 6 })),
            "one past the next: it waits for group 6"
        );
        assert!(matches!(c.check(&grp(7, &[d(0, 1)], 1), true).unwrap(), Take::New(_)), "recovery takes any");
        assert!(
            matches!(c.check(&grp(4, &[d(0, 1)], 1), false), Err(JournalError::Refused(_))),
            "an older number: the sender lost track"
        );
        let mut other = grp(5, &[d(0, 1)], 1).to_vec();
        let head = GroupHead { source: [9; 16], seq: 5, first_epoch: 5, last_epoch: 7, block_size: 512 };
        other = encode(&head, &[d(0, 1)], &other[other.len() - 512..], 1).unwrap();
        assert!(
            matches!(c.check(&other, false), Err(JournalError::Refused(_))),
            "the same number for other epochs: refused, never taken as held"
        );
        assert!(matches!(c.check(&grp(6, &[d(0, 1)], 1), false).unwrap(), Take::New(_)));
        assert!(matches!(c.check(&grp(6, &[d(1020, 8)], 1), false), Err(JournalError::Refused(_))));
    }

    #[test]
    fn the_ring_s_head_stays_at_the_token_table_s_newest_copy_until_a_newer_one_is_written() {
        let mut c = core();
        let d = |lba, blocks| Extent { lba, blocks, kind: ExtentKind::Data };
        assert!(c.wants_snapshot(10), "no copy yet");
        let at = c.place(BLOCK * 2).unwrap();
        c.tokens_committed(c.next_seq(), at, BLOCK * 2, true);
        let copy = c.next_seq() - 1;
        assert!(!c.wants_snapshot(BLOCK) && !c.snapshot_due());
        for i in 1..=3 {
            commit(&mut c, grp(i, &[d(0, 8)], 0));
        }
        while let Some(a) = c.next_apply() {
            c.applied(a.seq);
        }
        let (_, head, _) = c.checkpoint();
        assert_eq!(head, copy, "every group is applied, but replay starts from the copy");
        c.checkpoint_durable(head);
        assert!(c.fill().0 > 0);
        assert!(c.snapshot_due(), "the records behind the copy use more than an eighth of the ring");
        let at = c.place(BLOCK * 2).unwrap();
        c.tokens_committed(c.next_seq(), at, BLOCK * 2, true);
        let (_, head, _) = c.checkpoint();
        assert_eq!(head, c.next_seq() - 1);
        c.checkpoint_durable(head);
        assert_eq!(c.fill().0, 2 * BLOCK, "only the new copy is live");
        assert!(!c.snapshot_due());
        let at = c.place(BLOCK).unwrap();
        c.tokens_committed(c.next_seq(), at, BLOCK, false);
        assert!(c.wants_snapshot(5 << 20), "replay would read more changes than a copy is worth");
    }

    #[test]
    fn ring_space_comes_back_only_behind_a_durable_checkpoint() {
        let mut c = core();
        let d = |lba, blocks| Extent { lba, blocks, kind: ExtentKind::Data };
        for i in 1..=7 {
            commit(&mut c, grp(i, &[d(0, 60)], 0));
        }
        assert!(c.place(8 * BLOCK + BLOCK).is_none(), "full");
        while let Some(a) = c.next_apply() {
            c.applied(a.seq);
        }
        assert!(c.place(16 * BLOCK).is_none(), "applied, but the checkpoint is not durable");
        let (_, head, _) = c.checkpoint();
        c.checkpoint_durable(head);
        assert_eq!(c.fill().0, 0);
        assert!(c.place(16 * BLOCK).is_some());
    }
}

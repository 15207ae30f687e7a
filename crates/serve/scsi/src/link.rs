//! The SG's side of the link's SCSI commands (see the `stics-link` crate): LINK WRITE pieces of
//! a group are staged per nexus and group, LINK COMMIT hands the whole group to the device's
//! [`stics_block::GroupSink`], LINK STATUS reads what it holds. Staging is bounded per logical
//! unit, whatever peers send: [`GROUPS_IN_FLIGHT`] groups per nexus (a group and the one after
//! it), at most [`STAGED_GROUPS`] groups' worth in all.
//!
//! A gateway may send the commit right behind its pieces, without waiting for their answers
//! (a round trip less per group): a commit that finds pieces of its group still missing waits
//! for them ([`Taken::Wait`]) as long as none of them failed, up to [`COMMIT_WAIT`].

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use stics_link::status::GROUPS_IN_FLIGHT;
use stics_sam::sense::Sense;

/// Largest groups staged at once on one logical unit (bytes: this many times the device's
/// largest group): one gateway's two in flight and another's. More nexuses staging at once
/// wait (BUSY) until a commit frees room.
pub const STAGED_GROUPS: u64 = 3;

/// Longest a LINK COMMIT waits for pieces of its group sent before it that have not arrived (a
/// piece beyond the first burst comes after an R2T, so after the commit's command).
pub const COMMIT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// One group in the making.
#[derive(Debug, Default)]
struct Staged {
    seq: u64,
    buf: Vec<u8>,
    /// Byte ranges written, sorted and merged.
    have: Vec<(u64, u64)>,
}

impl Staged {
    fn add(&mut self, from: u64, to: u64) {
        self.have.push((from, to));
        self.have.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(self.have.len());
        for &(a, b) in &self.have {
            match merged.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        self.have = merged;
    }

    fn holds(&self, len: u64) -> bool {
        len == 0 || self.have.first().is_some_and(|&(a, b)| a == 0 && b >= len)
    }
}

/// Drops the staged groups `gone` picks; returns the bytes they held.
fn drop_staged(groups: &mut Vec<Staged>, mut gone: impl FnMut(&Staged) -> bool) -> u64 {
    let mut freed = 0;
    groups.retain(|g| {
        let drop = gone(g);
        if drop {
            freed += g.buf.len() as u64;
        }
        !drop
    });
    freed
}

/// Why a link command failed, as the SCSI layer answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StageError {
    /// A CDB field out of bounds: CHECK CONDITION with this sense.
    Sense(Sense),
    /// No room to stage now: BUSY.
    Busy,
}

/// What a LINK COMMIT finds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Taken {
    /// The whole group, taken out of staging.
    Group(Bytes),
    /// Pieces of the group are missing and none failed: they may still be on their way.
    Wait,
}

/// The groups being staged on one logical unit, by nexus.
#[derive(Debug, Default)]
pub(crate) struct Staging {
    /// Each nexus's groups in the making, at most [`GROUPS_IN_FLIGHT`].
    by_nexus: HashMap<u64, Vec<Staged>>,
    bytes: u64,
    /// The groups (nexus, seq) a piece of which was refused since their last commit: that
    /// commit fails at once instead of waiting for the piece, and the gateway sends the group
    /// again.
    failed: HashSet<(u64, u64)>,
}

impl Staging {
    /// LINK WRITE: `data` is bytes `offset..` of group `seq`. A piece of a group this nexus is
    /// not staging starts it afresh, in place of a group out of the window of two around it, or
    /// of the older of two (the gateway sends a group again whole).
    pub(crate) fn write(
        &mut self,
        nexus: u64,
        seq: u64,
        offset: u32,
        data: &[u8],
        max_group: u32,
    ) -> Result<(), StageError> {
        let end = u64::from(offset) + data.len() as u64;
        if end > u64::from(max_group) {
            self.refused(nexus, seq);
            return Err(StageError::Sense(Sense::invalid_cdb_field(10, None)));
        }
        let budget = u64::from(max_group) * STAGED_GROUPS;
        let groups = self.by_nexus.entry(nexus).or_default();
        if !groups.iter().any(|g| g.seq == seq) {
            let window = u64::from(GROUPS_IN_FLIGHT);
            let mut freed = drop_staged(groups, |g| g.seq.abs_diff(seq) >= window);
            if groups.len() >= GROUPS_IN_FLIGHT as usize {
                groups.sort_unstable_by_key(|g| g.seq);
                freed += groups.remove(0).buf.len() as u64;
            }
            self.bytes -= freed;
            groups.push(Staged { seq, ..Staged::default() });
        }
        let Some(st) = groups.iter_mut().find(|g| g.seq == seq) else {
            return Err(StageError::Busy);
        };
        let grow = end.saturating_sub(st.buf.len() as u64);
        if self.bytes + grow > budget {
            self.refused(nexus, seq);
            return Err(StageError::Busy);
        }
        if grow > 0 {
            st.buf.resize(end as usize, 0);
            self.bytes += grow;
        }
        if let Some(dst) = st.buf.get_mut(offset as usize..end as usize) {
            dst.copy_from_slice(data);
        }
        st.add(u64::from(offset), end);
        Ok(())
    }

    /// LINK COMMIT: the first `len` bytes of group `seq`, when this nexus sent them all;
    /// [`Taken::Wait`] while some are missing but none was refused (with nothing staged for
    /// the group yet as well: its first piece may be the one on its way). A commit of a group
    /// out of the window behind the newest staged is out of sequence. Taking a group drops any
    /// older one of the nexus left staged.
    pub(crate) fn take(&mut self, nexus: u64, seq: u64, len: u32) -> Result<Taken, StageError> {
        let sequence_error = Err(StageError::Sense(Sense::command_sequence_error()));
        if self.failed.remove(&(nexus, seq)) {
            return sequence_error;
        }
        let groups = self.by_nexus.get_mut(&nexus);
        let Some(groups) = groups else {
            return if len > 0 { Ok(Taken::Wait) } else { sequence_error };
        };
        let Some(at) = groups.iter().position(|g| g.seq == seq) else {
            if groups.iter().any(|g| g.seq >= seq + u64::from(GROUPS_IN_FLIGHT)) || len == 0 {
                return sequence_error;
            }
            return Ok(Taken::Wait);
        };
        if !groups[at].holds(u64::from(len)) {
            return Ok(Taken::Wait);
        }
        let mut st = groups.remove(at);
        let freed = st.buf.len() as u64 + drop_staged(groups, |g| g.seq < seq);
        if groups.is_empty() {
            self.by_nexus.remove(&nexus);
        }
        self.bytes -= freed;
        st.buf.truncate(len as usize);
        Ok(Taken::Group(Bytes::from(st.buf)))
    }

    /// A commit gave up waiting for pieces of group `seq`: what it staged goes, so that the
    /// group sent again (or another under its number) never mixes with them.
    pub(crate) fn abandon(&mut self, nexus: u64, seq: u64) {
        if let Some(groups) = self.by_nexus.get_mut(&nexus) {
            self.bytes -= drop_staged(groups, |g| g.seq == seq);
            if groups.is_empty() {
                self.by_nexus.remove(&nexus);
            }
        }
    }

    /// A nexus is gone: what it staged goes.
    pub(crate) fn forget(&mut self, nexus: u64) {
        if let Some(groups) = self.by_nexus.remove(&nexus) {
            self.bytes -= groups.iter().map(|g| g.buf.len() as u64).sum::<u64>();
        }
        self.failed.retain(|(n, _)| *n != nexus);
    }

    /// A piece of `seq` was refused: what the nexus staged of it goes (the whole group comes
    /// again), and the group's commit fails.
    fn refused(&mut self, nexus: u64, seq: u64) {
        self.abandon(nexus, seq);
        self.failed.insert((nexus, seq));
    }

    #[cfg(test)]
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    fn group(t: Result<Taken, StageError>) -> Bytes {
        match t {
            Ok(Taken::Group(g)) => g,
            other => panic!("not a whole group: {other:?}"),
        }
    }

    const SEQUENCE_ERROR: Result<Taken, StageError> = Err(StageError::Sense(Sense::command_sequence_error()));

    #[test]
    fn pieces_in_any_order_make_the_group_and_a_commit_waits_for_a_missing_one() {
        let mut s = Staging::default();
        assert_eq!(s.take(1, 5, 8), Ok(Taken::Wait), "nothing staged yet: the pieces may be on their way");
        s.write(1, 5, 4, b"efgh", 64).unwrap();
        assert_eq!(s.take(1, 5, 8), Ok(Taken::Wait), "a gap: its piece may still come");
        s.write(1, 5, 0, b"abcd", 64).unwrap();
        assert_eq!(s.take(1, 3, 8), SEQUENCE_ERROR, "a group out of the window behind the one staged");
        assert_eq!(s.take(1, 4, 8), Ok(Taken::Wait), "the one before it: its pieces may be on their way");
        assert_eq!(s.take(1, 6, 8), Ok(Taken::Wait), "the one after it: staged beside it");
        assert_eq!(&group(s.take(1, 5, 8))[..], b"abcdefgh");
        assert_eq!(s.bytes(), 0);
        assert_eq!(s.take(1, 5, 0), SEQUENCE_ERROR, "a group is taken once");
    }

    #[test]
    fn a_refused_piece_fails_its_commit_at_once_and_the_group_sent_again_lands() {
        let mut s = Staging::default();
        s.write(1, 2, 0, &[1; 8], 64).unwrap();
        assert_eq!(s.write(1, 2, 60, &[0; 8], 64), Err(StageError::Sense(Sense::invalid_cdb_field(10, None))));
        assert_eq!(s.bytes(), 0, "what the nexus staged went with the refusal");
        assert_eq!(s.take(1, 2, 16), SEQUENCE_ERROR);
        s.write(2, 1, 0, &[0; 64], 64).unwrap();
        s.write(3, 1, 0, &[0; 64], 64).unwrap();
        s.write(3, 2, 0, &[0; 64], 64).unwrap();
        assert_eq!(s.write(1, 3, 0, &[0; 8], 64), Err(StageError::Busy));
        assert_eq!(s.take(1, 3, 8), SEQUENCE_ERROR, "a piece refused as busy is not waited for either");
        s.forget(2);
        s.write(1, 3, 0, &[7; 8], 64).unwrap();
        assert_eq!(&group(s.take(1, 3, 8))[..], &[7; 8], "the same group sent again whole lands");
    }

    #[test]
    fn a_nexus_stages_a_group_and_the_next_and_staging_stays_within_its_budget() {
        let mut s = Staging::default();
        s.write(1, 1, 0, &[1; 40], 64).unwrap();
        s.write(1, 2, 0, &[2; 8], 64).unwrap();
        assert_eq!(s.bytes(), 48, "group 2 is staged beside group 1");
        s.write(1, 1, 40, &[1; 8], 64).unwrap();
        assert_eq!(&group(s.take(1, 1, 48))[..], &[1; 48], "the pieces of both arrive in any order");
        s.write(1, 3, 0, &[3; 8], 64).unwrap();
        s.write(1, 4, 0, &[4; 8], 64).unwrap();
        assert_eq!(s.bytes(), 16, "group 4 took the place of group 2, two behind it");
        assert_eq!(s.take(1, 2, 8), SEQUENCE_ERROR, "its pieces are gone");
        assert_eq!(&group(s.take(1, 4, 8))[..], &[4; 8]);
        assert_eq!(s.bytes(), 0, "taking group 4 dropped the older group 3 left behind");
        s.write(2, 1, 0, &[0; 64], 64).unwrap();
        s.write(3, 1, 0, &[0; 64], 64).unwrap();
        s.write(3, 2, 0, &[0; 64], 64).unwrap();
        assert_eq!(s.write(4, 1, 0, &[0; 64], 64), Err(StageError::Busy), "three groups' worth in all");
        s.forget(3);
        assert_eq!(s.bytes(), 64);
        assert_eq!(s.take(4, 1, 64), SEQUENCE_ERROR, "its piece was refused as busy");
        s.write(4, 1, 0, &[0; 60], 64).unwrap();
        s.abandon(4, 1);
        assert_eq!(s.bytes(), 64, "an abandoned group's pieces go");
        assert_eq!(s.take(4, 1, 64), Ok(Taken::Wait), "and its commit waits for them again");
    }

    #[test]
    fn an_empty_group_needs_no_pieces() {
        let mut s = Staging::default();
        s.write(1, 9, 0, &[], 64).unwrap();
        assert!(group(s.take(1, 9, 0)).is_empty());
    }
}

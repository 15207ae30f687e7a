//! The SG's side of the link's SCSI commands (see the `stics-link` crate): LINK WRITE pieces of
//! a group are staged per nexus, LINK COMMIT hands the whole group to the device's
//! [`stics_block::GroupSink`], LINK STATUS reads what it holds. Staging is bounded per logical
//! unit, whatever peers send: one group per nexus, at most [`STAGED_GROUPS`] groups' worth in all.
//!
//! A gateway may send the commit right behind its pieces, without waiting for their answers
//! (a round trip less per group): a commit that finds pieces of its group still missing waits
//! for them ([`Taken::Wait`]) as long as none of them failed, up to [`COMMIT_WAIT`].

use std::collections::HashMap;

use bytes::Bytes;
use stics_sam::sense::Sense;

/// Largest groups staged at once on one logical unit (bytes: this many times the device's
/// largest group). A gateway sends one group at a time; more nexuses staging at once wait
/// (BUSY) until a commit frees room.
pub const STAGED_GROUPS: u64 = 2;

/// Longest a LINK COMMIT waits for pieces of its group sent before it that have not arrived (a
/// piece beyond the first burst comes after an R2T, so after the commit's command).
pub const COMMIT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// One nexus's group in the making.
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
    by_nexus: HashMap<u64, Staged>,
    bytes: u64,
    /// The group of each nexus a piece of which was refused since its last commit: that commit
    /// fails at once instead of waiting for the piece, and the gateway sends the group again.
    failed: HashMap<u64, u64>,
}

impl Staging {
    /// LINK WRITE: `data` is bytes `offset..` of group `seq`. A piece of another group than the
    /// one this nexus stages starts that group afresh (the gateway sends a group again whole).
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
        let st = self.by_nexus.entry(nexus).or_default();
        if st.seq != seq {
            self.bytes -= st.buf.len() as u64;
            *st = Staged { seq, ..Staged::default() };
        }
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
    /// the group yet, or an earlier group's pieces, as well: its first piece may be the one on
    /// its way). A commit of a group older than the one staged is out of sequence.
    pub(crate) fn take(&mut self, nexus: u64, seq: u64, len: u32) -> Result<Taken, StageError> {
        let sequence_error = Err(StageError::Sense(Sense::command_sequence_error()));
        if self.failed.get(&nexus) == Some(&seq) {
            self.failed.remove(&nexus);
            return sequence_error;
        }
        match self.by_nexus.get(&nexus) {
            Some(s) if s.seq == seq && s.holds(u64::from(len)) => {}
            Some(s) if s.seq == seq => return Ok(Taken::Wait),
            Some(s) if s.seq > seq => return sequence_error,
            _ if len > 0 => return Ok(Taken::Wait),
            _ => return sequence_error,
        }
        let Some(mut st) = self.by_nexus.remove(&nexus) else {
            return Err(StageError::Sense(Sense::command_sequence_error()));
        };
        self.bytes -= st.buf.len() as u64;
        st.buf.truncate(len as usize);
        Ok(Taken::Group(Bytes::from(st.buf)))
    }

    /// A nexus is gone: what it staged goes.
    pub(crate) fn forget(&mut self, nexus: u64) {
        if let Some(st) = self.by_nexus.remove(&nexus) {
            self.bytes -= st.buf.len() as u64;
        }
        self.failed.remove(&nexus);
    }

    /// A piece of `seq` was refused: what the nexus staged goes (the whole group comes again),
    /// and the group's commit fails.
    fn refused(&mut self, nexus: u64, seq: u64) {
        if let Some(st) = self.by_nexus.remove(&nexus) {
            self.bytes -= st.buf.len() as u64;
        }
        self.failed.insert(nexus, seq);
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
        assert_eq!(s.take(1, 4, 8), SEQUENCE_ERROR, "an older group than the one staged");
        assert_eq!(s.take(1, 6, 8), Ok(Taken::Wait), "a newer one: its pieces replace these");
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
        assert_eq!(s.write(1, 3, 0, &[0; 8], 64), Err(StageError::Busy));
        assert_eq!(s.take(1, 3, 8), SEQUENCE_ERROR, "a piece refused as busy is not waited for either");
        s.forget(2);
        s.write(1, 3, 0, &[7; 8], 64).unwrap();
        assert_eq!(&group(s.take(1, 3, 8))[..], &[7; 8], "the same group sent again whole lands");
    }

    #[test]
    fn a_new_group_starts_afresh_and_staging_stays_within_its_budget() {
        let mut s = Staging::default();
        s.write(1, 1, 0, &[1; 40], 64).unwrap();
        s.write(1, 2, 0, &[2; 8], 64).unwrap();
        assert_eq!(s.bytes(), 8, "the first group's bytes went with it");
        s.write(2, 1, 0, &[0; 64], 64).unwrap();
        assert_eq!(s.write(3, 1, 0, &[0; 64], 64), Err(StageError::Busy), "two groups' worth in all");
        s.forget(2);
        s.write(3, 1, 0, &[0; 64], 64).unwrap();
        assert_eq!(s.bytes(), 72);
    }

    #[test]
    fn an_empty_group_needs_no_pieces() {
        let mut s = Staging::default();
        s.write(1, 9, 0, &[], 64).unwrap();
        assert!(group(s.take(1, 9, 0)).is_empty());
    }
}

//! LINK STATUS: what the SG holds of each source (the newest group it took and the newest it
//! applied to its medium), how large a group it takes and how full its journal is. A gateway
//! reads it at start and after a lost connection to learn which epochs are already durable on
//! the SG.
//!
//! ```text
//!  header (32 B) │ sources (40 B each) │ lease (8 B, ms) │ features (8 B)   (SGs that keep tokens)
//! ```
//!
//! The lease and the features follow the sources, so that a reader that does not know them
//! stops before them; a reader finds none in an older SG's answer, or in one the allocation cut.

use crate::{be, field, need, u32_at, u64_at, LinkError};

const HEADER_LEN: usize = 32;
const ENTRY_LEN: usize = 40;
const TRAILER_LEN: usize = 16;

/// A feature bit: the SG takes [`crate::token::Msg::ReleaseAfter`] and `Hello`.
pub const FEATURE_RELEASE_AFTER: u64 = 1;

/// A feature bit: a LINK COMMIT waits for the pieces of its group that are still on their way,
/// so a gateway sends it right behind them instead of after their answers (a round trip less
/// per group).
pub const FEATURE_COMMIT_WAITS: u64 = 2;

/// A feature bit: the SG takes a source's groups strictly in sequence, and a group that comes
/// before its predecessor was taken waits for it (and fails with it), so a gateway may have
/// [`GROUPS_IN_FLIGHT`] out at once without one overtaking another.
pub const FEATURE_IN_ORDER: u64 = 4;

/// A feature bit: the SG takes [`crate::token::Msg::Want`] and sends the blocks it names with
/// the shared grant they wait for ([`crate::token::GrantData`]), a round trip less per read that
/// follows another gateway's writes.
pub const FEATURE_GRANT_DATA: u64 = 8;

/// Groups a gateway has out at once on an SG with [`FEATURE_IN_ORDER`]: the next one leaves
/// while the one before it is still on its way (a surrender of a token need not wait for the
/// group in flight to be answered).
pub const GROUPS_IN_FLIGHT: u32 = 2;

/// One source's groups on the SG.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceState {
    /// The gateway's log UUID.
    pub source: [u8; 16],
    /// The newest group durable in the SG's journal, and the newest epoch it held.
    pub committed_seq: u64,
    pub committed_epoch: u64,
    /// The newest group on the SG's medium.
    pub applied_seq: u64,
}

/// The SG's answer to LINK STATUS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// The link version it speaks.
    pub version: u32,
    /// The largest encoded group it takes.
    pub max_group: u32,
    /// Its journal's size and what is in use.
    pub journal_bytes: u64,
    pub journal_used: u64,
    /// The segment its coherence tokens cover, in bytes; 0 from an SG that keeps none.
    pub segment_bytes: u32,
    pub sources: Vec<SourceState>,
    /// How long its answers keep a gateway's tokens good, in milliseconds (past it, it may give
    /// a silent gateway's shared tokens to others); 0 when the answer does not say.
    pub lease_ms: u64,
    /// What it takes beyond the link's first version (`FEATURE_*` bits); 0 when it does not say.
    pub features: u64,
}

impl Status {
    /// The encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER_LEN + self.sources.len() * ENTRY_LEN);
        b.extend_from_slice(&self.version.to_be_bytes());
        b.extend_from_slice(&self.max_group.to_be_bytes());
        b.extend_from_slice(&self.journal_bytes.to_be_bytes());
        b.extend_from_slice(&self.journal_used.to_be_bytes());
        b.extend_from_slice(&(self.sources.len() as u32).to_be_bytes());
        // Reserved (zero) before SGs kept tokens, so older readers ignore it.
        b.extend_from_slice(&self.segment_bytes.to_be_bytes());
        for s in &self.sources {
            b.extend_from_slice(&s.source);
            for v in [s.committed_seq, s.committed_epoch, s.applied_seq] {
                b.extend_from_slice(&v.to_be_bytes());
            }
        }
        if self.lease_ms != 0 || self.features != 0 {
            b.extend_from_slice(&self.lease_ms.to_be_bytes());
            b.extend_from_slice(&self.features.to_be_bytes());
        }
        b
    }

    /// Reads an answer; a short one (the initiator's allocation cut it) keeps the sources
    /// that came whole.
    pub fn decode(b: &[u8]) -> Result<Status, LinkError> {
        need(b, HEADER_LEN)?;
        let count = u32_at(b, 24)? as usize;
        let whole = b.len().saturating_sub(HEADER_LEN) / ENTRY_LEN;
        let mut sources = Vec::with_capacity(count.min(whole));
        for i in 0..count.min(whole) {
            let at = HEADER_LEN + i * ENTRY_LEN;
            sources.push(SourceState {
                source: be(b, at)?,
                committed_seq: u64_at(b, at + 16)?,
                committed_epoch: u64_at(b, at + 24)?,
                applied_seq: u64_at(b, at + 32)?,
            });
        }
        let at = HEADER_LEN + count * ENTRY_LEN;
        let (lease_ms, features) =
            if whole >= count && b.len() >= at + TRAILER_LEN { (u64_at(b, at)?, u64_at(b, at + 8)?) } else { (0, 0) };
        let s = Status {
            version: u32_at(b, 0)?,
            max_group: u32_at(b, 4)?,
            journal_bytes: u64_at(b, 8)?,
            journal_used: u64_at(b, 16)?,
            segment_bytes: u32_at(b, 28)?,
            sources,
            lease_ms,
            features,
        };
        if s.version == 0 || s.max_group == 0 {
            return Err(field("status", "version and the largest group must not be zero"));
        }
        Ok(s)
    }

    /// What the SG holds of `source`.
    pub fn of(&self, source: &[u8; 16]) -> Option<SourceState> {
        self.sources.iter().find(|s| &s.source == source).copied()
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn a_status_round_trips_and_a_cut_one_keeps_its_whole_entries() {
        let s = Status {
            version: 1,
            max_group: 64 << 20,
            journal_bytes: 1 << 30,
            journal_used: 12345,
            segment_bytes: 64 << 10,
            sources: (0..3u8)
                .map(|i| SourceState {
                    source: [i; 16],
                    committed_seq: 10 + u64::from(i),
                    committed_epoch: 100,
                    applied_seq: 9,
                })
                .collect(),
            lease_ms: 30_000,
            features: FEATURE_RELEASE_AFTER,
        };
        let b = s.encode();
        assert_eq!(b.len(), HEADER_LEN + 3 * ENTRY_LEN + TRAILER_LEN);
        assert_eq!(b[b.len() - 16..b.len() - 8], 30_000u64.to_be_bytes());
        assert_eq!(b[b.len() - 8..], 1u64.to_be_bytes());
        assert_eq!(Status::decode(&b).unwrap(), s);
        let cut = Status::decode(&b[..HEADER_LEN + ENTRY_LEN + 5]).unwrap();
        assert_eq!(cut.sources.len(), 1);
        assert_eq!(cut.lease_ms, 0, "a cut answer says no lease");
        // An older SG's answer ends with its sources: no lease.
        let older = Status::decode(&b[..b.len() - TRAILER_LEN]).unwrap();
        assert_eq!(older, Status { lease_ms: 0, features: 0, ..s.clone() });
        assert_eq!(Status { lease_ms: 0, features: 0, ..s.clone() }.encode().len(), HEADER_LEN + 3 * ENTRY_LEN);
        // Part of the trailer is none of it.
        let part = Status::decode(&b[..b.len() - 3]).unwrap();
        assert_eq!((part.lease_ms, part.features), (0, 0));
        assert_eq!(s.of(&[2; 16]).map(|x| x.committed_seq), Some(12));
        assert!(Status::decode(&b[..10]).is_err());
    }
}

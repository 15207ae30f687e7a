//! The journal's on-disk format: a superblock (two alternating copies) that binds the journal to
//! its medium and holds the checkpoint (the oldest group not yet on the medium, and what the
//! medium holds of each source), and records, one committed group each, in a ring.
//!
//! ```text
//!  super A (4 KiB) │ super B (4 KiB) │ record seq n: header (4 KiB) │ group … │ record n+1 …
//! ```
//!
//! A record's header names the journal, its own sequence number and place, and the length and
//! CRC32C of the encoded group behind it (which carries its own checksums as well); a record
//! proves where it is, so bytes from an earlier lap of the ring are never taken for a group.

#![deny(clippy::unwrap_used, clippy::indexing_slicing)]

use crate::{JournalError, Result};

/// Alignment and unit of every journal write, and the size of one superblock copy or record
/// header.
pub const BLOCK: u64 = 4096;
/// Where the ring of records starts.
pub const RING_START: u64 = 2 * BLOCK;
/// Most sources the superblock keeps (gateways whose groups the SG took).
pub const MAX_SOURCES: usize = 96;

const SUPER_MAGIC: [u8; 8] = *b"STICSJSB";
const RECORD_MAGIC: [u8; 8] = *b"STICSJRC";
const VERSION: u16 = 1;
const SUPER_FIXED: usize = 88;
const SOURCE_LEN: usize = 40;

fn bad(field: &'static str, why: impl Into<String>) -> JournalError {
    JournalError::Format { field, why: why.into() }
}

fn le<const N: usize>(b: &[u8], at: usize) -> Result<[u8; N]> {
    let s = b.get(at..at + N).ok_or_else(|| bad("length", format!("{} bytes, {} needed", b.len(), at + N)))?;
    let mut out = [0u8; N];
    out.copy_from_slice(s);
    Ok(out)
}

fn u64_at(b: &[u8], at: usize) -> Result<u64> {
    le(b, at).map(u64::from_le_bytes)
}

fn u32_at(b: &[u8], at: usize) -> Result<u32> {
    le(b, at).map(u32::from_le_bytes)
}

/// CRC32C of `b` with the four bytes at 12..16 taken as zero.
fn crc(b: &[u8]) -> u32 {
    let head = b.get(..12).unwrap_or(b);
    let tail = b.get(16..).unwrap_or(&[]);
    crc32c::crc32c_append(crc32c::crc32c_append(crc32c::crc32c(head), &[0; 4]), tail)
}

fn check(b: &[u8], magic: [u8; 8], what: &'static str) -> Result<()> {
    if le::<8>(b, 0)? != magic {
        return Err(JournalError::Magic);
    }
    let version = u16::from_le_bytes(le(b, 8)?);
    if version != VERSION {
        return Err(bad("version", format!("{what} version {version}; this build reads {VERSION}")));
    }
    let (stored, computed) = (u32_at(b, 12)?, crc(b));
    if stored != computed {
        return Err(bad("checksum", format!("{what}: stored {stored:#010x}, computed {computed:#010x}")));
    }
    Ok(())
}

/// What the medium holds of one source, as of the checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceMark {
    pub source: [u8; 16],
    /// The newest group of the source applied to the medium.
    pub applied_seq: u64,
    /// The newest epoch that group held.
    pub applied_epoch: u64,
    /// The newest group committed (its record may still be live), kept so that a source whose
    /// records were all applied and freed is still known.
    pub committed_seq: u64,
}

/// The superblock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub uuid: [u8; 16],
    /// Written on every update; the valid copy with the higher one wins.
    pub generation: u64,
    /// Bytes of the journal device in use (the ring ends here).
    pub journal_bytes: u64,
    /// The medium it belongs to.
    pub medium_blocks: u64,
    pub block_size: u32,
    /// The oldest record not yet applied (or the next, when none is live).
    pub head_offset: u64,
    pub head_seq: u64,
    pub sources: Vec<SourceMark>,
}

impl Superblock {
    /// Where this generation's copy goes.
    pub fn copy_offset(&self) -> u64 {
        (self.generation % 2) * BLOCK
    }

    /// One [`BLOCK`] of bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(BLOCK as usize);
        b.extend_from_slice(&SUPER_MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&[0; 6]);
        b.extend_from_slice(&self.uuid);
        for v in [self.generation, self.journal_bytes, self.medium_blocks] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&self.block_size.to_le_bytes());
        let n = self.sources.len().min(MAX_SOURCES);
        b.extend_from_slice(&(n as u32).to_le_bytes());
        b.extend_from_slice(&self.head_offset.to_le_bytes());
        b.extend_from_slice(&self.head_seq.to_le_bytes());
        b.resize(SUPER_FIXED, 0);
        for s in self.sources.iter().take(n) {
            b.extend_from_slice(&s.source);
            for v in [s.applied_seq, s.applied_epoch, s.committed_seq] {
                b.extend_from_slice(&v.to_le_bytes());
            }
        }
        b.resize(BLOCK as usize, 0);
        let c = crc(&b);
        if let Some(slot) = b.get_mut(12..16) {
            slot.copy_from_slice(&c.to_le_bytes());
        }
        b
    }

    /// Reads one copy and checks it.
    pub fn decode(b: &[u8]) -> Result<Superblock> {
        let b = b.get(..BLOCK as usize).ok_or_else(|| bad("length", "short superblock"))?;
        check(b, SUPER_MAGIC, "superblock")?;
        let n = u32_at(b, 60)? as usize;
        if n > MAX_SOURCES {
            return Err(bad("sources", format!("{n} > {MAX_SOURCES}")));
        }
        let mut sources = Vec::with_capacity(n);
        for i in 0..n {
            let at = SUPER_FIXED + i * SOURCE_LEN;
            sources.push(SourceMark {
                source: le(b, at)?,
                applied_seq: u64_at(b, at + 16)?,
                applied_epoch: u64_at(b, at + 24)?,
                committed_seq: u64_at(b, at + 32)?,
            });
        }
        let sb = Superblock {
            uuid: le(b, 16)?,
            generation: u64_at(b, 32)?,
            journal_bytes: u64_at(b, 40)?,
            medium_blocks: u64_at(b, 48)?,
            block_size: u32_at(b, 56)?,
            head_offset: u64_at(b, 64)?,
            head_seq: u64_at(b, 72)?,
            sources,
        };
        let ring = RING_START..sb.journal_bytes;
        if sb.journal_bytes < RING_START + 2 * BLOCK || !sb.journal_bytes.is_multiple_of(BLOCK) {
            return Err(bad("journal_bytes", sb.journal_bytes.to_string()));
        }
        if !ring.contains(&sb.head_offset) || !sb.head_offset.is_multiple_of(BLOCK) {
            return Err(bad("head_offset", sb.head_offset.to_string()));
        }
        Ok(sb)
    }

    /// The copy in force: the valid one with the higher generation; copies of two different
    /// journals are refused.
    pub fn choose(a: &[u8], b: &[u8]) -> Result<Superblock> {
        match (Superblock::decode(a), Superblock::decode(b)) {
            (Ok(x), Ok(y)) if x.uuid == y.uuid => Ok(if y.generation > x.generation { y } else { x }),
            (Ok(_), Ok(_)) => Err(bad("uuid", "the two superblock copies belong to different journals")),
            (Ok(x), Err(_)) | (Err(_), Ok(x)) => Ok(x),
            (Err(e), Err(_)) => Err(e),
        }
    }
}

/// A record's header: one committed group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub uuid: [u8; 16],
    pub seq: u64,
    pub offset: u64,
    /// Bytes of the encoded group after the header.
    pub group_len: u64,
    pub group_crc: u32,
}

impl RecordHeader {
    /// Bytes the record takes on the journal.
    pub fn record_len(&self) -> u64 {
        BLOCK + self.group_len.div_ceil(BLOCK) * BLOCK
    }

    /// The header block followed by `group`, padded to [`BLOCK`].
    pub fn encode_record(&self, group: &[u8]) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.record_len() as usize);
        b.extend_from_slice(&RECORD_MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&[0; 6]);
        b.extend_from_slice(&self.uuid);
        for v in [self.seq, self.offset, self.group_len] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&self.group_crc.to_le_bytes());
        b.resize(BLOCK as usize, 0);
        let c = crc(&b);
        if let Some(slot) = b.get_mut(12..16) {
            slot.copy_from_slice(&c.to_le_bytes());
        }
        b.extend_from_slice(group);
        b.resize(self.record_len() as usize, 0);
        b
    }

    /// Reads a header block and checks it.
    pub fn decode(b: &[u8]) -> Result<RecordHeader> {
        let b = b.get(..BLOCK as usize).ok_or_else(|| bad("length", "short record header"))?;
        check(b, RECORD_MAGIC, "record")?;
        Ok(RecordHeader {
            uuid: le(b, 16)?,
            seq: u64_at(b, 32)?,
            offset: u64_at(b, 40)?,
            group_len: u64_at(b, 48)?,
            group_crc: u32_at(b, 56)?,
        })
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::*;

    fn sb(generation: u64) -> Superblock {
        Superblock {
            uuid: [3; 16],
            generation,
            journal_bytes: 1 << 20,
            medium_blocks: 4096,
            block_size: 512,
            head_offset: RING_START + BLOCK,
            head_seq: 5,
            sources: vec![SourceMark { source: [1; 16], applied_seq: 4, applied_epoch: 40, committed_seq: 6 }],
        }
    }

    #[test]
    fn superblocks_round_trip_and_the_newer_valid_copy_wins() {
        let (a, b) = (sb(7).encode(), sb(8).encode());
        assert_eq!(Superblock::decode(&a).unwrap(), sb(7));
        assert_eq!(Superblock::choose(&a, &b).unwrap().generation, 8);
        let mut torn = b.clone();
        torn[100] ^= 1;
        assert_eq!(Superblock::choose(&a, &torn).unwrap().generation, 7, "a torn copy leaves the other in force");
        assert!(Superblock::decode(&[0; 4096]).is_err());
    }

    #[test]
    fn records_round_trip_and_a_flip_is_refused() {
        let h = RecordHeader { uuid: [3; 16], seq: 9, offset: RING_START, group_len: 5000, group_crc: 77 };
        let r = h.encode_record(&[1; 5000]);
        assert_eq!(r.len() as u64, h.record_len());
        assert_eq!(h.record_len(), 3 * BLOCK);
        assert_eq!(RecordHeader::decode(&r).unwrap(), h);
        let mut bad = r.clone();
        bad[40] ^= 1;
        assert!(RecordHeader::decode(&bad).is_err());
    }
}

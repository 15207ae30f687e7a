//! The journal's on-disk format: a superblock (two alternating copies) that binds the journal to
//! its medium and holds the checkpoint (the oldest record the journal still needs, and what the
//! medium holds of each source), and records in a ring: each one committed group, or the lock
//! server's table (whole, or what changed since the record before).
//!
//! ```text
//!  super A (4 KiB) │ super B (4 KiB) │ record seq n: header (4 KiB) │ group … │ record n+1 …
//! ```
//!
//! A record's header names the journal, its own sequence number and place, and the length and
//! CRC32C of the encoded group behind it (which carries its own checksums as well); a record
//! proves where it is, so bytes from an earlier lap of the ring are never taken for a group.

#![deny(clippy::unwrap_used, clippy::indexing_slicing)]

use stics_coherence::server::Entry;
use stics_coherence::Gw;

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
/// Records are version 1; the superblock is version 2 since the ring may hold tokens records,
/// which an older build would take for the end of the chain (version 1 superblocks are read).
const RECORD_VERSION: u16 = 1;
const SUPER_VERSION: u16 = 2;
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

fn check(b: &[u8], magic: [u8; 8], what: &'static str, versions: std::ops::RangeInclusive<u16>) -> Result<()> {
    if le::<8>(b, 0)? != magic {
        return Err(JournalError::Magic);
    }
    let version = u16::from_le_bytes(le(b, 8)?);
    if !versions.contains(&version) {
        return Err(bad("version", format!("{what} version {version}; this build reads {versions:?}")));
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
        b.extend_from_slice(&SUPER_VERSION.to_le_bytes());
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
        check(b, SUPER_MAGIC, "superblock", 1..=SUPER_VERSION)?;
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

/// What a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// A committed group.
    Group,
    /// A [`TokenRecord`].
    Tokens,
}

/// A record's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub uuid: [u8; 16],
    pub seq: u64,
    pub offset: u64,
    /// Bytes of the body (an encoded group or token record) after the header.
    pub group_len: u64,
    pub group_crc: u32,
    pub kind: RecordKind,
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
        b.extend_from_slice(&RECORD_VERSION.to_le_bytes());
        b.extend_from_slice(&[0; 6]);
        b.extend_from_slice(&self.uuid);
        for v in [self.seq, self.offset, self.group_len] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&self.group_crc.to_le_bytes());
        // Zero in records written before tokens records existed: a group.
        let kind: u32 = match self.kind {
            RecordKind::Group => 0,
            RecordKind::Tokens => 1,
        };
        b.extend_from_slice(&kind.to_le_bytes());
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
        check(b, RECORD_MAGIC, "record", RECORD_VERSION..=RECORD_VERSION)?;
        let kind = match u32_at(b, 60)? {
            0 => RecordKind::Group,
            1 => RecordKind::Tokens,
            k => return Err(bad("kind", format!("record kind {k}"))),
        };
        Ok(RecordHeader {
            uuid: le(b, 16)?,
            seq: u64_at(b, 32)?,
            offset: u64_at(b, 40)?,
            group_len: u64_at(b, 48)?,
            group_crc: u32_at(b, 56)?,
            kind,
        })
    }
}

const TOKENS_MAGIC: [u8; 8] = *b"STICSJTK";
const TOKENS_VERSION: u16 = 1;
const TOKENS_FIXED: usize = 40;
const GATEWAY_LEN: usize = 20;
const UNTOLD_LEN: usize = 20;
const SEG_LEN: usize = 24;
const HOLDER_LEN: usize = 12;
/// A segment's holder count that says it is free.
const FREE: u32 = u32::MAX;
/// An exclusive holder's place when there is none.
const NOBODY: Gw = Gw::MAX;

/// The body of a tokens record: the lock server's table whole (a snapshot, which replay starts
/// from) or what changed since the record before it. The record header's CRC covers it.
///
/// ```text
///  magic "STICSJTK" │ version u16 │ flags u16 (1 snapshot, 2 untold) │ segment_bytes u32 │
///  next_gen u64 │ gateways u32 │ untold u32 │ segments u32 │ 0 u32 │
///  gateways × (source [16] │ gw u32) │ untold × (gw u32 │ seg u64 │ gen u64) │
///  segments × (seg u64 │ ew gw u32 (MAX: none) │ ew gen u64 │ shared n u32 (MAX: free) │
///              n × (gw u32 │ gen u64))
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenRecord {
    pub snapshot: bool,
    /// The segment the tokens cover.
    pub segment_bytes: u32,
    /// The generation counter a restore continues from.
    pub next_gen: u64,
    /// Gateways by source: every one in a snapshot, the new ones otherwise.
    pub gateways: Vec<([u8; 16], Gw)>,
    /// Broken tokens not yet acknowledged, when that list changed (always, in a snapshot).
    pub untold: Option<Vec<(Gw, u64, u64)>>,
    /// Segments' holders (`None`: free); every held one in a snapshot.
    pub segs: Vec<(u64, Option<Entry>)>,
}

impl TokenRecord {
    /// True when it says nothing a restore needs beyond its counter.
    pub fn is_empty(&self) -> bool {
        !self.snapshot && self.gateways.is_empty() && self.untold.is_none() && self.segs.is_empty()
    }

    /// Bytes of its encoding.
    pub fn encoded_len(&self) -> usize {
        TOKENS_FIXED
            + self.gateways.len() * GATEWAY_LEN
            + self.untold.as_ref().map_or(0, Vec::len) * UNTOLD_LEN
            + self.segs.iter().map(|(_, e)| SEG_LEN + e.as_ref().map_or(0, |e| e.sr.len()) * HOLDER_LEN).sum::<usize>()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.encoded_len());
        b.extend_from_slice(&TOKENS_MAGIC);
        b.extend_from_slice(&TOKENS_VERSION.to_le_bytes());
        let flags = u16::from(self.snapshot) | (u16::from(self.untold.is_some()) << 1);
        b.extend_from_slice(&flags.to_le_bytes());
        b.extend_from_slice(&self.segment_bytes.to_le_bytes());
        b.extend_from_slice(&self.next_gen.to_le_bytes());
        let untold: &[(Gw, u64, u64)] = self.untold.as_deref().unwrap_or(&[]);
        for n in [self.gateways.len(), untold.len(), self.segs.len(), 0] {
            b.extend_from_slice(&(n as u32).to_le_bytes());
        }
        for (source, gw) in &self.gateways {
            b.extend_from_slice(source);
            b.extend_from_slice(&gw.to_le_bytes());
        }
        for (gw, seg, gen) in untold {
            b.extend_from_slice(&gw.to_le_bytes());
            b.extend_from_slice(&seg.to_le_bytes());
            b.extend_from_slice(&gen.to_le_bytes());
        }
        for (seg, e) in &self.segs {
            b.extend_from_slice(&seg.to_le_bytes());
            let (ew_gw, ew_gen) = e.as_ref().and_then(|e| e.ew).unwrap_or((NOBODY, 0));
            b.extend_from_slice(&ew_gw.to_le_bytes());
            b.extend_from_slice(&ew_gen.to_le_bytes());
            let n = e.as_ref().map_or(FREE, |e| e.sr.len() as u32);
            b.extend_from_slice(&n.to_le_bytes());
            for (gw, gen) in e.iter().flat_map(|e| &e.sr) {
                b.extend_from_slice(&gw.to_le_bytes());
                b.extend_from_slice(&gen.to_le_bytes());
            }
        }
        b
    }

    /// Reads a body, every count checked against its length before anything is allocated.
    pub fn decode(b: &[u8]) -> Result<TokenRecord> {
        if le::<8>(b, 0)? != TOKENS_MAGIC {
            return Err(JournalError::Magic);
        }
        let version = u16::from_le_bytes(le(b, 8)?);
        if version != TOKENS_VERSION {
            return Err(bad("version", format!("tokens record version {version}; this build reads {TOKENS_VERSION}")));
        }
        let flags = u16::from_le_bytes(le(b, 10)?);
        if flags & !3 != 0 {
            return Err(bad("flags", format!("{flags:#x}")));
        }
        let (n_gw, n_untold, n_segs) = (u32_at(b, 24)? as usize, u32_at(b, 28)? as usize, u32_at(b, 32)? as usize);
        if u32_at(b, 36)? != 0 {
            return Err(bad("reserved", "not zero"));
        }
        let fixed = n_gw.saturating_mul(GATEWAY_LEN).saturating_add(n_untold.saturating_mul(UNTOLD_LEN));
        if TOKENS_FIXED.saturating_add(fixed).saturating_add(n_segs.saturating_mul(SEG_LEN)) > b.len() {
            return Err(bad(
                "length",
                format!("{} bytes for {n_gw} gateways, {n_untold} broken, {n_segs} segments", b.len()),
            ));
        }
        let mut at = TOKENS_FIXED;
        let mut gateways = Vec::with_capacity(n_gw);
        for _ in 0..n_gw {
            gateways.push((le(b, at)?, u32_at(b, at + 16)?));
            at += GATEWAY_LEN;
        }
        let mut untold = Vec::with_capacity(n_untold);
        for _ in 0..n_untold {
            untold.push((u32_at(b, at)?, u64_at(b, at + 4)?, u64_at(b, at + 12)?));
            at += UNTOLD_LEN;
        }
        let mut segs = Vec::with_capacity(n_segs);
        for _ in 0..n_segs {
            let seg = u64_at(b, at)?;
            let ew = match (u32_at(b, at + 8)?, u64_at(b, at + 12)?) {
                (NOBODY, 0) => None,
                (NOBODY, gen) => {
                    return Err(bad("segment", format!("segment {seg}: generation {gen} without a holder")))
                }
                (gw, gen) => Some((gw, gen)),
            };
            let n = u32_at(b, at + 20)?;
            at += SEG_LEN;
            if n == FREE {
                if ew.is_some() {
                    return Err(bad("segment", format!("segment {seg} is free and held")));
                }
                segs.push((seg, None));
                continue;
            }
            let n = n as usize;
            if at.saturating_add(n.saturating_mul(HOLDER_LEN)) > b.len() {
                return Err(bad("length", format!("segment {seg} has {n} shared holders past the end")));
            }
            let mut sr = Vec::with_capacity(n);
            for _ in 0..n {
                sr.push((u32_at(b, at)?, u64_at(b, at + 4)?));
                at += HOLDER_LEN;
            }
            segs.push((seg, Some(Entry { seg, ew, sr })));
        }
        if at != b.len() {
            return Err(bad("length", format!("{} bytes after the table", b.len() - at)));
        }
        Ok(TokenRecord {
            snapshot: flags & 1 != 0,
            segment_bytes: u32_at(b, 12)?,
            next_gen: u64_at(b, 16)?,
            gateways,
            untold: (flags & 2 != 0).then_some(untold),
            segs,
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
        let h = RecordHeader {
            uuid: [3; 16],
            seq: 9,
            offset: RING_START,
            group_len: 5000,
            group_crc: 77,
            kind: RecordKind::Group,
        };
        let r = h.encode_record(&[1; 5000]);
        assert_eq!(r.len() as u64, h.record_len());
        assert_eq!(h.record_len(), 3 * BLOCK);
        assert_eq!(RecordHeader::decode(&r).unwrap(), h);
        let mut bad = r.clone();
        bad[40] ^= 1;
        assert!(RecordHeader::decode(&bad).is_err());
    }

    fn table() -> TokenRecord {
        TokenRecord {
            snapshot: true,
            segment_bytes: 64 << 10,
            next_gen: 41,
            gateways: vec![([7; 16], 0), ([8; 16], 1)],
            untold: Some(vec![(1, 12, 30)]),
            segs: vec![
                (3, Some(Entry { seg: 3, ew: Some((0, 40)), sr: vec![] })),
                (4, Some(Entry { seg: 4, ew: None, sr: vec![(0, 38), (1, 39)] })),
                (9, None),
            ],
        }
    }

    #[test]
    fn a_tokens_record_has_these_bytes_and_round_trips() {
        let t = table();
        let b = t.encode();
        assert_eq!(b.len(), t.encoded_len());
        assert_eq!(&b[..16], b"STICSJTK\x01\x00\x03\x00\x00\x00\x01\x00");
        assert_eq!(&b[16..40], &[41, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0]);
        // Segment 9 is free: no exclusive holder, and the shared count says so.
        let free = &b[b.len() - SEG_LEN..];
        assert_eq!(&free[8..12], &[0xff; 4]);
        assert_eq!(&free[20..24], &[0xff; 4]);
        assert_eq!(TokenRecord::decode(&b).unwrap(), t);
        let delta = TokenRecord { snapshot: false, untold: None, ..table() };
        assert_eq!(TokenRecord::decode(&delta.encode()).unwrap(), delta);
        assert!(TokenRecord { snapshot: false, segment_bytes: 1, next_gen: 5, ..Default::default() }.is_empty());
    }

    #[test]
    fn a_damaged_tokens_record_is_refused_without_allocating_what_it_claims() {
        let b = table().encode();
        for cut in 0..b.len() {
            assert!(TokenRecord::decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        let mut huge = b.clone();
        huge[32..36].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(TokenRecord::decode(&huge).is_err());
        let mut holders = b.clone();
        // The shared count of segment 4, the second segment entry.
        let at = TOKENS_FIXED + 2 * GATEWAY_LEN + UNTOLD_LEN + SEG_LEN + 20;
        holders[at..at + 4].copy_from_slice(&(u32::MAX - 1).to_le_bytes());
        assert!(TokenRecord::decode(&holders).is_err());
        let mut flags = b.clone();
        flags[10] = 4;
        assert!(TokenRecord::decode(&flags).is_err());
        let mut longer = b;
        longer.push(0);
        assert!(TokenRecord::decode(&longer).is_err());
    }

    #[test]
    fn a_record_of_an_unknown_kind_is_refused_and_a_version_1_superblock_is_read() {
        let h = RecordHeader {
            uuid: [3; 16],
            seq: 1,
            offset: RING_START,
            group_len: 1,
            group_crc: 0,
            kind: RecordKind::Tokens,
        };
        let r = h.encode_record(&[0]);
        assert_eq!(RecordHeader::decode(&r).unwrap().kind, RecordKind::Tokens);
        let mut unknown = r[..BLOCK as usize].to_vec();
        unknown[60] = 7;
        let c = crc(&unknown);
        unknown[12..16].copy_from_slice(&c.to_le_bytes());
        assert!(RecordHeader::decode(&unknown).is_err());
        let mut v1 = sb(3).encode();
        v1[8] = 1;
        let c = crc(&v1);
        v1[12..16].copy_from_slice(&c.to_le_bytes());
        assert_eq!(Superblock::decode(&v1).unwrap(), sb(3));
        v1[8] = 3;
        let c = crc(&v1);
        v1[12..16].copy_from_slice(&c.to_le_bytes());
        assert!(Superblock::decode(&v1).is_err(), "a newer superblock is refused");
    }
}

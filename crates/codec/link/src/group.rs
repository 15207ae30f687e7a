//! A group: whole epochs `first_epoch..=last_epoch` of one source (a gateway's log), as the SG
//! takes them in one step. Last write wins per block and neighbours are coalesced before
//! encoding, so the extents are sorted and never overlap; the data extents' blocks follow each
//! other in one raw stream, cut into chunks that are zstd-compressed or, when that does not pay,
//! stored raw.
//!
//! ```text
//!  header (88 B) │ extents (16 B each) │ chunks (12 B each) │ payload (the chunks' bytes)
//!  magic, version, header CRC over the three tables; source, group sequence, epochs, block
//!  size, counts, raw and payload lengths, payload CRC
//! ```
//!
//! A gateway that shares its LUN with others (coherence tokens, [`crate::token`]) sends version
//! 2: the header grows by the segment size and a count (96 B), and a table of the generation of
//! the exclusive token each segment the group writes was written under (16 B each: segment,
//! generation; in segment order, every segment the extents touch and no other) follows the
//! chunks. The header CRC covers it; the SG refuses the group when any of them is not the
//! segment's token now (the fence).

use crate::{be, field, need, u32_at, u64_at, LinkError};

const MAGIC: [u8; 8] = *b"STICSGRP";
const VERSION: u16 = 1;
const VERSION_FENCED: u16 = 2;
const HEADER_LEN: usize = 88;
const FENCED_HEADER_LEN: usize = 96;
const FENCE_LEN: usize = 16;
const EXTENT_LEN: usize = 16;
const CHUNK_LEN: usize = 12;

/// Raw bytes per chunk: a read of a block still in the SG's journal decompresses at most this.
pub const CHUNK_BYTES: usize = 1 << 20;

/// What an extent's blocks hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtentKind {
    /// Host data: `blocks` blocks of the raw stream.
    Data,
    /// Written with zeros.
    Zero,
    /// Discarded: reads as zeros.
    Discard,
}

impl ExtentKind {
    fn code(self) -> u8 {
        match self {
            ExtentKind::Data => 1,
            ExtentKind::Zero => 2,
            ExtentKind::Discard => 3,
        }
    }

    fn from_code(c: u8) -> Option<ExtentKind> {
        match c {
            1 => Some(ExtentKind::Data),
            2 => Some(ExtentKind::Zero),
            3 => Some(ExtentKind::Discard),
            _ => None,
        }
    }
}

/// A run of blocks the group writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub lba: u64,
    pub blocks: u32,
    pub kind: ExtentKind,
}

/// Who sent a group and what it stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupHead {
    /// The source: the gateway's log UUID.
    pub source: [u8; 16],
    /// Its place in the source's sequence (1, 2, …): the SG takes each once, in order.
    pub seq: u64,
    /// The epochs it holds, whole.
    pub first_epoch: u64,
    pub last_epoch: u64,
    /// Block size of the LUN.
    pub block_size: u32,
}

/// The generations of the exclusive tokens a group's writes were made under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fences {
    /// The segment the tokens cover, in bytes.
    pub segment_bytes: u32,
    /// (segment, generation) for every segment the group writes, in segment order.
    pub gens: Vec<(u64, u64)>,
}

/// The segments `extents` touch, in order, each once, for segments of `segment_bytes`.
pub fn segments_touched(extents: &[Extent], block_size: u32, segment_bytes: u32) -> impl Iterator<Item = u64> + '_ {
    let per = (u64::from(segment_bytes) / u64::from(block_size.max(1))).max(1);
    let mut last: Option<u64> = None;
    extents.iter().flat_map(move |e| (e.lba / per)..=((e.lba + u64::from(e.blocks).max(1) - 1) / per)).filter(
        move |s| {
            let new = last != Some(*s);
            last = Some(*s);
            new
        },
    )
}

fn check_fences(f: &Fences, block_size: u32, extents: &[Extent]) -> Result<(), LinkError> {
    let b = f.segment_bytes;
    if !(32 << 10..=256 << 10).contains(&b) || !b.is_power_of_two() || b < block_size {
        return Err(field("segment_bytes", format!("{b} is not a power of two from 32 KiB to 256 KiB")));
    }
    let mut touched = segments_touched(extents, block_size, b);
    for (i, &(seg, _)) in f.gens.iter().enumerate() {
        if touched.next() != Some(seg) {
            return Err(field("fences", format!("entry {i} names segment {seg}, not the next one the group writes")));
        }
    }
    if let Some(seg) = touched.next() {
        return Err(field("fences", format!("segment {seg} is written without a token generation")));
    }
    Ok(())
}

/// How one chunk of the raw stream is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// zstd-compressed (else raw).
    pub compressed: bool,
    /// Where its raw bytes start in the raw stream, and how many.
    pub raw_offset: u64,
    pub raw_len: u32,
    /// Where its stored bytes start in the payload, and how many.
    pub stored_offset: u64,
    pub stored_len: u32,
}

/// What encoding a group produced, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sizes {
    /// Bytes of data extents.
    pub raw: u64,
    /// Bytes of the whole encoded group.
    pub encoded: u64,
}

/// Encodes a group. `extents` must be sorted, non-overlapping and of at least one block each;
/// `data` holds the data extents' blocks in order. zstd runs at `level` (0: zstd's default);
/// a chunk that does not shrink by at least 1/64 is stored raw.
pub fn encode(head: &GroupHead, extents: &[Extent], data: &[u8], level: i32) -> Result<Vec<u8>, LinkError> {
    encode_fenced(head, extents, data, level, None)
}

/// Encodes a group as [`encode`] does, with the token generations its writes were made under
/// when there are some (version 2).
pub fn encode_fenced(
    head: &GroupHead,
    extents: &[Extent],
    data: &[u8],
    level: i32,
    fences: Option<&Fences>,
) -> Result<Vec<u8>, LinkError> {
    check_head(head)?;
    check_extents(extents)?;
    if let Some(f) = fences {
        check_fences(f, head.block_size, extents)?;
    }
    let bs = u64::from(head.block_size);
    let raw_len: u64 = extents.iter().filter(|e| e.kind == ExtentKind::Data).map(|e| u64::from(e.blocks) * bs).sum();
    if raw_len != data.len() as u64 {
        return Err(field("data", format!("{} bytes for {raw_len} bytes of data extents", data.len())));
    }
    let mut chunks: Vec<(bool, u32, Vec<u8>)> = Vec::new();
    for piece in data.chunks(CHUNK_BYTES) {
        let packed = zstd::bulk::compress(piece, level)
            .map_err(|e| LinkError::Compression { chunk: chunks.len(), why: e.to_string() })?;
        if packed.len() + piece.len() / 64 < piece.len() {
            chunks.push((true, piece.len() as u32, packed));
        } else {
            chunks.push((false, piece.len() as u32, piece.to_vec()));
        }
    }
    let (version, header) = if fences.is_some() { (VERSION_FENCED, FENCED_HEADER_LEN) } else { (VERSION, HEADER_LEN) };
    let fence_count = fences.map_or(0, |f| f.gens.len());
    let tables = header + extents.len() * EXTENT_LEN + chunks.len() * CHUNK_LEN + fence_count * FENCE_LEN;
    let payload_len: usize = chunks.iter().map(|c| c.2.len()).sum();
    let mut out = Vec::with_capacity(tables + payload_len);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&version.to_be_bytes());
    out.extend_from_slice(&0u16.to_be_bytes());
    out.extend_from_slice(&0u32.to_be_bytes()); // header CRC, filled in below
    out.extend_from_slice(&head.source);
    for v in [head.seq, head.first_epoch, head.last_epoch] {
        out.extend_from_slice(&v.to_be_bytes());
    }
    out.extend_from_slice(&head.block_size.to_be_bytes());
    out.extend_from_slice(&(extents.len() as u32).to_be_bytes());
    out.extend_from_slice(&raw_len.to_be_bytes());
    out.extend_from_slice(&(payload_len as u64).to_be_bytes());
    out.extend_from_slice(&(chunks.len() as u32).to_be_bytes());
    let payload_crc = chunks.iter().fold(0u32, |c, (_, _, b)| crc32c::crc32c_append(c, b));
    out.extend_from_slice(&payload_crc.to_be_bytes());
    if let Some(f) = fences {
        out.extend_from_slice(&f.segment_bytes.to_be_bytes());
        out.extend_from_slice(&(f.gens.len() as u32).to_be_bytes());
    }
    for e in extents {
        out.extend_from_slice(&e.lba.to_be_bytes());
        out.extend_from_slice(&e.blocks.to_be_bytes());
        out.extend_from_slice(&[e.kind.code(), 0, 0, 0]);
    }
    for (compressed, raw, stored) in &chunks {
        out.extend_from_slice(&[u8::from(*compressed), 0, 0, 0]);
        out.extend_from_slice(&raw.to_be_bytes());
        out.extend_from_slice(&(stored.len() as u32).to_be_bytes());
    }
    for (seg, gen) in fences.map(|f| f.gens.as_slice()).unwrap_or_default() {
        out.extend_from_slice(&seg.to_be_bytes());
        out.extend_from_slice(&gen.to_be_bytes());
    }
    let crc = crc32c::crc32c(&out);
    if let Some(slot) = out.get_mut(12..16) {
        slot.copy_from_slice(&crc.to_be_bytes());
    }
    for (_, _, stored) in chunks {
        out.extend_from_slice(&stored);
    }
    Ok(out)
}

fn check_head(head: &GroupHead) -> Result<(), LinkError> {
    if !(512..=65536).contains(&head.block_size) || !head.block_size.is_power_of_two() {
        return Err(field("block_size", format!("{} is not a power of two in 512..=65536", head.block_size)));
    }
    if head.seq == 0 || head.first_epoch > head.last_epoch {
        return Err(field("seq", format!("seq {} with epochs {}..={}", head.seq, head.first_epoch, head.last_epoch)));
    }
    Ok(())
}

fn check_extents(extents: &[Extent]) -> Result<(), LinkError> {
    let mut end = 0u64;
    for (i, e) in extents.iter().enumerate() {
        let Some(stop) = e.lba.checked_add(u64::from(e.blocks)).filter(|_| e.blocks > 0) else {
            return Err(field("extent", format!("extent {i} at {} of {} blocks", e.lba, e.blocks)));
        };
        if i > 0 && e.lba < end {
            return Err(field("extent", format!("extent {i} at {} overlaps or precedes the one before", e.lba)));
        }
        end = stop;
    }
    Ok(())
}

/// The raw bytes of chunk `i` of a payload described by `chunks`.
pub fn chunk_of(chunks: &[Chunk], payload: &[u8], i: usize) -> Result<Vec<u8>, LinkError> {
    let c = chunks.get(i).ok_or_else(|| field("chunk", format!("no chunk {i}")))?;
    let from = c.stored_offset as usize;
    let stored = payload.get(from..from + c.stored_len as usize).ok_or_else(|| field("chunk", "out of the payload"))?;
    if !c.compressed {
        return Ok(stored.to_vec());
    }
    let raw = zstd::bulk::decompress(stored, c.raw_len as usize)
        .map_err(|e| LinkError::Compression { chunk: i, why: e.to_string() })?;
    if raw.len() != c.raw_len as usize {
        return Err(LinkError::Compression { chunk: i, why: format!("{} bytes, not {}", raw.len(), c.raw_len) });
    }
    Ok(raw)
}

/// `len` raw bytes from raw offset `offset` of a payload described by `chunks`, decompressing
/// only the chunks they lie in.
pub fn read_raw(chunks: &[Chunk], payload: &[u8], offset: u64, len: usize) -> Result<Vec<u8>, LinkError> {
    let raw_len = chunks.last().map_or(0, |c| c.raw_offset + u64::from(c.raw_len));
    let end = offset.checked_add(len as u64).filter(|e| *e <= raw_len);
    let Some(end) = end else { return Err(field("raw range", format!("{offset}+{len} past {raw_len}"))) };
    let mut out = Vec::with_capacity(len);
    for (i, c) in chunks.iter().enumerate() {
        let (c_start, c_end) = (c.raw_offset, c.raw_offset + u64::from(c.raw_len));
        if c_end <= offset || c_start >= end {
            continue;
        }
        let raw = chunk_of(chunks, payload, i)?;
        let from = (offset.max(c_start) - c_start) as usize;
        let to = (end.min(c_end) - c_start) as usize;
        out.extend_from_slice(raw.get(from..to).ok_or_else(|| field("raw range", "chunk short"))?);
    }
    Ok(out)
}

/// A group read back and checked, without decompressing its data.
#[derive(Debug, Clone)]
pub struct GroupView<'a> {
    pub head: GroupHead,
    pub extents: Vec<Extent>,
    pub chunks: Vec<Chunk>,
    /// Bytes of data extents.
    pub raw_len: u64,
    /// The token generations its writes were made under (version 2 only).
    pub fences: Option<Fences>,
    /// Bytes before the payload.
    tables: usize,
    payload: &'a [u8],
}

/// The group's head alone, from its first bytes (at least the fixed header): magic, version,
/// fields; the checksums need the whole group ([`parse`]).
pub fn peek(bytes: &[u8]) -> Result<GroupHead, LinkError> {
    need(bytes, HEADER_LEN)?;
    if be::<8>(bytes, 0)? != MAGIC {
        return Err(LinkError::Magic);
    }
    let version = u16::from_be_bytes(be(bytes, 8)?);
    if version != VERSION && version != VERSION_FENCED {
        return Err(LinkError::Version(version));
    }
    let head = GroupHead {
        source: be(bytes, 16)?,
        seq: u64_at(bytes, 32)?,
        first_epoch: u64_at(bytes, 40)?,
        last_epoch: u64_at(bytes, 48)?,
        block_size: u32_at(bytes, 56)?,
    };
    check_head(&head)?;
    Ok(head)
}

/// Reads a whole encoded group and checks it: both checksums, the tables against each other
/// and against the bytes present, and its data against `max_raw` (the reader's bound on what
/// one group may expand to) before anything is decompressed.
pub fn parse(bytes: &[u8], max_raw: u64) -> Result<GroupView<'_>, LinkError> {
    let head = peek(bytes)?;
    let fenced = u16::from_be_bytes(be(bytes, 8)?) == VERSION_FENCED;
    let extent_count = u32_at(bytes, 60)? as usize;
    let raw_len = u64_at(bytes, 64)?;
    let payload_len = u64_at(bytes, 72)?;
    let chunk_count = u32_at(bytes, 80)? as usize;
    let payload_crc = u32_at(bytes, 84)?;
    let (header, segment_bytes, fence_count) =
        if fenced { (FENCED_HEADER_LEN, u32_at(bytes, 88)?, u32_at(bytes, 92)? as usize) } else { (HEADER_LEN, 0, 0) };
    let tables = extent_count
        .checked_mul(EXTENT_LEN)
        .and_then(|x| chunk_count.checked_mul(CHUNK_LEN).and_then(|y| x.checked_add(y)))
        .and_then(|x| fence_count.checked_mul(FENCE_LEN).and_then(|y| x.checked_add(y)))
        .and_then(|x| x.checked_add(header))
        .ok_or_else(|| field("counts", "overflow"))?;
    need(bytes, tables)?;
    let total = (tables as u64).checked_add(payload_len).ok_or_else(|| field("payload_len", "overflow"))?;
    if bytes.len() as u64 != total {
        return Err(field("payload_len", format!("{} bytes for a group of {total}", bytes.len())));
    }
    let (table_bytes, payload) = bytes.split_at(tables);
    let stored_crc = u32_at(table_bytes, 12)?;
    let mut zeroed = table_bytes.to_vec();
    if let Some(slot) = zeroed.get_mut(12..16) {
        slot.fill(0);
    }
    let computed = crc32c::crc32c(&zeroed);
    if stored_crc != computed {
        return Err(LinkError::Checksum { what: "header", stored: stored_crc, computed });
    }
    let computed = crc32c::crc32c(payload);
    if payload_crc != computed {
        return Err(LinkError::Checksum { what: "payload", stored: payload_crc, computed });
    }
    if raw_len > max_raw {
        return Err(field("raw_len", format!("{raw_len} bytes of data, more than the {max_raw} this side takes")));
    }
    let mut extents = Vec::with_capacity(extent_count);
    for i in 0..extent_count {
        let at = header + i * EXTENT_LEN;
        let kind = table_bytes.get(at + 12).copied().and_then(ExtentKind::from_code);
        let Some(kind) = kind else { return Err(field("extent kind", format!("extent {i}"))) };
        extents.push(Extent { lba: u64_at(table_bytes, at)?, blocks: u32_at(table_bytes, at + 8)?, kind });
    }
    check_extents(&extents)?;
    let bs = u64::from(head.block_size);
    let data: u64 = extents.iter().filter(|e| e.kind == ExtentKind::Data).map(|e| u64::from(e.blocks) * bs).sum();
    if data != raw_len {
        return Err(field("raw_len", format!("{raw_len} bytes for {data} bytes of data extents")));
    }
    let mut chunks = Vec::with_capacity(chunk_count);
    let (mut raw_at, mut stored_at) = (0u64, 0u64);
    for i in 0..chunk_count {
        let at = header + extent_count * EXTENT_LEN + i * CHUNK_LEN;
        let compressed = match table_bytes.get(at) {
            Some(0) => false,
            Some(1) => true,
            _ => return Err(field("chunk codec", format!("chunk {i}"))),
        };
        let raw = u32_at(table_bytes, at + 4)?;
        let stored = u32_at(table_bytes, at + 8)?;
        if raw == 0 || raw as usize > CHUNK_BYTES || (!compressed && stored != raw) {
            return Err(field("chunk", format!("chunk {i}: {raw} raw bytes stored in {stored}")));
        }
        chunks.push(Chunk {
            compressed,
            raw_offset: raw_at,
            raw_len: raw,
            stored_offset: stored_at,
            stored_len: stored,
        });
        raw_at += u64::from(raw);
        stored_at += u64::from(stored);
    }
    if raw_at != raw_len || stored_at != payload_len {
        return Err(field(
            "chunks",
            format!("{raw_at} raw and {stored_at} stored bytes against {raw_len} and {payload_len}"),
        ));
    }
    let fences = if fenced {
        let at = header + extent_count * EXTENT_LEN + chunk_count * CHUNK_LEN;
        let gens = (0..fence_count)
            .map(|i| Ok((u64_at(table_bytes, at + i * FENCE_LEN)?, u64_at(table_bytes, at + i * FENCE_LEN + 8)?)))
            .collect::<Result<Vec<_>, LinkError>>()?;
        let f = Fences { segment_bytes, gens };
        check_fences(&f, head.block_size, &extents)?;
        Some(f)
    } else {
        None
    };
    Ok(GroupView { head, extents, chunks, raw_len, fences, tables, payload })
}

impl GroupView<'_> {
    /// The raw bytes of chunk `i`.
    pub fn chunk(&self, i: usize) -> Result<Vec<u8>, LinkError> {
        chunk_of(&self.chunks, self.payload, i)
    }

    /// `len` raw bytes from raw offset `offset`, decompressing only the chunks they lie in.
    pub fn raw_range(&self, offset: u64, len: usize) -> Result<Vec<u8>, LinkError> {
        read_raw(&self.chunks, self.payload, offset, len)
    }

    /// Where the payload starts in the encoded group: a reader that keeps the group's bytes and
    /// its chunk table reads its data later with [`read_raw`] on what follows.
    pub fn payload_offset(&self) -> usize {
        self.tables
    }

    /// All the data, decompressed.
    pub fn data(&self) -> Result<Vec<u8>, LinkError> {
        self.raw_range(0, self.raw_len as usize)
    }

    /// Each extent with where its blocks start in the raw stream (data extents only carry one).
    pub fn placed(&self) -> Vec<(Extent, Option<u64>)> {
        let bs = u64::from(self.head.block_size);
        let mut at = 0u64;
        self.extents
            .iter()
            .map(|e| {
                if e.kind == ExtentKind::Data {
                    let here = at;
                    at += u64::from(e.blocks) * bs;
                    (*e, Some(here))
                } else {
                    (*e, None)
                }
            })
            .collect()
    }

    /// Bytes of the whole encoded group.
    pub fn encoded_len(&self) -> u64 {
        self.tables as u64 + self.payload.len() as u64
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use stics_testkit::pattern::noise;

    fn head(seq: u64) -> GroupHead {
        GroupHead { source: [7; 16], seq, first_epoch: 3, last_epoch: 9, block_size: 512 }
    }

    #[test]
    fn a_group_reads_back_as_written_with_text_compressed_and_noise_raw() {
        let extents = [
            Extent { lba: 0, blocks: 4096, kind: ExtentKind::Data },
            Extent { lba: 5000, blocks: 10, kind: ExtentKind::Discard },
            Extent { lba: 6000, blocks: 4096, kind: ExtentKind::Data },
            Extent { lba: 20000, blocks: 1, kind: ExtentKind::Zero },
        ];
        let mut data = b"the quick brown fox ".repeat(4096 * 512 / 20 + 1);
        data.truncate(4096 * 512);
        data.extend_from_slice(&noise(1, 4096 * 512));
        let bytes = encode(&head(1), &extents, &data, 3).unwrap();
        let v = parse(&bytes, 64 << 20).unwrap();
        assert_eq!(v.head, head(1));
        assert_eq!(v.extents, extents);
        assert_eq!(v.data().unwrap(), data);
        assert!(v.chunks[0].compressed && v.chunks[1].compressed, "text shrinks");
        assert!(!v.chunks[2].compressed && !v.chunks[3].compressed, "noise is stored raw");
        assert!(bytes.len() < data.len() / 2 + 2 * CHUNK_BYTES + 4096);
        let noise_only = encode(&head(2), &extents[2..3], &data[4096 * 512..], 3).unwrap();
        assert!(
            noise_only.len() as f64 <= f64::from(4096 * 512) * 1.01,
            "no worse than raw + 1 %: {}",
            noise_only.len()
        );
        assert_eq!(v.placed()[2], (extents[2], Some(4096 * 512)));
        assert_eq!(v.raw_range(CHUNK_BYTES as u64 - 3, 10).unwrap(), data[CHUNK_BYTES - 3..CHUNK_BYTES + 7]);
    }

    #[test]
    fn damage_anywhere_is_refused_and_so_is_a_group_past_the_bound() {
        let extents = [Extent { lba: 10, blocks: 8, kind: ExtentKind::Data }];
        let bytes = encode(&head(4), &extents, &noise(2, 4096), 0).unwrap();
        for at in [0, 9, 20, 70, 90, 100, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[at] ^= 0x40;
            assert!(parse(&bad, 1 << 20).is_err(), "a flip at {at} passed");
        }
        assert!(matches!(parse(&bytes[..bytes.len() - 1], 1 << 20), Err(LinkError::Field { .. })));
        assert!(matches!(parse(&bytes, 4095), Err(LinkError::Field { field: "raw_len", .. })));
        assert!(matches!(parse(&bytes[..40], 1 << 20), Err(LinkError::Truncated { .. })));
    }

    #[test]
    fn overlapping_or_unsorted_extents_are_not_encoded() {
        let e = |lba, blocks| Extent { lba, blocks, kind: ExtentKind::Zero };
        assert!(encode(&head(1), &[e(0, 8), e(4, 8)], &[], 0).is_err());
        assert!(encode(&head(1), &[e(10, 1), e(0, 1)], &[], 0).is_err());
        assert!(encode(&head(1), &[e(0, 0)], &[], 0).is_err());
        assert!(encode(&head(1), &[e(0, 1), e(1, 1)], &[], 0).is_ok(), "neighbours are fine");
    }

    /// A fenced group's extents and generations: 64 KiB segments of 512-byte blocks (128 each).
    fn fenced_parts() -> (Vec<Extent>, Vec<u8>, Fences) {
        let extents = vec![
            Extent { lba: 100, blocks: 200, kind: ExtentKind::Data },
            Extent { lba: 1000, blocks: 8, kind: ExtentKind::Zero },
        ];
        let fences = Fences { segment_bytes: 64 << 10, gens: vec![(0, 5), (1, 6), (2, 6), (7, 9)] };
        (extents, noise(3, 200 * 512).to_vec(), fences)
    }

    #[test]
    fn a_fenced_group_carries_its_generations_and_a_plain_one_stays_version_1() {
        let (extents, data, fences) = fenced_parts();
        let bytes = encode_fenced(&head(4), &extents, &data, 1, Some(&fences)).unwrap();
        assert_eq!(&bytes[8..10], &[0, 2]);
        let v = parse(&bytes, 1 << 30).unwrap();
        assert_eq!(v.fences.as_ref(), Some(&fences));
        assert_eq!(v.data().unwrap(), data);
        assert_eq!(v.encoded_len(), bytes.len() as u64);
        assert_eq!(&bytes[v.payload_offset()..], &bytes[bytes.len() - v.payload.len()..]);
        assert_eq!(peek(&bytes).unwrap(), head(4));
        let plain = encode(&head(4), &extents, &data, 1).unwrap();
        assert_eq!((&plain[8..10], parse(&plain, 1 << 30).unwrap().fences), (&[0u8, 1][..], None));
        assert_eq!(segments_touched(&extents, 512, 64 << 10).collect::<Vec<_>>(), [0, 1, 2, 7]);
    }

    #[test]
    fn generations_that_do_not_cover_the_writes_exactly_are_refused() {
        let (extents, data, fences) = fenced_parts();
        let mut missing = fences.clone();
        missing.gens.pop();
        let mut extra = fences.clone();
        extra.gens.push((8, 1));
        let mut unordered = fences.clone();
        unordered.gens.swap(0, 1);
        let mut odd = fences.clone();
        odd.segment_bytes = 48 << 10;
        for f in [missing, extra, unordered, odd] {
            assert!(encode_fenced(&head(4), &extents, &data, 1, Some(&f)).is_err(), "{f:?}");
        }
        // A generation changed on the way fails the header CRC.
        let mut bytes = encode_fenced(&head(4), &extents, &data, 1, Some(&fences)).unwrap();
        let v = parse(&bytes, 1 << 30).unwrap();
        let fence_at = v.payload_offset() - FENCE_LEN + 15;
        bytes[fence_at] ^= 1;
        assert!(matches!(parse(&bytes, 1 << 30), Err(LinkError::Checksum { what: "header", .. })));
    }

    proptest! {
        #[test]
        fn any_group_round_trips(runs in prop::collection::vec((1u32..40, 0u8..3, 0u64..5), 0..30), seed in any::<u64>()) {
            let mut extents = Vec::new();
            let mut lba = 0u64;
            let mut raw = 0usize;
            for (blocks, kind, gap) in runs {
                lba += gap;
                let kind = [ExtentKind::Data, ExtentKind::Zero, ExtentKind::Discard][kind as usize];
                extents.push(Extent { lba, blocks, kind });
                if kind == ExtentKind::Data {
                    raw += blocks as usize * 512;
                }
                lba += u64::from(blocks);
            }
            let mut data = noise(seed, raw).to_vec();
            data.iter_mut().step_by(3).for_each(|b| *b = 0);
            let bytes = encode(&head(9), &extents, &data, 1).unwrap();
            let v = parse(&bytes, 1 << 30).unwrap();
            prop_assert_eq!(&v.extents, &extents);
            prop_assert_eq!(v.data().unwrap(), data);
            prop_assert_eq!(v.encoded_len(), bytes.len() as u64);
        }

        #[test]
        fn parsing_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
            let _ = parse(&bytes, 1 << 20);
            let mut framed = bytes.clone();
            if framed.len() >= 10 {
                framed[..8].copy_from_slice(&MAGIC);
                framed[8..10].copy_from_slice(&VERSION.to_be_bytes());
            }
            let _ = parse(&framed, 1 << 20);
        }
    }
}

//! The write log's on-disk format: a superblock (two alternating copies) and self-describing
//! records, each one group commit, as pure codecs from typed structs to bytes and back.
//!
//! ```text
//!  log device
//!  ┌────────────┬────────────┬──────────────────────── ring ─────────────────────────────┐
//!  │ super A    │ super B    │ record seq n │ record seq n+1 │ … │ (free) │ record seq m │…
//!  │ 4 KiB      │ 4 KiB      │ header│slots │                                            │
//!  └────────────┴────────────┴──────────────────────────────────────────────────────────┘
//! ```
//!
//! A record is one log write: a header (magic, version, log UUID, sequence number, its own ring
//! offset, one entry per extent with LBA, length, write sequence, epoch and CRC32C of the extent's
//! data, CRC32C of the header) followed by the extents' data in block-sized slots. Records start
//! on [`LOG_BLOCK`] boundaries; one that does not fit before the ring's end starts at its
//! beginning. A record proves where it is and what follows it (its sequence number and offset),
//! so stale bytes from an earlier lap of the ring are never taken for live data.
//!
//! The superblock binds the log to the remote LUN it caches (device identifier, capacity, block
//! size) and holds the checkpoint: where the oldest live record (head) is. It is written to the
//! copy its generation's parity names; the valid copy with the higher generation wins, so a torn
//! superblock write leaves the previous checkpoint in force.

#![deny(clippy::unwrap_used, clippy::indexing_slicing)]

use crc32c::crc32c;

/// Alignment and unit of every log write, and the size of one superblock copy.
pub const LOG_BLOCK: u64 = 4096;
/// Where the ring of records starts: after the two superblock copies.
pub const RING_START: u64 = 2 * LOG_BLOCK;
/// The on-disk format version this code writes and reads.
pub const VERSION: u16 = 1;
/// Most bytes of a remote device identifier (VPD page 83h designator) the superblock keeps.
pub const MAX_DEVICE_ID: usize = 256;

const SUPER_MAGIC: [u8; 8] = *b"STICSSUP";
const RECORD_MAGIC: [u8; 8] = *b"STICSREC";
/// Bytes of a record header before its entries.
const RECORD_FIXED: usize = 64;
/// Bytes of one entry in a record header.
const ENTRY_LEN: usize = 40;

/// Why bytes are not a valid superblock or record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// Fewer bytes than the structure needs.
    #[error("truncated: {need} bytes needed, {got} present")]
    Truncated { need: usize, got: usize },
    /// Not a stics log structure (never written, or another program's data).
    #[error("bad magic")]
    Magic,
    /// Written by a format version this build does not read.
    #[error("format version {0} is not supported (this build reads version {VERSION})")]
    Version(u16),
    /// The checksum over the structure does not match: torn or corrupt.
    #[error("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
    /// A field holds a value no writer produces.
    #[error("field {field} is invalid: {why}")]
    Field { field: &'static str, why: String },
}

fn field(field: &'static str, why: impl Into<String>) -> FormatError {
    FormatError::Field { field, why: why.into() }
}

/// Reads a little-endian integer at `at`; the caller has checked the length.
fn le<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    if let Some(s) = b.get(at..at + N) {
        out.copy_from_slice(s);
    }
    out
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(le(b, at))
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(le(b, at))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(le(b, at))
}

fn need(b: &[u8], n: usize) -> Result<(), FormatError> {
    if b.len() < n {
        return Err(FormatError::Truncated { need: n, got: b.len() });
    }
    Ok(())
}

/// CRC32C of `b` with the four bytes at `crc_at` taken as zero.
fn crc_without(b: &[u8], crc_at: usize) -> u32 {
    let (head, rest) = b.split_at(crc_at.min(b.len()));
    let tail = rest.get(4..).unwrap_or(&[]);
    let c = crc32c::crc32c_append(crc32c(head), &[0u8; 4]);
    crc32c::crc32c_append(c, tail)
}

/// What the log caches: the remote LUN it belongs to. A log is refused for any other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteBinding {
    /// The remote's device identifier (a VPD page 83h designator), at most [`MAX_DEVICE_ID`] bytes.
    pub device_id: Vec<u8>,
    /// Logical blocks of the remote LUN.
    pub num_blocks: u64,
    /// Logical block size of the remote LUN, which is also the log's slot size.
    pub block_size: u32,
}

/// The checkpoint: where recovery starts scanning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Checkpoint {
    /// Ring offset (from the device's start) of the oldest live record.
    pub head_offset: u64,
    /// Sequence number of the oldest live record (or of the next record, when none is live).
    pub head_seq: u64,
    /// Every epoch up to and including this one is on the remote and synchronised.
    pub destaged_epoch: u64,
}

/// The superblock: identity, geometry and checkpoint of a log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// Unique per formatted log; every record carries it.
    pub log_uuid: [u8; 16],
    /// Incremented on every write of the superblock; its parity chooses the copy.
    pub generation: u64,
    /// Bytes of the log device in use (the ring ends here).
    pub log_bytes: u64,
    /// The remote LUN this log caches.
    pub remote: RemoteBinding,
    /// Where recovery starts.
    pub checkpoint: Checkpoint,
}

impl Superblock {
    /// Byte offset of the copy this generation is written to.
    pub fn copy_offset(&self) -> u64 {
        (self.generation % 2) * LOG_BLOCK
    }

    /// Encodes into one [`LOG_BLOCK`].
    pub fn encode(&self) -> Vec<u8> {
        let mut b = [0u8; LOG_BLOCK as usize];
        b[0..8].copy_from_slice(&SUPER_MAGIC);
        b[8..10].copy_from_slice(&VERSION.to_le_bytes());
        b[16..32].copy_from_slice(&self.log_uuid);
        b[32..40].copy_from_slice(&self.generation.to_le_bytes());
        b[40..48].copy_from_slice(&self.log_bytes.to_le_bytes());
        b[48..56].copy_from_slice(&self.remote.num_blocks.to_le_bytes());
        b[56..60].copy_from_slice(&self.remote.block_size.to_le_bytes());
        let id = self.remote.device_id.get(..MAX_DEVICE_ID).unwrap_or(&self.remote.device_id);
        b[60..62].copy_from_slice(&(id.len() as u16).to_le_bytes());
        b[64..88].copy_from_slice(
            &[self.checkpoint.head_offset, self.checkpoint.head_seq, self.checkpoint.destaged_epoch]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        );
        for (to, from) in b[128..128 + MAX_DEVICE_ID].iter_mut().zip(id) {
            *to = *from;
        }
        let crc = crc_without(&b, 12);
        b[12..16].copy_from_slice(&crc.to_le_bytes());
        b.to_vec()
    }

    /// Decodes one copy and checks its checksum and fields.
    pub fn decode(b: &[u8]) -> Result<Superblock, FormatError> {
        let Some(b) = b.first_chunk::<{ LOG_BLOCK as usize }>() else {
            return Err(FormatError::Truncated { need: LOG_BLOCK as usize, got: b.len() });
        };
        if b[0..8] != SUPER_MAGIC {
            return Err(FormatError::Magic);
        }
        let version = u16_at(b, 8);
        if version != VERSION {
            return Err(FormatError::Version(version));
        }
        let (stored, computed) = (u32_at(b, 12), crc_without(b, 12));
        if stored != computed {
            return Err(FormatError::Checksum { stored, computed });
        }
        let id_len = usize::from(u16_at(b, 60));
        if id_len > MAX_DEVICE_ID {
            return Err(field("device_id_len", format!("{id_len} > {MAX_DEVICE_ID}")));
        }
        let block_size = u32_at(b, 56);
        if !(512..=65536).contains(&block_size) || !block_size.is_power_of_two() {
            return Err(field("block_size", format!("{block_size} is not a power of two in 512..=65536")));
        }
        let log_bytes = u64_at(b, 40);
        if log_bytes < RING_START + LOG_BLOCK || !log_bytes.is_multiple_of(LOG_BLOCK) {
            return Err(field(
                "log_bytes",
                format!("{log_bytes} is not a whole number of 4 KiB blocks past the superblocks"),
            ));
        }
        let checkpoint =
            Checkpoint { head_offset: u64_at(b, 64), head_seq: u64_at(b, 72), destaged_epoch: u64_at(b, 80) };
        if checkpoint.head_offset < RING_START
            || checkpoint.head_offset >= log_bytes
            || !checkpoint.head_offset.is_multiple_of(LOG_BLOCK)
        {
            return Err(field("head_offset", format!("{} is outside the ring", checkpoint.head_offset)));
        }
        Ok(Superblock {
            log_uuid: le(b, 16),
            generation: u64_at(b, 32),
            log_bytes,
            remote: RemoteBinding {
                device_id: b[128..128 + MAX_DEVICE_ID].iter().take(id_len).copied().collect(),
                num_blocks: u64_at(b, 48),
                block_size,
            },
            checkpoint,
        })
    }

    /// Picks the superblock in force from the two copies: the valid one with the higher
    /// generation. Formatting writes both copies, so copies of two different logs mean the
    /// device was tampered with or formatting was torn: refused rather than guessed.
    pub fn choose(a: &[u8], b: &[u8]) -> Result<Superblock, FormatError> {
        match (Superblock::decode(a), Superblock::decode(b)) {
            (Ok(x), Ok(y)) if x.log_uuid == y.log_uuid => Ok(if y.generation > x.generation { y } else { x }),
            (Ok(_), Ok(_)) => Err(field("log_uuid", "the two superblock copies belong to different logs")),
            (Ok(x), Err(_)) => Ok(x),
            (Err(_), Ok(y)) => Ok(y),
            (Err(e), Err(_)) => Err(e),
        }
    }
}

/// What an extent in a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtentKind {
    /// Host data, `blocks` slots of it in the record.
    Data,
    /// The blocks were discarded (they read as zeros); no slots.
    Discard,
    /// The blocks were written with zeros; no slots.
    Zero,
    /// What the blocks held dirty before is dropped, never to reach the remote (a shared LUN's
    /// writes under a token the SG broke, kept in quarantine instead); no slots, and no new
    /// content: they read as the remote has them.
    Forget,
}

impl ExtentKind {
    fn code(self) -> u8 {
        match self {
            ExtentKind::Data => 1,
            ExtentKind::Discard => 2,
            ExtentKind::Zero => 3,
            ExtentKind::Forget => 4,
        }
    }

    fn from_code(c: u8) -> Option<ExtentKind> {
        match c {
            1 => Some(ExtentKind::Data),
            2 => Some(ExtentKind::Discard),
            3 => Some(ExtentKind::Zero),
            4 => Some(ExtentKind::Forget),
            _ => None,
        }
    }

    /// True when the extent's blocks are stored in the record.
    pub fn has_slots(self) -> bool {
        self == ExtentKind::Data
    }
}

/// One host write (or the part of a coalesced write) in a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// First logical block on the remote LUN.
    pub lba: u64,
    /// Number of blocks.
    pub blocks: u32,
    /// What the blocks hold.
    pub kind: ExtentKind,
    /// Order of the host write among all writes to this log (later wins).
    pub write_seq: u64,
    /// The flush epoch the write belongs to: destage never lets a later epoch pass an earlier one.
    pub epoch: u64,
    /// CRC32C of the extent's slots (zero for extents without slots).
    pub data_crc: u32,
}

impl Entry {
    fn encode(&self) -> [u8; ENTRY_LEN] {
        let mut b = [0u8; ENTRY_LEN];
        b[0..8].copy_from_slice(&self.lba.to_le_bytes());
        b[8..16].copy_from_slice(&self.write_seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.epoch.to_le_bytes());
        b[24..28].copy_from_slice(&self.blocks.to_le_bytes());
        b[28] = self.kind.code();
        b[32..36].copy_from_slice(&self.data_crc.to_le_bytes());
        b
    }

    fn decode(b: &[u8; ENTRY_LEN]) -> Result<Entry, FormatError> {
        let kind = ExtentKind::from_code(b[28]).ok_or_else(|| field("kind", format!("{}", b[28])))?;
        let blocks = u32_at(b, 24);
        if blocks == 0 {
            return Err(field("blocks", "an extent of zero blocks"));
        }
        let (write_seq, epoch) = (u64_at(b, 8), u64_at(b, 16));
        // Recovery resumes at the largest of each plus one: the last value has no successor.
        if write_seq == u64::MAX || epoch == u64::MAX {
            return Err(field("epoch", format!("write {write_seq} of epoch {epoch} leaves no successor")));
        }
        Ok(Entry { lba: u64_at(b, 0), write_seq, epoch, blocks, kind, data_crc: u32_at(b, 32) })
    }
}

/// A record header: the description of one log write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordHeader {
    /// The log the record belongs to.
    pub log_uuid: [u8; 16],
    /// Position in the log's sequence: each record is its predecessor's plus one.
    pub seq: u64,
    /// Where the record starts on the log device, so a copy elsewhere is never mistaken for it.
    pub offset: u64,
    /// Slot size (the remote block size).
    pub block_size: u32,
    /// The extents, in the order their slots follow the header.
    pub entries: Vec<Entry>,
}

impl RecordHeader {
    /// Bytes the header takes on the log, rounded up to [`LOG_BLOCK`].
    pub fn header_len(entries: usize) -> u64 {
        ((RECORD_FIXED + entries * ENTRY_LEN) as u64).div_ceil(LOG_BLOCK) * LOG_BLOCK
    }

    /// Number of data slots the entries need.
    pub fn slots(&self) -> u64 {
        self.entries.iter().filter(|e| e.kind.has_slots()).map(|e| u64::from(e.blocks)).sum()
    }

    /// Bytes of data after the header (not rounded).
    pub fn data_len(&self) -> u64 {
        self.slots() * u64::from(self.block_size)
    }

    /// Bytes the whole record takes on the log, rounded up to [`LOG_BLOCK`].
    pub fn record_len(&self) -> u64 {
        Self::header_len(self.entries.len()) + self.data_len().div_ceil(LOG_BLOCK) * LOG_BLOCK
    }

    /// Byte offset, from the record's start, of the first slot of entry `i`.
    pub fn slot_offset(&self, i: usize) -> u64 {
        let before: u64 = self.entries.iter().take(i).filter(|e| e.kind.has_slots()).map(|e| u64::from(e.blocks)).sum();
        Self::header_len(self.entries.len()) + before * u64::from(self.block_size)
    }

    /// Encodes the header, padded to [`RecordHeader::header_len`].
    pub fn encode(&self) -> Vec<u8> {
        let len = Self::header_len(self.entries.len()) as usize;
        let mut fixed = [0u8; RECORD_FIXED];
        fixed[0..8].copy_from_slice(&RECORD_MAGIC);
        fixed[8..10].copy_from_slice(&VERSION.to_le_bytes());
        fixed[16..32].copy_from_slice(&self.log_uuid);
        fixed[32..40].copy_from_slice(&self.seq.to_le_bytes());
        fixed[40..48].copy_from_slice(&self.offset.to_le_bytes());
        fixed[48..52].copy_from_slice(&self.block_size.to_le_bytes());
        fixed[52..56].copy_from_slice(&(self.entries.len() as u32).to_le_bytes());
        let mut table = Vec::with_capacity(len - RECORD_FIXED);
        for e in &self.entries {
            table.extend_from_slice(&e.encode());
        }
        table.resize(len - RECORD_FIXED, 0);
        // The CRC field is still zero, as the checksum takes it.
        let crc = crc32c::crc32c_append(crc32c(&fixed), &table);
        fixed[12..16].copy_from_slice(&crc.to_le_bytes());
        let mut b = fixed.to_vec();
        b.append(&mut table);
        b
    }

    /// How many bytes of header to read before [`RecordHeader::decode`] can succeed, from the
    /// first [`LOG_BLOCK`] of a record (which always holds the entry count).
    pub fn header_len_from_prefix(b: &[u8]) -> Result<u64, FormatError> {
        need(b, RECORD_FIXED)?;
        if !b.starts_with(&RECORD_MAGIC) {
            return Err(FormatError::Magic);
        }
        let n = u32_at(b, 52) as usize;
        if n > max_entries() {
            return Err(field("entries", format!("{n} > {}", max_entries())));
        }
        Ok(Self::header_len(n))
    }

    /// Decodes a header and checks its checksum and fields.
    pub fn decode(b: &[u8]) -> Result<RecordHeader, FormatError> {
        need(b, RECORD_FIXED)?;
        if !b.starts_with(&RECORD_MAGIC) {
            return Err(FormatError::Magic);
        }
        let version = u16_at(b, 8);
        if version != VERSION {
            return Err(FormatError::Version(version));
        }
        let len = Self::header_len_from_prefix(b)? as usize;
        let b = b.get(..len).ok_or(FormatError::Truncated { need: len, got: b.len() })?;
        let (stored, computed) = (u32_at(b, 12), crc_without(b, 12));
        if stored != computed {
            return Err(FormatError::Checksum { stored, computed });
        }
        let block_size = u32_at(b, 48);
        if !(512..=65536).contains(&block_size) || !block_size.is_power_of_two() {
            return Err(field("block_size", format!("{block_size}")));
        }
        let n = u32_at(b, 52) as usize;
        // `len` covers the fixed part and `n` entries: the table is whole.
        let table = b.get(RECORD_FIXED..RECORD_FIXED + n * ENTRY_LEN).unwrap_or_default();
        let entries = table
            .chunks_exact(ENTRY_LEN)
            .filter_map(|e| e.first_chunk::<ENTRY_LEN>())
            .map(Entry::decode)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(RecordHeader { log_uuid: le(b, 16), seq: u64_at(b, 32), offset: u64_at(b, 40), block_size, entries })
    }

    /// Checks the slots of entry `i` (`data`: exactly its blocks) against the stored CRC.
    pub fn check_extent(&self, i: usize, data: &[u8]) -> Result<(), FormatError> {
        let Some(e) = self.entries.get(i) else {
            return Err(field("entry", format!("{i} out of range")));
        };
        let computed = if e.kind.has_slots() { crc32c(data) } else { 0 };
        if computed != e.data_crc {
            return Err(FormatError::Checksum { stored: e.data_crc, computed });
        }
        Ok(())
    }
}

/// Most entries a header may hold: a 1 MiB header, far beyond any record a writer makes.
pub const fn max_entries() -> usize {
    ((1 << 20) - RECORD_FIXED) / ENTRY_LEN
}

/// Builds a whole record (header and slots, padded to [`LOG_BLOCK`]) from extents and their data;
/// fills in each entry's `data_crc`. `data[i]` is the data of `extents[i]` (empty for extents
/// without slots).
pub fn encode_record(mut header: RecordHeader, data: &[&[u8]]) -> Result<(RecordHeader, Vec<u8>), FormatError> {
    if data.len() != header.entries.len() {
        return Err(field("data", format!("{} buffers for {} entries", data.len(), header.entries.len())));
    }
    for (e, d) in header.entries.iter_mut().zip(data) {
        let want = if e.kind.has_slots() { u64::from(e.blocks) * u64::from(header.block_size) } else { 0 };
        if d.len() as u64 != want {
            return Err(field("data", format!("{} bytes for an extent of {want}", d.len())));
        }
        e.data_crc = if e.kind.has_slots() { crc32c(d) } else { 0 };
    }
    let mut out = header.encode();
    for d in data {
        out.extend_from_slice(d);
    }
    out.resize(header.record_len() as usize, 0);
    Ok((header, out))
}

#[cfg(test)]
#[expect(clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sb() -> Superblock {
        Superblock {
            log_uuid: [7; 16],
            generation: 3,
            log_bytes: 1 << 30,
            remote: RemoteBinding { device_id: b"naa.6001405abcdef".to_vec(), num_blocks: 2_097_152, block_size: 512 },
            checkpoint: Checkpoint { head_offset: RING_START + 5 * LOG_BLOCK, head_seq: 42, destaged_epoch: 9 },
        }
    }

    fn rec() -> RecordHeader {
        RecordHeader {
            log_uuid: [7; 16],
            seq: 42,
            offset: RING_START,
            block_size: 512,
            entries: vec![
                Entry { lba: 100, blocks: 2, kind: ExtentKind::Data, write_seq: 1, epoch: 3, data_crc: 0 },
                Entry { lba: 7, blocks: 8, kind: ExtentKind::Discard, write_seq: 2, epoch: 3, data_crc: 0 },
                Entry { lba: 0, blocks: 1, kind: ExtentKind::Data, write_seq: 3, epoch: 4, data_crc: 0 },
            ],
        }
    }

    #[test]
    fn superblock_round_trips_and_sits_at_its_generations_copy() {
        let s = sb();
        let b = s.encode();
        assert_eq!(b.len(), 4096);
        assert_eq!(&b[0..8], b"STICSSUP");
        assert_eq!(Superblock::decode(&b), Ok(s.clone()));
        assert_eq!(s.copy_offset(), 4096);
        assert_eq!(Superblock { generation: 4, ..s }.copy_offset(), 0);
    }

    #[test]
    fn superblock_layout_is_fixed() {
        // Golden bytes of the fields whose place is the format: a change here is a new VERSION.
        let b = sb().encode();
        assert_eq!(&b[8..10], &[1, 0]);
        assert_eq!(&b[32..40], &3u64.to_le_bytes());
        assert_eq!(&b[56..60], &512u32.to_le_bytes());
        assert_eq!(&b[60..62], &17u16.to_le_bytes());
        assert_eq!(&b[72..80], &42u64.to_le_bytes());
        assert_eq!(&b[128..145], b"naa.6001405abcdef");
        assert_eq!(u32::from_le_bytes([b[12], b[13], b[14], b[15]]), crc_without(&b, 12));
    }

    #[test]
    fn a_flipped_bit_anywhere_in_the_superblock_is_detected() {
        let b = sb().encode();
        for i in (0..4096).step_by(97) {
            let mut c = b.clone();
            c[i] ^= 0x10;
            assert!(Superblock::decode(&c).is_err(), "flip at {i} went unnoticed");
        }
    }

    #[test]
    fn the_newer_valid_copy_wins_and_a_torn_one_leaves_the_older_in_force() {
        let old = sb();
        let new =
            Superblock { generation: 4, checkpoint: Checkpoint { head_seq: 50, ..old.checkpoint }, ..old.clone() };
        let (a, b) = (new.encode(), old.encode());
        assert_eq!(Superblock::choose(&a, &b), Ok(new.clone()));
        // Torn: the new copy's first 64 bytes reached the medium, the rest is still the old data.
        let mut torn = a.clone();
        torn[64..].copy_from_slice(&b[64..]);
        assert_eq!(Superblock::choose(&torn, &b), Ok(old));
        assert_eq!(Superblock::choose(&[0u8; 4096], &[0u8; 4096]), Err(FormatError::Magic));
        let other = Superblock { log_uuid: [9; 16], ..sb() }.encode();
        assert!(matches!(Superblock::choose(&a, &other), Err(FormatError::Field { field: "log_uuid", .. })));
    }

    #[test]
    fn superblock_refuses_other_versions_and_impossible_fields() {
        let mut b = sb().encode();
        b[8] = 2;
        let crc = crc_without(&b, 12);
        b[12..16].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(Superblock::decode(&b), Err(FormatError::Version(2)));
        let bad = Superblock { remote: RemoteBinding { block_size: 1000, ..sb().remote }, ..sb() };
        assert!(matches!(Superblock::decode(&bad.encode()), Err(FormatError::Field { field: "block_size", .. })));
        let bad = Superblock { checkpoint: Checkpoint { head_offset: 4096, ..sb().checkpoint }, ..sb() };
        assert!(matches!(Superblock::decode(&bad.encode()), Err(FormatError::Field { field: "head_offset", .. })));
        assert!(matches!(Superblock::decode(&[0u8; 100]), Err(FormatError::Truncated { .. })));
    }

    #[test]
    fn record_round_trips_with_slot_offsets_after_the_header() {
        let d0 = vec![0xaau8; 1024];
        let d2 = vec![0x55u8; 512];
        let (h, bytes) = encode_record(rec(), &[&d0, &[], &d2]).expect("encodes");
        assert_eq!(h.slots(), 3);
        assert_eq!(bytes.len() as u64, h.record_len());
        assert_eq!(h.record_len(), 4096 + 4096);
        assert_eq!(h.slot_offset(0), 4096);
        assert_eq!(h.slot_offset(2), 4096 + 1024);
        let back = RecordHeader::decode(&bytes).expect("decodes");
        assert_eq!(back, h);
        assert_eq!(back.check_extent(0, &bytes[4096..5120]), Ok(()));
        assert_eq!(back.check_extent(1, &[]), Ok(()));
        assert_eq!(back.check_extent(2, &bytes[5120..5632]), Ok(()));
    }

    #[test]
    fn a_torn_record_is_caught_by_its_header_or_its_data_checksum() {
        let d0 = vec![0xaau8; 1024];
        let d2 = vec![0x55u8; 512];
        let (_, bytes) = encode_record(rec(), &[&d0, &[], &d2]).expect("encodes");
        // Only the header landed: the header decodes, the slots do not match.
        let mut torn = bytes.clone();
        torn[4096..].fill(0);
        let h = RecordHeader::decode(&torn).expect("header intact");
        assert!(h.check_extent(0, &torn[4096..5120]).is_err());
        // The header itself torn.
        let mut torn = bytes.clone();
        torn[100..].fill(0);
        assert!(matches!(RecordHeader::decode(&torn), Err(FormatError::Checksum { .. })));
        // Stale bytes of another log or no record at all.
        assert_eq!(RecordHeader::decode(&[0u8; 4096]), Err(FormatError::Magic));
    }

    #[test]
    fn large_headers_span_several_log_blocks() {
        let mut h = rec();
        h.entries = (0..250)
            .map(|i| Entry { lba: i * 8, blocks: 1, kind: ExtentKind::Zero, write_seq: i, epoch: 0, data_crc: 0 })
            .collect();
        assert_eq!(RecordHeader::header_len(250), 3 * 4096);
        let b = h.encode();
        assert_eq!(RecordHeader::header_len_from_prefix(&b[..4096]), Ok(3 * 4096));
        assert_eq!(RecordHeader::decode(&b), Ok(h));
    }

    #[test]
    fn a_header_cut_short_of_its_entries_is_truncated() {
        let mut h = rec();
        h.entries = (0..250)
            .map(|i| Entry { lba: i, blocks: 1, kind: ExtentKind::Discard, write_seq: i, epoch: 0, data_crc: 0 })
            .collect();
        let b = h.encode();
        assert_eq!(RecordHeader::decode(&b[..4096]), Err(FormatError::Truncated { need: 3 * 4096, got: 4096 }));
        assert_eq!(RecordHeader::decode(&b[..63]), Err(FormatError::Truncated { need: 64, got: 63 }));
        assert_eq!(RecordHeader::header_len_from_prefix(&b[..8]), Err(FormatError::Truncated { need: 64, got: 8 }));
        assert_eq!(Superblock::decode(&sb().encode()[..4095]), Err(FormatError::Truncated { need: 4096, got: 4095 }));
    }

    #[test]
    fn an_entry_at_the_last_epoch_or_write_number_is_damage_not_an_overflow_at_recovery() {
        for (ws, ep) in [(u64::MAX, 3), (1, u64::MAX)] {
            let mut h = rec();
            h.entries[1].write_seq = ws;
            h.entries[1].epoch = ep;
            assert!(matches!(RecordHeader::decode(&h.encode()), Err(FormatError::Field { .. })), "{ws} {ep}");
        }
    }

    #[test]
    fn mismatched_data_is_refused_when_encoding() {
        assert!(encode_record(rec(), &[&[0u8; 10], &[], &[0u8; 512]]).is_err());
        assert!(encode_record(rec(), &[&[0u8; 1024]]).is_err());
    }

    fn entry() -> impl Strategy<Value = Entry> {
        (any::<u64>(), 1u32..64, 0u8..3, 0..u64::MAX, 0..u64::MAX).prop_map(|(lba, blocks, k, ws, ep)| Entry {
            lba,
            blocks,
            kind: [ExtentKind::Data, ExtentKind::Discard, ExtentKind::Zero][usize::from(k)],
            write_seq: ws,
            epoch: ep,
            data_crc: 0,
        })
    }

    proptest! {
        #[test]
        fn any_record_header_round_trips(
            seq in any::<u64>(),
            block_shift in 9u32..13,
            entries in proptest::collection::vec(entry(), 0..150),
        ) {
            let h = RecordHeader {
                log_uuid: [3; 16], seq, offset: RING_START, block_size: 1 << block_shift, entries,
            };
            let b = h.encode();
            prop_assert_eq!(b.len() as u64, RecordHeader::header_len(h.entries.len()));
            prop_assert_eq!(RecordHeader::decode(&b), Ok(h));
        }

        #[test]
        fn decoders_never_panic_on_arbitrary_bytes(b in proptest::collection::vec(any::<u8>(), 0..9000)) {
            let _ = Superblock::decode(&b);
            let _ = RecordHeader::decode(&b);
            let _ = RecordHeader::header_len_from_prefix(&b);
        }
    }
}

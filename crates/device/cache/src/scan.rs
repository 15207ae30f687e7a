//! Recovery's scan of the write log: from the checkpoint, follow the chain of records (each its
//! predecessor's sequence number plus one, at the place the writer's rule puts it), verify every
//! checksum, and tell a torn tail (never acknowledged: dropped) from lost acknowledged data
//! (a damaged record that a later record follows: the log refuses to open).
//!
//! The scan reads only the live part of the log (plus, when a record is damaged, one bounded
//! window after it), so recovery time grows with the live log, not with the log's capacity.

#![deny(clippy::unwrap_used, clippy::indexing_slicing)]

use crate::format::{FormatError, RecordHeader, Superblock, LOG_BLOCK, RING_START};

/// Largest record a writer makes; also how far past a damaged record the scan looks for a
/// successor.
pub const MAX_RECORD_BYTES: u64 = 32 << 20;

/// Reads bytes of the log device. Recovery's only I/O.
#[async_trait::async_trait]
pub trait LogRead: Send {
    /// Reads `len` bytes at `offset`; short only at the end of the device.
    async fn read_at(&mut self, offset: u64, len: usize) -> std::io::Result<Vec<u8>>;
}

#[async_trait::async_trait]
impl LogRead for &[u8] {
    async fn read_at(&mut self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let rest = usize::try_from(offset).ok().and_then(|at| self.get(at..)).unwrap_or_default();
        Ok(rest.get(..len).unwrap_or(rest).to_vec())
    }
}

/// Where the writer puts a record of `len` bytes when the previous one ended at `at`: there if it
/// fits before `end`, else at the start of the ring.
pub fn place(at: u64, len: u64, end: u64) -> u64 {
    if at.saturating_add(len) <= end {
        at
    } else {
        RING_START
    }
}

/// A record recovery found intact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveRecord {
    /// Where it starts on the log device.
    pub offset: u64,
    /// Its header (entries with their LBAs, write sequence numbers and epochs).
    pub header: RecordHeader,
}

impl LiveRecord {
    /// Bytes it takes on the log.
    pub fn len(&self) -> u64 {
        self.header.record_len()
    }

    /// Always false: a record holds at least its header.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// What the scan found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scanned {
    /// Intact records from the head on, in sequence order.
    pub records: Vec<LiveRecord>,
    /// Where the next record goes (the end of the last intact record, or the head).
    pub tail_offset: u64,
    /// The next record's sequence number.
    pub next_seq: u64,
    /// A damaged last record that nothing follows: a write in progress at the crash, never
    /// acknowledged, dropped. Its LBA ranges when its header was readable.
    pub torn_tail: Option<Damage>,
}

/// A damaged record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// Its sequence number (the one the chain expected).
    pub seq: u64,
    /// Where it was expected.
    pub offset: u64,
    /// The LBA ranges (first block, blocks) it held, when its header was intact.
    pub ranges: Option<Vec<(u64, u32)>>,
}

/// Why the log cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// The log device could not be read.
    #[error("reading the log at byte {offset}: {source}")]
    Io {
        offset: u64,
        #[source]
        source: std::io::Error,
    },
    /// A damaged record is followed by an intact one: the damaged one had been made durable and
    /// acknowledged, and its data is gone.
    #[error("record {} at byte {} of the log is damaged but later records exist: acknowledged writes are lost ({})", .0.seq, .0.offset, describe(.0.ranges.as_deref()))]
    LostAcknowledged(Damage),
}

fn describe(ranges: Option<&[(u64, u32)]>) -> String {
    match ranges {
        None => "its header is unreadable, so the blocks it held are unknown".into(),
        Some(r) => {
            let shown: Vec<String> =
                r.iter().take(16).map(|(lba, n)| format!("LBA {lba}..{}", lba.saturating_add(u64::from(*n)))).collect();
            let more = if r.len() > 16 { format!(" and {} more", r.len() - 16) } else { String::new() };
            format!("blocks {}{more}", shown.join(", "))
        }
    }
}

/// What is at one place of the ring.
enum Probe {
    /// An intact record with the expected sequence number at that place.
    Intact(RecordHeader),
    /// Something else: free space, a record of an earlier lap, another log's bytes.
    Absent,
    /// A record header that claims the place and sequence number but whose data is damaged, or
    /// a header that is damaged itself (magic present).
    Damaged(Option<RecordHeader>),
}

async fn read(dev: &mut impl LogRead, offset: u64, len: usize) -> Result<Vec<u8>, ScanError> {
    dev.read_at(offset, len).await.map_err(|source| ScanError::Io { offset, source })
}

/// Reads and checks the record that should be at `offset` with sequence number `seq`.
async fn probe(dev: &mut impl LogRead, sb: &Superblock, offset: u64, seq: u64) -> Result<Probe, ScanError> {
    if offset < RING_START || offset + LOG_BLOCK > sb.log_bytes {
        return Ok(Probe::Absent);
    }
    let first = read(dev, offset, LOG_BLOCK as usize).await?;
    let hlen = match RecordHeader::header_len_from_prefix(&first) {
        Ok(l) => l,
        Err(FormatError::Magic | FormatError::Truncated { .. }) => return Ok(Probe::Absent),
        Err(_) => return Ok(Probe::Damaged(None)),
    };
    let head = if hlen > LOG_BLOCK { read(dev, offset, hlen as usize).await? } else { first };
    let h = match RecordHeader::decode(&head) {
        Ok(h) => h,
        Err(FormatError::Checksum { .. } | FormatError::Truncated { .. } | FormatError::Field { .. }) => {
            return Ok(Probe::Damaged(None));
        }
        Err(FormatError::Magic | FormatError::Version(_)) => return Ok(Probe::Absent),
    };
    if h.log_uuid != sb.log_uuid || h.seq != seq || h.offset != offset {
        return Ok(Probe::Absent);
    }
    // A record that runs past the log's end is damaged, also when its length overflows.
    if h.block_size != sb.remote.block_size || offset.saturating_add(h.record_len()) > sb.log_bytes {
        return Ok(Probe::Damaged(Some(h)));
    }
    let data_len = h.data_len();
    if data_len > 0 {
        let data = read(dev, offset + RecordHeader::header_len(h.entries.len()), data_len as usize).await?;
        let mut at = 0usize;
        for (i, e) in h.entries.iter().enumerate() {
            let n = if e.kind.has_slots() { e.blocks as usize * h.block_size as usize } else { 0 };
            let ok = data.get(at..at + n).is_some_and(|d| h.check_extent(i, d).is_ok());
            if !ok {
                return Ok(Probe::Damaged(Some(h)));
            }
            at += n;
        }
    }
    Ok(Probe::Intact(h))
}

/// Looks for an intact record with sequence number `seq` anywhere in the window after `from`
/// (and after the ring's start, where a wrapped writer would have put it).
async fn successor_exists(dev: &mut impl LogRead, sb: &Superblock, from: u64, seq: u64) -> Result<bool, ScanError> {
    for start in [from, RING_START] {
        let end = start.saturating_add(MAX_RECORD_BYTES + LOG_BLOCK).min(sb.log_bytes);
        let mut at = start;
        while at < end {
            if let Probe::Intact(_) = probe(dev, sb, at, seq).await? {
                return Ok(true);
            }
            at += LOG_BLOCK;
        }
    }
    Ok(false)
}

fn ranges(h: &RecordHeader) -> Vec<(u64, u32)> {
    h.entries.iter().map(|e| (e.lba, e.blocks)).collect()
}

/// Scans the log from the superblock's checkpoint.
pub async fn scan(dev: &mut impl LogRead, sb: &Superblock) -> Result<Scanned, ScanError> {
    let mut records = Vec::new();
    let mut at = sb.checkpoint.head_offset;
    let mut seq = sb.checkpoint.head_seq;
    let ring = sb.log_bytes.saturating_sub(RING_START);
    let mut live = 0u64;
    let torn_tail = loop {
        // The record is where the previous one ended, or at the ring's start if it did not fit.
        let (found_at, probe_here) = match probe(dev, sb, at, seq).await? {
            Probe::Intact(h) => (at, Probe::Intact(h)),
            here => match probe(dev, sb, RING_START, seq).await? {
                Probe::Intact(h) if at != RING_START => (RING_START, Probe::Intact(h)),
                _ => (at, here),
            },
        };
        match probe_here {
            Probe::Intact(h) => {
                let len = h.record_len();
                live = live.saturating_add(len);
                if live > ring {
                    // A chain longer than the ring cannot be; stop rather than loop.
                    break None;
                }
                records.push(LiveRecord { offset: found_at, header: h });
                at = found_at + len;
                seq = seq.wrapping_add(1);
            }
            Probe::Absent => break None,
            Probe::Damaged(h) => {
                let next_from = h.as_ref().map_or(at + LOG_BLOCK, |h| at.saturating_add(h.record_len()));
                let damage = Damage { seq, offset: at, ranges: h.as_ref().map(ranges) };
                if successor_exists(dev, sb, next_from, seq.wrapping_add(1)).await? {
                    return Err(ScanError::LostAcknowledged(damage));
                }
                break Some(damage);
            }
        }
    };
    Ok(Scanned { records, tail_offset: at, next_seq: seq, torn_tail })
}

#[cfg(test)]
#[expect(clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::*;
    use crate::format::{encode_record, Checkpoint, Entry, ExtentKind, RemoteBinding};

    const UUID: [u8; 16] = [5; 16];

    fn superblock(log_bytes: u64, head_offset: u64, head_seq: u64) -> Superblock {
        Superblock {
            log_uuid: UUID,
            generation: 1,
            log_bytes,
            remote: RemoteBinding { device_id: b"dev".to_vec(), num_blocks: 1 << 20, block_size: 512 },
            checkpoint: Checkpoint { head_offset, head_seq, destaged_epoch: 0 },
        }
    }

    /// A log image and a writer that follows the placement rule.
    struct Log {
        bytes: Vec<u8>,
        at: u64,
        seq: u64,
    }

    impl Log {
        fn new(size: u64, seq: u64) -> Log {
            Log { bytes: vec![0; size as usize], at: RING_START, seq }
        }

        /// Appends a record of one data extent of `blocks` blocks at `lba`; returns its offset.
        fn append(&mut self, lba: u64, blocks: u32, fill: u8) -> u64 {
            let h = RecordHeader {
                log_uuid: UUID,
                seq: self.seq,
                offset: 0,
                block_size: 512,
                entries: vec![Entry {
                    lba,
                    blocks,
                    kind: ExtentKind::Data,
                    write_seq: self.seq,
                    epoch: 0,
                    data_crc: 0,
                }],
            };
            let data = vec![fill; blocks as usize * 512];
            let at = place(self.at, h.record_len(), self.bytes.len() as u64);
            let h = RecordHeader { offset: at, ..h };
            let (h, b) = encode_record(h, &[&data]).expect("encodes");
            self.bytes[at as usize..at as usize + b.len()].copy_from_slice(&b);
            self.at = at + h.record_len();
            self.seq += 1;
            at
        }
    }

    #[tokio::test]
    async fn an_empty_log_scans_to_nothing() {
        let log = Log::new(1 << 20, 1);
        let s = scan(&mut log.bytes.as_slice(), &superblock(1 << 20, RING_START, 1)).await.expect("scans");
        assert!(s.records.is_empty());
        assert_eq!((s.tail_offset, s.next_seq, s.torn_tail), (RING_START, 1, None));
    }

    #[tokio::test]
    async fn the_chain_is_followed_from_the_checkpoint_and_ends_at_stale_records() {
        let mut log = Log::new(1 << 20, 10);
        let offs: Vec<u64> = (0..5).map(|i| log.append(i * 8, 8, i as u8)).collect();
        // Checkpoint after the first two: those were destaged and are not live.
        let s = scan(&mut log.bytes.as_slice(), &superblock(1 << 20, offs[2], 12)).await.expect("scans");
        assert_eq!(s.records.iter().map(|r| r.header.seq).collect::<Vec<_>>(), vec![12, 13, 14]);
        assert_eq!((s.tail_offset, s.next_seq), (log.at, 15));
    }

    #[tokio::test]
    async fn a_record_that_does_not_fit_before_the_end_is_found_at_the_ring_start() {
        let size = RING_START + 10 * LOG_BLOCK;
        let mut log = Log::new(size, 1);
        for i in 0..4 {
            log.append(i, 8, 1); // 2 log blocks each
        }
        // Head after two records; the fifth record (3 blocks) does not fit in the last 2 blocks.
        let head = RING_START + 4 * LOG_BLOCK;
        let wrapped = log.append(100, 16, 9);
        assert_eq!(wrapped, RING_START);
        let s = scan(&mut log.bytes.as_slice(), &superblock(size, head, 3)).await.expect("scans");
        assert_eq!(
            s.records.iter().map(|r| (r.header.seq, r.offset)).collect::<Vec<_>>(),
            vec![(3, head), (4, head + 2 * LOG_BLOCK), (5, RING_START)]
        );
    }

    #[tokio::test]
    async fn a_torn_last_record_is_dropped_and_reported() {
        let mut log = Log::new(1 << 20, 1);
        log.append(0, 8, 1);
        let last = log.append(64, 8, 2);
        // The data of the last record never reached the medium.
        let data_at = (last + LOG_BLOCK) as usize;
        log.bytes[data_at..data_at + 4096].fill(0);
        let s = scan(&mut log.bytes.as_slice(), &superblock(1 << 20, RING_START, 1)).await.expect("scans");
        assert_eq!(s.records.len(), 1);
        assert_eq!(s.tail_offset, last);
        assert_eq!(s.torn_tail, Some(Damage { seq: 2, offset: last, ranges: Some(vec![(64, 8)]) }));
    }

    #[tokio::test]
    async fn a_damaged_record_followed_by_a_later_one_refuses_to_open_and_names_the_blocks() {
        let mut log = Log::new(1 << 20, 1);
        log.append(0, 8, 1);
        let mid = log.append(64, 8, 2);
        log.append(128, 8, 3);
        let data_at = (mid + LOG_BLOCK + 100) as usize;
        log.bytes[data_at] ^= 1;
        let e = scan(&mut log.bytes.as_slice(), &superblock(1 << 20, RING_START, 1)).await.expect_err("refuses");
        assert!(matches!(&e, ScanError::LostAcknowledged(d) if d.ranges == Some(vec![(64, 8)])));
        assert!(e.to_string().contains("LBA 64..72"), "{e}");
    }

    #[tokio::test]
    async fn a_damaged_header_followed_by_a_later_record_refuses_to_open() {
        let mut log = Log::new(1 << 20, 1);
        let first = log.append(0, 8, 1);
        log.append(64, 8, 2);
        log.bytes[first as usize + 40] ^= 0xff;
        let e = scan(&mut log.bytes.as_slice(), &superblock(1 << 20, RING_START, 1)).await.expect_err("refuses");
        assert!(matches!(e, ScanError::LostAcknowledged(Damage { seq: 1, ranges: None, .. })));
    }

    /// A device of `size` bytes that holds `bytes` at `at` and zeros elsewhere.
    struct Sparse {
        at: u64,
        bytes: Vec<u8>,
        size: u64,
    }

    #[async_trait::async_trait]
    impl LogRead for Sparse {
        async fn read_at(&mut self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
            let len = len.min(usize::try_from(self.size.saturating_sub(offset)).unwrap_or(usize::MAX));
            let mut out = vec![0; len];
            for (i, b) in out.iter_mut().enumerate() {
                let pos = offset + i as u64;
                if let Some(v) = pos.checked_sub(self.at).and_then(|d| self.bytes.get(d as usize)) {
                    *b = *v;
                }
            }
            Ok(out)
        }
    }

    #[tokio::test]
    async fn a_record_whose_end_overflows_the_offsets_is_a_torn_tail() {
        // The largest log the superblock can describe, its head in the last two log blocks: the
        // record there ends past 2^64 bytes.
        let log_bytes = u64::MAX - (LOG_BLOCK - 1);
        let head = log_bytes - LOG_BLOCK;
        let h = RecordHeader {
            log_uuid: UUID,
            seq: u64::MAX,
            offset: head,
            block_size: 512,
            entries: vec![Entry {
                lba: u64::MAX,
                blocks: 8,
                kind: ExtentKind::Data,
                write_seq: 1,
                epoch: 0,
                data_crc: 0,
            }],
        };
        let (_, bytes) = encode_record(h, &[&[7; 4096]]).expect("encodes");
        let mut dev = Sparse { at: head, bytes, size: log_bytes };
        let s = scan(&mut dev, &superblock(log_bytes, head, u64::MAX)).await.expect("scans");
        assert!(s.records.is_empty());
        assert_eq!((s.tail_offset, s.next_seq), (head, u64::MAX));
        let damage = Damage { seq: u64::MAX, offset: head, ranges: Some(vec![(u64::MAX, 8)]) };
        assert_eq!(s.torn_tail, Some(damage.clone()));
        assert!(ScanError::LostAcknowledged(damage)
            .to_string()
            .contains("LBA 18446744073709551615..18446744073709551615"));
    }

    #[tokio::test]
    async fn records_of_another_log_or_an_earlier_lap_are_not_taken() {
        let mut log = Log::new(1 << 20, 1);
        log.append(0, 8, 1);
        log.append(8, 8, 1);
        // The checkpoint says the chain starts at sequence 7: the bytes there are of sequence 1.
        let s = scan(&mut log.bytes.as_slice(), &superblock(1 << 20, RING_START, 7)).await.expect("scans");
        assert!(s.records.is_empty());
        let mut other = superblock(1 << 20, RING_START, 1);
        other.log_uuid = [6; 16];
        assert!(scan(&mut log.bytes.as_slice(), &other).await.expect("scans").records.is_empty());
    }
}

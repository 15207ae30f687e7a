//! Deterministic test data, as the devices take it (`Bytes`), and a self-describing block format
//! (LBA, version, checksum) that lets a checker tell blank, foreign, torn, misplaced and stale
//! blocks apart after a crash.

use std::ops::RangeInclusive;

use bytes::Bytes;

/// `len` pseudo-random bytes from `seed` (xorshift64): the same seed gives the same bytes.
pub fn noise(seed: u64, len: usize) -> Bytes {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect::<Vec<u8>>()
        .into()
}

/// `len` bytes of an arithmetic ramp (`i * 31 + seed`), cheap and never all zero.
pub fn ramp(seed: u8, len: usize) -> Bytes {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect::<Vec<u8>>().into()
}

const MAGIC: &[u8; 8] = b"STICSBLK";
const SUM: std::ops::Range<usize> = 24..28;
/// The smallest block [`stamp`] can fill: the header and some filler.
pub const MIN_BLOCK: usize = 32;

/// Why a block does not hold a whole stamp (or not the one expected).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Bad {
    /// All zeros: never written (or discarded).
    #[error("blank block")]
    Blank,
    /// Not a stamped block at all.
    #[error("foreign data (no stamp)")]
    Foreign,
    /// A stamp whose checksum fails: parts of two writes, or a write that did not finish.
    #[error("torn block (header says lba {lba} version {version})")]
    Torn { lba: u64, version: u64 },
    /// A whole stamp for another block.
    #[error("block for lba {found} found at lba {at}")]
    Misplaced { at: u64, found: u64 },
    /// A whole stamp whose version is older than any allowed.
    #[error("stale block at lba {lba}: version {found}, expected at least {oldest}")]
    Stale { lba: u64, found: u64, oldest: u64 },
    /// A whole stamp whose version is newer than any written.
    #[error("unknown block at lba {lba}: version {found}, newest written {newest}")]
    Unknown { lba: u64, found: u64, newest: u64 },
}

fn sum(buf: &[u8]) -> u32 {
    let c = crc32c::crc32c(&buf[..SUM.start]);
    crc32c::crc32c_append(c, &buf[SUM.end..])
}

/// One block of `block_size` bytes that says it is version `version` of block `lba`.
pub fn stamp(lba: u64, version: u64, block_size: usize) -> Bytes {
    assert!(block_size >= MIN_BLOCK, "a stamp needs {MIN_BLOCK} bytes");
    let mut b = Vec::with_capacity(block_size);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&lba.to_le_bytes());
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&[0; 4]);
    b.extend_from_slice(&noise(lba.rotate_left(32) ^ version, block_size - SUM.end));
    let s = sum(&b);
    b[SUM].copy_from_slice(&s.to_le_bytes());
    b.into()
}

/// `blocks` stamped blocks from `lba`, all at `version`, end to end: what a test writes when
/// every block must differ from every other and from each of its own versions.
pub fn stamp_run(lba: u64, blocks: u64, version: u64, block_size: usize) -> Bytes {
    (lba..lba + blocks).flat_map(|l| stamp(l, version, block_size)).collect::<Vec<u8>>().into()
}

/// The (lba, version) a block says it holds, if it is a whole stamp.
pub fn check(buf: &[u8]) -> Result<(u64, u64), Bad> {
    if buf.iter().all(|&b| b == 0) {
        return Err(Bad::Blank);
    }
    if buf.len() < MIN_BLOCK || &buf[..8] != MAGIC {
        return Err(Bad::Foreign);
    }
    let word = |r: std::ops::Range<usize>| u64::from_le_bytes(buf[r].try_into().unwrap_or_default());
    let (lba, version) = (word(8..16), word(16..24));
    let stored = u32::from_le_bytes(buf[SUM].try_into().unwrap_or_default());
    if stored != sum(buf) {
        return Err(Bad::Torn { lba, version });
    }
    Ok((lba, version))
}

/// Checks that `buf` is block `lba` at a version in `versions` and returns that version; a
/// blank block counts as version 0.
pub fn check_at(buf: &[u8], lba: u64, versions: RangeInclusive<u64>) -> Result<u64, Bad> {
    let version = match check(buf) {
        Ok((found, _)) if found != lba => return Err(Bad::Misplaced { at: lba, found }),
        Ok((_, v)) => v,
        Err(Bad::Blank) if *versions.start() == 0 => 0,
        Err(e) => return Err(e),
    };
    if version < *versions.start() {
        return Err(Bad::Stale { lba, found: version, oldest: *versions.start() });
    }
    if version > *versions.end() {
        return Err(Bad::Unknown { lba, found: version, newest: *versions.end() });
    }
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noise_and_ramp_are_deterministic() {
        assert_eq!(noise(7, 100), noise(7, 100));
        assert_ne!(noise(7, 100), noise(8, 100));
        assert_eq!(ramp(3, 4), vec![3, 34, 65, 96]);
    }

    #[test]
    fn a_stamp_reads_back_as_its_lba_and_version() {
        for bs in [MIN_BLOCK, 512, 4096] {
            let b = stamp(12345, 9, bs);
            assert_eq!(b.len(), bs);
            assert_eq!(check(&b), Ok((12345, 9)));
            assert_eq!(check_at(&b, 12345, 1..=9), Ok(9));
        }
        assert_ne!(stamp(1, 1, 512), stamp(1, 2, 512));
        let run = stamp_run(10, 3, 4, 512);
        assert_eq!(check(&run[1024..]), Ok((12, 4)));
    }

    #[test]
    fn blank_foreign_torn_misplaced_stale_and_unknown_are_told_apart() {
        assert_eq!(check(&[0u8; 512]), Err(Bad::Blank));
        assert_eq!(check_at(&[0u8; 512], 5, 0..=3), Ok(0));
        assert_eq!(check_at(&[0u8; 512], 5, 1..=3), Err(Bad::Blank));
        assert_eq!(check(&ramp(1, 512)), Err(Bad::Foreign));
        // A new version over an old one, torn at every byte from the first where they differ.
        let (old, new) = (stamp(5, 1, 512), stamp(5, 2, 512));
        let first = old.iter().zip(&new).position(|(a, b)| a != b).unwrap();
        for at in first + 1..512 {
            let mut b = new[..at].to_vec();
            b.extend_from_slice(&old[at..]);
            assert!(matches!(check(&b), Err(Bad::Torn { .. })), "torn at {at}");
        }
        assert_eq!(check_at(&new, 6, 0..=2), Err(Bad::Misplaced { at: 6, found: 5 }));
        assert_eq!(check_at(&old, 5, 2..=3), Err(Bad::Stale { lba: 5, found: 1, oldest: 2 }));
        assert_eq!(check_at(&new, 5, 0..=1), Err(Bad::Unknown { lba: 5, found: 2, newest: 1 }));
    }
}

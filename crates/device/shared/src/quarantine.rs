//! A quarantine file: the writes a gateway made under a token the SG broke, which can never land
//! (the fence refuses them) and are never thrown away. One file per segment and generation,
//! self-describing, checksummed, written whole (to a temporary name, synced, renamed, the
//! directory synced) before the writes leave the gateway's log.
//!
//! ```text
//!  magic "STICSQRN" │ version u16 │ 0 u16 │ block_size u32 │ segment u64 │ generation u64 │
//!  runs u32 │ 0 u32 │ runs × (lba u64 │ blocks u32 │ zeros u32) │ data of the runs that are not
//!  zeros │ CRC32C u32 of everything before it
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};

const MAGIC: [u8; 8] = *b"STICSQRN";
const VERSION: u16 = 1;
const FIXED: usize = 40;
const RUN: usize = 16;

/// Writes under a broken token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantine {
    pub block_size: u32,
    pub segment: u64,
    /// The generation of the token they were written under (0: not known, after a restart).
    pub generation: u64,
    /// Runs of blocks: first block, and their data (`None`: zeros) and length in blocks.
    pub runs: Vec<(u64, Option<Vec<u8>>, u64)>,
}

/// Why a quarantine file is refused.
#[derive(Debug, thiserror::Error)]
pub enum QuarantineError {
    #[error("not a quarantine file")]
    Magic,
    #[error("quarantine file: {0}")]
    Format(String),
    #[error("quarantine file: {0}")]
    Io(#[from] std::io::Error),
}

fn bad(why: impl Into<String>) -> QuarantineError {
    QuarantineError::Format(why.into())
}

fn take<const N: usize>(b: &[u8], at: usize) -> Result<[u8; N], QuarantineError> {
    b.get(at..at + N).and_then(|s| s.try_into().ok()).ok_or_else(|| bad(format!("short at byte {at}")))
}

impl Quarantine {
    /// Blocks it holds.
    pub fn blocks(&self) -> u64 {
        self.runs.iter().map(|r| r.2).sum()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&[0; 2]);
        b.extend_from_slice(&self.block_size.to_le_bytes());
        b.extend_from_slice(&self.segment.to_le_bytes());
        b.extend_from_slice(&self.generation.to_le_bytes());
        b.extend_from_slice(&(self.runs.len() as u32).to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        for (lba, data, blocks) in &self.runs {
            b.extend_from_slice(&lba.to_le_bytes());
            b.extend_from_slice(&(*blocks as u32).to_le_bytes());
            b.extend_from_slice(&u32::from(data.is_none()).to_le_bytes());
        }
        for (_, data, _) in &self.runs {
            if let Some(d) = data {
                b.extend_from_slice(d);
            }
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Reads a file's bytes, every length checked before it is used.
    pub fn decode(b: &[u8]) -> Result<Quarantine, QuarantineError> {
        if take::<8>(b, 0)? != MAGIC {
            return Err(QuarantineError::Magic);
        }
        let version = u16::from_le_bytes(take(b, 8)?);
        if version != VERSION {
            return Err(bad(format!("version {version}; this build reads {VERSION}")));
        }
        let body = b.len().checked_sub(4).ok_or_else(|| bad("short"))?;
        let crc = u32::from_le_bytes(take(b, body)?);
        if crc32c::crc32c(b.get(..body).unwrap_or_default()) != crc {
            return Err(bad("checksum"));
        }
        let block_size = u32::from_le_bytes(take(b, 12)?);
        if block_size == 0 {
            return Err(bad("block size 0"));
        }
        let n = u32::from_le_bytes(take(b, 32)?) as usize;
        if FIXED.saturating_add(n.saturating_mul(RUN)) > body {
            return Err(bad(format!("{n} runs past the end")));
        }
        let mut at = FIXED;
        let mut heads = Vec::with_capacity(n);
        for _ in 0..n {
            let lba = u64::from_le_bytes(take(b, at)?);
            let blocks = u64::from(u32::from_le_bytes(take(b, at + 8)?));
            let zeros = u32::from_le_bytes(take(b, at + 12)?);
            if zeros > 1 {
                return Err(bad(format!("run at {lba}: kind {zeros}")));
            }
            heads.push((lba, blocks, zeros == 1));
            at += RUN;
        }
        let mut runs = Vec::with_capacity(n);
        for (lba, blocks, zeros) in heads {
            let data = if zeros {
                None
            } else {
                let len = usize::try_from(blocks.saturating_mul(u64::from(block_size))).unwrap_or(usize::MAX);
                let d = b.get(at..at.saturating_add(len)).filter(|_| at.saturating_add(len) <= body);
                let d = d.ok_or_else(|| bad(format!("run at {lba}: data past the end")))?;
                at += len;
                Some(d.to_vec())
            };
            runs.push((lba, data, blocks));
        }
        if at != body {
            return Err(bad(format!("{} bytes after the data", body - at)));
        }
        Ok(Quarantine {
            block_size,
            segment: u64::from_le_bytes(take(b, 16)?),
            generation: u64::from_le_bytes(take(b, 24)?),
            runs,
        })
    }

    /// Its file's name in a quarantine directory.
    pub fn file_name(&self) -> String {
        format!("segment-{}-generation-{}.stq", self.segment, self.generation)
    }

    /// Writes it whole into `dir` (made if missing) under a name no other file there has, and
    /// makes it durable; returns its path.
    pub fn write_to(&self, dir: &Path) -> Result<PathBuf, QuarantineError> {
        std::fs::create_dir_all(dir)?;
        let name = (0..u32::MAX)
            .map(|n| if n == 0 { self.file_name() } else { self.file_name().replace(".stq", &format!("-{n}.stq")) })
            .find(|name| !dir.join(name).exists())
            .unwrap_or_else(|| self.file_name());
        let path = dir.join(&name);
        let tmp = dir.join(format!(".{name}.tmp"));
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&self.encode())?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(dir)?.sync_all()?;
        Ok(path)
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::*;

    fn q() -> Quarantine {
        Quarantine { block_size: 4, segment: 7, generation: 9, runs: vec![(3, Some(vec![1; 8]), 2), (10, None, 5)] }
    }

    #[test]
    fn a_quarantine_file_has_these_bytes_and_round_trips() {
        let b = q().encode();
        assert_eq!(&b[..16], b"STICSQRN\x01\x00\x00\x00\x04\x00\x00\x00");
        assert_eq!(b.len(), FIXED + 2 * RUN + 8 + 4);
        assert_eq!(&b[FIXED..FIXED + RUN], &[3, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(Quarantine::decode(&b).unwrap(), q());
        assert_eq!(q().blocks(), 7);
    }

    #[test]
    fn a_damaged_quarantine_file_is_refused() {
        let b = q().encode();
        for cut in 0..b.len() {
            assert!(Quarantine::decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        for i in 0..b.len() {
            let mut flip = b.clone();
            flip[i] ^= 0x40;
            assert!(Quarantine::decode(&flip).is_err(), "flip at {i}");
        }
    }

    #[test]
    fn it_is_written_whole_under_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = q().write_to(&dir.path().join("q")).unwrap();
        assert!(path.ends_with("segment-7-generation-9.stq"));
        assert_eq!(Quarantine::decode(&std::fs::read(&path).unwrap()).unwrap(), q());
        assert_eq!(std::fs::read_dir(dir.path().join("q")).unwrap().count(), 1, "no temporary file left");
    }
}

//! A RAM-backed device: allocated lazily in chunks, so a large LUN costs only what is written.

use std::sync::RwLock;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};

use crate::{blocks_in, BlockDev, BlockError, Geometry, Provisioning};

const CHUNK: usize = 1 << 20;

/// A memory LUN. Contents vanish with the process; it has no volatile cache to flush.
pub struct MemDev {
    geometry: Geometry,
    chunks: Vec<RwLock<Option<Box<[u8]>>>>,
}

impl MemDev {
    /// A zero-filled device of `num_blocks` blocks of `block_size` bytes.
    pub fn new(block_size: u32, num_blocks: u64) -> Self {
        let geometry = Geometry { block_size, num_blocks };
        let n = geometry.bytes().div_ceil(CHUNK as u64) as usize;
        MemDev { geometry, chunks: (0..n).map(|_| RwLock::new(None)).collect() }
    }

    /// Calls `f(chunk_index, offset_in_chunk, offset_in_buffer, len)` for each chunk piece of a
    /// byte range.
    #[expect(clippy::unused_self, reason = "the chunk layout is the device's; callers read it as a method")]
    fn for_each_piece(&self, start: u64, len: usize, mut f: impl FnMut(usize, usize, usize, usize)) {
        let mut done = 0usize;
        while done < len {
            let pos = start + done as u64;
            let idx = (pos / CHUNK as u64) as usize;
            let off = (pos % CHUNK as u64) as usize;
            let n = (CHUNK - off).min(len - done);
            f(idx, off, done, n);
            done += n;
        }
    }
}

#[async_trait]
impl BlockDev for MemDev {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn volatile_cache(&self) -> bool {
        false
    }

    fn supports_discard(&self) -> bool {
        true
    }

    async fn read(&self, lba: u64, blocks: u32) -> Result<Bytes, BlockError> {
        self.geometry.check_range(lba, u64::from(blocks))?;
        let len = blocks as usize * self.geometry.block_size as usize;
        let mut buf = BytesMut::zeroed(len);
        let start = lba * u64::from(self.geometry.block_size);
        self.for_each_piece(start, len, |idx, off, at, n| {
            let chunk = self.chunks[idx].read().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(c) = chunk.as_ref() {
                buf[at..at + n].copy_from_slice(&c[off..off + n]);
            }
        });
        Ok(buf.freeze())
    }

    async fn write(&self, lba: u64, data: Bytes, _fua: bool) -> Result<(), BlockError> {
        let blocks = blocks_in(&data, self.geometry.block_size)?;
        self.geometry.check_range(lba, blocks)?;
        let start = lba * u64::from(self.geometry.block_size);
        self.for_each_piece(start, data.len(), |idx, off, at, n| {
            let mut chunk = self.chunks[idx].write().unwrap_or_else(std::sync::PoisonError::into_inner);
            let c = chunk.get_or_insert_with(|| vec![0u8; CHUNK].into_boxed_slice());
            c[off..off + n].copy_from_slice(&data[at..at + n]);
        });
        Ok(())
    }

    async fn flush(&self) -> Result<(), BlockError> {
        Ok(())
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        self.geometry.check_range(lba, blocks)?;
        let bs = u64::from(self.geometry.block_size);
        let (start, len) = (lba * bs, (blocks * bs) as usize);
        self.for_each_piece(start, len, |idx, off, _, n| {
            let mut chunk = self.chunks[idx].write().unwrap_or_else(std::sync::PoisonError::into_inner);
            if n == CHUNK {
                *chunk = None;
            } else if let Some(c) = chunk.as_mut() {
                c[off..off + n].fill(0);
            }
        });
        Ok(())
    }

    async fn provisioning(&self, lba: u64) -> Result<(Provisioning, u64), BlockError> {
        self.geometry.check_range(lba, 1)?;
        let bs = u64::from(self.geometry.block_size);
        let state = |idx: usize| {
            let mapped = self.chunks[idx].read().unwrap_or_else(std::sync::PoisonError::into_inner).is_some();
            if mapped {
                Provisioning::Mapped
            } else {
                Provisioning::Deallocated
            }
        };
        let first = ((lba * bs) / CHUNK as u64) as usize;
        let kind = state(first);
        let mut end_chunk = first + 1;
        while end_chunk < self.chunks.len() && state(end_chunk) == kind {
            end_chunk += 1;
        }
        let end_lba = ((end_chunk as u64 * CHUNK as u64) / bs).min(self.geometry.num_blocks);
        Ok((kind, end_lba - lba))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn write_read_across_chunks() {
        let d = MemDev::new(512, 8192);
        let lba = (CHUNK / 512) as u64 - 2;
        let data = Bytes::from((0..4096u32).map(|i| i as u8).collect::<Vec<_>>());
        d.write(lba, data.clone(), false).await.unwrap();
        assert_eq!(d.read(lba, 8).await.unwrap(), data);
        assert_eq!(&d.read(0, 1).await.unwrap()[..], &[0u8; 512][..]);
    }

    #[tokio::test]
    async fn discard_reads_zero_and_reports_deallocated() {
        let d = MemDev::new(512, 8192);
        assert_eq!(d.provisioning(0).await.unwrap().0, Provisioning::Deallocated);
        d.write(0, Bytes::from(vec![7u8; 512]), false).await.unwrap();
        assert_eq!(d.provisioning(0).await.unwrap().0, Provisioning::Mapped);
        d.discard(0, 8192).await.unwrap();
        assert_eq!(d.provisioning(0).await.unwrap(), (Provisioning::Deallocated, 8192));
        assert!(d.read(0, 1).await.unwrap().iter().all(|&b| b == 0));
    }

    #[tokio::test]
    async fn write_zeros_clears_only_its_range() {
        let d = MemDev::new(512, 8192);
        d.write(0, Bytes::from(vec![9u8; 512 * 8192]), false).await.unwrap();
        // More than one 1 MiB zero buffer, starting mid-chunk.
        d.write_zeros(3, 2100).await.unwrap();
        let b = d.read(0, 2110).await.unwrap();
        assert!(b[..3 * 512].iter().all(|&x| x == 9));
        assert!(b[3 * 512..2103 * 512].iter().all(|&x| x == 0));
        assert!(b[2103 * 512..].iter().all(|&x| x == 9));
        assert!(d.write_zeros(8190, 3).await.is_err());
    }

    #[tokio::test]
    async fn out_of_range_is_an_error() {
        let d = MemDev::new(512, 16);
        assert!(matches!(d.read(15, 2).await, Err(BlockError::OutOfRange { .. })));
        assert!(d.write(u64::MAX, Bytes::from(vec![0; 512]), false).await.is_err());
    }
}

//! The null device: reads zeros, drops writes. It measures protocol overhead alone (seed 000).

use async_trait::async_trait;
use bytes::Bytes;

use crate::{blocks_in, BlockDev, BlockError, Geometry};

/// Zeros shared by every read that fits, so reads cost no allocation.
static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

/// A device of a given size that stores nothing.
pub struct NullDev {
    geometry: Geometry,
}

impl NullDev {
    /// A device of `num_blocks` blocks of `block_size` bytes.
    pub fn new(block_size: u32, num_blocks: u64) -> Self {
        NullDev { geometry: Geometry { block_size, num_blocks } }
    }
}

#[async_trait]
impl BlockDev for NullDev {
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
        if len <= ZEROS.len() {
            Ok(Bytes::from_static(&ZEROS[..len]))
        } else {
            Ok(Bytes::from(vec![0u8; len]))
        }
    }

    async fn write(&self, lba: u64, data: Bytes, _fua: bool) -> Result<(), BlockError> {
        let blocks = blocks_in(&data, self.geometry.block_size)?;
        self.geometry.check_range(lba, blocks)
    }

    async fn flush(&self) -> Result<(), BlockError> {
        Ok(())
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        self.geometry.check_range(lba, blocks)
    }
}

//! Coherence between several gateways' private caches of one shared LUN (seed 004 §3.4): tokens
//! per segment, shared-read or exclusive-write, handed out by a lock server at the SG. Both ends
//! are pure state machines over [`stics_link::token`]'s messages: [`server`] is the SG's table
//! (who holds, who waits, what to revoke or break, the fence every write passes), [`client`] a
//! gateway's (when an operation may run, when and how to give a token up). [`driver`] runs a
//! gateway's over a remote LUN's link commands; the SG's driver is the journal's.
//!
//! **Architecture Invariant:** at every moment each segment has one exclusive holder and no
//! other, or shared holders only, in the server's table, and a gateway believes it holds a token
//! only while the server's table says so or its lease has not run out; a write made under a token
//! the server no longer lists is fenced (`tests/sim.rs` runs gateways and a server against a
//! model of the data with messages in every order).

#![forbid(unsafe_code)]

pub mod client;
pub mod driver;
pub mod server;

pub use client::{Action, Client};
pub use server::{Policy, Server};
pub use stics_link::token::{Kind, Msg};

/// A gateway, as the SG numbers the sources of one LUN.
pub type Gw = u32;

/// Blocks per segment for a segment size and block size: the paper's granularity, 32-256 KiB.
pub fn seg_blocks(seg_bytes: u32, block_size: u32) -> Result<u64, CoherenceError> {
    if !(32 << 10..=256 << 10).contains(&seg_bytes) || !seg_bytes.is_power_of_two() {
        return Err(CoherenceError::Granularity(seg_bytes));
    }
    if block_size == 0 || !seg_bytes.is_multiple_of(block_size) {
        return Err(CoherenceError::BlockSize { seg_bytes, block_size });
    }
    Ok(u64::from(seg_bytes / block_size))
}

/// The segments blocks `lba..lba + blocks` touch.
pub fn segments(lba: u64, blocks: u64, seg_blocks: u64) -> std::ops::RangeInclusive<u64> {
    let seg_blocks = seg_blocks.max(1);
    let last = lba.saturating_add(blocks.max(1) - 1);
    lba / seg_blocks..=last / seg_blocks
}

/// A write the SG refuses: the token it was made under is not the segment's exclusive token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("segment {seg}: a write under generation {gen} is fenced (the exclusive token is {holder:?}'s, generation {current})")]
pub struct Fenced {
    pub seg: u64,
    pub gen: u64,
    pub holder: Option<Gw>,
    pub current: u64,
}

/// Why a coherence setting is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoherenceError {
    #[error("a segment of {0} bytes: the granularity is a power of two from 32 KiB to 256 KiB")]
    Granularity(u32),
    #[error("a segment of {seg_bytes} bytes is no whole number of {block_size}-byte blocks")]
    BlockSize { seg_bytes: u32, block_size: u32 },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_the_blocks_and_the_granularity_is_the_papers() {
        assert_eq!(seg_blocks(64 << 10, 4096), Ok(16));
        assert_eq!(seg_blocks(16 << 10, 512), Err(CoherenceError::Granularity(16 << 10)));
        assert_eq!(seg_blocks(96 << 10, 512), Err(CoherenceError::Granularity(96 << 10)));
        assert!(seg_blocks(32 << 10, 0).is_err());
        assert_eq!(segments(15, 2, 16), 0..=1);
        assert_eq!(segments(16, 16, 16), 1..=1);
        assert_eq!(segments(0, 0, 16), 0..=0);
    }
}

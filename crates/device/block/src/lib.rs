//! The block-device contract that every stics layer speaks, and the simple backends.
//!
//! Everything in stics is a [`BlockDev`]: backends (`mem`, `null`, `file`), the initiator's
//! remote LUN, the cache that wraps another device. The target exports any of them over iSCSI.
//!
//! Durability follows SCSI: a completed write may sit in a volatile cache
//! ([`BlockDev::volatile_cache`]); a write with `fua`, and every write completed before a
//! [`BlockDev::flush`] that has completed, is durable.

use std::future::Future;
use std::pin::Pin;

use async_trait::async_trait;
use bytes::Bytes;

pub mod extent;
pub mod file;
pub mod mem;
pub mod null;
pub mod range;

pub use file::{FileDev, Holder, InUse, LockError};
pub use mem::MemDev;
pub use null::NullDev;

/// Default logical block size.
pub const DEFAULT_BLOCK_SIZE: u32 = 512;

/// Size and shape of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Logical block size in bytes (512 or 4096 in practice).
    pub block_size: u32,
    /// Number of logical blocks.
    pub num_blocks: u64,
}

impl Geometry {
    /// Total capacity in bytes.
    pub fn bytes(&self) -> u64 {
        self.num_blocks * u64::from(self.block_size)
    }

    /// Checks that `blocks` blocks starting at `lba` lie inside the device.
    pub fn check_range(&self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        match lba.checked_add(blocks) {
            Some(end) if end <= self.num_blocks => Ok(()),
            _ => Err(BlockError::OutOfRange { lba, blocks, num_blocks: self.num_blocks }),
        }
    }
}

/// Provisioning state of a run of blocks, as GET LBA STATUS reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provisioning {
    /// Blocks hold data.
    Mapped,
    /// Blocks were discarded (a hole) and read as zeros.
    Deallocated,
}

/// Errors a block device reports; the SCSI layer turns each into sense data.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BlockError {
    /// The range `lba..lba+blocks` is outside the device.
    #[error("blocks {lba}+{blocks} outside a device of {num_blocks} blocks")]
    OutOfRange { lba: u64, blocks: u64, num_blocks: u64 },
    /// A buffer whose length is not a whole number of blocks.
    #[error("buffer of {len} bytes is not a multiple of the {block_size}-byte block")]
    Misaligned { len: usize, block_size: u32 },
    /// The device does not support the operation (for example discard).
    #[error("operation not supported: {0}")]
    Unsupported(&'static str),
    /// The medium failed (local I/O error).
    #[error("I/O error at block {lba}: {source}")]
    Io {
        lba: u64,
        #[source]
        source: std::io::Error,
    },
    /// A remote device could not be reached within its time limit.
    #[error("device unreachable: {0}")]
    Unreachable(String),
    /// Another writer holds the device (a SCSI persistent reservation): a claim under another
    /// key fails with the holder's key, and the device refuses writes (RESERVATION CONFLICT).
    #[error("the device is reserved by another writer{}", holder.map(|k| format!(" (reservation key {k:#018x})")).unwrap_or_default())]
    Reserved { holder: Option<u64> },
    /// The device has no space for the write: a thin-provisioned LUN whose pool is full (SCSI's
    /// SPACE ALLOCATION FAILED WRITE PROTECT), a file on a full file system.
    #[error("no space left on the device: {0}")]
    NoSpace(String),
    /// The device refuses writes (WRITE PROTECTED).
    #[error("the device is write-protected: {0}")]
    WriteProtected(String),
    /// The device is busy or resetting (BUSY, TASK SET FULL, a unit attention, not ready) and
    /// stayed so through the retries its driver makes: try again later.
    #[error("device busy: {0}")]
    Busy(String),
    /// The device could not serve the request within its bound because what it depends on
    /// (a cache's remote or log) has been failing for longer: the message names the cause.
    #[error("device stalled: {0}")]
    Stalled(String),
    /// The device refused what the request carries as invalid (a group whose checksum or
    /// structure does not hold): sent again unchanged it fails again, unless it was damaged on
    /// the way.
    #[error("request refused: {0}")]
    Rejected(String),
}

impl BlockError {
    /// True for failures that may go away by themselves (a lost connection, a busy or resetting
    /// device): a writer retries them with backoff. Everything else (a medium error, a full or
    /// write-protected device, another writer's reservation, a request out of range) stays
    /// until someone repairs it.
    pub fn is_transient(&self) -> bool {
        matches!(self, BlockError::Unreachable(_) | BlockError::Busy(_))
    }
}

/// What [`BlockDev::claim`] established.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The device has no other writers to keep out (a local medium): nothing was claimed.
    Unsupported,
    /// This writer now holds the device under its key (it may already have).
    Held,
    /// The key held the device from another connection (a previous run of the same writer, or
    /// a connection since lost); that hold was taken over.
    TakenOver,
}

/// A command already handed to the device; awaiting it gives its outcome.
pub type Queued = Pin<Box<dyn Future<Output = Result<(), BlockError>> + Send + 'static>>;

/// A device that keeps the order of what it is given around barriers (SCSI's ORDERED task
/// attribute): commands are queued when the method is called, not when the result is awaited;
/// a barrier runs after everything queued before it, and everything queued after it runs after
/// it. Over a long path this turns "write, wait, flush, wait, write" into one send.
#[async_trait]
pub trait OrderedQueue: Send + Sync {
    /// Redoes what a lost connection undid (a claim), before queuing more after a failure.
    async fn prepare(&self) -> Result<(), BlockError>;

    /// Queues a write of `data` (whole blocks) at `lba`.
    fn queue_write(&self, lba: u64, data: Bytes) -> Queued;

    /// Queues zeroing (or, with `discard` and when the device supports it, deallocating)
    /// `blocks` blocks from `lba`.
    fn queue_zeros(&self, lba: u64, blocks: u64, discard: bool) -> Queued;

    /// Queues a flush as a barrier: once it completes, everything queued before it is durable.
    fn queue_barrier(&self) -> Queued;
}

/// A device that takes groups of whole epochs as one step (a stics storage gateway, seed 000's
/// SG): an encoded group (see the `stics-link` crate) is durable once [`GroupSink::commit`]
/// returns, and what the device serves is its medium plus every committed group, never part of
/// one. A gateway in front of such a device ships groups instead of writes and flushes.
#[async_trait]
pub trait GroupSink: Send + Sync {
    /// The largest encoded group the device takes, in bytes.
    fn max_group(&self) -> u32;

    /// Groups of one source that may be committing at once: more than one only on a device
    /// that takes them strictly in sequence, one that arrives early waiting for the one before.
    fn groups_in_flight(&self) -> u32 {
        1
    }

    /// Takes an encoded group; on return it is durable. A group the device already holds (the
    /// same source and sequence number, sent again after a lost answer) is taken again without
    /// effect.
    async fn commit(&self, group: Bytes) -> Result<(), BlockError>;

    /// A mark of the fences set so far (see [`GroupSink::link_status`]), taken when a commit
    /// arrives: [`GroupSink::commit_marked`] then refuses the group if its source was fenced
    /// after it, however long the commit waited for its pieces meanwhile.
    fn fence_mark(&self) -> u64 {
        0
    }

    /// [`GroupSink::commit`], refused if the group's source was fenced after `mark`.
    async fn commit_marked(&self, group: Bytes, mark: u64) -> Result<(), BlockError> {
        let _ = mark;
        self.commit(group).await
    }

    /// What the device holds of each source, encoded as the link's status answer; a non-zero
    /// `fence` (`stics_link::fence_of` a source) refuses that source's commits that were under
    /// way when it was asked (see the link's LINK STATUS).
    async fn link_status(&self, fence: u64) -> Result<Bytes, BlockError>;

    /// Takes a gateway's coherence token messages (the link's token exchange: its source and a
    /// batch); `new_connection` when its connection is new since its last exchange. A device
    /// that keeps no tokens refuses them.
    async fn tokens(&self, exchange: Bytes, new_connection: bool) -> Result<(), BlockError> {
        let _ = (exchange, new_connection);
        Err(BlockError::Unsupported("this device keeps no coherence tokens"))
    }

    /// The token messages for the gateway whose source folds to `gateway`, numbered from `from`
    /// on (every earlier one acknowledged), as a poll answer of at most `max` bytes: at once
    /// when there are some, else when one comes or `wait` has passed.
    async fn token_poll(
        &self,
        gateway: u64,
        from: u32,
        wait: std::time::Duration,
        max: usize,
    ) -> Result<Bytes, BlockError> {
        let _ = (gateway, from, wait, max);
        Err(BlockError::Unsupported("this device keeps no coherence tokens"))
    }
}

/// A device that reads and writes ranges of logical blocks.
///
/// Buffers are owned (`Bytes`) so that implementations may hand them to threads or sockets
/// without copying.
#[async_trait]
pub trait BlockDev: Send + Sync + 'static {
    /// Size and block size; constant for the life of the device.
    fn geometry(&self) -> Geometry;

    /// True when completed writes may sit in a volatile cache until [`BlockDev::flush`]
    /// (the target then advertises WCE=1).
    fn volatile_cache(&self) -> bool;

    /// A name that identifies the device's medium wherever it is reached from (for a remote
    /// LUN, its Device Identification designator), when it has one: what a cache binds its log to.
    fn device_id(&self) -> Option<String> {
        None
    }

    /// True when the device refuses every write (a snapshot): it is served write-protected.
    fn read_only(&self) -> bool {
        false
    }

    /// True when [`BlockDev::discard`] frees space (thin provisioning).
    fn supports_discard(&self) -> bool {
        false
    }

    /// Claims the device for this writer alone, under `key` (non-zero, stable across restarts of
    /// the same writer): afterwards others may read but not write, and a claim under another key
    /// fails with [`BlockError::Reserved`] naming the holder's key. A claim under the key that
    /// already holds the device (a restart of the same writer) takes it over. The default claims
    /// nothing ([`Claim::Unsupported`]): local devices have no other writers.
    async fn claim(&self, key: u64) -> Result<Claim, BlockError> {
        let _ = key;
        Ok(Claim::Unsupported)
    }

    /// Reads `blocks` blocks from `lba`.
    async fn read(&self, lba: u64, blocks: u32) -> Result<Bytes, BlockError>;

    /// Writes `data` (a whole number of blocks) at `lba`; with `fua` it is durable on return.
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> Result<(), BlockError>;

    /// Makes every completed write durable.
    async fn flush(&self) -> Result<(), BlockError>;

    /// Compares the blocks at `lba` with `compare` and, only if they are equal, writes `write`
    /// (as long as `compare`) there, in one step that no writer of the medium can come between
    /// (SCSI COMPARE AND WRITE). `Ok(None)` once written; `Ok(Some(offset))` with the first byte
    /// of `compare` that differs, and nothing written. A device without such a step (the
    /// default) says [`BlockError::Unsupported`], and the caller compares and writes under a
    /// lock of its own, atomic against its own writers only.
    async fn compare_and_write(
        &self,
        lba: u64,
        compare: Bytes,
        write: Bytes,
        fua: bool,
    ) -> Result<Option<u64>, BlockError> {
        let _ = (lba, compare, write, fua);
        Err(BlockError::Unsupported("compare and write"))
    }

    /// Writes zeros to `blocks` blocks from `lba`. The default is [`write_zeros_by_writes`];
    /// devices with a cheaper way to zero (WRITE SAME, a hole that reads as zeros) override it.
    async fn write_zeros(&self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        write_zeros_by_writes(self, lba, blocks).await
    }

    /// Deallocates blocks; afterwards they read as zeros.
    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        let _ = (lba, blocks);
        Err(BlockError::Unsupported("discard"))
    }

    /// How many times the device may have lost writes it had completed but not made durable:
    /// a reconnection (the commands in flight and the target's volatile cache may be gone), a
    /// reset or power-on unit attention. A flush covers only the writes completed since this
    /// count last changed, so a writer that sees it change between a write and the flush meant
    /// to cover it writes again. Devices that never lose completed writes that way say 0.
    fn resets(&self) -> u64 {
        0
    }

    /// The device's group sink, when it takes groups of epochs (see [`GroupSink`]).
    fn group_sink(&self) -> Option<&dyn GroupSink> {
        None
    }

    /// The device's ordered queue, when it has one that keeps order (see [`OrderedQueue`]).
    fn ordered_queue(&self) -> Option<&dyn OrderedQueue> {
        None
    }

    /// Provisioning state at `lba` and how many blocks from there share it.
    async fn provisioning(&self, lba: u64) -> Result<(Provisioning, u64), BlockError> {
        let g = self.geometry();
        g.check_range(lba, 1)?;
        Ok((Provisioning::Mapped, g.num_blocks - lba))
    }
}

/// The zero buffer behind [`write_zeros_by_writes`].
static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

/// Writes zeros to `blocks` blocks from `lba` with ordinary writes of up to 1 MiB, one after
/// another: what [`BlockDev::write_zeros`] does unless a device knows better.
pub async fn write_zeros_by_writes<D: BlockDev + ?Sized>(dev: &D, lba: u64, blocks: u64) -> Result<(), BlockError> {
    let g = dev.geometry();
    g.check_range(lba, blocks)?;
    let bs = u64::from(g.block_size);
    let per = (ZEROS.len() as u64 / bs).max(1);
    let chunk = if bs as usize <= ZEROS.len() {
        Bytes::from_static(&ZEROS[..(per * bs) as usize])
    } else {
        Bytes::from(vec![0u8; bs as usize])
    };
    let (mut at, end) = (lba, lba + blocks);
    while at < end {
        let n = (end - at).min(per);
        dev.write(at, chunk.slice(..(n * bs) as usize), false).await?;
        at += n;
    }
    Ok(())
}

/// Checks that a write buffer is a whole number of blocks and returns that number.
pub fn blocks_in(data: &[u8], block_size: u32) -> Result<u64, BlockError> {
    if !data.len().is_multiple_of(block_size as usize) {
        return Err(BlockError::Misaligned { len: data.len(), block_size });
    }
    Ok((data.len() / block_size as usize) as u64)
}

//! The STICS cache (seed 004): a write-back cache that keeps its dirty data in a log-structured
//! write log on a local device and destages it to a remote device in epoch order, so the remote
//! image stays crash-consistent.
//!
//! [`format`] is the log's on-disk format (versioned, checksummed records and a superblock that
//! binds the log to its remote LUN), [`scan`] recovery's walk of it, [`core`] every decision as a
//! pure state machine, [`readcache`] the clean-block cache and [`device`] the tokio driver.
//!
//! **Architecture Invariant:** knows block devices, not iSCSI; every decision (admission, destage
//! order, recovery) is a pure function of the log's bytes, the index and `now`.

#![forbid(unsafe_code)]

pub use device::{AckMode, Cache, CacheError, CacheOptions, Status};

pub mod core;
pub mod device;
pub mod format;
pub mod readcache;
pub mod scan;

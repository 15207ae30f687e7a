//! The STICS cache (seed 004): a write-back cache that keeps its dirty data in a log-structured
//! write log on a local device and destages it to a remote device in epoch order, so the remote
//! image stays crash-consistent.
//!
//! This crate so far holds the log's on-disk format ([`format`]: versioned, checksummed records
//! and a superblock that binds the log to its remote LUN) and recovery's scan of it ([`scan`]).
//! The cache device and its destage planner build on them.
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

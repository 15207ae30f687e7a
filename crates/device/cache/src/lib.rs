//! The STICS cache (seed 004): a write-back cache that keeps its dirty data in a log-structured
//! write log on a local device and destages it to a remote device in epoch order, so the remote
//! image stays crash-consistent.
//!
//! [`config`] is its one configuration, [`format`] the log's on-disk format (versioned,
//! checksummed records and a superblock that binds the log to its remote LUN), [`scan`]
//! recovery's walk of it, [`extent`] (from stics-block) the runs of blocks its indexes are kept in, [`core`] every
//! decision as a pure state machine, [`readcache`] the clean-block cache and [`driver`] the tokio
//! driver that does the I/O.
//!
//! **Architecture Invariant:** knows block devices, not iSCSI; every decision (acknowledgement,
//! admission, destage order, retries, recovery, health) is a pure function of the log's bytes,
//! the index, the devices' answers and `now`, in [`core`].

#![forbid(unsafe_code)]

pub use config::{Config, ConfigError, Layout, Mode};
pub use driver::{claim_key, Cache, CacheError, Fencer, GroupStatus, HealthStatus, Status};

pub mod config;
pub mod core;
pub mod driver;
pub use stics_block::extent;
pub mod format;
pub mod readcache;
pub mod scan;

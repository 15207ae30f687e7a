//! A cached LUN as a typed value, and opening it: the log first, for this cache alone, then the
//! remote, then the STICS cache over both, as `stics gateway` serves each of its LUNs.

use std::path::PathBuf;
use std::sync::Arc;

use stics_block::BlockDev;
use stics_cache::Cache;
use stics_shared::SharedCache;
use stics_stack::{CacheLog, DeviceSpec, OpenContext, OpenError};

/// A remote served through the STICS cache.
#[derive(Debug, Clone)]
pub struct CachedLun {
    /// The remote device (an `iscsi://` LUN, usually).
    pub remote: DeviceSpec,
    /// The write log: a file or a block-device node.
    pub log: PathBuf,
    /// Size to create a missing log file at (`stics_stack::DEFAULT_LOG_BYTES` if `None`).
    pub log_size: Option<u64>,
    /// How the cache runs.
    pub cache: stics_cache::Config,
    /// The log's file behind a disk model, for the papers' setups.
    pub log_disk: Option<stics_disk::Preset>,
    /// Other gateways share the remote (a stics SG's LUN): the cache runs under its tokens.
    pub shared: Option<stics_coherence::driver::DriverConfig>,
}

/// An opened cached LUN: the device to serve, and its cache for status, drain and metrics.
pub struct Opened {
    pub dev: Arc<dyn BlockDev>,
    pub cache: Arc<Cache>,
    /// The tokens of a shared LUN.
    pub shared: Option<Arc<SharedCache>>,
}

/// Why a cached LUN could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum CachedError {
    /// The log or the remote could not be opened (the device stack's error).
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The cache refused the log or the remote (recovery failed, another writer holds the
    /// remote, the log is too small...).
    #[error("cache log {log}: {source}")]
    Cache {
        log: PathBuf,
        #[source]
        source: stics_cache::CacheError,
    },
    /// A shared cache could not start (the remote hands out no tokens, or refused the log).
    #[error("cache log {log}: {source}")]
    Shared {
        log: PathBuf,
        #[source]
        source: stics_shared::SharedError,
    },
}

impl CachedLun {
    /// Where a shared LUN's writes under broken tokens are kept: beside a log file, and under
    /// /var/lib/stics for a log on a block device.
    pub fn quarantine_dir(&self) -> PathBuf {
        let name = self.log.file_name().map_or_else(|| "log".into(), |n| n.to_string_lossy().into_owned());
        if self.log.starts_with("/dev") {
            return PathBuf::from("/var/lib/stics").join(format!("{name}.quarantine"));
        }
        self.log.with_file_name(format!("{name}.quarantine"))
    }

    /// Opens the log (refused while another cache has it), then the remote through `ctx`
    /// (which logs out of it at `close`), then the cache over both. A log this made is removed
    /// again when the remote cannot be opened.
    pub async fn open(&self, ctx: &OpenContext) -> Result<Opened, CachedError> {
        let log = CacheLog::open(&self.log, self.log_size).await?;
        let remote = match stics_stack::open_remote(&self.remote, ctx).await {
            Ok(r) => r,
            Err(e) => {
                log.abandon();
                return Err(e.into());
            }
        };
        let id = stics_stack::log_binding(&self.remote, remote.as_ref());
        let log_dev = log.into_dev(self.log_disk)?;
        if let Some(tokens) = self.shared {
            let shared =
                SharedCache::open(log_dev, remote, id.as_bytes(), self.cache.clone(), tokens, self.quarantine_dir())
                    .await
                    .map_err(|source| CachedError::Shared { log: self.log.clone(), source })?;
            let shared = Arc::new(shared);
            let cache = shared.cache().ok_or_else(|| CachedError::Shared {
                log: self.log.clone(),
                source: stics_shared::SharedError::Status("the cache did not open".into()),
            })?;
            return Ok(Opened { dev: Arc::clone(&shared) as Arc<dyn BlockDev>, cache, shared: Some(shared) });
        }
        let cache = Cache::open(log_dev, remote, id.as_bytes(), self.cache.clone())
            .await
            .map_err(|source| CachedError::Cache { log: self.log.clone(), source })?;
        let cache = Arc::new(cache);
        Ok(Opened { dev: Arc::clone(&cache) as Arc<dyn BlockDev>, cache, shared: None })
    }
}

//! Turning a [`DeviceSpec`] into a running device: the one place that calls every backend's
//! constructor.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use stics_block::{BlockDev, FileDev, InUse, LockError, MemDev, NullDev, DEFAULT_BLOCK_SIZE};
use stics_cache::{Cache, Config as CacheConfig};
use stics_initiator::{Lun, LunOptions};
use stics_journal::{JournalConfig, JournalDev};

use crate::spec::{valid_block_size, DeviceSpec, IscsiOptions, JournalAt, Layer, RbdSpec};

/// Size a new log file is created at when `log=PATH` gives none.
pub const DEFAULT_LOG_BYTES: u64 = 1 << 30;

/// What opening needs beyond the spec, and what it opened that needs closing.
///
/// Opening runs on the caller's tokio runtime: remote sessions spawn their tasks there.
#[derive(Debug, Default)]
pub struct OpenContext {
    /// How remote LUNs are reached: the initiator's name, digests, timers and recovery policy,
    /// sessions per LUN, largest transfer. A spec's own options override these.
    pub initiator: LunOptions,
    /// How `rbd:` images reach their cluster when their spec does not say.
    pub rbd: RbdDefaults,
    remote: Mutex<Vec<Arc<Lun>>>,
    caches: Mutex<Vec<Arc<Cache>>>,
    journals: Mutex<Vec<Arc<JournalDev>>>,
}

impl OpenContext {
    /// A context whose remote LUNs are opened with `initiator`.
    pub fn new(initiator: LunOptions) -> OpenContext {
        OpenContext {
            initiator,
            rbd: RbdDefaults::default(),
            remote: Mutex::new(Vec::new()),
            caches: Mutex::new(Vec::new()),
            journals: Mutex::new(Vec::new()),
        }
    }

    fn remote(&self) -> MutexGuard<'_, Vec<Arc<Lun>>> {
        self.remote.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every remote LUN opened through this context, in the order opened: for session parameters
    /// and counters.
    pub fn remote_luns(&self) -> Vec<Arc<Lun>> {
        self.remote().clone()
    }

    fn caches(&self) -> MutexGuard<'_, Vec<Arc<Cache>>> {
        self.caches.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn journals(&self) -> MutexGuard<'_, Vec<Arc<JournalDev>>> {
        self.journals.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every SG journal opened through this context: for status and metrics.
    pub fn journal_devices(&self) -> Vec<Arc<JournalDev>> {
        self.journals().clone()
    }

    /// Closes every cache opened through this context (what is dirty stays in its log) and
    /// every journal (what is not applied stays in it), then logs out of every remote LUN;
    /// their I/O fails afterwards.
    pub async fn close(&self) {
        let caches = std::mem::take(&mut *self.caches());
        for c in caches {
            c.close().await;
        }
        let journals = std::mem::take(&mut *self.journals());
        for j in journals {
            j.close().await;
        }
        let luns = std::mem::take(&mut *self.remote());
        for lun in luns {
            lun.close().await;
        }
    }
}

/// The cluster settings of `rbd:` specs that leave them out (a target's `[rbd]` config table).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RbdDefaults {
    /// The cluster's config file; librbd's own search (`CEPH_CONF`, /etc/ceph/ceph.conf) when None.
    pub conf: Option<PathBuf>,
    /// The client id (`admin` when None).
    pub id: Option<String>,
    /// The keyring; the config file's when None.
    pub keyring: Option<PathBuf>,
    /// Seconds reaching the cluster and opening an image may take ([`DEFAULT_RBD_TIMEOUT_SECS`]
    /// when None).
    pub timeout_secs: Option<u64>,
}

/// How long reaching a Ceph cluster and opening an image may take unless told otherwise.
pub const DEFAULT_RBD_TIMEOUT_SECS: u64 = 10;

/// Why a device could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The backing file or device node could not be opened or created.
    #[error("cannot open {path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The remote LUN could not be logged in to or is not a disk (`url` without secrets).
    #[error("cannot open {url}: {source}")]
    Iscsi {
        url: String,
        #[source]
        source: stics_initiator::Error,
    },
    /// The RBD image could not be opened (`image` as `rbd:POOL/IMAGE[@SNAP]`).
    #[cfg(feature = "rbd")]
    #[error("cannot open rbd:{image}: {source}")]
    Rbd {
        image: String,
        #[source]
        source: stics_rbd::RbdError,
    },
    /// An SG's journal could not be opened or replayed.
    #[error("{spec}: {source}")]
    Journal {
        spec: String,
        #[source]
        source: stics_journal::JournalError,
    },
    /// An `rbd:` spec given to a build without Ceph.
    #[error(
        "rbd:{0}: this stics was built without Ceph RBD support (build it with `cargo build --release -p stics \
         --features rbd`, which needs Debian's librbd-dev)"
    )]
    RbdNotBuilt(String),
    /// The cache's log could not be opened or recovered.
    #[error("cache log {log}: {source}")]
    Cache {
        log: PathBuf,
        #[source]
        source: stics_cache::CacheError,
    },
    /// Another cache, in this process or another, has the log open: two writers would append at
    /// the same tail and corrupt each other. Refused before the log is read or the remote
    /// logged in to.
    #[error("the log {source}; {}", if source.holder.as_ref().is_some_and(stics_block::Holder::is_this_process) { "each cache needs a log of its own" } else { "stop it first, or give another log" })]
    LogInUse {
        log: PathBuf,
        #[source]
        source: InUse,
    },
    /// The log's file could not be allocated in full. An existing log is left as it was, with
    /// whatever it holds still to be destaged once there is room.
    #[error("cache log {log}: {source}{}", if *kept { " (the log is untouched: free some space and start again to destage what it holds)" } else { " (nothing was created)" })]
    LogSpace {
        log: PathBuf,
        kept: bool,
        #[source]
        source: std::io::Error,
    },
    /// A disk model whose parameters describe no disk.
    #[error("{spec}: {source}")]
    Disk {
        spec: String,
        #[source]
        source: stics_disk::DiskError,
    },
    /// A spec built in code with a geometry no parsed spec has.
    #[error("{0}: size must be a positive whole number of 512-, 1024-, 2048- or 4096-byte blocks")]
    Geometry(String),
}

/// Blocks of `size` bytes, when the geometry is one a parsed spec could have.
fn blocks(spec: &DeviceSpec, size: u64, block_size: u32) -> Result<u64, OpenError> {
    if valid_block_size(block_size) && size > 0 && size.is_multiple_of(u64::from(block_size)) {
        Ok(size / u64::from(block_size))
    } else {
        Err(OpenError::Geometry(spec.redacted().to_string()))
    }
}

/// Opens the device `spec` names, and every device under it.
pub async fn open(spec: &DeviceSpec, ctx: &OpenContext) -> Result<Arc<dyn BlockDev>, OpenError> {
    open_in(spec, ctx, Place::Top).await
}

/// Where a device sits in the tree, as far as how to open it depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Exported as it is, or under a wrapper that asks nothing of it.
    Top,
    /// The remote of a cache: its reads are the cache's misses, which must not wait behind
    /// the cache's destage, so a remote LUN there reads on a session of its own, and it offers
    /// the link to a stics SG.
    UnderCache,
}

async fn open_in(spec: &DeviceSpec, ctx: &OpenContext, place: Place) -> Result<Arc<dyn BlockDev>, OpenError> {
    Ok(match spec {
        DeviceSpec::Mem { size, block_size } => Arc::new(MemDev::new(*block_size, blocks(spec, *size, *block_size)?)),
        DeviceSpec::Null { size, block_size } => Arc::new(NullDev::new(*block_size, blocks(spec, *size, *block_size)?)),
        DeviceSpec::File { path, size, block_size } => {
            if let Some(size) = size {
                blocks(spec, *size, *block_size)?;
            } else if !valid_block_size(*block_size) {
                return Err(OpenError::Geometry(spec.redacted().to_string()));
            }
            let file = FileDev::open(path, *size, *block_size)
                .map_err(|source| OpenError::File { path: path.clone(), source })?;
            Arc::new(file)
        }
        DeviceSpec::Iscsi { url, options } => {
            let mut opts = lun_options(&ctx.initiator, options, place);
            if let Some(t) = &options.tls {
                let c = stics_tls::Connector::new(t)
                    .map_err(|e| OpenError::Iscsi { url: url.to_string(), source: e.into() })?;
                opts.config.tls = Some(c);
            }
            let lun =
                Lun::open(url, &opts).await.map_err(|source| OpenError::Iscsi { url: url.to_string(), source })?;
            let lun = Arc::new(lun);
            ctx.remote().push(Arc::clone(&lun));
            lun
        }
        DeviceSpec::Rbd(r) => open_rbd(r, &ctx.rbd).await?,
        // A cache opens its log first, for itself alone (see `CacheLog::open`), then the device
        // it wraps (the future is recursive, hence the box).
        DeviceSpec::Layer(Layer::Cache(c)) => {
            let log = CacheLog::open(&c.log, c.log_size).await?;
            let inner = match Box::pin(open_in(&c.inner, ctx, Place::UnderCache)).await {
                Ok(inner) => inner,
                Err(e) => {
                    log.abandon();
                    return Err(e);
                }
            };
            let mut opts = CacheConfig::default();
            if let Some(m) = c.mode {
                opts.mode = m;
            }
            if let Some(n) = c.ram {
                opts.ram_bytes = n;
            }
            if let Some(n) = c.read_cache {
                opts.read_cache_bytes = n;
            }
            if let Some(p) = c.policy {
                opts.read_cache_policy = p;
            }
            if let Some(n) = c.full_timeout_secs {
                opts.full_timeout = std::time::Duration::from_secs(n);
            }
            if let Some(n) = c.index_memory {
                opts.index_bytes = n;
            }
            if let Some(n) = c.max_lag_secs {
                opts.max_lag = Some(std::time::Duration::from_secs(n));
            }
            let id = log_binding(&c.inner, inner.as_ref());
            let cache = Cache::open(log.into_dev(c.log_disk)?, inner, id.as_bytes(), opts)
                .await
                .map_err(|source| OpenError::Cache { log: c.log.clone(), source })?;
            let cache = Arc::new(cache);
            ctx.caches().push(Arc::clone(&cache));
            cache
        }
        DeviceSpec::Layer(Layer::Disk(d)) => {
            let inner = Box::pin(open_in(&d.inner, ctx, place)).await?;
            let dev = stics_disk::DiskDev::new(inner, &d.config())
                .map_err(|source| OpenError::Disk { spec: spec.redacted().to_string(), source })?;
            Arc::new(dev)
        }
        // A journal, like a cache's log, is opened for one SG alone, before the medium.
        DeviceSpec::Layer(Layer::Journal(j)) => {
            let journal: Arc<dyn BlockDev> = match &j.journal {
                JournalAt::Path { path, size } => {
                    let exists = path.exists();
                    let size = if exists { None } else { Some(size.unwrap_or(DEFAULT_LOG_BYTES)) };
                    let f = FileDev::open_exclusive(path, size, DEFAULT_BLOCK_SIZE).map_err(|e| match e {
                        LockError::InUse(source) => OpenError::LogInUse { log: path.clone(), source },
                        LockError::Io(source) => OpenError::File { path: path.clone(), source },
                    })?;
                    if let Err(source) = f.reserve() {
                        if !exists {
                            let _ = std::fs::remove_file(path);
                        }
                        return Err(OpenError::LogSpace { log: path.clone(), kept: exists, source });
                    }
                    Arc::new(f)
                }
                JournalAt::Device(d) => Box::pin(open_in(d, ctx, Place::Top)).await?,
            };
            let medium = Box::pin(open_in(&j.inner, ctx, Place::Top)).await?;
            let mut cfg = JournalConfig::default();
            if let Some(n) = j.max_group {
                cfg.max_group = n;
            }
            if let Some(n) = j.segment {
                cfg.segment_bytes = n;
            }
            if let Some(n) = j.lease_secs {
                cfg.tokens.lease = std::time::Duration::from_secs(n.into());
            }
            cfg.tokens.break_after = j.break_after_secs.map(|n| std::time::Duration::from_secs(n.into()));
            let dev = JournalDev::open(journal, medium, cfg)
                .await
                .map_err(|source| OpenError::Journal { spec: spec.redacted().to_string(), source })?;
            let dev = Arc::new(dev);
            ctx.journals().push(Arc::clone(&dev));
            dev
        }
    })
}

/// Opens the device `spec` names as the remote of a cache: a remote LUN reads on a session of
/// its own unless its spec says `read_session=off`, so that the cache's read misses never wait
/// behind its destage.
pub async fn open_remote(spec: &DeviceSpec, ctx: &OpenContext) -> Result<Arc<dyn BlockDev>, OpenError> {
    open_in(spec, ctx, Place::UnderCache).await
}

/// What a cache's log is bound to: the remote's own name when it has one (a remote LUN's
/// Device Identification designator), else how `spec` names it. A log refuses to serve
/// another remote, so every opener of a cache must bind it the same way.
pub fn log_binding(spec: &DeviceSpec, remote: &dyn BlockDev) -> String {
    remote.device_id().unwrap_or_else(|| spec.redacted().to_string())
}

/// A cache's write log, open for that cache alone.
///
/// The log is opened before anything else of its cache: a second writer on it would append at
/// the same tail and, under the same key, take the remote too. So another open of the log (in
/// this process or another) is refused before anything reads, sizes or formats it, and before
/// the remote is logged in to. The lock lives as long as the log's `FileDev`, which the cache
/// keeps.
pub struct CacheLog {
    file: FileDev,
    path: PathBuf,
    created: bool,
}

impl std::fmt::Debug for CacheLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheLog").field("path", &self.path).field("created", &self.created).finish_non_exhaustive()
    }
}

impl CacheLog {
    /// Opens the log at `path` exclusively, creating it at `size` ([`DEFAULT_LOG_BYTES`] when
    /// `None`) if it does not exist, allocated in full and written out once.
    pub async fn open(path: &Path, size: Option<u64>) -> Result<CacheLog, OpenError> {
        let exists = path.exists();
        let size = if exists { None } else { Some(size.unwrap_or(DEFAULT_LOG_BYTES)) };
        let file = FileDev::open_exclusive(path, size, DEFAULT_BLOCK_SIZE).map_err(|e| match e {
            LockError::InUse(source) => OpenError::LogInUse { log: path.to_owned(), source },
            LockError::Io(source) => OpenError::File { path: path.to_owned(), source },
        })?;
        let log = CacheLog { file, path: path.to_owned(), created: !exists };
        // A log allocated up front cannot meet a full file system in the middle of a commit,
        // where the only choices would be to hang or to fail writes already promised.
        if let Err(source) = log.file.reserve() {
            log.abandon();
            return Err(OpenError::LogSpace { log: path.to_owned(), kept: exists, source });
        }
        if exists {
            return Ok(log);
        }
        // A new log is written out once, so that its first round of synchronous appends
        // overwrites blocks instead of converting fallocate's unwritten extents one by one.
        let CacheLog { file, path, created } = log;
        let filled = tokio::task::spawn_blocking(move || file.prefill().map(|()| file))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)));
        match filled {
            Ok(file) => Ok(CacheLog { file, path, created }),
            Err(source) => {
                let _ = std::fs::remove_file(&path);
                Err(OpenError::File { path, source })
            }
        }
    }

    /// Whether opening made the file.
    pub fn created(&self) -> bool {
        self.created
    }

    /// Gives the log up because its cache could not be opened: a log made for it is removed
    /// again (nothing was ever acknowledged from it), one that existed is left as it was.
    pub fn abandon(self) {
        if self.created {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// The log's device, for `Cache::open`: the file itself, or the file behind the disk model
    /// `disk` (every append then takes as long as that disk would).
    pub fn into_dev(self, disk: Option<stics_disk::Preset>) -> Result<Arc<dyn BlockDev>, OpenError> {
        let file: Arc<dyn BlockDev> = Arc::new(self.file);
        match disk {
            None => Ok(file),
            Some(model) => match stics_disk::DiskDev::new(file, &model.config()) {
                Ok(dev) => Ok(Arc::new(dev)),
                Err(source) => Err(OpenError::Disk { spec: format!("log-disk={model}"), source }),
            },
        }
    }
}

/// `pool/image[@snap]`, for messages.
fn rbd_name(r: &RbdSpec) -> String {
    match &r.snap {
        Some(s) => format!("{}/{}@{s}", r.pool, r.image),
        None => format!("{}/{}", r.pool, r.image),
    }
}

/// Opens an RBD image with the spec's settings, else the context's.
#[cfg(feature = "rbd")]
async fn open_rbd(r: &RbdSpec, defaults: &RbdDefaults) -> Result<Arc<dyn BlockDev>, OpenError> {
    let secs = r.timeout_secs.or(defaults.timeout_secs).unwrap_or(DEFAULT_RBD_TIMEOUT_SECS);
    let opts = stics_rbd::RbdOptions {
        conf: r.conf.clone().or_else(|| defaults.conf.clone()),
        id: r.id.clone().or_else(|| defaults.id.clone()),
        keyring: r.keyring.clone().or_else(|| defaults.keyring.clone()),
        block_size: r.block_size,
        connect_timeout: std::time::Duration::from_secs(secs),
        options: Vec::new(),
    };
    let dev = stics_rbd::RbdDev::open(&r.pool, &r.image, r.snap.as_deref(), &opts)
        .await
        .map_err(|source| OpenError::Rbd { image: rbd_name(r), source })?;
    Ok(Arc::new(dev))
}

/// Refuses an RBD image in a build without librbd.
#[cfg(not(feature = "rbd"))]
#[allow(clippy::unused_async)]
async fn open_rbd(r: &RbdSpec, _defaults: &RbdDefaults) -> Result<Arc<dyn BlockDev>, OpenError> {
    Err(OpenError::RbdNotBuilt(rbd_name(r)))
}

/// The context's initiator settings with a spec's own options in force; a LUN under a cache reads
/// on a session of its own unless its spec says otherwise.
fn lun_options(base: &LunOptions, options: &IscsiOptions, place: Place) -> LunOptions {
    let IscsiOptions { sessions, digests, first_burst, max_burst, max_r2t, max_transfer, read_session, link, tls: _ } =
        *options;
    let mut opts = base.clone();
    opts.read_session = read_session.unwrap_or(base.read_session || place == Place::UnderCache);
    opts.link = link.unwrap_or(base.link || place == Place::UnderCache);
    let offer = &mut opts.config.offer;
    if let Some(n) = sessions {
        opts.sessions = n;
    }
    if let Some(d) = digests {
        offer.header_digest = d;
        offer.data_digest = d;
    }
    if let Some(n) = first_burst {
        offer.first_burst_length = n;
    }
    if let Some(n) = max_burst {
        offer.max_burst_length = n;
    }
    // FirstBurstLength may not exceed MaxBurstLength (RFC 7143 §13.14): a spec that lowers only
    // the latter below the default first burst lowers the first burst with it.
    offer.first_burst_length = offer.first_burst_length.min(offer.max_burst_length);
    if let Some(n) = max_r2t {
        offer.max_outstanding_r2t = n;
    }
    if let Some(n) = max_transfer {
        opts.max_transfer = n;
    }
    opts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A build without the `rbd` feature reads an `rbd:` spec and refuses to open it, saying how
    /// to get a build that does.
    #[cfg(not(feature = "rbd"))]
    #[tokio::test]
    async fn an_rbd_image_in_a_build_without_ceph_says_how_to_build_one() {
        let spec: DeviceSpec = "rbd:rbd/img0@s?conf=/etc/ceph/ceph.conf".parse().unwrap();
        let e = open(&spec, &OpenContext::default()).await.err().unwrap();
        assert!(matches!(&e, OpenError::RbdNotBuilt(name) if name == "rbd/img0@s"), "{e:?}");
        let e = e.to_string();
        assert!(e.starts_with("rbd:rbd/img0@s: ") && e.contains("--features rbd"), "{e}");
    }

    #[test]
    fn a_specs_iscsi_options_override_the_contexts_offer() {
        let base = LunOptions::default();
        let spec: DeviceSpec =
            "iscsi://h/iqn.x/0?first_burst=64KiB&max_burst=256KiB&max_r2t=1&max_transfer=16MiB&digests=on"
                .parse()
                .unwrap();
        let DeviceSpec::Iscsi { options, .. } = spec else { panic!("{spec:?}") };
        let o = lun_options(&base, &options, Place::Top);
        let offer = &o.config.offer;
        assert_eq!((offer.first_burst_length, offer.max_burst_length, offer.max_outstanding_r2t), (65536, 262_144, 1));
        assert!(offer.header_digest && offer.data_digest);
        assert_eq!((o.max_transfer, o.sessions), (16 << 20, base.sessions));
        // Nothing asked for: the context's settings as they were.
        assert_eq!(lun_options(&base, &IscsiOptions::default(), Place::Top).config.offer, base.config.offer);
        // A lower max_burst alone takes the first burst down with it.
        let o = lun_options(&base, &IscsiOptions { max_burst: Some(8192), ..IscsiOptions::default() }, Place::Top);
        assert_eq!((o.config.offer.first_burst_length, o.config.offer.max_burst_length), (8192, 8192));
    }

    #[test]
    fn a_remote_under_a_cache_reads_on_a_session_of_its_own_unless_its_spec_says_off() {
        let base = LunOptions::default();
        let on = |read_session, place| {
            lun_options(&base, &IscsiOptions { read_session, ..IscsiOptions::default() }, place).read_session
        };
        assert!(on(None, Place::UnderCache));
        assert!(!on(None, Place::Top));
        assert!(!on(Some(false), Place::UnderCache));
        assert!(on(Some(true), Place::Top));
        // The sessions asked for stay the write sessions.
        let o = lun_options(&base, &IscsiOptions { sessions: Some(2), ..IscsiOptions::default() }, Place::UnderCache);
        assert_eq!((o.sessions, o.read_session), (2, true));
    }

    async fn open_text(text: &str) -> Result<Arc<dyn BlockDev>, OpenError> {
        open(&text.parse().unwrap(), &OpenContext::default()).await
    }

    #[tokio::test]
    async fn a_disk_model_keeps_its_inner_devices_data_and_geometry_and_says_whether_it_buffers() {
        let d = open_text("disk(mem:1MiB:4096, model=o7n3200)").await.unwrap();
        assert_eq!((d.geometry().block_size, d.geometry().num_blocks), (4096, 256));
        assert!(!d.volatile_cache(), "no buffer on the O7N3200");
        let data = bytes::Bytes::from(vec![7u8; 4096]);
        d.write(3, data.clone(), true).await.unwrap();
        assert_eq!(d.read(3, 1).await.unwrap(), data);
        assert!(open_text("disk(mem:1MiB, model=ddys)").await.unwrap().volatile_cache());
        assert!(!open_text("disk(mem:1MiB, model=ddys, buffer=off)").await.unwrap().volatile_cache());
        assert!(open_text("disk(mem:1MiB, rpm=5400, seek=12ms, transfer=10MB/s, buffer=1MiB)")
            .await
            .unwrap()
            .volatile_cache());
        let e = open_text("disk(file:/nonexistent/dir/x.img, model=dnes)").await.err().unwrap();
        assert!(matches!(e, OpenError::File { .. }), "{e}");
    }

    #[tokio::test]
    async fn backends_get_the_geometry_of_their_spec() {
        let g = open_text("mem:1MiB").await.unwrap().geometry();
        assert_eq!((g.block_size, g.num_blocks), (512, 2048));
        let g = open_text("mem:1MiB:4096").await.unwrap().geometry();
        assert_eq!((g.block_size, g.num_blocks), (4096, 256));
        let g = open_text("null:1G:2048").await.unwrap().geometry();
        assert_eq!((g.block_size, g.num_blocks), (2048, 1 << 19));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lun.img");
        let g = open_text(&format!("file:{}:1M:4096", path.display())).await.unwrap().geometry();
        assert_eq!((g.block_size, g.num_blocks), (4096, 256));
        // Without a size, the file's length counts.
        let g = open_text(&format!("file:{}::1024", path.display())).await.unwrap().geometry();
        assert_eq!((g.block_size, g.num_blocks), (1024, 1024));
        let g = open_text(&format!("file:{}", path.display())).await.unwrap().geometry();
        assert_eq!((g.block_size, g.num_blocks), (512, 2048));
    }

    #[tokio::test]
    async fn a_cache_opens_over_its_inner_device_and_refuses_a_log_too_small() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = OpenContext::default();
        let spec = format!("cache(mem:4MiB, log={}:1GiB, mode=immediate)", dir.path().join("log").display());
        let dev = open(&spec.parse().unwrap(), &ctx).await.unwrap();
        assert_eq!(dev.geometry().num_blocks, 8192);
        assert!(dev.volatile_cache(), "immediate mode advertises a volatile cache");
        dev.write(3, bytes::Bytes::from(vec![7u8; 1024]), false).await.unwrap();
        assert_eq!(&dev.read(3, 2).await.unwrap()[..], &[7u8; 1024][..]);
        ctx.close().await;
        let small = format!("cache(mem:4MiB, log={}:8MiB)", dir.path().join("small").display());
        let e = open(&small.parse().unwrap(), &ctx).await.err().unwrap().to_string();
        assert!(e.contains("needs at least"), "{e}");
        // A log larger than the file system's free space: a clear error, and no file left.
        let free = free_bytes(dir.path());
        let huge = dir.path().join("huge");
        let spec = format!("cache(mem:4MiB, log={}:{}MiB)", huge.display(), (free >> 20) + 1024);
        let e = open(&spec.parse().unwrap(), &ctx).await.err().unwrap().to_string();
        assert!(e.contains("no room") && e.contains("nothing was created"), "{e}");
        assert!(!huge.exists());
    }

    #[tokio::test]
    async fn a_cache_whose_log_sits_on_a_disk_model_serves_and_keeps_its_log_to_itself() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = OpenContext::default();
        let spec = format!("cache(mem:4MiB, log={}:1GiB, log-disk=o7n3200)", dir.path().join("log").display());
        let dev = open(&spec.parse().unwrap(), &ctx).await.unwrap();
        dev.write(9, bytes::Bytes::from(vec![5u8; 4096]), true).await.unwrap();
        dev.flush().await.unwrap();
        assert_eq!(&dev.read(9, 8).await.unwrap()[..], &[5u8; 4096][..]);
        let again = open(&spec.parse().unwrap(), &ctx).await.err().expect("the log is in use").to_string();
        assert!(again.contains("in use"), "{again}");
        ctx.close().await;
    }

    #[tokio::test]
    async fn a_second_cache_on_the_same_log_is_refused_before_its_remote_is_opened() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let ctx = OpenContext::default();
        let spec = format!("cache(mem:4MiB, log={}:256MiB, ram=4MiB)", log.display());
        let first = open(&spec.parse().unwrap(), &ctx).await.unwrap();
        first.write(0, bytes::Bytes::from(vec![9u8; 4096]), true).await.unwrap();
        // The second names a remote nobody answers for: it is refused for the log, before any
        // login is tried.
        let second = format!("cache(iscsi://127.0.0.1:1/iqn.2024-01.org.x:y/0, log={}, ram=4MiB)", log.display());
        let e = open(&second.parse().unwrap(), &ctx).await.err().unwrap();
        let OpenError::LogInUse { log: named, source } = &e else { panic!("{e:?}") };
        assert_eq!(named, &log);
        assert!(source.holder.as_ref().is_some_and(stics_block::Holder::is_this_process), "{source:?}");
        let text = e.to_string();
        let holder = format!("the log {} is in use by this process, {}", log.display(), std::process::id());
        assert!(text.starts_with(&holder) && text.ends_with("each cache needs a log of its own"), "{text}");
        assert!(ctx.remote_luns().is_empty(), "no login was tried");
        // The same log inside its own cache's remote, too.
        let nested = format!("cache(cache(mem:4MiB, log={0}, ram=4MiB), log={0}, ram=4MiB)", log.display());
        let e = open(&nested.parse().unwrap(), &ctx).await.err().unwrap();
        assert!(matches!(e, OpenError::LogInUse { .. }), "{e:?}");
        // The first cache still serves what it took, and its log is where it was.
        assert_eq!(&first.read(0, 8).await.unwrap()[..], &[9u8; 4096][..]);
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 256 << 20);
        ctx.close().await;
    }

    #[tokio::test]
    async fn a_new_log_is_removed_when_its_remote_cannot_be_opened() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let ctx = OpenContext::default();
        let spec = format!("cache(iscsi://127.0.0.1:1/iqn.2024-01.org.x:y/0, log={}:256MiB)", log.display());
        let e = open(&spec.parse().unwrap(), &ctx).await.err().unwrap();
        assert!(matches!(e, OpenError::Iscsi { .. }), "{e:?}");
        assert!(!log.exists(), "the log made for it is gone");
    }

    #[tokio::test]
    async fn a_closed_and_dropped_cache_frees_its_log_for_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let ctx = OpenContext::default();
        let spec = format!("cache(mem:4MiB, log={}:256MiB, ram=4MiB)", log.display());
        let first = open(&spec.parse().unwrap(), &ctx).await.unwrap();
        ctx.close().await;
        drop(first);
        let again = open(&spec.parse().unwrap(), &ctx).await;
        assert!(again.is_ok(), "{:?}", again.err());
        ctx.close().await;
    }

    fn free_bytes(path: &std::path::Path) -> u64 {
        let out = std::process::Command::new("df").args(["--output=avail", "-B1"]).arg(path).output().unwrap();
        String::from_utf8(out.stdout).unwrap().lines().nth(1).unwrap().trim().parse().unwrap()
    }

    #[tokio::test]
    async fn failures_name_the_device() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.img");
        let e = open_text(&format!("file:{}", missing.display())).await.err().unwrap();
        assert!(e.to_string().contains("missing.img"), "{e}");
        let e = open(&DeviceSpec::Mem { size: 1000, block_size: 512 }, &OpenContext::default()).await.err().unwrap();
        assert!(matches!(e, OpenError::Geometry(_)), "{e}");
        let e = open(&DeviceSpec::Null { size: 4096, block_size: 3000 }, &OpenContext::default()).await.err().unwrap();
        assert!(e.to_string().contains("null:4KiB:3000"), "{e}");
    }

    #[tokio::test]
    async fn an_unreachable_target_is_an_error_without_secrets() {
        // Port 1 on loopback refuses connections at once.
        let ctx = OpenContext::default();
        let e = open(&"iscsi://u%hush@127.0.0.1:1/iqn.2024-01.org.x:y/0".parse().unwrap(), &ctx).await.err().unwrap();
        assert!(matches!(e, OpenError::Iscsi { .. }), "{e}");
        assert!(e.to_string().contains("127.0.0.1:1"), "{e}");
        assert!(!e.to_string().contains("hush"), "{e}");
        assert!(ctx.remote_luns().is_empty());
    }
}

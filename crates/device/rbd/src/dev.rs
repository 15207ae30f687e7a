//! [`RbdDev`]: an RBD image (or a snapshot of one, read-only) as a block device.
//!
//! # One writer per image
//!
//! Opening an image read-write takes its RBD exclusive lock (`rbd_lock_acquire` in exclusive
//! mode) before [`RbdDev::open`] returns, and keeps it until the device is dropped: librbd then
//! refuses every other client's request for the lock. So when two targets export the same
//! image:
//!
//! - the first to open it holds the lock; the second's open fails at once with
//!   [`RbdError::Locked`], naming the holder's client address (`rbd:POOL/IMAGE is in use by
//!   another writer (...)`), and it exports nothing;
//! - snapshots open read-only and take no lock: any number of targets may export one;
//! - when the holder's device is dropped or closed ([`RbdDev::close`]), the lock is released
//!   and the next open succeeds;
//! - when the holder dies without closing (SIGKILL, power loss), its lock stays until the OSDs
//!   notice that its watch on the image lapsed (`osd_client_watch_timeout`, an OSD setting,
//!   30 s by default). A new open meanwhile waits inside `rbd_lock_acquire`, bounded by the
//!   connect timeout ([`RbdError::LockTimeout`] if it runs out), and then breaks the dead
//!   owner's lock, blocklisting its address (for an hour, Ceph's default): should the old
//!   writer come back (it was cut off, not dead), its writes fail instead of landing behind
//!   the new writer's. A process that opens again after its own open ran out of time waits
//!   for that earlier attempt to finish and let go first.
//!
//! The image must have the exclusive-lock feature: without it librbd would let both write, so
//! such an image is refused ([`RbdError::NoExclusiveLock`]).
//!
//! # Durability and zeros
//!
//! librbd's cache is turned off (`rbd_cache = false`), so a completed write is in the OSDs and
//! the device reports no volatile cache; discards zero partial objects too
//! (`rbd_skip_partial_discard = false`), so discarded blocks read back as zeros. Both are read
//! back from the image's effective configuration after it opens (a pool or image override may
//! differ), and the device follows what is in force.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use stics_block::{blocks_in, BlockDev, BlockError, Geometry, Provisioning};
use tokio::sync::RwLock;

use crate::sys::{Errno, Image, IoCtx, Rados, RBD_FEATURE_EXCLUSIVE_LOCK};

/// How a client connects to the cluster and how the image is presented.
#[derive(Debug, Clone)]
pub struct RbdOptions {
    /// The Ceph config file; `None` searches as the Ceph tools do (`$CEPH_CONF`, then
    /// `/etc/ceph/ceph.conf`, ...).
    pub conf: Option<PathBuf>,
    /// The client id (`admin` for `client.admin`); `None` means `admin`.
    pub id: Option<String>,
    /// A keyring file, when the config file names none (or another).
    pub keyring: Option<PathBuf>,
    /// Logical block size: 512 or 4096.
    pub block_size: u32,
    /// How long connecting, opening the image, and taking its lock may each take.
    pub connect_timeout: Duration,
    /// Extra client options (`key`, `value`) set before connecting, after this crate's own.
    pub options: Vec<(String, String)>,
}

impl Default for RbdOptions {
    fn default() -> Self {
        RbdOptions {
            conf: None,
            id: None,
            keyring: None,
            block_size: 512,
            connect_timeout: Duration::from_secs(10),
            options: Vec::new(),
        }
    }
}

/// Why an image could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RbdError {
    /// A block size other than 512 or 4096.
    #[error("block size {0} is not supported: use 512 or 4096")]
    BlockSize(u32),
    /// A client option or the config file was refused before connecting.
    #[error("cannot set up the Ceph client (conf {conf}, {client}): {what}: {source}")]
    Setup {
        conf: String,
        client: String,
        what: String,
        #[source]
        source: io::Error,
    },
    /// The monitors did not answer in time (or refused the client).
    #[error("cannot reach the Ceph cluster (conf {conf}, {client}) within {secs} s: {reason}")]
    Unreachable { conf: String, client: String, secs: f64, reason: String },
    /// The pool does not exist or cannot be used.
    #[error("cannot open pool {pool} (conf {conf}): {source}")]
    Pool {
        pool: String,
        conf: String,
        #[source]
        source: io::Error,
    },
    /// The image (or snapshot) does not exist or cannot be opened.
    #[error("cannot open rbd:{image}: {source}")]
    Open {
        image: String,
        #[source]
        source: io::Error,
    },
    /// The monitors answered but the image did not open in time.
    #[error("rbd:{image} did not open within {secs} s: the monitors answered, but the OSDs holding it did not (are they up?)")]
    OpenTimeout { image: String, secs: f64 },
    /// A query about the open image failed.
    #[error("rbd:{image}: cannot read its {what}: {source}")]
    Query {
        image: String,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// The image is not a whole number of blocks.
    #[error("rbd:{image} is {size} bytes, not a multiple of the {block_size}-byte block size: resize it or use 512-byte blocks")]
    Size { image: String, size: u64, block_size: u32 },
    /// The image lacks the exclusive-lock feature, so a second writer could not be kept out.
    #[error(
        "rbd:{image} lacks the exclusive-lock feature, which keeps a second writer out: run \
         `rbd feature enable {image} exclusive-lock` (or export a snapshot, read-only)"
    )]
    NoExclusiveLock { image: String },
    /// Another client holds the image's exclusive lock.
    #[error(
        "rbd:{image} is in use by another writer ({holder}); stop that writer first (a writer \
         killed without closing keeps the lock until the OSDs' osd_client_watch_timeout, 30 s by \
         default, runs out)"
    )]
    Locked { image: String, holder: String },
    /// The lock's holder neither released it nor lapsed within the time limit.
    #[error(
        "rbd:{image} is locked by {holder}, which did not give it up within {secs} s; if that \
         writer died, its lock lapses once the OSDs' osd_client_watch_timeout (30 s by default) \
         runs out: retry then, or allow a longer connect timeout"
    )]
    LockTimeout { image: String, holder: String, secs: f64 },
    /// Taking the lock failed otherwise.
    #[error("rbd:{image}: cannot take its exclusive lock: {source}")]
    Lock {
        image: String,
        #[source]
        source: io::Error,
    },
    /// A setup thread failed (a bug, not the cluster).
    #[error("rbd:{image}: {what} failed: {reason}")]
    Internal { image: String, what: &'static str, reason: String },
}

/// Provisioning answers look this far ahead at most: one `rbd_diff_iterate2` call stays short.
const PROVISIONING_WINDOW: u64 = 1 << 30;

/// librbd compares and writes atomically only within one 512-byte sector (Ceph 16).
const CAW_SECTOR: u64 = 512;

/// Where the open got to when its time ran out.
const STAGE_CONNECTING: u8 = 0;
const STAGE_OPENING: u8 = 1;

/// An RBD image as a block device. See the module documentation for locking.
pub struct RbdDev {
    image: Arc<Image>,
    /// `POOL/IMAGE` or `POOL/IMAGE@SNAP`, for messages.
    name: String,
    geometry: Geometry,
    object_size: u64,
    read_only: bool,
    volatile: bool,
    discard_zeroes: bool,
    device_id: String,
    /// Writes hold it shared; a compare-and-write that librbd cannot do atomically holds it
    /// alone, so no write of ours lands between its compare and its write (no other client
    /// can write: we hold the image's exclusive lock).
    gate: RwLock<()>,
}

impl std::fmt::Debug for RbdDev {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RbdDev")
            .field("name", &self.name)
            .field("geometry", &self.geometry)
            .field("read_only", &self.read_only)
            .field("device_id", &self.device_id)
            .finish_non_exhaustive()
    }
}

/// What the blocking part of the open found.
struct Opened {
    image: Arc<Image>,
    size: u64,
    obj_size: u64,
    features: u64,
    device_id: String,
    volatile: bool,
    discard_zeroes: bool,
}

/// The client settings an open uses, with the names its messages give them.
#[derive(Clone)]
struct Client {
    conf: Option<PathBuf>,
    conf_text: String,
    name: String,
    keyring: Option<PathBuf>,
    timeout: Duration,
    options: Vec<(String, String)>,
}

impl RbdDev {
    /// Connects to the cluster and opens `pool/image`, or its snapshot `snap` (read-only).
    /// A read-write open holds the image's exclusive lock before it returns.
    pub async fn open(pool: &str, image: &str, snap: Option<&str>, opts: &RbdOptions) -> Result<RbdDev, RbdError> {
        let bs = opts.block_size;
        if bs != 512 && bs != 4096 {
            return Err(RbdError::BlockSize(bs));
        }
        let name = match snap {
            Some(s) => format!("{pool}/{image}@{s}"),
            None => format!("{pool}/{image}"),
        };
        let client = Client {
            conf: opts.conf.clone(),
            conf_text: conf_text(opts.conf.as_ref()),
            name: client_name(opts.id.as_deref()),
            keyring: opts.keyring.clone(),
            timeout: opts.connect_timeout,
            options: opts.options.clone(),
        };
        let read_only = snap.is_some();
        let secs = client.timeout.as_secs_f64();

        let stage = Arc::new(AtomicU8::new(STAGE_CONNECTING));
        let job = {
            let (stage, pool, image, snap, name) =
                (Arc::clone(&stage), pool.to_owned(), image.to_owned(), snap.map(str::to_owned), name.clone());
            let client = client.clone();
            // Blocking calls run on the blocking pool; if the timeout below fires first, the
            // thread finishes on its own (client_mount_timeout bounds the connect) and drops
            // whatever it opened.
            tokio::task::spawn_blocking(move || {
                connect_and_open(&client, &pool, &image, snap.as_deref(), &name, &stage)
            })
        };
        let opened = match tokio::time::timeout(client.timeout, job).await {
            Ok(Ok(r)) => r?,
            Ok(Err(e)) => return Err(RbdError::Internal { image: name, what: "opening", reason: e.to_string() }),
            Err(_) if stage.load(Ordering::SeqCst) == STAGE_CONNECTING => {
                return Err(RbdError::Unreachable {
                    conf: client.conf_text,
                    client: client.name,
                    secs,
                    reason: Errno(libc::ETIMEDOUT).to_string(),
                })
            }
            Err(_) => return Err(RbdError::OpenTimeout { image: name, secs }),
        };

        let block_size = u64::from(bs);
        if opened.size % block_size != 0 {
            return Err(RbdError::Size { image: name, size: opened.size, block_size: bs });
        }
        if !read_only && opened.features & RBD_FEATURE_EXCLUSIVE_LOCK == 0 {
            return Err(RbdError::NoExclusiveLock { image: format!("{pool}/{image}") });
        }
        let image = if read_only {
            opened.image
        } else {
            take_lock(opened.image, &name, &opened.device_id, client.timeout).await?
        };
        Ok(RbdDev {
            image,
            name,
            geometry: Geometry { block_size: bs, num_blocks: opened.size / block_size },
            object_size: opened.obj_size,
            read_only,
            volatile: opened.volatile,
            discard_zeroes: opened.discard_zeroes,
            device_id: opened.device_id,
            gate: RwLock::new(()),
        })
    }

    /// True for a snapshot: every write and discard fails (a flush has nothing to do).
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// The size of the RADOS objects the image is striped over (4 MiB by default): I/O that
    /// stays inside one costs one OSD operation.
    pub fn object_size(&self) -> u64 {
        self.object_size
    }

    /// `POOL/IMAGE` or `POOL/IMAGE@SNAP`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Closes the image, releasing its lock, once the requests still in flight (those whose
    /// futures were dropped) have completed; the close itself runs on the blocking pool, not
    /// on the caller's thread as a plain drop does.
    pub async fn close(self) {
        let mut image = self.image;
        loop {
            match Arc::try_unwrap(image) {
                Ok(last) => {
                    let _ = tokio::task::spawn_blocking(move || drop(last)).await;
                    return;
                }
                Err(shared) => {
                    image = shared;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }
    }

    /// Writes `write` at `lba` if the device holds `compare` there (both the same whole number
    /// of blocks), atomically with respect to every other write. `Ok(None)`: it matched and
    /// was written; `Ok(Some(n))`: it did not, and nothing was written; `n` is the offset in
    /// bytes, from the start of `compare`, of the first byte that differs.
    pub async fn compare_and_write(&self, lba: u64, compare: Bytes, write: Bytes) -> Result<Option<u64>, BlockError> {
        self.writable()?;
        let bs = u64::from(self.geometry.block_size);
        let blocks = blocks_in(&write, self.geometry.block_size)?;
        if compare.len() != write.len() {
            return Err(BlockError::Io { lba, source: io::Error::from_raw_os_error(libc::EINVAL) });
        }
        self.geometry.check_range(lba, blocks)?;
        if blocks == 0 {
            return Ok(None);
        }
        let off = lba * bs;
        let len = write.len() as u64;
        if off % CAW_SECTOR + len <= CAW_SECTOR {
            // One sector: librbd's own, which the OSD compares and writes in one operation.
            let _shared = self.gate.read().await;
            let Some(raw) = self.image.compare_and_write(off, compare.clone(), write).await.map_err(io_at(lba))? else {
                return Ok(None);
            };
            if let Some(at) = miscompare_index(raw, off, len, self.object_size) {
                return Ok(Some(at));
            }
            // An offset we cannot place (a striped image): the data differed, and nothing was
            // written; find the byte as it reads now.
            let now = self.image.read(off, compare.len()).await.map_err(io_at(lba))?;
            let at = now.iter().zip(compare.iter()).position(|(a, b)| a != b).unwrap_or(0);
            return Ok(Some(at as u64));
        }
        // Longer than librbd compares atomically: compare, then write, with our other writes
        // held off (and other clients' kept out by the exclusive lock).
        let _alone = self.gate.write().await;
        let now = self.image.read(off, write.len()).await.map_err(io_at(lba))?;
        if let Some(i) = now.iter().zip(compare.iter()).position(|(a, b)| a != b) {
            return Ok(Some(i as u64));
        }
        self.image.write(off, write).await.map_err(io_at(lba))?;
        Ok(None)
    }

    fn writable(&self) -> Result<(), BlockError> {
        if self.read_only {
            return Err(BlockError::Unsupported("write to a snapshot"));
        }
        Ok(())
    }

    fn bytes(&self, lba: u64, blocks: u64) -> (u64, u64) {
        let bs = u64::from(self.geometry.block_size);
        (lba * bs, blocks * bs)
    }
}

fn client_name(id: Option<&str>) -> String {
    let id = id.unwrap_or("admin");
    if id.starts_with("client.") {
        id.to_owned()
    } else {
        format!("client.{id}")
    }
}

fn conf_text(conf: Option<&PathBuf>) -> String {
    match conf {
        Some(p) => p.display().to_string(),
        None => match std::env::var("CEPH_CONF") {
            Ok(p) if !p.is_empty() => format!("{p} from CEPH_CONF"),
            _ => "/etc/ceph/ceph.conf (default)".to_owned(),
        },
    }
}

/// Whole seconds, at least one: the form Ceph's `secs` options take.
fn whole_secs(d: Duration) -> String {
    d.as_secs_f64().ceil().max(1.0).to_string()
}

/// The blocking part of [`RbdDev::open`], on the blocking pool.
fn connect_and_open(
    client: &Client,
    pool: &str,
    image: &str,
    snap: Option<&str>,
    name: &str,
    stage: &AtomicU8,
) -> Result<Opened, RbdError> {
    let setup = |what: String| {
        move |e: Errno| RbdError::Setup {
            conf: client.conf_text.clone(),
            client: client.name.clone(),
            what,
            source: e.io(),
        }
    };
    let rados = Rados::create(&client.name).map_err(setup("creating the client".into()))?;
    rados.read_conf_file(client.conf.as_deref()).map_err(setup("reading the config file".into()))?;
    if let Some(k) = &client.keyring {
        rados.conf_set("keyring", &k.to_string_lossy()).map_err(setup(format!("keyring {}", k.display())))?;
    }
    let secs = whole_secs(client.timeout);
    // The mount and monitor timeouts bound the connect and the pool lookup. rados_osd_op_timeout
    // stays unset: it would be fixed for the life of the client, and I/O must wait out an OSD
    // failure rather than fail; opening the image is bounded by our own timeout instead.
    let ours = [
        ("client_mount_timeout", secs.as_str()),
        ("rados_mon_op_timeout", secs.as_str()),
        ("rbd_cache", "false"),
        ("rbd_skip_partial_discard", "false"),
    ];
    for (k, v) in ours.iter().copied().chain(client.options.iter().map(|(k, v)| (k.as_str(), v.as_str()))) {
        rados.conf_set(k, v).map_err(setup(format!("option {k} = {v}")))?;
    }
    rados.connect().map_err(|e| RbdError::Unreachable {
        conf: client.conf_text.clone(),
        client: client.name.clone(),
        secs: client.timeout.as_secs_f64(),
        reason: e.to_string(),
    })?;
    stage.store(STAGE_OPENING, Ordering::SeqCst);
    let rados = Arc::new(rados);
    let query = |what: &'static str| move |e: Errno| RbdError::Query { image: name.to_owned(), what, source: e.io() };
    let fsid = rados.fsid().map_err(query("cluster fsid"))?;
    let io = IoCtx::create(&rados, pool).map_err(|e| RbdError::Pool {
        pool: pool.to_owned(),
        conf: client.conf_text.clone(),
        source: e.io(),
    })?;
    let img = Image::open(&io, image, snap, snap.is_some())
        .map_err(|e| RbdError::Open { image: name.to_owned(), source: e.io() })?;
    // Past the open, monitor commands (a lock break's blocklist among them) wait as long as
    // they must, unless the caller asked otherwise.
    if !client.options.iter().any(|(k, _)| k == "rados_mon_op_timeout") {
        rados.conf_set("rados_mon_op_timeout", "0").map_err(setup("option rados_mon_op_timeout = 0".into()))?;
    }
    let stat = img.stat().map_err(query("size"))?;
    let features = img.features().map_err(query("features"))?;
    // Format 1 images have no id: their name is all there is.
    let id = img.id().unwrap_or_else(|_| format!("name:{image}"));
    let mut device_id = format!("rbd:{fsid}/{}/{id}", img.pool_id());
    if let Some(s) = snap {
        device_id += &format!("@{}", img.snap_id(s).map_err(query("snapshot id"))?);
    }
    let setting = |key: &str, ours: &str| match img.config(key) {
        Ok(Some(v)) => v,
        _ => rados.conf_get(key).unwrap_or_else(|_| ours.to_owned()),
    };
    let volatile = setting("rbd_cache", "false") == "true";
    let discard_zeroes = setting("rbd_skip_partial_discard", "false") != "true";
    Ok(Opened { image: img, size: stat.size, obj_size: stat.obj_size, features, device_id, volatile, discard_zeroes })
}

/// Takes the image's exclusive lock, waiting at most `limit`; gives the image back on success.
/// On failure the caller's reference is gone: an `rbd_lock_acquire` that is still waiting holds
/// the only one left, and closes the image (releasing what it got) when it returns.
async fn take_lock(image: Arc<Image>, name: &str, key: &str, limit: Duration) -> Result<Arc<Image>, RbdError> {
    let secs = limit.as_secs_f64();
    let deadline = tokio::time::Instant::now() + limit;
    // One attempt at a time per image in this process: an attempt that ran out of time keeps
    // waiting in librbd and would win the lock from under the next attempt, which librbd would
    // then refuse as a second writer. The next waits for it to finish and let go instead.
    let Ok(turn) = tokio::time::timeout_at(deadline, lock_turn(key).lock_owned()).await else {
        return Err(RbdError::LockTimeout {
            image: name.to_owned(),
            holder: "an earlier open of it in this process, still waiting for the lock".to_owned(),
            secs,
        });
    };
    let job = {
        let image = Arc::clone(&image);
        tokio::task::spawn_blocking(move || {
            let r = image.lock_acquire_exclusive();
            drop(image);
            drop(turn);
            r
        })
    };
    let err = match tokio::time::timeout_at(deadline, job).await {
        Ok(Ok(Ok(()))) => return Ok(image),
        Ok(Ok(Err(e))) => Some(e),
        Ok(Err(e)) => {
            return Err(RbdError::Internal { image: name.to_owned(), what: "locking", reason: e.to_string() })
        }
        Err(_) => None,
    };
    let holder = holders(&image, limit).await;
    drop(image);
    match err {
        // Another client holds the lock in exclusive mode and refused to hand it over.
        Some(Errno(libc::EROFS | libc::EBUSY)) => Err(RbdError::Locked { image: name.to_owned(), holder }),
        Some(e) => Err(RbdError::Lock { image: name.to_owned(), source: e.io() }),
        None => Err(RbdError::LockTimeout { image: name.to_owned(), holder, secs }),
    }
}

/// The turn to lock image `key` (its device id) in this process.
fn lock_turn(key: &str) -> Arc<tokio::sync::Mutex<()>> {
    static TURNS: std::sync::Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>> =
        std::sync::Mutex::new(BTreeMap::new());
    let mut turns = TURNS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    Arc::clone(turns.entry(key.to_owned()).or_default())
}

/// The lock's owners, for a message.
async fn holders(image: &Arc<Image>, limit: Duration) -> String {
    let image = Arc::clone(image);
    let job = tokio::task::spawn_blocking(move || image.lock_owners());
    match tokio::time::timeout(limit, job).await {
        Ok(Ok(Ok(owners))) if !owners.is_empty() => {
            owners.iter().map(|o| format!("client at {o}")).collect::<Vec<_>>().join(", ")
        }
        Ok(Ok(Ok(_))) => "no owner named".to_owned(),
        Ok(Ok(Err(e))) => format!("owner unknown: {e}"),
        _ => "owner unknown".to_owned(),
    }
}

/// The index in the compare buffer of the first differing byte, from the offset librbd
/// reported for a compare-and-write of `len` bytes at image offset `off`. Ceph 16 reports the
/// object's first byte plus the index (it maps the OSD's buffer-relative offset as if it were
/// an object offset); a fixed librbd reports the image offset (`off` plus the index). The two
/// agree whenever both fit, so each is tried; `None` when neither does.
fn miscompare_index(raw: u64, off: u64, len: u64, object_size: u64) -> Option<u64> {
    let object_start = off - off % object_size.max(1);
    [off, object_start, 0].into_iter().find_map(|base| raw.checked_sub(base).filter(|&i| i < len))
}

fn io_at(lba: u64) -> impl Fn(Errno) -> BlockError {
    move |e| BlockError::Io { lba, source: e.io() }
}

/// The run of blocks from `lba` that share its provisioning state, given the byte extents that
/// hold data within a window of `window` blocks from `lba` (in any order, possibly overlapping).
/// A block that holds any data is mapped.
fn provisioning_run(lba: u64, window: u64, block_size: u64, extents: &[(u64, u64)]) -> (Provisioning, u64) {
    let end = lba + window;
    let mut runs: Vec<(u64, u64)> = extents
        .iter()
        .filter(|&&(_, len)| len > 0)
        .map(|&(off, len)| (off / block_size, (off + len).div_ceil(block_size)))
        .map(|(s, e)| (s.max(lba), e.min(end)))
        .filter(|&(s, e)| s < e)
        .collect();
    runs.sort_unstable();
    let Some(&(first, mut mapped_end)) = runs.first() else {
        return (Provisioning::Deallocated, window);
    };
    if first > lba {
        return (Provisioning::Deallocated, first - lba);
    }
    for &(s, e) in &runs[1..] {
        if s > mapped_end {
            break;
        }
        mapped_end = mapped_end.max(e);
    }
    (Provisioning::Mapped, mapped_end - lba)
}

#[async_trait]
impl BlockDev for RbdDev {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn volatile_cache(&self) -> bool {
        self.volatile
    }

    fn device_id(&self) -> Option<String> {
        Some(self.device_id.clone())
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn supports_discard(&self) -> bool {
        !self.read_only && self.discard_zeroes
    }

    async fn read(&self, lba: u64, blocks: u32) -> Result<Bytes, BlockError> {
        self.geometry.check_range(lba, u64::from(blocks))?;
        if blocks == 0 {
            return Ok(Bytes::new());
        }
        let (off, len) = self.bytes(lba, u64::from(blocks));
        let len = usize::try_from(len).map_err(|_| BlockError::Unsupported("a read larger than memory"))?;
        self.image.read(off, len).await.map_err(io_at(lba))
    }

    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> Result<(), BlockError> {
        self.writable()?;
        let blocks = blocks_in(&data, self.geometry.block_size)?;
        self.geometry.check_range(lba, blocks)?;
        if blocks == 0 {
            return Ok(());
        }
        let (off, _) = self.bytes(lba, blocks);
        {
            let _shared = self.gate.read().await;
            self.image.write(off, data).await.map_err(io_at(lba))?;
        }
        // Without librbd's cache the write is already in the OSDs; with it (an override in
        // force), FUA needs the flush.
        if fua && self.volatile {
            self.image.flush().await.map_err(io_at(lba))?;
        }
        Ok(())
    }

    async fn flush(&self) -> Result<(), BlockError> {
        // A snapshot holds nothing unwritten: SYNCHRONIZE CACHE on it has nothing to do.
        if self.read_only {
            return Ok(());
        }
        self.image.flush().await.map_err(io_at(0))
    }

    async fn compare_and_write(
        &self,
        lba: u64,
        compare: Bytes,
        write: Bytes,
        fua: bool,
    ) -> Result<Option<u64>, BlockError> {
        let outcome = RbdDev::compare_and_write(self, lba, compare, write).await?;
        if outcome.is_none() && fua && self.volatile {
            self.image.flush().await.map_err(io_at(lba))?;
        }
        Ok(outcome)
    }

    async fn write_zeros(&self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        self.writable()?;
        self.geometry.check_range(lba, blocks)?;
        if blocks == 0 {
            return Ok(());
        }
        let (off, len) = self.bytes(lba, blocks);
        let len_z = usize::try_from(len).map_err(|_| BlockError::Unsupported("zeroing more than memory addresses"))?;
        let _shared = self.gate.read().await;
        match self.image.write_zeroes(off, len_z).await {
            Err(Errno(libc::EOPNOTSUPP | libc::ENOSYS)) if self.discard_zeroes => {
                self.image.discard(off, len).await.map_err(io_at(lba))
            }
            Err(Errno(libc::EOPNOTSUPP | libc::ENOSYS)) => {
                let zeros = Bytes::from(vec![0u8; self.geometry.block_size as usize]);
                self.image.write_same(off, len_z, zeros).await.map_err(io_at(lba))
            }
            r => r.map_err(io_at(lba)),
        }
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        self.writable()?;
        if !self.discard_zeroes {
            // rbd_skip_partial_discard is on for this image: a discard would leave data behind.
            return Err(BlockError::Unsupported("discard (rbd_skip_partial_discard is on for this image)"));
        }
        self.geometry.check_range(lba, blocks)?;
        if blocks == 0 {
            return Ok(());
        }
        let (off, len) = self.bytes(lba, blocks);
        let _shared = self.gate.read().await;
        self.image.discard(off, len).await.map_err(io_at(lba))
    }

    async fn provisioning(&self, lba: u64) -> Result<(Provisioning, u64), BlockError> {
        self.geometry.check_range(lba, 1)?;
        let bs = u64::from(self.geometry.block_size);
        let window = (PROVISIONING_WINDOW / bs).min(self.geometry.num_blocks - lba);
        let (off, len) = self.bytes(lba, window);
        let image = Arc::clone(&self.image);
        let extents = tokio::task::spawn_blocking(move || image.allocated_extents(off, len))
            .await
            .map_err(|e| BlockError::Io { lba, source: io::Error::other(e.to_string()) })?
            .map_err(io_at(lba))?;
        Ok(provisioning_run(lba, window, bs, &extents))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provisioning_runs() {
        use Provisioning::{Deallocated, Mapped};
        // Nothing allocated: deallocated to the window's end.
        assert_eq!(provisioning_run(10, 100, 512, &[]), (Deallocated, 100));
        // Data starts later: deallocated until its first block.
        assert_eq!(provisioning_run(0, 100, 512, &[(512 * 7, 1024)]), (Deallocated, 7));
        // Data starting inside the block at `lba` maps it.
        assert_eq!(provisioning_run(7, 100, 512, &[(512 * 7 + 100, 10)]), (Mapped, 1));
        // Touching and overlapping extents, out of order, merge; a gap ends the run.
        let ext = [(512 * 4, 512), (0, 1024), (1024, 1024), (512 * 9, 512)];
        assert_eq!(provisioning_run(0, 100, 512, &ext), (Mapped, 5));
        assert_eq!(provisioning_run(5, 100, 512, &ext), (Deallocated, 4));
        // Runs are cut at the window's end, and extents before `lba` count only from it.
        assert_eq!(provisioning_run(2, 3, 512, &[(0, 512 * 50)]), (Mapped, 3));
        // 4096-byte blocks: a partial block counts as mapped.
        assert_eq!(provisioning_run(0, 10, 4096, &[(4096 + 1, 1)]), (Deallocated, 1));
        assert_eq!(provisioning_run(1, 10, 4096, &[(4096 + 1, 1)]), (Mapped, 1));
    }

    #[test]
    fn miscompare_offsets() {
        let obj = 4 << 20;
        // Ceph 16 in a later object: the object's start plus the index.
        assert_eq!(miscompare_index(obj, obj + 1_050_112, 512, obj), Some(0));
        assert_eq!(miscompare_index(obj + 100, obj + 1_050_112, 512, obj), Some(100));
        // The image offset (a fixed librbd), and the first object, where both readings agree.
        assert_eq!(miscompare_index(obj + 1_050_112 + 7, obj + 1_050_112, 512, obj), Some(7));
        assert_eq!(miscompare_index(1536 + 511, 1536, 512, obj), Some(511));
        assert_eq!(miscompare_index(100, 1536, 512, obj), Some(100));
        // Nothing that fits.
        assert_eq!(miscompare_index(obj + 9999, obj + 1_050_112, 512, obj), None);
    }

    #[test]
    fn names() {
        assert_eq!(client_name(None), "client.admin");
        assert_eq!(client_name(Some("gw")), "client.gw");
        assert_eq!(client_name(Some("client.x")), "client.x");
        assert_eq!(whole_secs(Duration::from_millis(1500)), "2");
        assert_eq!(whole_secs(Duration::ZERO), "1");
    }
}

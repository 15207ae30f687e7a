//! Device specs: the text that names a block device, parsed into a typed, recursive
//! [`DeviceSpec`] and printed back so that the printed text parses to the same spec.
//!
//! ```text
//! spec    = leaf | wrapper
//! leaf    = "mem:" SIZE [":" BLOCK]            RAM
//!         | "null:" SIZE [":" BLOCK]           reads zeros, drops writes
//!         | "file:" PATH [":" [SIZE] ":" BLOCK] | "file:" PATH [":" SIZE]
//!         | "iscsi://" [user ["%" secret] "@"] host [":" port] "/" IQN "/" LUN ["?" query]
//!         | "rbd:" POOL "/" IMAGE ["@" SNAP] ["?" query]
//! wrapper = NAME "(" spec { "," KEY "=" VALUE } ")"
//! ```
//!
//! SIZE is bytes or a binary suffix (`1GiB`, `64M`), BLOCK the logical block size (512, 1024,
//! 2048 or 4096; 512 when left out). The iSCSI query takes the initiator's `target_user` and
//! `target_password` (mutual CHAP) and this crate's `sessions=N`, `digests=on|off`,
//! `first_burst=SIZE`, `max_burst=SIZE`, `max_r2t=N`, `max_transfer=SIZE` and
//! `read_session=on|off` (on by default under a `cache(...)`, off elsewhere). The RBD query
//! takes `conf=PATH` (the cluster's ceph.conf), `id=NAME` (the client, `admin` for
//! `client.admin`), `keyring=PATH`, `block=512|4096` and `timeout=SECONDS` (how long
//! reaching the cluster may take); a snapshot is served read-only.
//!
//! A file's trailing `:SIZE` is a size only when it reads as one, so paths may hold `:`; a
//! trailing `:SIZE:DIGITS` or `::DIGITS` is a size and a block size. A path that ends in such
//! pieces itself cannot be named, and a `File` spec holding one prints as text that reads
//! differently. Inside a wrapper, arguments are split at commas outside parentheses: a nested
//! spec may not hold a comma or an unbalanced parenthesis.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use stics_block::DEFAULT_BLOCK_SIZE;
use stics_initiator::{IscsiUrl, UrlError};

use crate::syntax;

/// The leaf kinds, for error messages.
const KINDS: &str = "mem, null, file, iscsi, rbd";

/// A block device as a spec names it. Wrappers hold the spec of the device they wrap, so a spec
/// is a tree whose leaves are backends and remote LUNs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSpec {
    /// RAM: `size` bytes in blocks of `block_size`.
    Mem { size: u64, block_size: u32 },
    /// Reads zeros, drops writes: `size` bytes in blocks of `block_size`.
    Null { size: u64, block_size: u32 },
    /// A regular file (created at `size` if missing) or a block-device node; without a size the
    /// file's length counts.
    File { path: PathBuf, size: Option<u64>, block_size: u32 },
    /// A LUN of a remote iSCSI target; its geometry is the target's.
    Iscsi { url: IscsiUrl, options: IscsiOptions },
    /// An image (or a snapshot of one, read-only) in a Ceph cluster's RBD pool.
    Rbd(RbdSpec),
    /// A device that wraps another one.
    Layer(Layer),
}

/// Per-device overrides of the initiator settings in [`crate::OpenContext`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IscsiOptions {
    /// Sessions to open to the LUN (`sessions=N`).
    pub sessions: Option<usize>,
    /// CRC32C header and data digests (`digests=on|off`).
    pub digests: Option<bool>,
    /// FirstBurstLength to offer (`first_burst=SIZE`): unsolicited data per write.
    pub first_burst: Option<u32>,
    /// MaxBurstLength to offer (`max_burst=SIZE`): data per R2T.
    pub max_burst: Option<u32>,
    /// MaxOutstandingR2T to offer (`max_r2t=N`): R2Ts one write may have open at once.
    pub max_r2t: Option<u32>,
    /// Largest transfer per SCSI command (`max_transfer=SIZE`); bigger requests are split.
    pub max_transfer: Option<u32>,
    /// A session of its own for reads (`read_session=on|off`); when not given, on for the
    /// remote of a cache, whose reads must not wait behind its destage, and off elsewhere.
    pub read_session: Option<bool>,
    /// Offer the link to a stics SG at login (`link=on|off`); when not given, on for the remote
    /// of a cache, which then ships groups of epochs to an SG that takes them, and off elsewhere.
    pub link: Option<bool>,
    /// TLS 1.3 under the connections (`tls=on&tls_ca=PATH[&tls_name=NAME][&tls_cert=PATH&tls_key=PATH]`):
    /// the CA to trust, the name the target's certificate carries (the URL's host if not given)
    /// and a client certificate for targets that ask for one. Plain TCP when not given.
    pub tls: Option<stics_tls::ClientOptions>,
}

/// `rbd:POOL/IMAGE[@SNAP]` and its query: which image, and how to reach its cluster. What is
/// left out comes from [`crate::OpenContext::rbd`], then from librbd's defaults (`CEPH_CONF`,
/// /etc/ceph/ceph.conf, `client.admin`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdSpec {
    pub pool: String,
    pub image: String,
    /// A snapshot to serve (read-only) instead of the image's head.
    pub snap: Option<String>,
    /// The cluster's config file (`conf=`).
    pub conf: Option<PathBuf>,
    /// The client id (`id=`): `admin` is `client.admin`.
    pub id: Option<String>,
    /// The keyring (`keyring=`).
    pub keyring: Option<PathBuf>,
    /// Logical block size served (`block=`; 512 when not given).
    pub block_size: u32,
    /// Seconds reaching the cluster and opening the image may take (`timeout=`).
    pub timeout_secs: Option<u64>,
}

/// The longest `timeout=` an `rbd:` spec may ask for, in seconds.
pub const MAX_RBD_TIMEOUT_SECS: u64 = 600;

/// The most sessions one spec may ask for.
pub const MAX_SESSIONS: usize = 64;
/// The largest FirstBurstLength and MaxBurstLength iSCSI can negotiate (24 bits, RFC 7143 §13).
pub const MAX_BURST: u32 = 16_777_215;
/// The largest `max_transfer=` a spec may ask for.
pub const MAX_TRANSFER: u32 = 1 << 30;

/// Devices that wrap another device: `NAME(SPEC, KEY=VALUE, ...)`.
///
/// A wrapper is a variant holding its typed arguments and a `Box<DeviceSpec>` of the device it
/// wraps, its name in [`LAYERS`], its parse in `Layer::from_call` (with [`LayerArgs`] doing the
/// common part), its text in `Layer::write`, and its constructor in [`crate::open`], which opens
/// the inner spec first. Callers of `parse` and `open` do not change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layer {
    /// `cache(SPEC, log=PATH[:SIZE], mode=log|immediate|write-through, ram=SIZE,
    /// read-cache=SIZE, policy=lru|s3fifo, full-timeout=SECS, index-memory=SIZE, max-lag=SECS,
    /// log-disk=MODEL)`: the STICS cache over the device SPEC names (`log-disk` puts the log's
    /// file behind a disk model, for the papers' setups).
    Cache(CacheSpec),
    /// `journal(SPEC, journal=PATH[:SIZE]|DEVICE-SPEC, max-group=SIZE, segment=SIZE)`: the storage side of
    /// STICS (an SG) over the device SPEC names: it takes groups of epochs from gateways over
    /// the link, makes them durable in its journal and applies them to SPEC whole.
    Journal(JournalSpec),
    /// `disk(SPEC, model=o7n3200|as010a1|91366u4|dnes|ddys|raid5, rpm=N, seek=MS, transfer=MB/s,
    /// buffer=SIZE|off, queue=fifo|elevator)`: the device SPEC names, answering when the seeds'
    /// disk would (see the `stics-disk` crate). Without a model, rpm, seek and transfer are needed.
    Disk(DiskSpec),
}

/// The arguments of `disk(...)`: a preset and the parameters that replace its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskSpec {
    /// The device whose data the disk holds.
    pub inner: Box<DeviceSpec>,
    /// The preset (`model=`).
    pub model: Option<stics_disk::Preset>,
    /// Revolutions per minute (`rpm=`).
    pub rpm: Option<u32>,
    /// The average seek in microseconds (`seek=4.9ms`).
    pub seek_us: Option<u64>,
    /// The media rate in bytes per second (`transfer=29.8MB/s`).
    pub transfer: Option<u64>,
    /// The volatile write buffer in bytes, 0 for none (`buffer=SIZE|off`).
    pub buffer: Option<u64>,
    /// The order the buffer drains in (`queue=`).
    pub queue: Option<stics_disk::Queue>,
}

impl DiskSpec {
    /// The model's parameters: the preset's, or the explicit ones, with the explicit ones on top.
    pub fn config(&self) -> stics_disk::Config {
        let o = stics_disk::Overrides {
            rpm: self.rpm.map(f64::from),
            seek: self.seek_us.map(std::time::Duration::from_micros),
            transfer: self.transfer.map(|t| t as f64),
            buffer: self.buffer,
            queue: self.queue,
        };
        match self.model {
            Some(p) => p.config().with(&o),
            None => stics_disk::Config::explicit(
                o.rpm.unwrap_or_default(),
                o.seek.unwrap_or_default(),
                o.transfer.unwrap_or_default(),
            )
            .with(&o),
        }
    }
}

/// The arguments of `journal(...)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalSpec {
    /// The medium the groups are applied to.
    pub inner: Box<DeviceSpec>,
    /// Where the journal lives.
    pub journal: JournalAt,
    /// The largest encoded group taken.
    pub max_group: Option<u32>,
    /// The coherence segment the SG hands tokens out for (32 to 256 KiB).
    pub segment: Option<u32>,
    /// Seconds a gateway's tokens stay good after the SG last heard from it.
    pub lease_secs: Option<u32>,
    /// Seconds after which the SG takes an exclusive token from a silent holder (none: it waits).
    pub break_after_secs: Option<u32>,
}

/// Where a journal lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JournalAt {
    /// A file (created at the size, 1 GiB when not given, if missing) or a block-device node.
    Path { path: PathBuf, size: Option<u64> },
    /// A device of its own (an `rbd:` image in the medium's cluster, so that a standby SG finds
    /// it).
    Device(Box<DeviceSpec>),
}

/// The arguments of `cache(...)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheSpec {
    /// The device cached (the remote).
    pub inner: Box<DeviceSpec>,
    /// The write log: a file (created at `log_size`, 1 GiB when not given, if missing) or a
    /// block-device node.
    pub log: PathBuf,
    /// Size to create the log file at.
    pub log_size: Option<u64>,
    /// When writes are acknowledged (`log` when not given).
    pub mode: Option<stics_cache::Mode>,
    /// RAM write buffer.
    pub ram: Option<u64>,
    /// DRAM read cache.
    pub read_cache: Option<u64>,
    /// Read cache policy.
    pub policy: Option<stics_cache::readcache::Policy>,
    /// Seconds host writes wait for room in a full log while the remote keeps failing.
    pub full_timeout_secs: Option<u64>,
    /// Memory the dirty index may take.
    pub index_memory: Option<u64>,
    /// Seconds the oldest write the remote lacks may age before host writes wait.
    pub max_lag_secs: Option<u64>,
    /// The log's file behind a disk model (seed 004's log disk), for the papers' setups.
    pub log_disk: Option<stics_disk::Preset>,
}

/// The names of the wrappers, for error messages.
pub const LAYERS: &[&str] = &["cache", "journal", "disk"];

/// Why a spec was refused; each names the piece of text at fault (with secrets hidden).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// Nothing to parse.
    #[error("empty device spec")]
    Empty,
    /// Neither `KIND:ARGS` nor `NAME(...)`.
    #[error(
        "bad device spec {text:?}: expected mem:SIZE[:BLOCK], null:SIZE[:BLOCK], file:PATH[:SIZE[:BLOCK]], \
         iscsi://[user[%secret]@]host[:port]/IQN/LUN, rbd:POOL/IMAGE[@SNAP] or WRAPPER(SPEC, KEY=VALUE, ...)"
    )]
    Syntax { text: String },
    /// `KIND:` with a kind that is not a backend.
    #[error("unknown device kind {kind:?} (known: {KINDS})")]
    UnknownKind { kind: String },
    /// `NAME(` with a name that is not a wrapper.
    #[error("unknown wrapper {kind:?} (known: {})", if LAYERS.is_empty() { "none yet".to_owned() } else { LAYERS.join(", ") })]
    UnknownLayer { kind: String },
    /// A parenthesis without its partner; `at` is the byte offset of the one at fault.
    #[error("unbalanced parentheses in {text:?}: {problem} (byte {at})")]
    Unbalanced { text: String, at: usize, problem: &'static str },
    /// Text after a wrapper's closing parenthesis.
    #[error("unexpected {rest:?} after the closing ')' of {text:?}")]
    Trailing { text: String, rest: String },
    /// A size that does not parse, is zero or is not a whole number of 512-byte blocks.
    #[error("bad size {piece:?}: {reason}")]
    Size { piece: String, reason: String },
    /// A block size other than 512, 1024, 2048 or 4096.
    #[error("bad block size {piece:?}: use 512, 1024, 2048 or 4096")]
    BlockSize { piece: String },
    /// A size that is not a whole number of blocks.
    #[error("size {piece:?} is not a whole number of {block_size}-byte blocks")]
    NotWholeBlocks { piece: String, block_size: u32 },
    /// `file:` without a path.
    #[error("file: needs a path (file:PATH[:SIZE[:BLOCK]])")]
    MissingPath,
    /// The iSCSI URL is malformed or names no LUN (the initiator's parser says why).
    #[error(transparent)]
    Url(#[from] UrlError),
    /// An iSCSI query argument (`sessions=`, `digests=`, `first_burst=`, …) with a bad value.
    #[error("bad iSCSI option {piece:?}: {reason}")]
    IscsiOption { piece: String, reason: &'static str },
    /// An `rbd:` spec that names no image, or a query argument with a bad value.
    #[error("bad RBD spec {piece:?}: {reason}")]
    Rbd { piece: String, reason: &'static str },
    /// A wrapper argument that is not `KEY=VALUE`, or a wrapper without the spec it wraps.
    #[error("bad argument {piece:?} of {kind}(...): {reason}")]
    LayerArg { kind: String, piece: String, reason: &'static str },
}

/// The largest size a spec may give (a device's bytes are a signed offset to the kernel).
const MAX_SIZE: u64 = i64::MAX as u64;

/// Every size in a spec is read here: as every stics subcommand reads sizes (`stics_units`), in
/// whole 512-byte blocks.
fn read_size(piece: &str) -> Result<u64, SpecError> {
    stics_units::parse_size_within(piece, 1..=MAX_SIZE, u64::from(DEFAULT_BLOCK_SIZE))
        .map_err(|e| SpecError::Size { piece: piece.to_owned(), reason: e.reason() })
}

/// Reads a logical block size.
fn parse_block_size(piece: &str) -> Result<u32, SpecError> {
    match piece.parse::<u32>() {
        Ok(bs) if valid_block_size(bs) => Ok(bs),
        _ => Err(SpecError::BlockSize { piece: piece.to_owned() }),
    }
}

/// Block sizes the backends and the SCSI layer serve.
pub(crate) fn valid_block_size(bs: u32) -> bool {
    bs.is_power_of_two() && (512..=4096).contains(&bs)
}

/// Checks that `size` (written as `piece`) is a whole number of `block_size` blocks.
fn whole_blocks(size: u64, block_size: u32, piece: &str) -> Result<u64, SpecError> {
    if size.is_multiple_of(u64::from(block_size)) {
        Ok(size)
    } else {
        Err(SpecError::NotWholeBlocks { piece: piece.to_owned(), block_size })
    }
}

/// `SIZE[:BLOCK]` of `mem:` and `null:`.
fn sized(rest: &str) -> Result<(u64, u32), SpecError> {
    let (size_piece, block_size) = match rest.split_once(':') {
        Some((s, b)) => (s, parse_block_size(b)?),
        None => (rest, DEFAULT_BLOCK_SIZE),
    };
    Ok((whole_blocks(read_size(size_piece)?, block_size, size_piece)?, block_size))
}

/// `PATH`, `PATH:SIZE`, `PATH:SIZE:BLOCK` or `PATH::BLOCK` of `file:`.
fn file(rest: &str) -> Result<DeviceSpec, SpecError> {
    if rest.is_empty() {
        return Err(SpecError::MissingPath);
    }
    let mut pieces = rest.rsplitn(3, ':');
    if let (Some(b), Some(s), Some(path)) = (pieces.next(), pieces.next(), pieces.next()) {
        let size = if s.is_empty() { Some(None) } else { read_size(s).ok().map(Some) };
        if let (false, Some(size)) = (path.is_empty(), size) {
            match parse_block_size(b) {
                Ok(block_size) => {
                    if let Some(n) = size {
                        whole_blocks(n, block_size, s)?;
                    }
                    return Ok(DeviceSpec::File { path: path.into(), size, block_size });
                }
                // `PATH:SIZE:DIGITS` asks for a block size; a path ending so would be perverse.
                Err(e) if !b.is_empty() && b.bytes().all(|c| c.is_ascii_digit()) => return Err(e),
                Err(_) => {}
            }
        }
    }
    // A trailing `:SIZE` is a size only if it parses as one, so paths may hold ':'.
    if let Some((path, s)) = rest.rsplit_once(':') {
        if let Ok(size) = read_size(s) {
            return Ok(DeviceSpec::File { path: path.into(), size: Some(size), block_size: DEFAULT_BLOCK_SIZE });
        }
    }
    Ok(DeviceSpec::File { path: rest.into(), size: None, block_size: DEFAULT_BLOCK_SIZE })
}

/// An `iscsi://` URL with this crate's query arguments taken out before the initiator's parser
/// reads the rest.
fn iscsi(text: &str) -> Result<DeviceSpec, SpecError> {
    let mut options = IscsiOptions::default();
    let url = match text.split_once('?') {
        None => IscsiUrl::parse(text)?,
        Some((base, query)) => {
            let mut rest = Vec::new();
            let (mut tls, mut tls_args) = (None, stics_tls::ClientOptions::default());
            let mut tls_named = None;
            for kv in query.split('&').filter(|kv| !kv.is_empty()) {
                let bad = |reason| SpecError::IscsiOption { piece: kv.to_owned(), reason };
                match kv.split_once('=') {
                    Some(("sessions", v)) => {
                        let n = v.parse::<usize>().ok().filter(|n| (1..=MAX_SESSIONS).contains(n));
                        options.sessions = Some(n.ok_or_else(|| bad("sessions is a number from 1 to 64"))?);
                    }
                    Some(("digests", v)) => {
                        options.digests = Some(match v {
                            "on" => true,
                            "off" => false,
                            _ => return Err(bad("digests is on or off")),
                        });
                    }
                    Some(("read_session", v)) => {
                        options.read_session = Some(match v {
                            "on" => true,
                            "off" => false,
                            _ => return Err(bad("read_session is on or off")),
                        });
                    }
                    Some(("link", v)) => {
                        options.link = Some(match v {
                            "on" => true,
                            "off" => false,
                            _ => return Err(bad("link is on or off")),
                        });
                    }
                    Some(("tls", v)) => {
                        tls = Some(match v {
                            "on" => true,
                            "off" => false,
                            _ => return Err(bad("tls is on or off")),
                        });
                    }
                    Some((k @ ("tls_ca" | "tls_name" | "tls_cert" | "tls_key"), v)) => {
                        if v.is_empty() {
                            return Err(bad("tls_ca, tls_name, tls_cert and tls_key take a value"));
                        }
                        tls_named.get_or_insert(kv.to_owned());
                        match k {
                            "tls_ca" => tls_args.ca = v.into(),
                            "tls_name" => tls_args.name = Some(v.to_owned()),
                            "tls_cert" => tls_args.cert = Some(v.into()),
                            _ => tls_args.key = Some(v.into()),
                        }
                    }
                    Some(("first_burst", v)) => {
                        let why = "first_burst is a size from 512 B to 16 MiB - 1 B, e.g. 64KiB";
                        options.first_burst = Some(query_size(v, MAX_BURST).ok_or_else(|| bad(why))?);
                    }
                    Some(("max_burst", v)) => {
                        let why = "max_burst is a size from 512 B to 16 MiB - 1 B, e.g. 256KiB";
                        options.max_burst = Some(query_size(v, MAX_BURST).ok_or_else(|| bad(why))?);
                    }
                    Some(("max_r2t", v)) => {
                        let n = v.parse::<u32>().ok().filter(|n| (1..=65_535).contains(n));
                        options.max_r2t = Some(n.ok_or_else(|| bad("max_r2t is a number from 1 to 65535"))?);
                    }
                    Some(("max_transfer", v)) => {
                        let why = "max_transfer is a size from 512 B to 1 GiB, e.g. 16MiB";
                        options.max_transfer = Some(query_size(v, MAX_TRANSFER).ok_or_else(|| bad(why))?);
                    }
                    _ => rest.push(kv),
                }
            }
            if tls == Some(true) {
                let bad = |reason| SpecError::IscsiOption { piece: "tls=on".into(), reason };
                if tls_args.ca.as_os_str().is_empty() {
                    return Err(bad("tls=on needs tls_ca=PATH, the CA that signed the target's certificate"));
                }
                if tls_args.cert.is_some() != tls_args.key.is_some() {
                    return Err(bad("tls_cert and tls_key go together"));
                }
                options.tls = Some(tls_args);
            } else if let Some(piece) = tls_named {
                return Err(SpecError::IscsiOption { piece, reason: "TLS options need tls=on" });
            }
            if let (Some(first), Some(max)) = (options.first_burst, options.max_burst) {
                if first > max {
                    return Err(SpecError::IscsiOption {
                        piece: format!("first_burst={}", size_text(first.into())),
                        reason: "first_burst may not exceed max_burst (RFC 7143 §13.14)",
                    });
                }
            }
            if rest.is_empty() {
                IscsiUrl::parse(base)?
            } else {
                IscsiUrl::parse(&format!("{base}?{}", rest.join("&")))?
            }
        }
    };
    url.require_lun()?;
    Ok(DeviceSpec::Iscsi { url, options })
}

/// `POOL/IMAGE[@SNAP][?KEY=VALUE&...]` of `rbd:`.
fn rbd(rest: &str) -> Result<DeviceSpec, SpecError> {
    let (name, query) = rest.split_once('?').unwrap_or((rest, ""));
    let bad = |piece: &str, reason| SpecError::Rbd { piece: piece.to_owned(), reason };
    let (pool, image) = name.split_once('/').ok_or_else(|| bad(name, "expected rbd:POOL/IMAGE[@SNAP]"))?;
    let (image, snap) = match image.split_once('@') {
        Some((i, s)) => (i, Some(s)),
        None => (image, None),
    };
    let fine =
        |n: &str| !n.is_empty() && !n.contains(['/', '@', '?', '&', ',', '(', ')']) && !n.contains(char::is_whitespace);
    if !fine(pool) || !fine(image) || snap.is_some_and(|s| !fine(s)) {
        return Err(bad(name, "pool, image and snapshot names are non-empty, without / @ ? & , ( ) or spaces"));
    }
    let mut r = RbdSpec {
        pool: pool.to_owned(),
        image: image.to_owned(),
        snap: snap.map(str::to_owned),
        conf: None,
        id: None,
        keyring: None,
        block_size: DEFAULT_BLOCK_SIZE,
        timeout_secs: None,
    };
    for kv in query.split('&').filter(|kv| !kv.is_empty()) {
        match kv.split_once('=') {
            Some(("conf", v)) if !v.is_empty() => r.conf = Some(v.into()),
            Some(("keyring", v)) if !v.is_empty() => r.keyring = Some(v.into()),
            Some(("id", v)) if fine(v) => r.id = Some(v.to_owned()),
            Some(("block", v)) => {
                r.block_size = match v {
                    "512" => 512,
                    "4096" => 4096,
                    _ => return Err(bad(kv, "block is 512 or 4096")),
                };
            }
            Some(("timeout", v)) => {
                let n = v.trim_end_matches('s').parse::<u64>().ok().filter(|n| (1..=MAX_RBD_TIMEOUT_SECS).contains(n));
                r.timeout_secs = Some(n.ok_or_else(|| bad(kv, "timeout is whole seconds from 1 to 600"))?);
            }
            _ => {
                return Err(bad(kv, "known options: conf=PATH, id=NAME, keyring=PATH, block=512|4096, timeout=SECONDS"))
            }
        }
    }
    Ok(DeviceSpec::Rbd(r))
}

/// A size in a query argument, from 512 bytes to `max`.
fn query_size(v: &str, max: u32) -> Option<u32> {
    stics_units::parse_size(v).ok().filter(|n| *n >= 512).and_then(|n| u32::try_from(n).ok()).filter(|n| *n <= max)
}

impl FromStr for DeviceSpec {
    type Err = SpecError;

    fn from_str(text: &str) -> Result<Self, SpecError> {
        if text.is_empty() {
            return Err(SpecError::Empty);
        }
        match syntax::kind(text) {
            ("", _) | (_, None) => Err(SpecError::Syntax { text: redact(text) }),
            ("iscsi", Some(':')) => iscsi(text),
            (kind, Some(':')) => {
                let rest = &text[kind.len() + 1..];
                match kind {
                    "mem" => sized(rest).map(|(size, block_size)| DeviceSpec::Mem { size, block_size }),
                    "null" => sized(rest).map(|(size, block_size)| DeviceSpec::Null { size, block_size }),
                    "file" => file(rest),
                    "rbd" => rbd(rest),
                    _ => Err(SpecError::UnknownKind { kind: kind.to_owned() }),
                }
            }
            (_, Some('(')) => Layer::from_call(syntax::call(text)?).map(DeviceSpec::Layer),
            _ => Err(SpecError::Syntax { text: redact(text) }),
        }
    }
}

/// The common part of a wrapper's arguments: the spec it wraps, then `KEY=VALUE` options in the
/// order given. Each wrapper checks its own keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerArgs {
    pub inner: DeviceSpec,
    pub options: Vec<(String, String)>,
}

impl LayerArgs {
    pub(crate) fn parse(call: &syntax::Call<'_>) -> Result<LayerArgs, SpecError> {
        let bad =
            |piece: &str, reason| SpecError::LayerArg { kind: call.name.to_owned(), piece: redact(piece), reason };
        let (first, rest) = call.args.split_first().ok_or_else(|| bad("", "the spec it wraps comes first"))?;
        if first.is_empty() {
            return Err(bad(first, "the spec it wraps comes first"));
        }
        let inner = first.parse()?;
        let options = rest
            .iter()
            .map(|kv| match kv.split_once('=') {
                Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.trim().to_owned())),
                _ => Err(bad(kv, "expected KEY=VALUE")),
            })
            .collect::<Result<_, _>>()?;
        Ok(LayerArgs { inner, options })
    }
}

impl Layer {
    fn from_call(call: syntax::Call<'_>) -> Result<Layer, SpecError> {
        match call.name {
            "cache" => cache(&call).map(Layer::Cache),
            "journal" => journal(&call).map(Layer::Journal),
            "disk" => disk(&call).map(Layer::Disk),
            _ => Err(SpecError::UnknownLayer { kind: call.name.to_owned() }),
        }
    }

    fn write(&self, out: &mut String, secrets: bool) {
        match self {
            Layer::Cache(c) => {
                *out += "cache(";
                c.inner.write(out, secrets);
                *out += &format!(", log={}", c.log.display());
                if let Some(n) = c.log_size {
                    *out += &format!(":{}", size_text(n));
                }
                if let Some(m) = c.mode {
                    *out += &format!(", mode={m}");
                }
                if let Some(n) = c.ram {
                    *out += &format!(", ram={}", size_text(n));
                }
                if let Some(n) = c.read_cache {
                    *out += &format!(", read-cache={}", size_text(n));
                }
                if let Some(p) = c.policy {
                    let p = match p {
                        stics_cache::readcache::Policy::Lru => "lru",
                        stics_cache::readcache::Policy::S3Fifo => "s3fifo",
                    };
                    *out += &format!(", policy={p}");
                }
                if let Some(n) = c.full_timeout_secs {
                    *out += &format!(", full-timeout={n}");
                }
                if let Some(n) = c.index_memory {
                    *out += &format!(", index-memory={}", size_text(n));
                }
                if let Some(n) = c.max_lag_secs {
                    *out += &format!(", max-lag={n}");
                }
                if let Some(m) = c.log_disk {
                    *out += &format!(", log-disk={m}");
                }
                out.push(')');
            }
            Layer::Journal(j) => {
                *out += "journal(";
                j.inner.write(out, secrets);
                match &j.journal {
                    JournalAt::Path { path, size } => {
                        *out += &format!(", journal={}", path.display());
                        if let Some(n) = size {
                            *out += &format!(":{}", size_text(*n));
                        }
                    }
                    JournalAt::Device(d) => {
                        *out += ", journal=";
                        d.write(out, secrets);
                    }
                }
                if let Some(n) = j.max_group {
                    *out += &format!(", max-group={}", size_text(n.into()));
                }
                if let Some(n) = j.segment {
                    *out += &format!(", segment={}", size_text(n.into()));
                }
                if let Some(n) = j.lease_secs {
                    *out += &format!(", lease={n}s");
                }
                if let Some(n) = j.break_after_secs {
                    *out += &format!(", break-after={n}s");
                }
                out.push(')');
            }
            Layer::Disk(d) => {
                *out += "disk(";
                d.inner.write(out, secrets);
                if let Some(m) = d.model {
                    *out += &format!(", model={m}");
                }
                if let Some(n) = d.rpm {
                    *out += &format!(", rpm={n}");
                }
                if let Some(us) = d.seek_us {
                    *out += &format!(", seek={}ms", decimal_text(us, 3));
                }
                if let Some(b) = d.transfer {
                    *out += &format!(", transfer={}MB/s", decimal_text(b, 6));
                }
                match d.buffer {
                    Some(0) => *out += ", buffer=off",
                    Some(n) => *out += &format!(", buffer={}", size_text(n)),
                    None => {}
                }
                if let Some(q) = d.queue {
                    *out += match q {
                        stics_disk::Queue::Fifo => ", queue=fifo",
                        stics_disk::Queue::Elevator => ", queue=elevator",
                    };
                }
                out.push(')');
            }
        }
    }
}

/// The largest `max-group=` a journal takes (a LINK WRITE offset is 32 bits).
pub const MAX_GROUP: u64 = 1 << 30;

/// Reads `journal(SPEC, journal=PATH[:SIZE]|DEVICE-SPEC, max-group=SIZE, segment=SIZE, lease=SECS,
/// break-after=SECS)`.
fn journal(call: &syntax::Call<'_>) -> Result<JournalSpec, SpecError> {
    let args = LayerArgs::parse(call)?;
    let bad = |piece: &str, reason| SpecError::LayerArg { kind: "journal".into(), piece: redact(piece), reason };
    let mut j = JournalSpec {
        inner: Box::new(args.inner),
        journal: JournalAt::Path { path: PathBuf::new(), size: None },
        max_group: None,
        segment: None,
        lease_secs: None,
        break_after_secs: None,
    };
    let mut given = false;
    for (k, v) in &args.options {
        let piece = format!("{k}={v}");
        match k.as_str() {
            "journal" => {
                given = true;
                // A device spec (`rbd:`, `mem:`, `file:`) names a device; anything else is a path
                // with an optional `:SIZE`, as for a cache's log.
                let device = ["rbd:", "mem:", "file:", "null:"].iter().any(|p| v.starts_with(p));
                j.journal = if device {
                    JournalAt::Device(Box::new(v.parse()?))
                } else {
                    match v.rsplit_once(':') {
                        Some((p, n)) if !p.is_empty() && read_size(n).is_ok() => {
                            JournalAt::Path { path: PathBuf::from(p), size: Some(read_size(n)?) }
                        }
                        _ if v.is_empty() => return Err(bad(&piece, "the journal needs a path or a device")),
                        _ => JournalAt::Path { path: PathBuf::from(v), size: None },
                    }
                };
            }
            "max-group" => {
                let n = read_size(v).ok().filter(|n| (1 << 20..=MAX_GROUP).contains(n));
                j.max_group = Some(n.ok_or_else(|| bad(&piece, "a size from 1 MiB to 1 GiB"))? as u32);
            }
            "segment" => {
                let n = read_size(v).ok().and_then(|n| u32::try_from(n).ok());
                let n = n.filter(|&n| stics_coherence::seg_blocks(n, 512).is_ok());
                j.segment = Some(n.ok_or_else(|| bad(&piece, "a power of two from 32 KiB to 256 KiB"))?);
            }
            "lease" | "break-after" => {
                let max = if k == "lease" { 3600.0 } else { 86_400.0 };
                // A bare number is seconds, as the cache's timeouts read it.
                let text =
                    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) { format!("{v}s") } else { v.clone() };
                let secs =
                    stics_units::parse_duration(&text).ok().filter(|s| (1.0..=max).contains(s) && s.fract() == 0.0);
                let secs =
                    secs.ok_or_else(|| bad(&piece, "whole seconds, at least 1s (lease at most 1h, break-after 1d)"))?;
                if k == "lease" {
                    j.lease_secs = Some(secs as u32);
                } else {
                    j.break_after_secs = Some(secs as u32);
                }
            }
            _ => return Err(bad(&piece, "known keys: journal, max-group, segment, lease, break-after")),
        }
    }
    if !given {
        return Err(bad("", "journal(...) needs journal=PATH[:SIZE] or journal=DEVICE-SPEC"));
    }
    Ok(j)
}

/// Reads `disk(SPEC, model=NAME, rpm=N, seek=MS, transfer=MB/s, buffer=SIZE|off, queue=fifo|elevator)`.
fn disk(call: &syntax::Call<'_>) -> Result<DiskSpec, SpecError> {
    let args = LayerArgs::parse(call)?;
    let bad = |piece: &str, reason| SpecError::LayerArg { kind: "disk".into(), piece: redact(piece), reason };
    let mut d = DiskSpec {
        inner: Box::new(args.inner),
        model: None,
        rpm: None,
        seek_us: None,
        transfer: None,
        buffer: None,
        queue: None,
    };
    for (k, v) in &args.options {
        let piece = format!("{k}={v}");
        match k.as_str() {
            "model" => {
                let why = "unknown model (known: o7n3200, as010a1, 91366u4, dnes, ddys, raid5)";
                d.model = Some(v.parse().map_err(|_| bad(&piece, why))?);
            }
            "rpm" => {
                let n = v.parse::<u32>().ok().filter(|n| (1..=1_000_000).contains(n));
                d.rpm = Some(n.ok_or_else(|| bad(&piece, "rpm is a whole number from 1 to 1000000"))?);
            }
            "seek" => {
                let why = "seek is a time from 0 to 1000 ms, e.g. 4.9ms or 4900us";
                let us = match (v.strip_suffix("us"), v.strip_suffix("ms")) {
                    (Some(us), _) => us.parse::<u64>().ok(),
                    (None, Some(ms)) => parse_decimal(ms, 3),
                    (None, None) => parse_decimal(v, 3),
                };
                d.seek_us = Some(us.filter(|us| *us <= 1_000_000).ok_or_else(|| bad(&piece, why))?);
            }
            "transfer" => {
                let why = "transfer is a rate above 0 up to 100000 MB/s, e.g. 29.8MB/s";
                let rate = parse_decimal(v.strip_suffix("MB/s").unwrap_or(v), 6);
                d.transfer = Some(rate.filter(|b| (1..=100_000_000_000).contains(b)).ok_or_else(|| bad(&piece, why))?);
            }
            "buffer" => {
                d.buffer = Some(match v.as_str() {
                    "off" => 0,
                    _ => stics_units::parse_size(v).map_err(|_| bad(&piece, "buffer is a size (e.g. 2MiB) or off"))?,
                });
            }
            "queue" => {
                d.queue = Some(match v.as_str() {
                    "fifo" => stics_disk::Queue::Fifo,
                    "elevator" => stics_disk::Queue::Elevator,
                    _ => return Err(bad(&piece, "queue is fifo or elevator")),
                });
            }
            _ => return Err(bad(&piece, "known keys: model, rpm, seek, transfer, buffer, queue")),
        }
    }
    if d.model.is_none() && (d.rpm.is_none() || d.seek_us.is_none() || d.transfer.is_none()) {
        return Err(bad("", "disk(...) needs model=NAME, or rpm=, seek= and transfer= all given"));
    }
    if d.model == Some(stics_disk::Preset::Raid5) && d.queue == Some(stics_disk::Queue::Elevator) {
        return Err(bad("queue=elevator", "the raid5 controller issues writes as they come: its queue is fifo"));
    }
    Ok(d)
}

/// A decimal number with at most `digits` digits after the point, as an integer of that many
/// decimal places: `4.9` with 3 is 4900.
fn parse_decimal(text: &str, digits: u32) -> Option<u64> {
    let (int, frac) = text.split_once('.').unwrap_or((text, ""));
    let all_digits = |t: &str| t.bytes().all(|c| c.is_ascii_digit());
    if int.is_empty() || !all_digits(int) || !all_digits(frac) || frac.len() > digits as usize {
        return None;
    }
    let scale = 10u64.pow(digits);
    let frac_value =
        if frac.is_empty() { 0 } else { frac.parse::<u64>().ok()? * 10u64.pow(digits - frac.len() as u32) };
    int.parse::<u64>().ok()?.checked_mul(scale)?.checked_add(frac_value)
}

/// An integer of `digits` decimal places as the shortest decimal: 4900 with 3 is `4.9`.
fn decimal_text(value: u64, digits: u32) -> String {
    let scale = 10u64.pow(digits);
    let (int, frac) = (value / scale, value % scale);
    if frac == 0 {
        return int.to_string();
    }
    let frac = format!("{frac:0width$}", width = digits as usize);
    format!("{int}.{}", frac.trim_end_matches('0'))
}

/// Reads `cache(SPEC, log=PATH[:SIZE], ...)`.
fn cache(call: &syntax::Call<'_>) -> Result<CacheSpec, SpecError> {
    let args = LayerArgs::parse(call)?;
    let bad = |piece: &str, reason| SpecError::LayerArg { kind: "cache".into(), piece: piece.to_owned(), reason };
    let mut c = CacheSpec {
        inner: Box::new(args.inner),
        log: PathBuf::new(),
        log_size: None,
        mode: None,
        ram: None,
        read_cache: None,
        policy: None,
        full_timeout_secs: None,
        index_memory: None,
        max_lag_secs: None,
        log_disk: None,
    };
    for (k, v) in &args.options {
        let piece = format!("{k}={v}");
        match k.as_str() {
            "log" => {
                // A trailing `:SIZE` is a size when it reads as one, as for `file:`.
                match v.rsplit_once(':') {
                    Some((p, n)) if !p.is_empty() && read_size(n).is_ok() => {
                        c.log = PathBuf::from(p);
                        c.log_size = Some(read_size(n)?);
                    }
                    _ => c.log = PathBuf::from(v),
                }
                if c.log.as_os_str().is_empty() {
                    return Err(bad(&piece, "the log needs a path"));
                }
            }
            "mode" => c.mode = Some(v.parse().map_err(|_| bad(&piece, "use log, immediate or write-through"))?),
            "ram" => c.ram = Some(read_size(v)?),
            // Zero is a valid read cache (none), which a device size never is.
            "read-cache" => c.read_cache = Some(stics_units::parse_size(v).map_err(|_| bad(&piece, "not a size"))?),
            "policy" => c.policy = Some(v.parse().map_err(|_| bad(&piece, "use lru or s3fifo"))?),
            "full-timeout" => {
                let secs = v.trim_end_matches('s').parse::<u64>().ok().filter(|n| (1..=86_400).contains(n));
                c.full_timeout_secs = Some(secs.ok_or_else(|| bad(&piece, "seconds, 1 to 86400"))?);
            }
            "index-memory" => c.index_memory = Some(read_size(v)?),
            "max-lag" => {
                let secs = v.trim_end_matches('s').parse::<u64>().ok().filter(|n| (1..=86_400).contains(n));
                c.max_lag_secs = Some(secs.ok_or_else(|| bad(&piece, "seconds, 1 to 86400"))?);
            }
            "log-disk" => {
                c.log_disk = Some(
                    v.parse().map_err(|_| bad(&piece, "a disk model: o7n3200, as010a1, 91366u4, dnes, ddys, raid5"))?,
                );
            }
            _ => {
                return Err(bad(
                    &piece,
                    "known keys: log, mode, ram, read-cache, policy, full-timeout, index-memory, max-lag, log-disk",
                ));
            }
        }
    }
    if c.log.as_os_str().is_empty() {
        return Err(bad("", "cache(...) needs log=PATH[:SIZE]"));
    }
    Ok(c)
}

/// Bytes in the largest binary unit that divides them exactly.
fn size_text(bytes: u64) -> String {
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

impl DeviceSpec {
    /// The spec as text with every CHAP secret left out: for logs and mount tables.
    pub fn redacted(&self) -> Redacted<'_> {
        Redacted(self)
    }

    fn write(&self, out: &mut String, secrets: bool) {
        let block = |out: &mut String, bs: u32| {
            if bs != DEFAULT_BLOCK_SIZE {
                *out += &format!(":{bs}");
            }
        };
        match self {
            DeviceSpec::Mem { size, block_size } => {
                *out += &format!("mem:{}", size_text(*size));
                block(out, *block_size);
            }
            DeviceSpec::Null { size, block_size } => {
                *out += &format!("null:{}", size_text(*size));
                block(out, *block_size);
            }
            DeviceSpec::File { path, size, block_size } => {
                *out += &format!("file:{}", path.display());
                match size {
                    Some(s) => *out += &format!(":{}", size_text(*s)),
                    None if *block_size != DEFAULT_BLOCK_SIZE => *out += ":",
                    None => {}
                }
                block(out, *block_size);
            }
            DeviceSpec::Iscsi { url, options } => {
                *out += &if secrets { url.unredacted() } else { url.to_string() };
                let IscsiOptions {
                    sessions,
                    digests,
                    first_burst,
                    max_burst,
                    max_r2t,
                    max_transfer,
                    read_session,
                    link,
                    tls,
                } = options;
                let size = |key: &str, n: Option<u32>| n.map(|n| format!("{key}={}", size_text(n.into())));
                let on_off = |key: &str, b: Option<bool>| b.map(|b| format!("{key}={}", if b { "on" } else { "off" }));
                let args = sessions
                    .map(|n| format!("sessions={n}"))
                    .into_iter()
                    .chain(on_off("digests", *digests))
                    .chain(size("first_burst", *first_burst))
                    .chain(size("max_burst", *max_burst))
                    .chain(max_r2t.map(|n| format!("max_r2t={n}")))
                    .chain(size("max_transfer", *max_transfer))
                    .chain(on_off("read_session", *read_session))
                    .chain(on_off("link", *link))
                    .chain(tls.iter().flat_map(|t| {
                        let path = |key: &str, p: &Option<std::path::PathBuf>| {
                            p.as_ref().map(|p| format!("{key}={}", p.display()))
                        };
                        [Some("tls=on".to_owned()), path("tls_ca", &Some(t.ca.clone()))]
                            .into_iter()
                            .chain([t.name.as_ref().map(|n| format!("tls_name={n}")), path("tls_cert", &t.cert)])
                            .chain([path("tls_key", &t.key)])
                            .flatten()
                    }));
                for a in args {
                    out.push(if out.contains('?') { '&' } else { '?' });
                    *out += &a;
                }
            }
            DeviceSpec::Rbd(r) => {
                *out += &format!("rbd:{}/{}", r.pool, r.image);
                if let Some(s) = &r.snap {
                    *out += &format!("@{s}");
                }
                let args = r
                    .conf
                    .iter()
                    .map(|p| format!("conf={}", p.display()))
                    .chain(r.id.iter().map(|i| format!("id={i}")))
                    .chain(r.keyring.iter().map(|p| format!("keyring={}", p.display())))
                    .chain((r.block_size != DEFAULT_BLOCK_SIZE).then(|| format!("block={}", r.block_size)))
                    .chain(r.timeout_secs.map(|n| format!("timeout={n}")));
                for (i, a) in args.enumerate() {
                    out.push(if i == 0 { '?' } else { '&' });
                    *out += &a;
                }
            }
            DeviceSpec::Layer(layer) => layer.write(out, secrets),
        }
    }
}

impl fmt::Display for DeviceSpec {
    /// The spec as [`FromStr`] reads it back, secrets included (see [`DeviceSpec::redacted`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::new();
        self.write(&mut s, true);
        f.write_str(&s)
    }
}

/// A [`DeviceSpec`] printed without secrets.
#[derive(Debug, Clone, Copy)]
pub struct Redacted<'a>(&'a DeviceSpec);

impl fmt::Display for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::new();
        self.0.write(&mut s, false);
        f.write_str(&s)
    }
}

/// Hides the secrets of every `iscsi://` URL inside `text`, for error messages.
pub(crate) fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("iscsi://") {
        let (head, tail) = rest.split_at(i + "iscsi://".len());
        out += head;
        let end = tail.find(['/', '?']).unwrap_or(tail.len());
        let authority = &tail[..end];
        match (authority.find('%'), authority.rfind('@')) {
            (Some(p), Some(a)) if p < a => out += &format!("{}%***{}", &authority[..p], &authority[a..]),
            _ => out += authority,
        }
        rest = &tail[end..];
    }
    out += rest;
    let mut hidden = String::with_capacity(out.len());
    let mut rest = out.as_str();
    const KEY: &str = "target_password=";
    while let Some(i) = rest.find(KEY) {
        let (head, tail) = rest.split_at(i + KEY.len());
        hidden += head;
        hidden += "***";
        rest = &tail[tail.find(['&', ',', ')']).unwrap_or(tail.len())..];
    }
    hidden += rest;
    hidden
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn parse(s: &str) -> Result<DeviceSpec, SpecError> {
        s.parse()
    }

    fn mem(size: u64) -> DeviceSpec {
        DeviceSpec::Mem { size, block_size: 512 }
    }

    fn file(path: &str, size: Option<u64>, block_size: u32) -> DeviceSpec {
        DeviceSpec::File { path: path.into(), size, block_size }
    }

    #[test]
    fn parses_specs() {
        assert_eq!(parse("mem:1GiB").unwrap(), mem(1 << 30));
        assert_eq!(parse("null:64M").unwrap(), DeviceSpec::Null { size: 64 << 20, block_size: 512 });
        assert_eq!(parse("file:/tmp/a.img:1G").unwrap(), file("/tmp/a.img", Some(1 << 30), 512));
        assert_eq!(parse("file:/dev/loop0").unwrap(), file("/dev/loop0", None, 512));
        assert!(parse("mem:12").is_err());
        assert!(parse("mem:").is_err());
        assert!(parse("disk:1G").is_err());
        assert!(parse("mem:-1G").is_err());
        assert!(parse("mem:1Q").is_err());
    }

    #[test]
    fn the_old_file_syntax_keeps_its_meaning() {
        assert_eq!(parse("file:/a:b").unwrap(), file("/a:b", None, 512));
        assert_eq!(parse("file:/a:b:1M").unwrap(), file("/a:b", Some(1 << 20), 512));
        assert_eq!(parse("file:/a:x:4096").unwrap(), file("/a:x", Some(4096), 512));
        assert_eq!(parse("file:rel/x.img:4096").unwrap(), file("rel/x.img", Some(4096), 512));
        assert_eq!(parse("file::1G").unwrap(), file("", Some(1 << 30), 512));
        assert_eq!(parse("file: spaced ").unwrap(), file(" spaced ", None, 512));
        assert_eq!(parse("file:/a(1),b.img").unwrap(), file("/a(1),b.img", None, 512));
    }

    #[test]
    fn block_sizes_follow_the_size() {
        assert_eq!(parse("mem:1GiB:4096").unwrap(), DeviceSpec::Mem { size: 1 << 30, block_size: 4096 });
        assert_eq!(parse("null:1M:1024").unwrap(), DeviceSpec::Null { size: 1 << 20, block_size: 1024 });
        assert_eq!(parse("mem:1M:512").unwrap(), mem(1 << 20));
        assert_eq!(parse("file:/x.img:1G:4096").unwrap(), file("/x.img", Some(1 << 30), 4096));
        assert_eq!(parse("file:/dev/sdb::4096").unwrap(), file("/dev/sdb", None, 4096));
        assert_eq!(parse("mem:1M:8192"), Err(SpecError::BlockSize { piece: "8192".into() }));
        assert_eq!(parse("mem:1M:500"), Err(SpecError::BlockSize { piece: "500".into() }));
        assert_eq!(parse("mem:1M:4K"), Err(SpecError::BlockSize { piece: "4K".into() }));
        assert_eq!(parse("file:/x:1G:520"), Err(SpecError::BlockSize { piece: "520".into() }));
        assert_eq!(parse("file:/x:1G:8192"), Err(SpecError::BlockSize { piece: "8192".into() }));
        assert_eq!(parse("file:/x::8192"), Err(SpecError::BlockSize { piece: "8192".into() }));
        assert_eq!(parse("mem:1536:4096"), Err(SpecError::NotWholeBlocks { piece: "1536".into(), block_size: 4096 }));
        assert_eq!(
            parse("file:/x:1536:4096"),
            Err(SpecError::NotWholeBlocks { piece: "1536".into(), block_size: 4096 })
        );
    }

    #[test]
    fn iscsi_urls_are_read_by_the_initiators_parser() {
        let s = parse("iscsi://u%pw@10.0.0.1:3261/iqn.2024-01.org.example:disk/1").unwrap();
        let DeviceSpec::Iscsi { url, options } = &s else { panic!("{s:?}") };
        assert_eq!((url.host.as_str(), url.port, url.lun), ("10.0.0.1", 3261, Some(1)));
        assert_eq!(url.target.as_deref(), Some("iqn.2024-01.org.example:disk"));
        assert_eq!(url.chap.as_ref().map(|c| c.secret.as_str()), Some("pw"));
        assert_eq!(*options, IscsiOptions::default());
        assert_eq!(s.to_string(), "iscsi://u%pw@10.0.0.1:3261/iqn.2024-01.org.example:disk/1");
        assert_eq!(s.redacted().to_string(), "iscsi://u%***@10.0.0.1:3261/iqn.2024-01.org.example:disk/1");
        assert!(!format!("{s:?}").contains("pw@"), "{s:?}");

        let s = parse("iscsi://u%p@h/iqn.x/2?sessions=4&target_user=t&target_password=tp&digests=on").unwrap();
        let DeviceSpec::Iscsi { url, options } = &s else { panic!("{s:?}") };
        assert_eq!(*options, IscsiOptions { sessions: Some(4), digests: Some(true), ..IscsiOptions::default() });
        assert_eq!(url.chap.as_ref().and_then(|c| c.mutual.clone()), Some(("t".into(), "tp".into())));
        assert_eq!(s.to_string(), "iscsi://u%p@h:3260/iqn.x/2?target_user=t&target_password=tp&sessions=4&digests=on");
        assert_eq!(s.redacted().to_string(), "iscsi://u%***@h:3260/iqn.x/2?sessions=4&digests=on");
        assert_eq!(parse("iscsi://h/iqn.x/0?digests=off").unwrap().to_string(), "iscsi://h:3260/iqn.x/0?digests=off");
        for (text, want) in [("on", true), ("off", false)] {
            let s = parse(&format!("iscsi://h/iqn.x/0?read_session={text}&sessions=2")).unwrap();
            let DeviceSpec::Iscsi { options, .. } = &s else { panic!("{s:?}") };
            assert_eq!(options.read_session, Some(want));
            assert_eq!(s.to_string(), format!("iscsi://h:3260/iqn.x/0?sessions=2&read_session={text}"));
        }
    }

    #[test]
    fn bad_iscsi_specs_say_what_is_wrong_without_secrets() {
        let e = parse("iscsi://u%hush@h/iqn.x").unwrap_err();
        assert!(matches!(e, SpecError::Url(_)), "{e:?}");
        assert!(e.to_string().contains("missing LUN"), "{e}");
        assert!(!e.to_string().contains("hush"), "{e}");
        let e = parse("iscsi://u%hush@h/iqn.x/0?sessions=0").unwrap_err();
        assert_eq!(
            e,
            SpecError::IscsiOption { piece: "sessions=0".into(), reason: "sessions is a number from 1 to 64" }
        );
        let e = parse("iscsi://h/iqn.x/0?digests=yes").unwrap_err();
        assert!(e.to_string().contains("\"digests=yes\""), "{e}");
        let e = parse("iscsi://h/iqn.x/0?read_session=1").unwrap_err();
        assert_eq!(e, SpecError::IscsiOption { piece: "read_session=1".into(), reason: "read_session is on or off" });
        let e = parse("iscsi://u%hush@h/iqn.x/0?colour=red").unwrap_err();
        assert!(e.to_string().contains("unknown query argument"), "{e}");
        assert!(!e.to_string().contains("hush"), "{e}");
        assert!(parse("iscsi:/h/iqn.x/0").is_err());
    }

    #[test]
    fn burst_options_read_and_print_back() {
        let s = parse("iscsi://h/iqn.x/0?first_burst=64KiB&max_burst=256k&max_r2t=1&max_transfer=16MiB").unwrap();
        let DeviceSpec::Iscsi { options, .. } = &s else { panic!("{s:?}") };
        let want = IscsiOptions {
            first_burst: Some(65536),
            max_burst: Some(262_144),
            max_r2t: Some(1),
            max_transfer: Some(16 << 20),
            ..IscsiOptions::default()
        };
        assert_eq!(*options, want);
        let text = "iscsi://h:3260/iqn.x/0?first_burst=64KiB&max_burst=256KiB&max_r2t=1&max_transfer=16MiB";
        assert_eq!(s.to_string(), text);
        assert_eq!(parse(text).unwrap(), s);
        // Sizes that are no whole binary unit print as bytes and still read back.
        let s = parse("iscsi://h/iqn.x/0?sessions=2&max_burst=16777215&first_burst=1000kB").unwrap();
        assert_eq!(s.to_string(), "iscsi://h:3260/iqn.x/0?sessions=2&first_burst=1000000&max_burst=16777215");
        assert_eq!(parse(&s.to_string()).unwrap(), s);
    }

    #[test]
    fn bad_burst_options_say_what_is_wrong() {
        let cases: &[(&str, &str)] = &[
            ("first_burst=256", "\"first_burst=256\": first_burst is a size from 512 B to 16 MiB - 1 B"),
            ("first_burst=16MiB", "first_burst is a size from 512 B"),
            ("first_burst=lots", "\"first_burst=lots\""),
            ("max_burst=0", "max_burst is a size from 512 B to 16 MiB - 1 B, e.g. 256KiB"),
            ("max_burst=-4KiB", "\"max_burst=-4KiB\""),
            ("max_r2t=0", "max_r2t is a number from 1 to 65535"),
            ("max_r2t=65536", "max_r2t is a number from 1 to 65535"),
            ("max_transfer=2GiB", "max_transfer is a size from 512 B to 1 GiB"),
            ("max_burst=64KiB&first_burst=256KiB", "\"first_burst=256KiB\": first_burst may not exceed max_burst"),
        ];
        for (query, want) in cases {
            let e = parse(&format!("iscsi://u%hush@h/iqn.x/0?{query}")).unwrap_err();
            assert!(matches!(e, SpecError::IscsiOption { .. }), "{query}: {e:?}");
            let e = e.to_string();
            assert!(e.contains(want), "{query}: {e}");
            assert!(!e.contains("hush"), "{query}: {e}");
        }
    }

    #[test]
    fn errors_name_the_piece_at_fault() {
        let cases: &[(&str, &str)] = &[
            ("", "empty device spec"),
            ("disk:1G", "unknown device kind \"disk\""),
            ("mem", "bad device spec \"mem\""),
            ("/dev/sda", "bad device spec \"/dev/sda\""),
            ("mem:1Q", "bad size \"1Q\""),
            ("null:12", "bad size \"12\""),
            ("mem:1G:3000", "bad block size \"3000\""),
            ("file:", "file: needs a path"),
            ("cache(mem:1G", "unbalanced parentheses in \"cache(mem:1G\": '(' is never closed (byte 5)"),
            ("cache(mem:1G))", "unexpected \")\" after the closing ')'"),
            ("zip(mem:1G, log=/l)", "unknown wrapper \"zip\" (known: cache, journal, disk)"),
            ("cache(mem:1G)", "cache(...) needs log=PATH[:SIZE]"),
            ("cache(mem:1G, log=/l, mode=fast)", "use log, immediate or write-through"),
            ("cache(mem:1G, log=/l, speed=9)", "known keys: log, mode, ram, read-cache, policy"),
            ("cache(mem:1G, log=/l, ram=1Q)", "bad size \"1Q\""),
            ("cache(iscsi://u%hush@h/iqn.x/0", "iscsi://u%***@h/iqn.x/0"),
            ("iscsi://h/iqn.x/0?tls=on", "tls=on needs tls_ca=PATH"),
            ("iscsi://h/iqn.x/0?tls=yes", "tls is on or off"),
            ("iscsi://h/iqn.x/0?tls_ca=/ca.pem", "TLS options need tls=on"),
            ("iscsi://h/iqn.x/0?tls=off&tls_name=sg", "TLS options need tls=on"),
            ("iscsi://h/iqn.x/0?tls=on&tls_ca=/ca.pem&tls_cert=/c.pem", "tls_cert and tls_key go together"),
            ("iscsi://h/iqn.x/0?tls=on&tls_ca=", "take a value"),
        ];
        for (text, want) in cases {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(!e.contains("hush"), "{text:?}: {e}");
        }
    }

    #[test]
    fn cache_specs_read_and_print_back() {
        for text in [
            "cache(iscsi://10.0.0.1:3260/iqn.2024-01.org.x:y/0, log=/var/lib/stics/log:1GiB, mode=immediate, ram=64MiB, read-cache=256MiB, policy=lru)",
            "cache(mem:1GiB, log=/tmp/l)",
            "cache(cache(mem:1GiB, log=/a), log=/b:2GiB, mode=write-through)",
            "cache(mem:1GiB, log=/tmp/l, max-lag=2, log-disk=as010a1)",
        ] {
            let spec: DeviceSpec = text.parse().unwrap();
            assert_eq!(spec.to_string(), text);
            assert!(matches!(spec, DeviceSpec::Layer(Layer::Cache(_))));
        }
        let DeviceSpec::Layer(Layer::Cache(c)) = "cache(mem:1G, log=/x:y:512MiB)".parse().unwrap() else { panic!() };
        assert_eq!((c.log, c.log_size), (PathBuf::from("/x:y"), Some(512 << 20)));
        let e = "cache(mem:1G, log=/l, log-disk=floppy)".parse::<DeviceSpec>().unwrap_err().to_string();
        assert!(e.contains("log-disk=floppy") && e.contains("o7n3200"), "{e}");
    }

    #[test]
    fn journal_specs_read_and_print_back_and_name_what_is_wrong() {
        for text in [
            "journal(file:/srv/lun.img:10GiB, journal=/srv/journal:2GiB)",
            "journal(rbd:p/img, journal=rbd:p/img-journal, max-group=16MiB)",
            "journal(file:/d, journal=/j:1GiB, segment=128KiB, lease=10s, break-after=120s)",
            "journal(mem:1GiB, journal=/j)",
            "cache(iscsi://h:3260/iqn.2024-01.org.x:y/0?link=off, log=/l)",
            "cache(iscsi://h:3260/iqn.2024-01.org.x:y/0?link=on&tls=on&tls_ca=/pki/ca.pem&tls_name=sg, log=/l)",
            "iscsi://h:3260/iqn.2024-01.org.x:y/0?tls=on&tls_ca=/ca.pem&tls_cert=/c.pem&tls_key=/c.key",
        ] {
            let spec: DeviceSpec = text.parse().unwrap();
            assert_eq!(spec.to_string(), text);
        }
        let DeviceSpec::Layer(Layer::Journal(j)) = "journal(mem:1G, journal=rbd:p/j)".parse().unwrap() else {
            panic!()
        };
        assert!(matches!(j.journal, JournalAt::Device(d) if matches!(*d, DeviceSpec::Rbd(_))));
        let bare: DeviceSpec = "journal(mem:1GiB, journal=/j, lease=2, break-after=3)".parse().unwrap();
        assert_eq!(
            bare.to_string(),
            "journal(mem:1GiB, journal=/j, lease=2s, break-after=3s)",
            "a bare number is seconds"
        );
        for (text, want) in [
            ("journal(mem:1G)", "needs journal=PATH[:SIZE] or journal=DEVICE-SPEC"),
            ("journal(mem:1G, journal=/j, max-group=1KiB)", "a size from 1 MiB to 1 GiB"),
            ("journal(mem:1G, journal=/j, lag=3)", "known keys: journal, max-group, segment, lease, break-after"),
            ("journal(mem:1G, journal=/j, lease=0s)", "whole seconds, at least 1s"),
            ("journal(mem:1G, journal=/j, break-after=1.5s)", "whole seconds, at least 1s"),
            ("journal(mem:1G, journal=/j, segment=48KiB)", "a power of two from 32 KiB to 256 KiB"),
            ("journal(mem:1G, journal=/j, segment=1MiB)", "a power of two from 32 KiB to 256 KiB"),
            ("journal(mem:1G, journal=)", "needs a path or a device"),
            ("iscsi://h/iqn.2024-01.org.x:y/0?link=maybe", "link is on or off"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn disk_specs_read_and_print_back() {
        for text in [
            "disk(mem:1GiB, model=o7n3200)",
            "disk(file:/srv/lun.img:10GiB, model=as010a1, rpm=5400, seek=12.25ms, transfer=8.5MB/s, buffer=off, queue=elevator)",
            "disk(mem:1GiB, rpm=7200, seek=9ms, transfer=33.7MB/s)",
            "journal(disk(file:/srv/a.img, model=raid5, buffer=64MiB), journal=/j)",
            "cache(disk(iscsi://h:3260/iqn.x/0, model=ddys, queue=fifo), log=/l)",
        ] {
            let spec: DeviceSpec = text.parse().unwrap();
            assert_eq!(spec.to_string(), text);
        }
        let DeviceSpec::Layer(Layer::Disk(d)) = parse("disk(mem:1G, model=DDYS, seek=4900us, transfer=34.04)").unwrap()
        else {
            panic!()
        };
        assert_eq!((d.model, d.seek_us, d.transfer), (Some(stics_disk::Preset::Ddys), Some(4900), Some(34_040_000)));
        let c = d.config();
        assert_eq!((c.mechanics.transfer, c.buffer), (34.04e6, 4 << 20));
        let DeviceSpec::Layer(Layer::Disk(d)) = parse("disk(mem:1G, model=91366u4, buffer=off)").unwrap() else {
            panic!()
        };
        assert_eq!(d.buffer, Some(0));
    }

    #[test]
    fn bad_disk_specs_say_what_is_wrong() {
        for (text, want) in [
            ("disk(mem:1G)", "needs model=NAME, or rpm=, seek= and transfer= all given"),
            ("disk(mem:1G, rpm=7200, seek=9ms)", "needs model=NAME"),
            ("disk(mem:1G, model=st506)", "\"model=st506\" of disk(...): unknown model (known: o7n3200, as010a1"),
            ("disk(mem:1G, model=dnes, rpm=0)", "rpm is a whole number from 1 to 1000000"),
            ("disk(mem:1G, model=dnes, rpm=fast)", "rpm is a whole number"),
            ("disk(mem:1G, model=dnes, seek=-1ms)", "seek is a time from 0 to 1000 ms"),
            ("disk(mem:1G, model=dnes, seek=4.9999ms)", "seek is a time"),
            ("disk(mem:1G, model=dnes, seek=2s)", "seek is a time"),
            ("disk(mem:1G, model=dnes, transfer=0MB/s)", "transfer is a rate above 0"),
            ("disk(mem:1G, model=dnes, transfer=fast)", "transfer is a rate"),
            ("disk(mem:1G, model=dnes, buffer=lots)", "buffer is a size (e.g. 2MiB) or off"),
            ("disk(mem:1G, model=dnes, queue=lifo)", "queue is fifo or elevator"),
            ("disk(mem:1G, model=raid5, queue=elevator)", "the raid5 controller issues writes as they come"),
            ("disk(mem:1G, model=dnes, heads=4)", "known keys: model, rpm, seek, transfer, buffer, queue"),
            ("disk(iscsi://u%hush@h/iqn.x/0, model=zz)", "unknown model"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
            assert!(!e.contains("hush"), "{text}: {e}");
        }
    }

    #[test]
    fn decimals_read_and_print_exactly() {
        assert_eq!(parse_decimal("4.9", 3), Some(4900));
        assert_eq!(parse_decimal("29.8", 6), Some(29_800_000));
        assert_eq!(parse_decimal("7", 3), Some(7000));
        assert_eq!(parse_decimal("0.001", 3), Some(1));
        for bad in ["", ".5", "1.", "1.2345", "-1", "1e3", "1.2.3"] {
            assert_eq!(parse_decimal(bad, 3), if bad == "1." { Some(1000) } else { None }, "{bad}");
        }
        assert_eq!(decimal_text(4900, 3), "4.9");
        assert_eq!(decimal_text(34_040_000, 6), "34.04");
        assert_eq!(decimal_text(7, 3), "0.007");
        assert_eq!(decimal_text(9000, 3), "9");
    }

    #[test]
    fn wrapper_arguments_are_the_inner_spec_then_options() {
        let args = |t| LayerArgs::parse(&syntax::call(t).unwrap());
        assert_eq!(
            args("cache(mem:1G, log=/var/l.img, mode = log)").unwrap(),
            LayerArgs {
                inner: mem(1 << 30),
                options: vec![("log".into(), "/var/l.img".into()), ("mode".into(), "log".into())]
            }
        );
        assert_eq!(args("cache(file:/a(1).img)").unwrap().inner, file("/a(1).img", None, 512));
        assert!(matches!(args("cache()"), Err(SpecError::LayerArg { .. })));
        let e = args("cache(mem:1G, fast)").unwrap_err();
        assert_eq!(e.to_string(), "bad argument \"fast\" of cache(...): expected KEY=VALUE");
        assert_eq!(args("cache(mem:1Q)").unwrap_err(), parse("mem:1Q").unwrap_err());
    }

    #[test]
    fn redact_hides_every_secret() {
        assert_eq!(
            redact("a(iscsi://u%s@h/i/0, iscsi://v%t@[::1]:1/j/1)"),
            "a(iscsi://u%***@h/i/0, iscsi://v%***@[::1]:1/j/1)"
        );
        assert_eq!(
            redact("iscsi://u%s@h/i/0?target_user=t&target_password=x&sessions=2"),
            "iscsi://u%***@h/i/0?target_user=t&target_password=***&sessions=2"
        );
        assert_eq!(redact("mem:1G"), "mem:1G");
    }

    fn block_size() -> impl Strategy<Value = u32> {
        prop_oneof![Just(512u32), Just(1024), Just(2048), Just(4096)]
    }

    /// Sizes as whole blocks, up to 2^40 blocks (beyond that a byte count is no longer exact in
    /// the parser's floating point).
    fn sized() -> impl Strategy<Value = (u64, u32)> {
        let blocks = prop_oneof![1u64..(1 << 40), (1u64..(1 << 12), 0u32..4).prop_map(|(n, shift)| n << (shift * 10))];
        (block_size(), blocks).prop_map(|(bs, n)| (n * u64::from(bs), bs))
    }

    fn tls_options() -> impl Strategy<Value = stics_tls::ClientOptions> {
        let path = "/[a-z0-9._/-]{1,20}";
        (path, proptest::option::of("[a-z0-9.-]{1,12}"), proptest::option::of((path, path))).prop_map(
            |(ca, name, pair)| {
                let (cert, key) = pair.map_or((None, None), |(c, k)| (Some(c.into()), Some(k.into())));
                stics_tls::ClientOptions { ca: ca.into(), name, cert, key }
            },
        )
    }

    fn spec() -> impl Strategy<Value = DeviceSpec> {
        // Paths without ':' (see the module docs for paths that hold one).
        let path = "[a-zA-Z0-9_./ (),-]{1,30}";
        let name = "[a-z0-9]{1,8}";
        let secret = "[a-zA-Z0-9%:@._-]{0,12}";
        prop_oneof![
            sized().prop_map(|(size, block_size)| DeviceSpec::Mem { size, block_size }),
            sized().prop_map(|(size, block_size)| DeviceSpec::Null { size, block_size }),
            (path, proptest::option::of(sized()), block_size()).prop_map(|(p, s, bs)| {
                let (size, block_size) = match s {
                    Some((size, block_size)) => (Some(size), block_size),
                    None => (None, bs),
                };
                DeviceSpec::File { path: p.into(), size, block_size }
            }),
            (
                name,
                proptest::option::of((name, secret)),
                proptest::option::of((name, "[a-zA-Z0-9._-]{1,12}")),
                proptest::option::of(any::<u16>()),
                "iqn\\.2024-01\\.[a-z.]{1,10}:[a-z0-9.-]{1,10}",
                0u64..16384,
                proptest::option::of(1usize..=MAX_SESSIONS),
                (
                    proptest::option::of(any::<bool>()),
                    proptest::option::of(any::<bool>()),
                    proptest::option::of(any::<bool>()),
                    proptest::option::of(tls_options()),
                ),
                burst_options(),
            )
                .prop_map(
                    |(host, chap, mutual, port, target, lun, sessions, (digests, read_session, link, tls), bursts)| {
                        let chap = chap.map(|(user, secret)| stics_initiator::Chap {
                            user,
                            secret,
                            mutual: mutual.map(|(u, p)| (u.clone(), p)),
                        });
                        let url =
                            IscsiUrl { host, port: port.unwrap_or(3260), target: Some(target), lun: Some(lun), chap };
                        let (first_burst, max_burst, max_r2t, max_transfer) = bursts;
                        let options = IscsiOptions {
                            sessions,
                            digests,
                            first_burst,
                            max_burst,
                            max_r2t,
                            max_transfer,
                            read_session,
                            link,
                            tls,
                        };
                        DeviceSpec::Iscsi { url, options }
                    }
                ),
            (
                "[a-z0-9._-]{1,8}",
                "[a-zA-Z0-9._-]{1,12}",
                proptest::option::of("[a-z0-9._-]{1,8}"),
                proptest::option::of("/[a-z0-9._/-]{1,20}"),
                proptest::option::of(name),
                proptest::option::of("/[a-z0-9._/-]{1,20}"),
                prop_oneof![Just(512u32), Just(4096)],
                proptest::option::of(1u64..=MAX_RBD_TIMEOUT_SECS),
            )
                .prop_map(|(pool, image, snap, conf, id, keyring, block_size, timeout_secs)| {
                    DeviceSpec::Rbd(RbdSpec {
                        pool,
                        image,
                        snap,
                        conf: conf.map(Into::into),
                        id,
                        keyring: keyring.map(Into::into),
                        block_size,
                        timeout_secs,
                    })
                }),
        ]
    }

    #[test]
    fn rbd_specs_name_pool_image_snapshot_and_how_to_reach_the_cluster() {
        let r = |pool: &str, image: &str, snap: Option<&str>| RbdSpec {
            pool: pool.into(),
            image: image.into(),
            snap: snap.map(Into::into),
            conf: None,
            id: None,
            keyring: None,
            block_size: 512,
            timeout_secs: None,
        };
        assert_eq!(parse("rbd:rbd/img0").unwrap(), DeviceSpec::Rbd(r("rbd", "img0", None)));
        assert_eq!(parse("rbd:p/i@s1").unwrap(), DeviceSpec::Rbd(r("p", "i", Some("s1"))));
        let full = parse("rbd:p/i?conf=/etc/c.conf&id=gw&keyring=/k&block=4096&timeout=5").unwrap();
        let want = RbdSpec {
            conf: Some("/etc/c.conf".into()),
            id: Some("gw".into()),
            keyring: Some("/k".into()),
            block_size: 4096,
            timeout_secs: Some(5),
            ..r("p", "i", None)
        };
        assert_eq!(full, DeviceSpec::Rbd(want));
        assert_eq!(full.to_string(), "rbd:p/i?conf=/etc/c.conf&id=gw&keyring=/k&block=4096&timeout=5");
        let inner = parse("cache(rbd:p/i?conf=/c, log=/l)").unwrap();
        assert!(matches!(inner, DeviceSpec::Layer(Layer::Cache(c)) if matches!(*c.inner, DeviceSpec::Rbd(_))));
        for (bad, says) in [
            ("rbd:", "rbd:POOL/IMAGE"),
            ("rbd:pool", "rbd:POOL/IMAGE"),
            ("rbd:/img", "non-empty"),
            ("rbd:p/", "non-empty"),
            ("rbd:p/i@", "non-empty"),
            ("rbd:p/i/j", "without /"),
            ("rbd:p/i?block=8192", "512 or 4096"),
            ("rbd:p/i?block=1024", "512 or 4096"),
            ("rbd:p/i?timeout=0", "1 to 600"),
            ("rbd:p/i?pool=x", "known options"),
            ("rbd:p/i?conf=", "known options"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(matches!(e, SpecError::Rbd { .. }), "{bad}: {e:?}");
            assert!(e.to_string().contains(says), "{bad}: {e}");
        }
    }

    /// `disk(...)` over any leaf, with a model or all three mechanics, and any of the options.
    fn disk_spec() -> impl Strategy<Value = DeviceSpec> {
        let preset = proptest::option::of(proptest::sample::select(stics_disk::Preset::ALL.to_vec()));
        let queue = proptest::option::of(prop_oneof![Just(stics_disk::Queue::Fifo), Just(stics_disk::Queue::Elevator)]);
        let buffer = proptest::option::of(prop_oneof![Just(0u64), (1u64..1 << 30), (1u64..64).prop_map(|n| n << 20)]);
        // A nested spec may not hold a comma or an unbalanced parenthesis (see the module docs),
        // nor begin or end with a space (wrapper arguments are trimmed).
        let inner = spec().prop_filter("no commas, parentheses or spaces at the ends", |s| {
            let t = s.to_string();
            !t.contains([',', '(', ')']) && t.trim() == t
        });
        (
            inner,
            preset,
            proptest::option::of(1u32..=1_000_000),
            proptest::option::of(0u64..=1_000_000),
            proptest::option::of(1u64..=100_000_000_000),
            buffer,
            queue,
        )
            .prop_map(|(inner, model, rpm, seek_us, transfer, buffer, queue)| {
                let explicit = model.is_none();
                let queue =
                    if model == Some(stics_disk::Preset::Raid5) { Some(stics_disk::Queue::Fifo) } else { queue };
                DeviceSpec::Layer(Layer::Disk(DiskSpec {
                    inner: Box::new(inner),
                    model,
                    rpm: if explicit { Some(rpm.unwrap_or(7200)) } else { rpm },
                    seek_us: if explicit { Some(seek_us.unwrap_or(8500)) } else { seek_us },
                    transfer: if explicit { Some(transfer.unwrap_or(16_600_000)) } else { transfer },
                    buffer,
                    queue,
                }))
            })
    }

    /// `first_burst`, `max_burst` (never below the first), `max_r2t` and `max_transfer`, in
    /// range, as whole bytes or whole binary units.
    fn burst_options() -> impl Strategy<Value = (Option<u32>, Option<u32>, Option<u32>, Option<u32>)> {
        let size =
            |max: u32| prop_oneof![512u32..=max, (1u32..=16, 9u32..=20).prop_map(move |(n, s)| (n << s).min(max))];
        (
            proptest::option::of(size(MAX_BURST)),
            proptest::option::of(size(MAX_BURST)),
            proptest::option::of(1u32..=65_535),
            proptest::option::of(size(MAX_TRANSFER)),
        )
            .prop_map(|(a, b, r2t, t)| match (a, b) {
                (Some(a), Some(b)) => (Some(a.min(b)), Some(a.max(b)), r2t, t),
                _ => (a, b, r2t, t),
            })
    }

    proptest! {
        #[test]
        fn printed_specs_parse_back_to_the_same_spec(s in spec()) {
            let text = s.to_string();
            prop_assert_eq!(parse(&text).map_err(|e| e.to_string()), Ok(s), "{}", text);
        }

        #[test]
        fn printed_disk_specs_parse_back_to_the_same_spec(s in disk_spec()) {
            let text = s.to_string();
            prop_assert_eq!(parse(&text).map_err(|e| e.to_string()), Ok(s), "{}", text);
        }

        #[test]
        fn any_text_parses_or_fails_without_panicking(t in "\\PC{0,40}") {
            let _ = parse(&t);
        }
    }
}

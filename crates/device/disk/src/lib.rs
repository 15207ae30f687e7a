//! A disk model in the device stack: a block device that answers each request when a disk of the
//! seeds' kind would have (seek curve, rotation, media rate, command overhead, a request queue
//! and an optional volatile write buffer), with the data kept by any inner device.
//!
//! [`model`] is the pure state machine (no clock, no tokio); [`DiskDev`] wraps a device, asks the
//! model when each request completes, does the inner I/O and sleeps until then. [`Preset`] names
//! the seeds' disks (seed 004 Table 2, seed 000 §3) and [`Overrides`] changes any parameter.
//!
//! **Architecture Invariant:** the model is pure (it takes `now` and returns completion times);
//! the wrapper only asks it, forwards to the inner device and sleeps.

#![forbid(unsafe_code)]

pub mod model;

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use stics_block::{blocks_in, BlockDev, BlockError, Claim, Geometry, Provisioning};
use tokio::time::Instant;

pub use model::{Disk, Head, Mechanics, Model, Queue, Raid5};

/// Command processing when no seed gives it: seed 000 counts "command processing" in Tdisk
/// without a number; 0.1 ms is under 1 % of a random 8 KiB access on every preset, so the choice
/// hardly moves the totals, and it is what a buffered write costs to be acknowledged.
pub const OVERHEAD: Duration = Duration::from_micros(100);

/// The track-to-track seek as a share of the average seek, when no seed gives it: a tenth,
/// which drives of the seeds' time quoted (0.5 ms beside a 4.9 ms average); it shapes short seeks
/// only, never the mean over random requests.
pub const TRACK_SEEK_SHARE: f64 = 0.1;

/// The seeds' disks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Preset {
    /// IBM O7N3200 (seed 004 Table 2, the target's disk): 10,000 rpm, 4.9 ms average seek,
    /// 29.8 MB/s, no data buffer ("N/A"), so writes go to the medium.
    O7n3200,
    /// Maxtor AS010a1 (seed 004 Table 2, the log disk): 7,200 rpm, 8.5 ms, 16.6 MB/s, 2 MB buffer
    /// (taken as 2 MiB, as buffer memory comes).
    As010a1,
    /// Maxtor 91366U4 (seed 004 Table 2): 7,200 rpm, 9.0 ms, "up to 33.7 MB/s" (the outer zone;
    /// the model has one zone, so inner tracks come out faster than on the real disk), 2 MB.
    M91366u4,
    /// IBM DNES, 8 GB with a 2 MB cache, write cache on (seed 000 §3). The seeds give nothing of
    /// its mechanics; it is a 7,200 rpm disk of the generation before the DDYS, so the preset
    /// takes seed 004's 7,200 rpm AS010a1 mechanics (8.5 ms, 16.6 MB/s) and says so.
    Dnes,
    /// IBM DDYS, 18 GB with a 4 MB cache, write cache on (seed 000 §3). Media rate 34.04 MB/s:
    /// seed 000's own local sequential 8 KB writes (0.24 ms each, acknowledged by the cache at
    /// the media rate). RPM and seek are not in the seeds: the DDYS is of the 10,000 rpm Ultrastar
    /// generation the O7N3200 belongs to, so it takes that disk's 10,000 rpm and 4.9 ms.
    Ddys,
    /// The RAID 5 array of seed 000 §3: eight DDYS (their own caches left out), a 16 KB chunk,
    /// a 128 MB controller cache (see [`model::Raid5`] for what is simplified).
    Raid5,
}

impl Preset {
    /// Every preset, in the order the seeds name them.
    pub const ALL: [Preset; 6] =
        [Preset::O7n3200, Preset::As010a1, Preset::M91366u4, Preset::Dnes, Preset::Ddys, Preset::Raid5];

    /// The name a spec uses.
    pub fn name(self) -> &'static str {
        match self {
            Preset::O7n3200 => "o7n3200",
            Preset::As010a1 => "as010a1",
            Preset::M91366u4 => "91366u4",
            Preset::Dnes => "dnes",
            Preset::Ddys => "ddys",
            Preset::Raid5 => "raid5",
        }
    }

    /// The preset's parameters.
    pub fn config(self) -> Config {
        let disk = |rpm: f64, seek_us: u64, mb_per_s: f64, buffer: u64| Config {
            buffer,
            ..Config::explicit(rpm, Duration::from_micros(seek_us), mb_per_s * 1e6)
        };
        match self {
            Preset::O7n3200 => disk(10_000.0, 4_900, 29.8, 0),
            Preset::As010a1 => disk(7_200.0, 8_500, 16.6, 2 << 20),
            Preset::M91366u4 => disk(7_200.0, 9_000, 33.7, 2 << 20),
            Preset::Dnes => disk(7_200.0, 8_500, 16.6, 2 << 20),
            Preset::Ddys => disk(10_000.0, 4_900, 34.04, 4 << 20),
            Preset::Raid5 => {
                Config { buffer: 128 << 20, array: Some(Array { disks: 8, chunk: 16 << 10 }), ..Preset::Ddys.config() }
            }
        }
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The preset names, for messages.
pub const PRESETS: &str = "o7n3200, as010a1, 91366u4, dnes, ddys, raid5";

impl FromStr for Preset {
    type Err = DiskError;

    fn from_str(s: &str) -> Result<Preset, DiskError> {
        Preset::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| DiskError::UnknownModel(s.to_owned()))
    }
}

/// A striped array's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Array {
    /// Disks, parity included.
    pub disks: usize,
    /// Bytes per chunk.
    pub chunk: u64,
}

/// Everything the model needs but the device's size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// One disk's mechanics (each member's, for an array).
    pub mechanics: Mechanics,
    /// The volatile write buffer (the controller's cache for an array), bytes; 0 for none.
    pub buffer: u64,
    /// The order the buffer drains in (a single disk's).
    pub queue: Queue,
    /// A RAID 5 array of such disks, or one disk.
    pub array: Option<Array>,
}

/// Parameters that replace a preset's.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Overrides {
    pub rpm: Option<f64>,
    /// The average seek; the track-to-track seek keeps its share of it.
    pub seek: Option<Duration>,
    /// Bytes per second.
    pub transfer: Option<f64>,
    /// Buffer bytes; 0 turns it off.
    pub buffer: Option<u64>,
    pub queue: Option<Queue>,
}

/// Random or sequential, read or write: the accesses the check measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    RandomRead,
    RandomWrite,
    SeqRead,
    SeqWrite,
}

impl Config {
    /// A single disk of the given mechanics, with the crate's command overhead and track seek,
    /// no buffer and a FIFO queue.
    pub fn explicit(rpm: f64, seek: Duration, transfer: f64) -> Config {
        Config {
            mechanics: Mechanics {
                rpm,
                avg_seek: seek,
                track_seek: seek.mul_f64(TRACK_SEEK_SHARE),
                transfer,
                overhead: OVERHEAD,
            },
            buffer: 0,
            queue: Queue::Fifo,
            array: None,
        }
    }

    /// This configuration with `o`'s parameters in place of its own.
    pub fn with(mut self, o: &Overrides) -> Config {
        if let Some(rpm) = o.rpm {
            self.mechanics.rpm = rpm;
        }
        if let Some(seek) = o.seek {
            self.mechanics.avg_seek = seek;
            self.mechanics.track_seek = seek.mul_f64(TRACK_SEEK_SHARE);
        }
        if let Some(t) = o.transfer {
            self.mechanics.transfer = t;
        }
        if let Some(b) = o.buffer {
            self.buffer = b;
        }
        if let Some(q) = o.queue {
            self.queue = q;
        }
        self
    }

    /// The model of a device of `bytes` bytes.
    pub fn model(&self, bytes: u64) -> Result<Model, DiskError> {
        self.mechanics.check().map_err(DiskError::Invalid)?;
        Ok(match self.array {
            None => Model::Disk(Disk::new(self.mechanics, bytes, self.buffer, self.queue)),
            Some(a) => {
                if self.queue != Queue::Fifo {
                    return Err(DiskError::Invalid(
                        "queue=elevator orders a single disk's buffer; the raid5 controller issues its writes as they \
                         come"
                            .into(),
                    ));
                }
                if a.disks < 3 || a.chunk == 0 {
                    return Err(DiskError::Invalid(format!("a RAID 5 array needs 3 or more disks and a chunk: {a:?}")));
                }
                Model::Raid5(Raid5::new(self.mechanics, a.disks, a.chunk, bytes, self.buffer))
            }
        })
    }

    /// Seed 000's Tdisk for `access` of `bytes` at depth 1 in the steady state: for random I/O
    /// the command overhead, average seek, half a revolution and the transfer; for sequential
    /// I/O the transfer alone. A buffered single disk's writes cost the same once the buffer is
    /// full (each waits for one to drain). An array's reads go to one member (sequential ones
    /// skip the member's parity chunk once in `disks` stripes, hence `disks/(disks−1)` of the
    /// transfer, for requests within a chunk); its writes cost the overhead while its cache has
    /// room.
    pub fn expected(&self, access: Access, bytes: u64) -> Duration {
        let m = &self.mechanics;
        match (self.array, access) {
            (_, Access::RandomRead) => m.random_access(bytes),
            (None, Access::RandomWrite) => m.random_access(bytes),
            (None, Access::SeqRead | Access::SeqWrite) => m.transfer_time(bytes),
            (Some(a), Access::SeqRead) => m.transfer_time(bytes).mul_f64(a.disks as f64 / (a.disks - 1) as f64),
            (Some(_), Access::RandomWrite | Access::SeqWrite) if self.buffer > 0 => m.overhead,
            (Some(_), Access::RandomWrite | Access::SeqWrite) => {
                // Two reads in parallel, then the two writes a revolution later.
                m.random_access(bytes) + m.revolution()
            }
        }
    }
}

/// Why a disk model could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DiskError {
    /// A model name that is not a preset.
    #[error("unknown disk model {0:?} (known: {PRESETS})")]
    UnknownModel(String),
    /// Parameters that describe no disk.
    #[error("bad disk parameters: {0}")]
    Invalid(String),
}

/// A block device that completes each request when the disk model says, with the data kept by
/// the inner device.
///
/// Each request's completion time is taken from the model under a lock, so the model sees
/// requests in the order they arrive; then the inner I/O is done, then the request sleeps until
/// its completion time. Everything else (geometry, discard, claims, the device's name) is the
/// inner device's. Its ordered queue and group sink are not offered: through them writes would
/// reach the medium without the model's timing.
pub struct DiskDev {
    inner: Arc<dyn BlockDev>,
    model: Mutex<Model>,
    origin: Instant,
    block: u64,
}

impl DiskDev {
    /// `inner` timed by `config`'s model over its whole size.
    pub fn new(inner: Arc<dyn BlockDev>, config: &Config) -> Result<DiskDev, DiskError> {
        let g = inner.geometry();
        let model = config.model(g.bytes())?;
        Ok(DiskDev { inner, model: Mutex::new(model), origin: Instant::now(), block: u64::from(g.block_size) })
    }

    fn model(&self) -> MutexGuard<'_, Model> {
        self.model.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The model's time now.
    fn now(&self) -> Duration {
        Instant::now().saturating_duration_since(self.origin)
    }

    /// Asks the model, under its lock, when a request arriving now completes.
    fn schedule(&self, f: impl FnOnce(&mut Model, Duration) -> Duration) -> Instant {
        let mut m = self.model();
        let now = self.now();
        self.origin + f(&mut m, now)
    }
}

/// Waits until `deadline`. Tokio's timer ticks in whole milliseconds and wakes up to a tick or
/// so late, which would turn a 0.27 ms sequential transfer into a millisecond and add half a
/// millisecond to every random access; so it sleeps to two ticks before the deadline and yields
/// for the rest, measured on the real clock (under a paused tokio clock that rest is at most two
/// milliseconds of real time and still ends). The price is a core kept busy for up to 2 ms a
/// request: this device is for measuring, not for serving many LUNs.
async fn wait_until(deadline: Instant) {
    let margin = Duration::from_millis(2);
    if deadline > Instant::now() + margin {
        tokio::time::sleep_until(deadline - margin).await;
    }
    let rest = deadline.saturating_duration_since(Instant::now());
    let end = std::time::Instant::now() + rest;
    while std::time::Instant::now() < end {
        tokio::task::yield_now().await;
    }
}

#[async_trait]
impl BlockDev for DiskDev {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    fn volatile_cache(&self) -> bool {
        self.model().volatile()
    }

    fn device_id(&self) -> Option<String> {
        self.inner.device_id()
    }

    fn read_only(&self) -> bool {
        self.inner.read_only()
    }

    fn supports_discard(&self) -> bool {
        self.inner.supports_discard()
    }

    async fn claim(&self, key: u64) -> Result<Claim, BlockError> {
        self.inner.claim(key).await
    }

    fn resets(&self) -> u64 {
        self.inner.resets()
    }

    async fn read(&self, lba: u64, blocks: u32) -> Result<Bytes, BlockError> {
        self.geometry().check_range(lba, u64::from(blocks))?;
        let done = self.schedule(|m, now| m.read(now, lba * self.block, u64::from(blocks) * self.block));
        let r = self.inner.read(lba, blocks).await;
        wait_until(done).await;
        r
    }

    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> Result<(), BlockError> {
        let blocks = blocks_in(&data, self.geometry().block_size)?;
        self.geometry().check_range(lba, blocks)?;
        let done = self.schedule(|m, now| m.write(now, lba * self.block, blocks * self.block, fua));
        let r = self.inner.write(lba, data, fua).await;
        wait_until(done).await;
        r
    }

    async fn flush(&self) -> Result<(), BlockError> {
        let done = self.schedule(Model::flush);
        let r = self.inner.flush().await;
        wait_until(done).await;
        r
    }

    async fn compare_and_write(
        &self,
        lba: u64,
        compare: Bytes,
        write: Bytes,
        fua: bool,
    ) -> Result<Option<u64>, BlockError> {
        let len = compare.len() as u64;
        let arrived = self.now();
        let r = self.inner.compare_and_write(lba, compare, write, fua).await;
        // Without a step of its own the caller compares and writes through `read` and `write`,
        // which time themselves.
        if matches!(r, Err(BlockError::Unsupported(_))) {
            return r;
        }
        let done = self.schedule(|m, _| {
            let read = m.read(arrived, lba * self.block, len);
            m.write(read, lba * self.block, len, fua)
        });
        wait_until(done).await;
        r
    }

    /// Zeroing is timed as writing the zeros.
    async fn write_zeros(&self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        self.geometry().check_range(lba, blocks)?;
        let done = self.schedule(|m, now| m.write(now, lba * self.block, blocks * self.block, false));
        let r = self.inner.write_zeros(lba, blocks).await;
        wait_until(done).await;
        r
    }

    /// Discard only changes the inner device's map: the model does not time it.
    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        self.inner.discard(lba, blocks).await
    }

    async fn provisioning(&self, lba: u64) -> Result<(Provisioning, u64), BlockError> {
        self.inner.provisioning(lba).await
    }
}

#[cfg(test)]
mod tests;

//! The cache's one configuration: how writes are acknowledged, what RAM, log and index it may use,
//! how destage and its retries run, and the read cache; checked against the log it runs on.

use std::time::Duration;

use crate::format::LOG_BLOCK;
use crate::readcache::Policy;

/// When a host write is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Once the remote has it: no write caching (plain iSCSI, the baseline). The write still
    /// goes through the core, so that the index and the read cache see it; while the log holds
    /// dirty data from an earlier run it goes through the log and waits for destage.
    WriteThrough,
    /// Once it is on stable local storage (seed 004's "report after complete"; WCE=0).
    #[default]
    Log,
    /// Once it is in RAM (seed 004's "immediate report"; WCE=1): FUA writes and flushes wait
    /// for stable local storage.
    Immediate,
}

impl Mode {
    /// The name `--mode` takes.
    pub fn name(self) -> &'static str {
        match self {
            Mode::WriteThrough => "write-through",
            Mode::Log => "log",
            Mode::Immediate => "immediate",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "write-through" => Ok(Mode::WriteThrough),
            "log" => Ok(Mode::Log),
            "immediate" => Ok(Mode::Immediate),
            _ => Err(format!("unknown mode {s:?}: use write-through, log or immediate")),
        }
    }
}

/// How many epochs past the durable checkpoint destage may have on an ordered remote at once.
/// Single-write epochs (a `log`-mode host at depth one, or the host at steady state) need many
/// in flight to keep a long path busy.
pub const PIPELINE_EPOCHS: usize = 128;

/// How many bytes of blocks those epochs may hold (beyond two, which may hold any): recovery
/// reads this much back from the remote.
pub const PIPELINE_BYTES: u64 = 16 << 20;

/// What one run of blocks costs in the dirty index, counted against [`Config::index_bytes`]: a
/// B-tree entry of the newest version and one of its epoch's, with their keys and values.
pub const EXTENT_COST: u64 = 160;

/// How a cache runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Acknowledgement rule.
    pub mode: Mode,
    /// Bytes of host writes held in RAM while they wait for the log.
    pub ram_bytes: u64,
    /// Largest log record (header and data).
    pub max_record_bytes: u64,
    /// Largest single remote write destage issues.
    pub destage_io_bytes: u64,
    /// Remote writes destage keeps in flight.
    pub destage_inflight: usize,
    /// Pipeline epochs when the remote keeps command order around barriers: destage then
    /// queues an epoch's writes, its flush and the next epoch's writes at once, instead of
    /// waiting a round trip for each.
    pub ordered_destage: bool,
    /// Most epochs past the durable checkpoint destage may have sent; recovery reads back what
    /// the remote holds of that many. It must not shrink between runs on one log.
    pub pipeline_epochs: usize,
    /// Most bytes of blocks in those epochs, beyond the first two.
    pub pipeline_bytes: u64,
    /// An epoch ends after this many host writes, so that no epoch outgrows the log (destage
    /// frees space one whole epoch at a time) and destage never waits long for one to end.
    pub epoch_max_writes: u64,
    /// An epoch ends after this many bytes of host writes.
    pub epoch_max_bytes: u64,
    /// Log fill (0–1) above which host writes are slowed, in proportion to how far beyond.
    pub throttle_from: f64,
    /// Log fill (0–1) from which destage keeps its whole pipeline in flight; below it, two
    /// epochs: while the log has room, destage is background work and leaves the machine to
    /// the host. While host reads go to the remote, destage sends one write at a time below it,
    /// and nothing below half of it. The dirty index's fill of `index_bytes` counts as the
    /// log's.
    pub deep_destage_from: f64,
    /// First pause after a failure the remote or the log may get over by itself (a lost
    /// connection, a busy device); it doubles with each failure in a row up to `retry_max`.
    pub retry_delay: Duration,
    /// Longest pause between retries, and the pause between retries of a lasting failure (a
    /// medium error, a full thin remote), which are kept up only to notice a repair.
    pub retry_max: Duration,
    /// How long the remote may leave every command destage (or write-through) has sent it
    /// unanswered before the cache counts it unreachable (degraded): a lost connection the
    /// initiator is still trying to restore fails nothing for a while.
    pub answer_timeout: Duration,
    /// How long host writes wait for room once the log (or RAM, or the index) is full while the
    /// remote or the log keeps failing; after that they end with a CHECK CONDITION naming the
    /// cause instead of hanging (multipath's no_path_retry). Nothing already acknowledged is
    /// dropped.
    pub full_timeout: Duration,
    /// Memory the dirty index may take, at [`EXTENT_COST`] per run of blocks; when it is full,
    /// host writes wait for destage as they do for a full log.
    pub index_bytes: u64,
    /// Bytes of clean blocks kept in RAM for reads.
    pub read_cache_bytes: u64,
    /// How the read cache evicts.
    pub read_cache_policy: Policy,
    /// Largest read-ahead window for sequential readers (0: none); it doubles while reads stay
    /// sequential.
    pub read_ahead_bytes: u64,
    /// Oldest a write the remote does not hold yet may get (`None`: no bound but the log's
    /// size). Host writes wait (as for a full log) while the oldest is older, or the data the
    /// remote lacks would take more than half of it to destage (on an SG: to ship) at the rate
    /// measured; groups to an SG are kept small enough to ship in a quarter of it.
    pub max_lag: Option<Duration>,
    /// zstd level groups are compressed at (1 is fast and, on a WAN, as good as higher levels
    /// on the bytes that matter; see `stics bench packets`).
    pub group_level: i32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mode: Mode::Log,
            ram_bytes: 64 << 20,
            max_record_bytes: 4 << 20,
            destage_io_bytes: 1 << 20,
            // A long path needs many writes in flight: at 16 ms round trip, 64 4 KiB writes
            // are 16 MB/s.
            destage_inflight: 64,
            ordered_destage: true,
            pipeline_epochs: PIPELINE_EPOCHS,
            pipeline_bytes: PIPELINE_BYTES,
            epoch_max_writes: 4096,
            epoch_max_bytes: 64 << 20,
            throttle_from: 0.75,
            deep_destage_from: 0.25,
            retry_delay: Duration::from_millis(200),
            retry_max: Duration::from_secs(5),
            answer_timeout: Duration::from_secs(5),
            full_timeout: Duration::from_secs(60),
            index_bytes: 64 << 20,
            read_cache_bytes: 256 << 20,
            read_cache_policy: Policy::default(),
            read_ahead_bytes: 1 << 20,
            max_lag: None,
            group_level: 1,
        }
    }
}

/// What the devices under a cache are: the remote's geometry, where the log's ring lies and
/// whether the remote keeps order around barriers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Remote (and slot) block size.
    pub block_size: u32,
    /// Remote capacity in blocks.
    pub num_blocks: u64,
    /// Where the log's ring of records starts (a device byte offset).
    pub ring_start: u64,
    /// Where it ends.
    pub ring_end: u64,
    /// Destage pipelines epochs on an ordered queue (see [`Config::ordered_destage`]).
    pub ordered_remote: bool,
    /// The remote is a stics SG that takes groups of epochs up to this many encoded bytes
    /// ([`stics_block::GroupSink`]): destage ships groups.
    pub max_group: Option<u32>,
    /// Groups that may be out at once ([`stics_block::GroupSink::groups_in_flight`]).
    pub groups_in_flight: u32,
}

/// A configuration the cache cannot run with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The log's ring cannot hold two epochs and a record.
    #[error("the log holds {ring} bytes of records but needs at least {need} for these RAM and epoch limits")]
    LogTooSmall { ring: u64, need: u64 },
    /// A limit of zero.
    #[error(
        "epoch limits, destage concurrency and the index budget must be at least 1, the pipeline at least 2 epochs"
    )]
    Zero,
}

impl Config {
    /// The most log bytes one epoch can take: each write may sit alone in a record (a header
    /// block and its data rounded up to a log block), plus the write that crosses the limits.
    pub fn epoch_log_bound(&self) -> u64 {
        let largest_write = self.ram_bytes.max(self.max_record_bytes);
        (self.epoch_max_writes + 1) * 2 * LOG_BLOCK + self.epoch_max_bytes + largest_write
    }

    /// Checks that the log can always make progress: it holds the epoch being destaged, the
    /// one being written and a record lost to the ring's wrap.
    pub fn validate(&self, layout: &Layout) -> Result<(), ConfigError> {
        let ring = layout.ring_end.saturating_sub(layout.ring_start);
        let need = 2 * self.epoch_log_bound() + self.max_record_bytes;
        if ring < need {
            return Err(ConfigError::LogTooSmall { ring, need });
        }
        if self.epoch_max_writes == 0
            || self.epoch_max_bytes == 0
            || self.destage_inflight == 0
            || self.pipeline_epochs < 2
            || self.index_bytes < EXTENT_COST
        {
            return Err(ConfigError::Zero);
        }
        Ok(())
    }

    /// Runs of blocks the dirty index may hold.
    pub fn max_extents(&self) -> u64 {
        (self.index_bytes / EXTENT_COST).max(1)
    }
}

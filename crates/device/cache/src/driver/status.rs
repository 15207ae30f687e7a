//! What an operator scrapes: the cache's counters and health as one serialisable snapshot, and
//! the driver's own measurements (bytes, service times, destage rate and lag).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::core::{Core, State};

/// The health in force, as `/status` shows it.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct HealthStatus {
    /// healthy, degraded (failures that may go away by themselves, retried with backoff) or
    /// stalled (a lasting failure: reported, retried only to notice a repair).
    pub state: State,
    /// What failed: unreachable, busy, medium, no_space, write_protected, reserved or log.
    pub kind: Option<&'static str>,
    /// The error's text.
    pub error: Option<String>,
    /// The remote block it concerned, when one did.
    pub lba: Option<u64>,
    /// How long the failure has lasted, seconds (0 when healthy).
    pub since_secs: f64,
}

/// Counters an operator scrapes (see [`crate::Cache::status`]).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Status {
    /// Acknowledgement mode.
    pub mode: String,
    /// The remote's and the log's health.
    pub health: HealthStatus,
    /// Failures so far, by kind.
    pub errors_by_kind: BTreeMap<&'static str, u64>,
    /// Blocks held dirty (not yet on the remote).
    pub dirty_blocks: u64,
    /// Bytes held dirty.
    pub dirty_bytes: u64,
    /// Runs of blocks in the dirty index (its memory is about 160 bytes a run).
    pub index_extents: u64,
    /// Fraction of the log in use.
    pub log_fill: f64,
    /// Bytes of the log's ring.
    pub log_bytes: u64,
    /// Host write bytes in RAM waiting for the log.
    pub ram_bytes: u64,
    /// The open epoch.
    pub epoch: u64,
    /// The newest epoch fully on the remote.
    pub destaged_epoch: u64,
    /// Host write blocks absorbed by later writes before reaching the remote.
    pub blocks_absorbed: u64,
    /// Blocks destaged to the remote.
    pub blocks_destaged: u64,
    /// Epochs sent to the remote again whole after a failure or a reset of the remote.
    pub epochs_resent: u64,
    /// Log records written.
    pub records: u64,
    /// Host reads (blocks) served from RAM, the log or the read cache.
    pub read_blocks_cache: u64,
    /// Host reads (blocks) that went to the remote.
    pub read_blocks_remote: u64,
    /// Read cache lookups that found their block.
    pub read_cache_hits: u64,
    /// Read cache lookups that did not.
    pub read_cache_misses: u64,
    /// Remote destage writes, flushes or read-backs that failed and were retried.
    pub destage_retries: u64,
    /// Host writes slowed or held because the log, RAM or the index was filling.
    pub throttled_writes: u64,
    /// Host writes that ended with an error because the log was full and the remote (or the
    /// log) had failed for longer than the full timeout.
    pub refused_writes: u64,
    /// Bytes the host wrote (zeroing and discards not counted).
    pub host_write_bytes: u64,
    /// Bytes written to the remote (destage, or the host's writes in `write-through` mode).
    pub remote_write_bytes: u64,
    /// Destage throughput over the last few seconds, bytes per second.
    pub destage_bytes_per_sec: f64,
    /// Age of the oldest write not yet on the remote, seconds (0 when clean).
    pub destage_lag_secs: f64,
    /// Moving average of a remote write's service time, seconds (one round trip plus the
    /// remote's work and transfer).
    pub remote_write_secs: f64,
    /// Moving average of a remote SYNCHRONIZE CACHE's service time, seconds: the remote's round
    /// trip when its media is fast.
    pub remote_sync_secs: f64,
    /// Destage to a stics SG, when the remote is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub groups: Option<GroupStatus>,
}

/// Groups of epochs shipped to a stics SG.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct GroupStatus {
    /// Groups the SG took, and the epochs they held.
    pub groups: u64,
    pub epochs: u64,
    /// Bytes of the epochs' data before merging, after merging (last write wins per block)
    /// and as shipped (compressed, with the group's tables).
    pub bytes_before_merge: u64,
    pub bytes_merged: u64,
    pub bytes_shipped: u64,
    /// Groups sent again after a failure.
    pub resent: u64,
    /// Groups sent while the one before was still out.
    pub overlapped: u64,
    /// Epochs too large for a group, sent as plain writes.
    pub plain_epochs: u64,
    /// Shipping rate measured, bytes per second.
    pub ship_bytes_per_sec: f64,
}

/// Weight of the newest sample in the service-time moving averages.
const EWMA: f64 = 0.2;
/// Shortest interval over which the destage rate is measured.
const RATE_WINDOW: Duration = Duration::from_secs(2);

/// The driver's own counters.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) read_blocks_cache: u64,
    pub(crate) read_blocks_remote: u64,
    pub(crate) destage_retries: u64,
    pub(crate) throttled_writes: u64,
    pub(crate) refused_writes: u64,
    pub(crate) host_write_bytes: u64,
    pub(crate) remote_write_bytes: u64,
    pub(crate) remote_write_secs: f64,
    pub(crate) remote_sync_secs: f64,
    /// The last rate sample: when, and bytes written to the remote by then.
    rate_sample: Option<(Instant, u64)>,
    rate: f64,
}

impl Counters {
    /// A host write of `bytes` went into the cache.
    pub(crate) fn host_write(&mut self, bytes: u64) {
        self.host_write_bytes += bytes;
    }

    pub(crate) fn remote_write(&mut self, bytes: u64, took: Duration) {
        self.remote_write_bytes += bytes;
        self.remote_write_secs = ewma(self.remote_write_secs, took);
    }

    pub(crate) fn remote_sync(&mut self, took: Duration) {
        self.remote_sync_secs = ewma(self.remote_sync_secs, took);
    }

    /// The snapshot of the core `c` and these counters at `now`.
    pub(crate) fn status(&mut self, c: &Core, now: Instant) -> Status {
        let s = c.stats();
        let (epoch, destaged_epoch) = c.epochs();
        let (bs, ring) = (c.layout().block_size, c.layout().ring_end - c.layout().ring_start);
        let lag = c.lag(now).as_secs_f64();
        let g = c.group_stats();
        match self.rate_sample {
            Some((at, bytes)) if now.saturating_duration_since(at) >= RATE_WINDOW => {
                self.rate = (self.remote_write_bytes - bytes) as f64 / now.saturating_duration_since(at).as_secs_f64();
                self.rate_sample = Some((now, self.remote_write_bytes));
            }
            Some(_) => {}
            None => self.rate_sample = Some((now, self.remote_write_bytes)),
        }
        let h = c.health();
        let health = match h.failure() {
            None => HealthStatus::default(),
            Some(f) => HealthStatus {
                state: h.state(),
                kind: Some(f.kind.name()),
                error: Some(f.error.clone()),
                lba: f.lba,
                since_secs: now.saturating_duration_since(f.since).as_secs_f64(),
            },
        };
        let (hits, misses) = c.read_cache_hits();
        Status {
            mode: c.mode().name().to_owned(),
            health,
            errors_by_kind: h.counts().iter().map(|(k, n)| (k.name(), *n)).collect(),
            dirty_blocks: c.dirty_blocks(),
            dirty_bytes: c.dirty_blocks() * u64::from(bs),
            index_extents: c.index_extents(),
            log_fill: c.log_fill(),
            log_bytes: ring,
            ram_bytes: c.ram_used(),
            epoch,
            destaged_epoch,
            blocks_absorbed: s.blocks_absorbed,
            blocks_destaged: s.blocks_destaged,
            epochs_resent: s.epochs_resent,
            records: s.records,
            read_blocks_cache: self.read_blocks_cache,
            read_blocks_remote: self.read_blocks_remote,
            read_cache_hits: hits,
            read_cache_misses: misses,
            destage_retries: self.destage_retries,
            throttled_writes: self.throttled_writes,
            refused_writes: self.refused_writes,
            host_write_bytes: self.host_write_bytes,
            remote_write_bytes: self.remote_write_bytes,
            destage_bytes_per_sec: self.rate,
            destage_lag_secs: lag,
            remote_write_secs: self.remote_write_secs,
            remote_sync_secs: self.remote_sync_secs,
            groups: c.layout().max_group.is_some().then_some(GroupStatus {
                groups: g.groups,
                epochs: g.group_epochs,
                bytes_before_merge: g.bytes_before_merge,
                bytes_merged: g.bytes_merged,
                bytes_shipped: g.bytes_shipped,
                resent: g.groups_resent,
                overlapped: g.groups_overlapped,
                plain_epochs: g.plain_epochs,
                ship_bytes_per_sec: g.rate,
            }),
        }
    }
}

fn ewma(avg: f64, sample: Duration) -> f64 {
    if avg == 0.0 {
        sample.as_secs_f64()
    } else {
        avg * (1.0 - EWMA) + sample.as_secs_f64() * EWMA
    }
}

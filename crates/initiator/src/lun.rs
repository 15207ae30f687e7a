//! A remote LUN as a [`BlockDev`]: READ(16)/WRITE(16)/SYNCHRONIZE CACHE over one or several
//! sessions (commands spread round-robin), with retries of unit attentions and busy statuses.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use stics_block::{blocks_in, write_zeros_by_writes, BlockDev, BlockError, Geometry};

use crate::core::{Data, Request};
use crate::counters::{Counters, Snapshot};
use stics_sam::op::{mode_page, vpd};
use stics_sam::sense::key as sense_key;
use stics_sam::{cdb, data, status};

use crate::scsi::ScsiOutcome;
use crate::session::{random_isid, Config, Session};
use crate::url::IscsiUrl;
use crate::Error;

/// How to open a LUN.
#[derive(Debug, Clone)]
pub struct LunOptions {
    pub config: Config,
    /// Sessions to open to the same target; commands are spread over them.
    pub sessions: usize,
    /// Largest transfer per command, in bytes; bigger requests are split.
    pub max_transfer: u32,
}

impl Default for LunOptions {
    fn default() -> Self {
        LunOptions { config: Config::default(), sessions: 1, max_transfer: 1 << 20 }
    }
}

/// How many times a command is sent again after a transient SCSI status.
const MAX_RETRIES: u32 = 20;

/// Runs `req` on `s`, sending it again on unit attention, busy, task set full, not-ready and
/// aborted-command statuses, which a reconnection or target restart commonly produces.
pub async fn execute_retrying(s: &Session, req: Request, counters: &Counters) -> Result<ScsiOutcome, Error> {
    let mut attempt = 0u32;
    loop {
        let out = s.execute(req.clone()).await?;
        let transient = match out.status {
            status::GOOD => return Ok(out),
            status::BUSY | status::TASK_SET_FULL | status::TASK_ABORTED => true,
            status::CHECK_CONDITION => {
                matches!(
                    out.sense().map(|x| x.key),
                    Some(sense_key::UNIT_ATTENTION | sense_key::NOT_READY | sense_key::ABORTED_COMMAND)
                )
            }
            _ => false,
        };
        if !transient || attempt >= MAX_RETRIES {
            return Err(Error::scsi(req.cdb[0], &out));
        }
        attempt += 1;
        Counters::add(&counters.retries, 1);
        if out.status != status::CHECK_CONDITION || out.sense().is_some_and(|x| x.key == sense_key::NOT_READY) {
            tokio::time::sleep(Duration::from_millis(u64::from(attempt.min(10)) * 5)).await;
        }
    }
}

/// A remote logical unit.
#[derive(Debug)]
#[expect(clippy::struct_field_names, reason = "`lun` is the LUN number, the spec's name")]
pub struct Lun {
    sessions: Vec<Session>,
    next: AtomicUsize,
    lun: u64,
    geometry: Geometry,
    wce: bool,
    /// The LUN's name from its Device Identification page.
    device_id: Option<String>,
    max_blocks: u32,
    /// Writes completed so far; a flush covers every write counted before it started.
    write_gen: AtomicU64,
    /// `write_gen` as sampled at the start of the last flush that succeeded.
    flushed_gen: AtomicU64,
    /// Flushes answered without a command because no write completed since the last one.
    flushes_skipped: AtomicU64,
    /// Most blocks one WRITE SAME may cover, as the Block Limits VPD page says; 0 when the
    /// target does not say, and zeroing then falls back to ordinary writes.
    write_same_max: u64,
    /// Cleared when the target refuses WRITE SAME after all.
    write_same_ok: AtomicBool,
    /// UNMAP limits when the LUN is thin-provisioned, accepts UNMAP and reads unmapped blocks as
    /// zeros (what `discard` promises); `None` otherwise.
    unmap: Option<UnmapLimits>,
}

/// How much one UNMAP may carry.
#[derive(Debug, Clone, Copy)]
struct UnmapLimits {
    blocks_per_descriptor: u32,
    descriptors: usize,
}

impl Lun {
    /// Logs in (as many sessions as asked), checks that the LUN is a disk and reads its geometry
    /// and write-cache setting.
    pub async fn open(url: &IscsiUrl, opts: &LunOptions) -> Result<Lun, Error> {
        let (_, lun) = url.require_lun()?;
        let first = Session::connect(url, &opts.config, random_isid(0)).await?;
        let c = first.counters_ref().clone();
        let inq = execute_retrying(&first, Request { lun, cdb: cdb::inquiry(96), data: Data::Read(96) }, &c).await?;
        let inq = data::parse_inquiry(&inq.data).ok_or_else(|| Error::Protocol("short INQUIRY data".into()))?;
        if inq.qualifier != 0 || inq.device_type != data::DIRECT_ACCESS {
            return Err(Error::NotADisk { lun, device_type: data::device_type_name(inq.device_type) });
        }
        let cap = read_capacity(&first, lun, &c).await?;
        let ms = execute_retrying(
            &first,
            Request { lun, cdb: cdb::mode_sense6(mode_page::CACHING, 64), data: Data::Read(64) },
            &c,
        )
        .await;
        // Assume a volatile cache when the target does not say: flushes are then never skipped.
        let wce = ms.ok().and_then(|o| data::parse_wce(&o.data)).unwrap_or(true);
        let vpd =
            |page| execute_retrying(&first, Request { lun, cdb: cdb::inquiry_vpd(page, 64), data: Data::Read(64) }, &c);
        let limits =
            vpd(vpd::BLOCK_LIMITS).await.ok().and_then(|o| data::parse_block_limits(&o.data)).unwrap_or_default();
        // A zero count means the target does not implement UNMAP.
        let unmap = if cap.thin
            && cap.unmapped_read_zero
            && limits.max_unmap_blocks > 0
            && limits.max_unmap_descriptors > 0
            && vpd(vpd::LOGICAL_BLOCK_PROVISIONING).await.ok().and_then(|o| data::parse_unmap_supported(&o.data))
                == Some(true)
        {
            Some(UnmapLimits {
                blocks_per_descriptor: limits.max_unmap_blocks,
                // The parameter list length is 16 bits; a few hundred ranges per command is plenty.
                descriptors: limits.max_unmap_descriptors.min(256) as usize,
            })
        } else {
            None
        };
        let id_page = Request { lun, cdb: cdb::inquiry_vpd(vpd::DEVICE_IDENTIFICATION, 1024), data: Data::Read(1024) };
        let device_id =
            execute_retrying(&first, id_page, &c).await.ok().and_then(|o| data::parse_device_identification(&o.data));
        let mut sessions = vec![first];
        for i in 1..opts.sessions.max(1) {
            sessions.push(Session::connect(url, &opts.config, random_isid(i as u16)).await?);
        }
        let max_blocks = (opts.max_transfer / cap.block_size).max(1);
        Ok(Lun {
            sessions,
            next: AtomicUsize::new(0),
            lun,
            geometry: Geometry { block_size: cap.block_size, num_blocks: cap.num_blocks },
            wce,
            max_blocks,
            write_gen: AtomicU64::new(0),
            flushed_gen: AtomicU64::new(0),
            flushes_skipped: AtomicU64::new(0),
            write_same_max: limits.max_write_same.min(u64::from(u32::MAX)),
            write_same_ok: AtomicBool::new(true),
            unmap,
            device_id,
        })
    }

    fn pick(&self) -> &Session {
        let i = self.next.fetch_add(1, Relaxed) % self.sessions.len();
        &self.sessions[i]
    }

    /// Runs a command on the next session, with retries of transient statuses.
    pub async fn execute(&self, cdb: [u8; 16], data: Data) -> Result<ScsiOutcome, Error> {
        let s = self.pick();
        execute_retrying(s, Request { lun: self.lun, cdb, data }, s.counters_ref()).await
    }

    /// Counters summed over all sessions.
    pub fn counters(&self) -> Snapshot {
        self.sessions.iter().map(super::session::Session::counters).fold(Snapshot::default(), |a, b| a + b)
    }

    /// Flushes that needed no SYNCHRONIZE CACHE (nothing written since the previous flush).
    pub fn flushes_skipped(&self) -> u64 {
        self.flushes_skipped.load(Relaxed)
    }

    /// The sessions behind this LUN.
    pub fn sessions(&self) -> &[Session] {
        &self.sessions
    }

    /// Logs out of every session.
    pub async fn close(&self) {
        for s in &self.sessions {
            s.logout().await;
        }
    }

    fn io_err(lba: u64, e: Error) -> BlockError {
        match e {
            Error::Task(crate::core::TaskError::Unreachable(m)) => BlockError::Unreachable(m),
            other => BlockError::Io { lba, source: std::io::Error::other(other.to_string()) },
        }
    }
}

/// READ CAPACITY(16), or (10) when the target does not know (16).
pub async fn read_capacity(s: &Session, lun: u64, c: &Counters) -> Result<data::Capacity, Error> {
    let r16 = execute_retrying(s, Request { lun, cdb: cdb::read_capacity16(32), data: Data::Read(32) }, c).await;
    if let Some(cap) = r16.as_ref().ok().and_then(|o| data::parse_capacity16(&o.data)) {
        return Ok(cap);
    }
    let r10 = execute_retrying(s, Request { lun, cdb: cdb::read_capacity10(), data: Data::Read(8) }, c).await?;
    data::parse_capacity10(&r10.data).ok_or_else(|| Error::Protocol("short READ CAPACITY data".into()))
}

#[async_trait]
impl BlockDev for Lun {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn volatile_cache(&self) -> bool {
        self.wce
    }

    fn device_id(&self) -> Option<String> {
        self.device_id.clone()
    }

    async fn read(&self, lba: u64, blocks: u32) -> Result<Bytes, BlockError> {
        self.geometry.check_range(lba, u64::from(blocks))?;
        if blocks == 0 {
            return Ok(Bytes::new());
        }
        let bs = self.geometry.block_size;
        let mut out = BytesMut::new();
        let mut done = 0u32;
        while done < blocks {
            let n = (blocks - done).min(self.max_blocks);
            let at = lba + u64::from(done);
            let len = n * bs;
            let o = self.execute(cdb::read16(at, n), Data::Read(len)).await.map_err(|e| Self::io_err(at, e))?;
            if o.data.len() != len as usize {
                return Err(Self::io_err(at, Error::Protocol(format!("short read: {} of {len} bytes", o.data.len()))));
            }
            if n == blocks {
                // One command covered it all: hand its buffer over without copying.
                return Ok(o.data);
            }
            out.reserve((blocks * bs) as usize);
            out.extend_from_slice(&o.data);
            done += n;
        }
        Ok(out.freeze())
    }

    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> Result<(), BlockError> {
        let bs = self.geometry.block_size;
        let blocks = blocks_in(&data, bs)?;
        self.geometry.check_range(lba, blocks)?;
        let mut done = 0u64;
        while done < blocks {
            let n = (blocks - done).min(u64::from(self.max_blocks)) as u32;
            let at = lba + done;
            let off = (done * u64::from(bs)) as usize;
            let chunk = data.slice(off..off + (n * bs) as usize);
            self.execute(cdb::write16(at, n, fua), Data::Write(chunk)).await.map_err(|e| Self::io_err(at, e))?;
            done += u64::from(n);
        }
        self.write_gen.fetch_add(1, SeqCst);
        Ok(())
    }

    fn supports_discard(&self) -> bool {
        self.unmap.is_some()
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        self.geometry.check_range(lba, blocks)?;
        let Some(lim) = self.unmap else {
            return Err(BlockError::Unsupported("discard: the target does not unmap blocks to zeros"));
        };
        let mut ranges = Vec::new();
        let (mut at, end) = (lba, lba + blocks);
        while at < end {
            let n = (end - at).min(u64::from(lim.blocks_per_descriptor)) as u32;
            ranges.push((at, n));
            at += u64::from(n);
        }
        for group in ranges.chunks(lim.descriptors) {
            let params = Bytes::from(data::unmap_parameters(group));
            self.execute(cdb::unmap(group.len()), Data::Write(params))
                .await
                .map_err(|e| Self::io_err(group[0].0, e))?;
        }
        self.write_gen.fetch_add(1, SeqCst);
        Ok(())
    }

    async fn write_zeros(&self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        self.geometry.check_range(lba, blocks)?;
        // One WRITE SAME carries a single block however large the range: over a long path that
        // is one round trip instead of one per megabyte.
        let zero = Bytes::from(vec![0u8; self.geometry.block_size as usize]);
        let (mut at, end) = (lba, lba + blocks);
        while at < end && self.write_same_max > 0 && self.write_same_ok.load(Relaxed) {
            let n = (end - at).min(self.write_same_max) as u32;
            match self.execute(cdb::write_same16(at, n), Data::Write(zero.clone())).await {
                Ok(_) => at += u64::from(n),
                Err(Error::Scsi { sense: Some(s), .. }) if s.key == sense_key::ILLEGAL_REQUEST => {
                    tracing::info!(lun = self.lun, "target refuses WRITE SAME; zeroing with writes");
                    self.write_same_ok.store(false, Relaxed);
                }
                Err(e) => return Err(Self::io_err(at, e)),
            }
        }
        if at < end {
            write_zeros_by_writes(self, at, end - at).await?;
        } else {
            self.write_gen.fetch_add(1, SeqCst);
        }
        Ok(())
    }

    async fn flush(&self) -> Result<(), BlockError> {
        // A flush only has to cover writes that completed before it; when none completed since
        // the last successful flush started, that flush covered them all already. File systems
        // mounted with -o sync ask for many such back-to-back flushes.
        let gen = self.write_gen.load(SeqCst);
        if !self.wce || gen == self.flushed_gen.load(SeqCst) {
            self.flushes_skipped.fetch_add(1, Relaxed);
            return Ok(());
        }
        // Every session's writes must be durable: SYNCHRONIZE CACHE on each.
        for s in &self.sessions {
            execute_retrying(
                s,
                Request { lun: self.lun, cdb: cdb::synchronize_cache10(), data: Data::None },
                s.counters_ref(),
            )
            .await
            .map_err(|e| Self::io_err(0, e))?;
        }
        self.flushed_gen.fetch_max(gen, SeqCst);
        Ok(())
    }
}

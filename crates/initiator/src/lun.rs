//! A remote LUN as a [`BlockDev`]: READ(16)/WRITE(16)/SYNCHRONIZE CACHE over one or several
//! sessions (commands spread round-robin, reads on a session of their own when asked), with
//! retries of unit attentions and busy statuses, and the one-writer claim as a persistent
//! reservation (see [`Lun`]'s `claim`).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use stics_block::{
    blocks_in, write_zeros_by_writes, BlockDev, BlockError, Claim, Geometry, GroupSink, OrderedQueue, Queued,
};

use crate::core::{Data, Request};
use crate::counters::{Counters, Snapshot};
use crate::link::LinkInfo;
use stics_sam::op::{mode_page, pr_in, pr_out, pr_type, vpd};
use stics_sam::sense::{asc, key as sense_key};
use stics_sam::{cdb, data, status};

use crate::driver::{random_isid, Config, Session};
use crate::scsi::ScsiOutcome;
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
    /// One more session that carries reads alone, so that a read never waits behind writes:
    /// behind ORDERED barriers (a target orders tasks per session), behind write data queued
    /// on the same connection, or for a command window that writes fill.
    pub read_session: bool,
    /// Offer the link to a stics SG at login (`stics_link::LOGIN_KEY`); when the target takes
    /// it and the LUN takes groups, the LUN is a [`stics_block::GroupSink`].
    pub link: bool,
}

impl Default for LunOptions {
    fn default() -> Self {
        LunOptions { config: Config::default(), sessions: 1, max_transfer: 1 << 20, read_session: false, link: false }
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
    /// The write sessions, then the read session when there is one.
    sessions: Vec<Session>,
    /// How many of `sessions` carry writes, flushes, the claim and the ordered queue.
    writers: usize,
    next: AtomicUsize,
    pub(crate) lun: u64,
    pub(crate) geometry: Geometry,
    wce: bool,
    /// The LUN's name from its Device Identification page.
    device_id: Option<String>,
    pub(crate) max_blocks: u32,
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
    /// The key this LUN was claimed under (0: not claimed).
    pub(crate) claim_key: AtomicU64,
    /// Sum of the write sessions' logins when the claim was made: a change means a session was
    /// reinstated since, and the claim is made again before the next write.
    claim_logins: AtomicU64,
    /// Claims made so far. Many commands meet the same lost registration at once; one that met
    /// RESERVATION CONFLICT claims again only if no claim was made since it was sent.
    pub(crate) claims: AtomicU64,
    /// Preemption unit attentions the sessions had seen when the claim was made: a later one
    /// means that another connection under the same key took the LUN over (a restarted
    /// writer), and this one does not take it back.
    claim_preemptions: AtomicU64,
    /// Set (to `claims` + 1 as it was when the command was queued) when a command of the
    /// ordered queue met RESERVATION CONFLICT under the claim: the next `prepare` claims again.
    reclaim: Arc<AtomicU64>,
    /// Set when a command of the ordered queue failed: the next `prepare` takes any unit
    /// attention waiting (a reinstated session starts with one) with a command that is retried.
    unsettled: Arc<AtomicBool>,
    /// The write session's logins at the last `prepare`.
    prepared_logins: AtomicU64,
    /// One claim at a time.
    claim_lock: tokio::sync::Mutex<()>,
    /// The target honours ORDERED tasks (ORDSUP in its Extended INQUIRY Data page) and there
    /// is one write session, so that the order commands are queued in is the order they
    /// arrive in.
    ordered: bool,
    /// What `resets` counted when `open` returned: the power-on unit attentions of new nexuses.
    resets_at_open: u64,
    /// The SG's link, when the target took the login key and this LUN takes groups.
    pub(crate) link: Option<LinkInfo>,
}

/// How much one UNMAP may carry.
#[derive(Debug, Clone, Copy)]
struct UnmapLimits {
    blocks_per_descriptor: u32,
    descriptors: usize,
}

impl UnmapLimits {
    /// `blocks` blocks from `lba` as descriptors, in groups of what one UNMAP carries.
    fn commands(&self, lba: u64, blocks: u64) -> Vec<Vec<(u64, u32)>> {
        let mut ranges = Vec::new();
        let (mut at, end) = (lba, lba + blocks);
        while at < end {
            let n = (end - at).min(u64::from(self.blocks_per_descriptor)) as u32;
            ranges.push((at, n));
            at += u64::from(n);
        }
        ranges.chunks(self.descriptors).map(<[_]>::to_vec).collect()
    }
}

impl Lun {
    /// Logs in (as many sessions as asked), checks that the LUN is a disk and reads its geometry
    /// and write-cache setting.
    pub async fn open(url: &IscsiUrl, opts: &LunOptions) -> Result<Lun, Error> {
        let (_, lun) = url.require_lun()?;
        let mut config = opts.config.clone();
        if opts.link {
            config.offer.private.push((stics_link::LOGIN_KEY.to_owned(), stics_link::LINK_VERSION.to_string()));
        }
        let first = Session::connect(url, &config, random_isid(0)).await?;
        let c = first.counters_ref().clone();
        let inq = execute_retrying(&first, Request::new(lun, cdb::inquiry(96), Data::Read(96)), &c).await?;
        let inq = data::parse_inquiry(&inq.data).ok_or_else(|| Error::Protocol("short INQUIRY data".into()))?;
        if inq.qualifier != 0 || inq.device_type != data::DIRECT_ACCESS {
            return Err(Error::NotADisk { lun, device_type: data::device_type_name(inq.device_type) });
        }
        let cap = read_capacity(&first, lun, &c).await?;
        let ms =
            execute_retrying(&first, Request::new(lun, cdb::mode_sense6(mode_page::CACHING, 64), Data::Read(64)), &c)
                .await;
        // Assume a volatile cache when the target does not say: flushes are then never skipped.
        let wce = ms.ok().and_then(|o| data::parse_wce(&o.data)).unwrap_or(true);
        let vpd = |page| execute_retrying(&first, Request::new(lun, cdb::inquiry_vpd(page, 64), Data::Read(64)), &c);
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
        let ordsup = vpd(vpd::EXTENDED_INQUIRY_DATA).await.ok().is_some_and(|o| data::parse_ordsup(&o.data));
        let id_page = Request::new(lun, cdb::inquiry_vpd(vpd::DEVICE_IDENTIFICATION, 1024), Data::Read(1024));
        let device_id =
            execute_retrying(&first, id_page, &c).await.ok().and_then(|o| data::parse_device_identification(&o.data));
        let writers = opts.sessions.max(1);
        let mut sessions = vec![first];
        for i in 1..writers + usize::from(opts.read_session) {
            sessions.push(Session::connect(url, &config, random_isid(i as u16)).await?);
        }
        // A new nexus starts with a power-on unit attention (the commands above may be exempt
        // from it): taken now, not by the first command that has work to do, which on the
        // ordered queue is not retried.
        for s in &sessions {
            let tur = Request::new(lun, cdb::test_unit_ready(), Data::None);
            let _ = execute_retrying(s, tur, s.counters_ref()).await;
        }
        let link = if opts.link { crate::link::probe(&sessions[0], lun).await } else { None };
        let max_blocks = (opts.max_transfer / cap.block_size).max(1);
        let mut l = Lun {
            sessions,
            writers,
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
            claim_key: AtomicU64::new(0),
            claim_logins: AtomicU64::new(0),
            claims: AtomicU64::new(0),
            claim_preemptions: AtomicU64::new(0),
            reclaim: Arc::default(),
            unsettled: Arc::default(),
            prepared_logins: AtomicU64::new(1),
            claim_lock: tokio::sync::Mutex::new(()),
            ordered: ordsup && writers == 1,
            resets_at_open: 0,
            link,
        };
        l.resets_at_open = l.resets_seen();
        Ok(l)
    }

    /// `data` for `lba` in pieces of at most one command each: (lba, blocks, bytes).
    fn pieces(&self, lba: u64, data: &Bytes, blocks: u64) -> Vec<(u64, u32, Bytes)> {
        let bs = self.geometry.block_size;
        let mut out = Vec::new();
        let mut done = 0u64;
        while done < blocks {
            let n = (blocks - done).min(u64::from(self.max_blocks)) as u32;
            let off = (done * u64::from(bs)) as usize;
            out.push((lba + done, n, data.slice(off..off + (n * bs) as usize)));
            done += u64::from(n);
        }
        out
    }

    /// The next write session.
    fn pick(&self) -> &Session {
        let i = self.next.fetch_add(1, Relaxed) % self.writers;
        &self.sessions[i]
    }

    /// The session reads go on: the read session, else the next write session.
    fn reader(&self) -> &Session {
        self.read_session().unwrap_or_else(|| self.pick())
    }

    /// Runs a command on the next write session, with retries of transient statuses.
    pub async fn execute(&self, cdb: [u8; 16], data: Data) -> Result<ScsiOutcome, Error> {
        let s = self.pick();
        execute_retrying(s, Request::new(self.lun, cdb, data), s.counters_ref()).await
    }

    /// Runs a command that writes or flushes on `s`, with retries of transient statuses. When
    /// it meets RESERVATION CONFLICT while this LUN holds a claim, the claim is made again
    /// (some targets, tgt among them, forget a registration when its session ends, reinstated
    /// or not) and the command runs once more.
    async fn execute_claimed(&self, s: &Session, cdb: [u8; 16], data: Data) -> Result<ScsiOutcome, Error> {
        let req = Request::new(self.lun, cdb, data);
        let claims = self.claims.load(SeqCst);
        match execute_retrying(s, req.clone(), s.counters_ref()).await {
            Err(e) if is_conflict(&e) && self.claim_key.load(SeqCst) != 0 => {
                if self.reclaim(claims).await? {
                    execute_retrying(s, req, s.counters_ref()).await
                } else {
                    Err(e)
                }
            }
            other => other,
        }
    }

    /// Counters summed over all sessions.
    pub fn counters(&self) -> Snapshot {
        self.sessions.iter().map(super::driver::Session::counters).fold(Snapshot::default(), |a, b| a + b)
    }

    /// The SG's link, when this LUN takes groups over it.
    pub fn link(&self) -> Option<LinkInfo> {
        self.link
    }

    /// Flushes that needed no SYNCHRONIZE CACHE (nothing written since the previous flush).
    pub fn flushes_skipped(&self) -> u64 {
        self.flushes_skipped.load(Relaxed)
    }

    /// The sessions behind this LUN: the write sessions, then the read session if there is one.
    pub fn sessions(&self) -> &[Session] {
        &self.sessions
    }

    /// The sessions that carry writes, flushes, the claim and the ordered queue.
    pub fn write_sessions(&self) -> &[Session] {
        &self.sessions[..self.writers]
    }

    /// The session that carries reads alone ([`LunOptions::read_session`]).
    pub fn read_session(&self) -> Option<&Session> {
        self.sessions.get(self.writers)
    }

    /// Logs out of every session.
    pub async fn close(&self) {
        for s in &self.sessions {
            s.logout().await;
        }
    }

    /// What a failed command means to the caller of a block device: a lasting or a transient
    /// failure, and which. A status that [`execute_retrying`] retries and that stayed after its
    /// retries is a busy device.
    pub(crate) fn io_err(lba: u64, e: Error) -> BlockError {
        let text = e.to_string();
        match e {
            Error::Task(crate::core::TaskError::Unreachable(m)) => BlockError::Unreachable(m),
            Error::Reserved { holder } => BlockError::Reserved { holder: Some(holder) },
            Error::Scsi { status: status::RESERVATION_CONFLICT, .. } => BlockError::Reserved { holder: None },
            Error::Scsi { status: status::BUSY | status::TASK_SET_FULL | status::TASK_ABORTED, .. } => {
                BlockError::Busy(text)
            }
            Error::Scsi { status: status::CHECK_CONDITION, sense: Some(s), .. } => match s.key {
                sense_key::DATA_PROTECT if (s.asc, s.ascq) == asc::SPACE_ALLOCATION_FAILED => BlockError::NoSpace(text),
                sense_key::DATA_PROTECT => BlockError::WriteProtected(text),
                sense_key::UNIT_ATTENTION | sense_key::NOT_READY | sense_key::ABORTED_COMMAND => BlockError::Busy(text),
                _ => BlockError::Io { lba, source: std::io::Error::other(text) },
            },
            _ => BlockError::Io { lba, source: std::io::Error::other(text) },
        }
    }

    /// Reinstatements of the write sessions and the power-on or reset unit attentions they saw,
    /// since they logged in. The read session's are left out: its reinstatement loses no write,
    /// and a reset it tells of is told to every write session too (a unit attention is per
    /// nexus), at the latest with the flush that was to cover the writes.
    fn resets_seen(&self) -> u64 {
        let write = self.write_sessions();
        let reinstated: u64 = write.iter().map(|s| s.logins().saturating_sub(1)).sum();
        let attentions: u64 = write.iter().map(|s| s.counters_ref().reset_attentions.load(SeqCst)).sum();
        reinstated + attentions
    }
}

fn is_conflict(e: &Error) -> bool {
    matches!(e, Error::Scsi { status: status::RESERVATION_CONFLICT, .. })
}

impl Lun {
    fn logins(&self) -> u64 {
        self.write_sessions().iter().map(Session::logins).sum()
    }

    fn preemptions(&self) -> u64 {
        self.sessions.iter().map(|s| s.counters_ref().preemptions.load(SeqCst)).sum()
    }

    async fn pr_out(&self, s: &Session, sa: u8, ptype: u8, key: u64, sa_key: u64) -> Result<(), Error> {
        let params = Bytes::from(data::pr_out_parameters(key, sa_key));
        let req = Request::new(self.lun, cdb::pr_out(sa, ptype), Data::Write(params));
        execute_retrying(s, req, s.counters_ref()).await.map(|_| ())
    }

    async fn read_reservation(&self, s: &Session) -> Result<Option<data::PrReservation>, Error> {
        let req = Request::new(self.lun, cdb::pr_in(pr_in::READ_RESERVATION, 24), Data::Read(24));
        let o = execute_retrying(s, req, s.counters_ref()).await?;
        let (_, r) = data::parse_read_reservation(&o.data)
            .ok_or_else(|| Error::Protocol("short READ RESERVATION data".into()))?;
        Ok(r)
    }

    /// The claim itself (the caller holds `claim_lock`). SPC-4 5.9: registrations and the
    /// reservation belong to an I_T nexus (initiator name and ISID), so each session registers
    /// `key`; the first session reserves. With one session the type is Write Exclusive; with
    /// several, Write Exclusive – Registrants Only, so that every session (each registered under
    /// `key`) may write, while initiators that did not register may not.
    async fn claim_now(&self, key: u64) -> Result<Claim, Error> {
        let logins = self.logins();
        let ptype = if self.writers == 1 { pr_type::WRITE_EXCLUSIVE } else { pr_type::WRITE_EXCLUSIVE_RO };
        let first = &self.sessions[0];
        self.pr_out(first, pr_out::REGISTER_AND_IGNORE, 0, 0, key).await?;
        let conflict = |e: &Error| matches!(e, Error::Scsi { status: status::RESERVATION_CONFLICT, .. });
        let mut claim = None;
        // Twice at most: a RESERVE can lose a race with another writer's between our read and it.
        for _ in 0..2 {
            let held = self.read_reservation(first).await?;
            if let Some(r) = held.filter(|r| r.key != key) {
                // Leave no registration behind on a LUN someone else holds.
                let _ = self.pr_out(first, pr_out::REGISTER_AND_IGNORE, 0, 0, 0).await;
                return Err(Error::Reserved { holder: r.key });
            }
            match self.pr_out(first, pr_out::RESERVE, ptype, key, 0).await {
                Ok(()) => {
                    claim = Some(Claim::Held);
                    break;
                }
                Err(e) if conflict(&e) && held.is_some() => {
                    // Our key holds it through another nexus: an earlier process of this writer
                    // (a new ISID after a restart), or another type. PREEMPT naming our own key
                    // moves the reservation to this nexus and drops the other registrations of
                    // the key (SPC-4 5.9.11.4.3); this nexus keeps its own.
                    self.pr_out(first, pr_out::PREEMPT, ptype, key, key).await?;
                    claim = Some(Claim::TakenOver);
                    break;
                }
                Err(e) if conflict(&e) => {}
                Err(e) => return Err(e),
            }
        }
        let Some(claim) = claim else {
            let holder = self.read_reservation(first).await?.map_or(0, |r| r.key);
            return Err(Error::Reserved { holder });
        };
        // After any PREEMPT, which would have dropped them (and told them so: the preemption
        // unit attentions of our own sessions come with these commands, before the count below).
        for s in &self.sessions[1..self.writers] {
            self.pr_out(s, pr_out::REGISTER_AND_IGNORE, 0, 0, key).await?;
        }
        self.claim_key.store(key, SeqCst);
        self.claim_logins.store(logins, SeqCst);
        self.claim_preemptions.store(self.preemptions(), SeqCst);
        self.claims.fetch_add(1, SeqCst);
        Ok(claim)
    }

    /// Makes the claim again for a command that met RESERVATION CONFLICT when `claims` claims
    /// had been made (the caller holds no lock). True when the LUN is claimed again, by this
    /// call or by another since; false when it is not to be: there is no claim, or another
    /// connection under the same key took the LUN over (then the claim is given up for good).
    pub(crate) async fn reclaim(&self, claims: u64) -> Result<bool, Error> {
        let _one = self.claim_lock.lock().await;
        if self.claims.load(SeqCst) != claims {
            return Ok(true);
        }
        let key = self.claim_key.load(SeqCst);
        if key == 0 || self.preempted_since_claim() {
            return Ok(false);
        }
        tracing::info!(
            lun = self.lun,
            key = format_args!("{key:#018x}"),
            "RESERVATION CONFLICT under our claim (the target forgot our registration): claiming the LUN again"
        );
        self.claim_now(key).await.map(|_| true).inspect_err(|e| self.lost_claim(e))
    }

    /// True when a session saw a preemption unit attention since the claim was made; then the
    /// claim is dropped, so that nothing takes the LUN back from the connection that took it.
    fn preempted_since_claim(&self) -> bool {
        if self.preemptions() == self.claim_preemptions.load(SeqCst) {
            return false;
        }
        tracing::warn!(
            lun = self.lun,
            "another connection under our reservation key took the LUN over: not claiming it back"
        );
        self.claim_key.store(0, SeqCst);
        true
    }

    /// After a failed claim: another key holds the LUN, so this one no longer claims it again by
    /// itself (a new [`BlockDev::claim`] may).
    fn lost_claim(&self, e: &Error) {
        if let Error::Reserved { holder } = e {
            tracing::warn!(lun = self.lun, holder = format_args!("{holder:#018x}"), "another writer holds the LUN");
            self.claim_key.store(0, SeqCst);
        }
    }

    /// Breaks the persistent reservation `holder` holds on this LUN, for a writer that is gone
    /// for good (a gateway whose log was lost): registers a key of its own, PREEMPTs `holder`
    /// (SPC-4 5.9.11.4: the holder's registrations go and the reservation passes to this nexus),
    /// then releases and unregisters, leaving the LUN free. Refused when `holder` is not the one
    /// holding it, so that a live writer named by mistake is never preempted.
    pub async fn release_holder(&self, holder: u64) -> Result<(), Error> {
        let s = &self.sessions[0];
        let held = self.read_reservation(s).await?;
        let Some(r) = held else { return Ok(()) };
        if r.key != holder {
            return Err(Error::Reserved { holder: r.key });
        }
        // Any key other than the holder's will do; never zero (that would unregister).
        let own = !holder | 1;
        self.pr_out(s, pr_out::REGISTER_AND_IGNORE, 0, 0, own).await?;
        self.pr_out(s, pr_out::PREEMPT, r.ptype, own, holder).await?;
        self.pr_out(s, pr_out::RELEASE, r.ptype, own, 0).await?;
        self.pr_out(s, pr_out::REGISTER_AND_IGNORE, 0, 0, 0).await
    }

    /// Makes the claim again when a session was reinstated since it was made. A target keeps
    /// registrations across the reinstatement of a session with the same ISID (SPC-4: the
    /// nexus is the same), but one that restarted lost them; commands reissued by the session
    /// itself before this runs still go out under whatever the target holds, so they never
    /// write behind another holder's back (it refuses them with RESERVATION CONFLICT).
    async fn keep_claim(&self) -> Result<(), BlockError> {
        let key = self.claim_key.load(SeqCst);
        if key == 0 || self.logins() == self.claim_logins.load(SeqCst) {
            return Ok(());
        }
        let _one = self.claim_lock.lock().await;
        let key = self.claim_key.load(SeqCst);
        if key == 0 || self.logins() == self.claim_logins.load(SeqCst) || self.preempted_since_claim() {
            return Ok(());
        }
        tracing::info!(
            lun = self.lun,
            key = format_args!("{key:#018x}"),
            "a session was reinstated: claiming the LUN again"
        );
        self.claim_now(key).await.map(|_| ()).inspect_err(|e| self.lost_claim(e)).map_err(claim_err)
    }
}

/// What a queued command needs to know when its answer comes.
struct QueueCtx {
    /// `reclaim` of the LUN.
    reclaim: Arc<AtomicU64>,
    /// `unsettled` of the LUN.
    unsettled: Arc<AtomicBool>,
    /// `claims` + 1 when the LUN held a claim as the command was queued; 0 otherwise.
    claimed: u64,
}

impl Lun {
    fn queue_ctx(&self) -> QueueCtx {
        let claimed = if self.claim_key.load(SeqCst) == 0 { 0 } else { self.claims.load(SeqCst) + 1 };
        QueueCtx { reclaim: Arc::clone(&self.reclaim), unsettled: Arc::clone(&self.unsettled), claimed }
    }

    /// A command of the ordered queue, on the one write session: never reissued after a lost
    /// connection.
    fn submit_once(&self, req: Request) -> impl std::future::Future<Output = Result<ScsiOutcome, Error>> + Send {
        self.sessions[0].submit(req.once())
    }
}

/// Waits for queued commands, in order; the first failure is the answer. A RESERVATION CONFLICT
/// under a claim is a registration the target forgot (the next `prepare` claims again), so it
/// is a busy device to the caller, not another writer's.
fn queued(
    lba: u64,
    op: u8,
    ctx: QueueCtx,
    cmds: Vec<impl std::future::Future<Output = Result<ScsiOutcome, Error>> + Send + 'static>,
) -> Queued {
    Box::pin(async move {
        for c in cmds {
            let out = c.await.map_err(|e| {
                ctx.unsettled.store(true, SeqCst);
                Lun::io_err(lba, e)
            })?;
            if out.status != status::GOOD {
                ctx.unsettled.store(true, SeqCst);
            }
            if out.status == status::RESERVATION_CONFLICT && ctx.claimed != 0 {
                let _ = ctx.reclaim.compare_exchange(0, ctx.claimed, SeqCst, SeqCst);
                return Err(BlockError::Busy(format!(
                    "{}: the LUN is claimed again before more is queued",
                    Error::scsi(op, &out)
                )));
            }
            if out.status != status::GOOD {
                return Err(Lun::io_err(lba, Error::scsi(op, &out)));
            }
        }
        Ok(())
    })
}

/// Commands go out on the one write session, never retried here and never reissued after a lost
/// connection: a failure must reach the caller, which knows what else it had queued behind it.
#[async_trait]
impl OrderedQueue for Lun {
    /// After a failure or a reinstatement: takes the unit attention a reinstated session starts
    /// with, claims again when a session was reinstated or a queued command met RESERVATION
    /// CONFLICT, then lets commands through again after a lost connection failed some.
    async fn prepare(&self) -> Result<(), BlockError> {
        let s = &self.sessions[0];
        let logins = s.logins();
        if self.unsettled.swap(false, SeqCst) || logins != self.prepared_logins.load(SeqCst) {
            let tur = Request::new(self.lun, cdb::test_unit_ready(), Data::None);
            if let Err(e) = execute_retrying(s, tur, s.counters_ref()).await {
                self.unsettled.store(true, SeqCst);
                return Err(Self::io_err(0, e));
            }
            self.prepared_logins.store(logins, SeqCst);
        }
        let conflicted = self.reclaim.swap(0, SeqCst);
        if conflicted != 0 {
            if let Err(e) = self.reclaim(conflicted - 1).await {
                let _ = self.reclaim.compare_exchange(0, conflicted, SeqCst, SeqCst);
                return Err(claim_err(e));
            }
        }
        self.keep_claim().await?;
        s.rearm();
        Ok(())
    }

    fn queue_write(&self, lba: u64, data: Bytes) -> Queued {
        let bs = self.geometry.block_size;
        let blocks = match blocks_in(&data, bs).and_then(|n| self.geometry.check_range(lba, n).map(|()| n)) {
            Ok(n) => n,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        let ctx = self.queue_ctx();
        let cmds: Vec<_> = self
            .pieces(lba, &data, blocks)
            .into_iter()
            .map(|(at, n, chunk)| {
                self.submit_once(Request::new(self.lun, cdb::write16(at, n, false), Data::Write(chunk)))
            })
            .collect();
        self.write_gen.fetch_add(1, SeqCst);
        queued(lba, stics_sam::op::WRITE_16, ctx, cmds)
    }

    fn queue_zeros(&self, lba: u64, blocks: u64, discard: bool) -> Queued {
        if let Err(e) = self.geometry.check_range(lba, blocks) {
            return Box::pin(async move { Err(e) });
        }
        let ctx = self.queue_ctx();
        let bs = self.geometry.block_size;
        let mut cmds = Vec::new();
        let (mut at, end) = (lba, lba + blocks);
        let op;
        if let (true, Some(lim)) = (discard, self.unmap) {
            op = stics_sam::op::UNMAP;
            for group in lim.commands(lba, blocks) {
                let params = Bytes::from(data::unmap_parameters(&group));
                cmds.push(self.submit_once(Request::new(self.lun, cdb::unmap(group.len()), Data::Write(params))));
            }
        } else if self.write_same_max > 0 && self.write_same_ok.load(Relaxed) {
            op = stics_sam::op::WRITE_SAME_16;
            let zero = Bytes::from(vec![0u8; bs as usize]);
            while at < end {
                let n = (end - at).min(self.write_same_max) as u32;
                cmds.push(self.submit_once(Request::new(
                    self.lun,
                    cdb::write_same16(at, n),
                    Data::Write(zero.clone()),
                )));
                at += u64::from(n);
            }
        } else {
            op = stics_sam::op::WRITE_16;
            let per = u64::from(self.max_blocks);
            let zero = Bytes::from(vec![0u8; (per.min(blocks) * u64::from(bs)) as usize]);
            while at < end {
                let n = (end - at).min(per);
                let chunk = zero.slice(..(n * u64::from(bs)) as usize);
                cmds.push(self.submit_once(Request::new(
                    self.lun,
                    cdb::write16(at, n as u32, false),
                    Data::Write(chunk),
                )));
                at += n;
            }
        }
        self.write_gen.fetch_add(1, SeqCst);
        queued(lba, op, ctx, cmds)
    }

    fn queue_barrier(&self) -> Queued {
        let req = Request::new(self.lun, cdb::synchronize_cache10(), Data::None).ordered();
        queued(0, stics_sam::op::SYNC_CACHE_10, self.queue_ctx(), vec![self.submit_once(req)])
    }
}

fn claim_err(e: Error) -> BlockError {
    Lun::io_err(0, e)
}

/// READ CAPACITY(16), or (10) when the target does not know (16).
pub async fn read_capacity(s: &Session, lun: u64, c: &Counters) -> Result<data::Capacity, Error> {
    let r16 = execute_retrying(s, Request::new(lun, cdb::read_capacity16(32), Data::Read(32)), c).await;
    if let Some(cap) = r16.as_ref().ok().and_then(|o| data::parse_capacity16(&o.data)) {
        return Ok(cap);
    }
    let r10 = execute_retrying(s, Request::new(lun, cdb::read_capacity10(), Data::Read(8)), c).await?;
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

    fn group_sink(&self) -> Option<&dyn GroupSink> {
        if self.link.is_some() {
            Some(self)
        } else {
            None
        }
    }

    fn ordered_queue(&self) -> Option<&dyn OrderedQueue> {
        if self.ordered {
            Some(self)
        } else {
            None
        }
    }

    /// Reinstatements of the write sessions and the power-on or reset unit attentions their
    /// commands saw since `open`; both are counted before the command that saw them completes.
    fn resets(&self) -> u64 {
        self.resets_seen().saturating_sub(self.resets_at_open)
    }

    /// PERSISTENT RESERVE OUT: register `key` on every session, then reserve (or take back from
    /// a stale nexus of the same key); see `claim_now`. A target that does not implement
    /// persistent reservations gives [`Claim::Unsupported`].
    async fn claim(&self, key: u64) -> Result<Claim, BlockError> {
        if key == 0 {
            return Err(BlockError::Unsupported("a claim under reservation key 0"));
        }
        let _one = self.claim_lock.lock().await;
        match self.claim_now(key).await {
            Err(Error::Scsi { sense: Some(s), .. }) if s.key == sense_key::ILLEGAL_REQUEST => {
                tracing::warn!(lun = self.lun, "the target has no persistent reservations: the LUN is not claimed");
                Ok(Claim::Unsupported)
            }
            other => other.map_err(claim_err),
        }
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
            let s = self.reader();
            let req = Request::new(self.lun, cdb::read16(at, n), Data::Read(len));
            let o = execute_retrying(s, req, s.counters_ref()).await.map_err(|e| Self::io_err(at, e))?;
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
        self.keep_claim().await?;
        for (at, n, chunk) in self.pieces(lba, &data, blocks) {
            self.execute_claimed(self.pick(), cdb::write16(at, n, fua), Data::Write(chunk))
                .await
                .map_err(|e| Self::io_err(at, e))?;
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
        self.keep_claim().await?;
        for group in lim.commands(lba, blocks) {
            let params = Bytes::from(data::unmap_parameters(&group));
            self.execute_claimed(self.pick(), cdb::unmap(group.len()), Data::Write(params))
                .await
                .map_err(|e| Self::io_err(group[0].0, e))?;
        }
        self.write_gen.fetch_add(1, SeqCst);
        Ok(())
    }

    async fn write_zeros(&self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        self.geometry.check_range(lba, blocks)?;
        self.keep_claim().await?;
        // One WRITE SAME carries a single block however large the range: over a long path that
        // is one round trip instead of one per megabyte.
        let zero = Bytes::from(vec![0u8; self.geometry.block_size as usize]);
        let (mut at, end) = (lba, lba + blocks);
        while at < end && self.write_same_max > 0 && self.write_same_ok.load(Relaxed) {
            let n = (end - at).min(self.write_same_max) as u32;
            match self.execute_claimed(self.pick(), cdb::write_same16(at, n), Data::Write(zero.clone())).await {
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
        // SYNCHRONIZE CACHE is refused to a writer that is not the holder, like a write.
        self.keep_claim().await?;
        // Every write session's writes must be durable: SYNCHRONIZE CACHE on each.
        for s in self.write_sessions() {
            self.execute_claimed(s, cdb::synchronize_cache10(), Data::None).await.map_err(|e| Self::io_err(0, e))?;
        }
        self.flushed_gen.fetch_max(gen, SeqCst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(status: u8, sense: Option<Vec<u8>>) -> Error {
        let o = ScsiOutcome { status, data: Bytes::new(), sense: sense.map(Bytes::from) };
        Error::scsi(stics_sam::op::WRITE_16, &o)
    }

    /// CHECK CONDITION with fixed-format sense bytes.
    fn check(key: u8, asc: u8, ascq: u8) -> Error {
        failed(status::CHECK_CONDITION, Some(vec![0x70, 0, key, 0, 0, 0, 0, 10, 0, 0, 0, 0, asc, ascq, 0, 0, 0, 0]))
    }

    fn kind(e: Error) -> String {
        let b = Lun::io_err(7, e);
        let name = match &b {
            BlockError::Reserved { holder: None } => "reserved",
            BlockError::Reserved { holder: Some(_) } => "reserved by a key",
            BlockError::NoSpace(_) => "no space",
            BlockError::WriteProtected(_) => "write-protected",
            BlockError::Busy(_) => "busy",
            BlockError::Unreachable(_) => "unreachable",
            BlockError::Io { lba: 7, .. } => "io",
            _ => "other",
        };
        format!("{name}: {b}")
    }

    #[test]
    fn scsi_failures_map_to_lasting_and_transient_block_errors() {
        let cases: Vec<(Error, &str)> = vec![
            (failed(status::RESERVATION_CONFLICT, None), "reserved"),
            (Error::Reserved { holder: 0x77 }, "reserved by a key"),
            (check(0x07, 0x27, 0x07), "no space"),
            (check(0x07, 0x27, 0x00), "write-protected"),
            (check(0x07, 0x27, 0x02), "write-protected"),
            (failed(status::BUSY, None), "busy"),
            (failed(status::TASK_SET_FULL, None), "busy"),
            (failed(status::TASK_ABORTED, None), "busy"),
            (check(0x06, 0x29, 0x00), "busy"),
            (check(0x02, 0x04, 0x01), "busy"),
            (check(0x0b, 0x47, 0x05), "busy"),
            (check(0x03, 0x11, 0x00), "io"),
            (check(0x04, 0x44, 0x00), "io"),
            (check(0x05, 0x24, 0x00), "io"),
            (failed(status::CHECK_CONDITION, None), "io"),
            (Error::Task(crate::core::TaskError::Unreachable("connection lost; not reissued".into())), "unreachable"),
            (Error::Task(crate::core::TaskError::TargetFailure(1)), "io"),
            (Error::Protocol("short read".into()), "io"),
        ];
        for (e, want) in cases {
            let what = e.to_string();
            let got = kind(e);
            assert!(got.starts_with(&format!("{want}: ")), "{what} → {got}, expected {want}");
        }
        // The message names what the target said.
        let e = Lun::io_err(0, check(0x07, 0x27, 0x07)).to_string();
        assert!(e.contains("sense key 0x7 asc 0x27 ascq 0x07"), "{e}");
        assert!(Lun::io_err(0, failed(status::BUSY, None)).is_transient());
        assert!(!Lun::io_err(0, check(0x07, 0x27, 0x07)).is_transient());
    }
}

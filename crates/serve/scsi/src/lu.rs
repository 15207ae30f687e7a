//! A logical unit: one block device plus its SCSI state (mode parameters, reservations, unit
//! attentions). Hot-path state lives in atomics so READ and WRITE need no mutex.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use stics_block::{BlockDev, Geometry};

use stics_sam::sense::asc;

use crate::link::Staging;
use crate::pr::{NexusKey, PrState};
use crate::spc::{MAX_CAW_BLOCKS, MAX_WRITE_SAME_BLOCKS};

/// Default largest data transfer of one READ/WRITE ([`LuConfig::max_transfer_bytes`]).
pub const MAX_TRANSFER_BYTES: u64 = 64 << 20;
/// Most unit attentions queued per nexus; older ones are dropped first.
const MAX_UA: usize = 8;

/// Identity and options of a logical unit.
#[derive(Debug, Clone)]
pub struct LuConfig {
    /// T10 vendor identification (8 ASCII characters, padded with spaces).
    pub vendor: String,
    /// Product identification (16 characters).
    pub product: String,
    /// Product revision level (4 characters).
    pub revision: String,
    /// Unit serial number (VPD page 80h).
    pub serial: String,
    /// NAA identifier, unique per LU (VPD page 83h). A zero top nibble is replaced by NAA 5.
    pub naa_id: u64,
    /// Refuse every write with DATA PROTECT / WRITE PROTECTED.
    pub read_only: bool,
    /// log2 of logical blocks per physical block (READ CAPACITY 16).
    pub lbppbe: u8,
    /// Largest data transfer of one command: reported in the Block Limits VPD page and
    /// enforced, so that it should equal what the transport accepts.
    pub max_transfer_bytes: u64,
}

impl Default for LuConfig {
    fn default() -> Self {
        LuConfig {
            vendor: "STICS".into(),
            product: "VIRTUAL-DISK".into(),
            revision: "0001".into(),
            serial: "0000000000000001".into(),
            naa_id: 0x5001_4050_0000_0001,
            read_only: false,
            lbppbe: 0,
            max_transfer_bytes: MAX_TRANSFER_BYTES,
        }
    }
}

/// The SCSI-2 RESERVE(6/10) holder and the persistent reservation state.
#[derive(Debug, Default)]
pub(crate) struct Reservations {
    pub(crate) spc2: Option<NexusKey>,
    pub(crate) pr: PrState,
}

/// Mutable state behind the LU mutex (never touched by a READ/WRITE without an attention pending).
#[derive(Debug, Default)]
pub(crate) struct LuState {
    /// Live sessions (nexus id -> identity).
    pub(crate) nexuses: HashMap<u64, NexusKey>,
    /// Pending unit attentions (ASC, ASCQ) per session.
    pub(crate) ua: HashMap<u64, VecDeque<(u8, u8)>>,
    pub(crate) resv: Reservations,
}

fn ua_bit(id: u64) -> u64 {
    1 << (id % 64)
}

/// One BlockDev and its SCSI state.
pub struct LogicalUnit {
    pub(crate) dev: Arc<dyn BlockDev>,
    pub(crate) cfg: LuConfig,
    pub(crate) geo: Geometry,
    pub(crate) discard: bool,
    pub(crate) volatile: bool,
    /// Write cache enable as the caching mode page shows it; off means every write is FUA.
    pub(crate) wce: AtomicBool,
    /// Bit `id % 64` is set while some session whose id maps to it has a unit attention queued;
    /// a clear bit lets a command skip the mutex, whatever other sessions have pending.
    pub(crate) ua_bits: AtomicU64,
    /// True while a RESERVE(6/10) or persistent reservation exists.
    pub(crate) reserved: AtomicBool,
    pub(crate) state: Mutex<LuState>,
    /// Writes hold it shared; COMPARE AND WRITE and ORWRITE hold it exclusively.
    pub(crate) write_lock: tokio::sync::RwLock<()>,
    /// The device's reset count last seen ([`BlockDev::resets`]).
    pub(crate) resets: AtomicU64,
    /// Groups being sent over the link, when the device takes them.
    pub(crate) staging: Mutex<Staging>,
    /// A piece was staged or refused: commits waiting for their groups' pieces look again.
    pub(crate) staged: tokio::sync::Notify,
}

impl LogicalUnit {
    /// A logical unit over `dev`.
    pub fn new(dev: Arc<dyn BlockDev>, config: LuConfig) -> Self {
        let geo = dev.geometry();
        let volatile = dev.volatile_cache();
        let resets = AtomicU64::new(dev.resets());
        LogicalUnit {
            discard: dev.supports_discard(),
            volatile,
            geo,
            dev,
            cfg: config,
            wce: AtomicBool::new(volatile),
            ua_bits: AtomicU64::new(0),
            reserved: AtomicBool::new(false),
            state: Mutex::new(LuState::default()),
            write_lock: tokio::sync::RwLock::new(()),
            resets,
            staging: Mutex::new(Staging::default()),
            staged: tokio::sync::Notify::new(),
        }
    }

    /// The device under this LU.
    pub fn dev(&self) -> &Arc<dyn BlockDev> {
        &self.dev
    }

    /// The configuration this LU was created with.
    pub fn config(&self) -> &LuConfig {
        &self.cfg
    }

    pub(crate) fn staging(&self) -> MutexGuard<'_, Staging> {
        self.staging.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, LuState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Largest transfer in blocks.
    pub(crate) fn max_transfer_blocks(&self) -> u64 {
        (self.cfg.max_transfer_bytes / u64::from(self.geo.block_size.max(1))).max(1)
    }

    /// Largest WRITE SAME in blocks. A WRITE SAME writes as many bytes as a WRITE of its length,
    /// so it gets the same byte budget: with 4096-byte blocks a fixed block count would let one
    /// command write eight times what a 512-byte LUN allows (and hosts, libiscsi among them,
    /// WRITE the range they are about to WRITE SAME with one command).
    pub(crate) fn max_write_same_blocks(&self) -> u64 {
        MAX_WRITE_SAME_BLOCKS.min(self.max_transfer_blocks())
    }

    /// Largest COMPARE AND WRITE in blocks: its data-out holds twice the blocks, and must fit in
    /// one transfer.
    pub(crate) fn max_caw_blocks(&self) -> u8 {
        let fits = self.cfg.max_transfer_bytes / (2 * u64::from(self.geo.block_size.max(1)));
        fits.clamp(1, u64::from(MAX_CAW_BLOCKS)) as u8
    }

    pub(crate) fn refresh_reserved(&self, st: &LuState) {
        self.reserved.store(st.resv.spc2.is_some() || st.resv.pr.reserved(), Ordering::Release);
    }

    /// Queues a unit attention for one session. Reset conditions (29h) replace what is queued.
    pub(crate) fn queue_ua(&self, st: &mut LuState, id: u64, code: (u8, u8)) {
        let q = st.ua.entry(id).or_default();
        if code.0 == asc::POWER_ON_RESET.0 {
            q.clear();
        }
        if !q.contains(&code) {
            if q.len() >= MAX_UA {
                q.pop_front();
            }
            q.push_back(code);
        }
        self.ua_bits.fetch_or(ua_bit(id), Ordering::AcqRel);
    }

    /// True when the session may have a unit attention queued (checked without the mutex).
    pub(crate) fn may_have_ua(&self, id: u64) -> bool {
        self.ua_bits.load(Ordering::Acquire) & ua_bit(id) != 0
    }

    /// Clears the hint bit of `id` when no session sharing it has anything queued.
    fn refresh_ua_bit(&self, st: &LuState, id: u64) {
        let bit = ua_bit(id);
        if !st.ua.keys().any(|k| ua_bit(*k) == bit) {
            self.ua_bits.fetch_and(!bit, Ordering::AcqRel);
        }
    }

    /// Queues a unit attention for every session of a nexus identity.
    pub(crate) fn queue_ua_key(&self, st: &mut LuState, key: &NexusKey, code: (u8, u8)) {
        let ids: Vec<u64> = st.nexuses.iter().filter(|(_, k)| *k == key).map(|(id, _)| *id).collect();
        for id in ids {
            self.queue_ua(st, id, code);
        }
    }

    /// Queues a unit attention for every session except `except`.
    pub(crate) fn queue_ua_all(&self, st: &mut LuState, except: Option<u64>, code: (u8, u8)) {
        let ids: Vec<u64> = st.nexuses.keys().copied().filter(|id| Some(*id) != except).collect();
        for id in ids {
            self.queue_ua(st, id, code);
        }
    }

    /// Takes the oldest unit attention of a session.
    pub(crate) fn take_ua(&self, st: &mut LuState, id: u64) -> Option<(u8, u8)> {
        let q = st.ua.get_mut(&id)?;
        let ua = q.pop_front();
        if q.is_empty() {
            st.ua.remove(&id);
            self.refresh_ua_bit(st, id);
        }
        ua
    }

    /// The device says it may have lost completed writes it had not made durable (a remote
    /// behind it lost its volatile cache, or its connection): when that is news, every session
    /// learns it as a reset (29h/00h), as from a disk that lost power, so that no initiator
    /// counts on a flush to cover writes completed before it. True when it was news.
    pub(crate) fn notice_resets(&self, now: u64) -> bool {
        if self.resets.swap(now, Ordering::AcqRel) == now {
            return false;
        }
        let mut st = self.lock();
        self.queue_ua_all(&mut st, None, asc::POWER_ON_RESET);
        true
    }

    pub(crate) fn add_nexus(&self, id: u64, key: NexusKey) {
        let mut st = self.lock();
        st.nexuses.insert(id, key);
        // Every new I_T nexus sees POWER ON, RESET, OR BUS DEVICE RESET OCCURRED first, as real
        // disks report it; initiators (libiscsi, Linux) clear it with TEST UNIT READY on login.
        self.queue_ua(&mut st, id, asc::POWER_ON_RESET);
    }

    pub(crate) fn remove_nexus(&self, id: u64) {
        self.staging.lock().unwrap_or_else(std::sync::PoisonError::into_inner).forget(id);
        let mut st = self.lock();
        let removed = st.nexuses.remove(&id);
        // A commit of this nexus that waits for its pieces gives up now.
        self.staged.notify_waiters();
        let Some(key) = removed else { return };
        if st.ua.remove(&id).is_some() {
            self.refresh_ua_bit(&st, id);
        }
        let still_there = st.nexuses.values().any(|k| *k == key);
        if !still_there && st.resv.spc2.as_ref() == Some(&key) {
            st.resv.spc2 = None;
        }
        self.refresh_reserved(&st);
    }

    /// LOGICAL UNIT RESET and target resets: drop RESERVE(6/10), restore mode defaults, tell
    /// every session but `except`.
    pub(crate) fn reset(&self, code: (u8, u8), clear_pr: bool, except: Option<u64>) {
        let mut st = self.lock();
        st.resv.spc2 = None;
        if clear_pr {
            st.resv.pr.clear_all();
        }
        self.wce.store(self.volatile, Ordering::Release);
        self.queue_ua_all(&mut st, except, code);
        self.refresh_reserved(&st);
    }
}

//! A RAM block device that fails on purpose: it loses unflushed writes on a crash (or keeps a
//! random, seeded subset of them), tears a write at a chosen byte, fails or delays chosen
//! operations. What crash and property tests of caching layers stand on.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use stics_block::{blocks_in, BlockDev, BlockError, Claim, Geometry};

/// The kinds of operation a [`Rule`] can pick out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Flush,
    Discard,
    WriteZeros,
}

const OPS: usize = 5;

/// What a matching [`Rule`] does to an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// The operation does nothing and returns an I/O error.
    Fail,
    /// The operation does nothing and returns an error of this kind, which a target serving
    /// the device turns into its SCSI status and sense.
    Error(ErrorKind),
    /// The operation waits this long (tokio time) first, then goes on.
    Delay(Duration),
}

/// The kinds of [`BlockError`] an [`Effect::Error`] returns, each what a real disk or array
/// says in some failure: the SCSI layer answers MEDIUM ERROR, SPACE ALLOCATION FAILED, WRITE
/// PROTECTED, RESERVATION CONFLICT and BUSY for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// [`BlockError::Io`]: a medium error.
    Io,
    /// [`BlockError::NoSpace`]: a thin pool that is full.
    NoSpace,
    /// [`BlockError::WriteProtected`].
    WriteProtected,
    /// [`BlockError::Reserved`] with no holder named: another initiator's reservation.
    Reserved,
    /// [`BlockError::Busy`].
    Busy,
    /// [`BlockError::Unreachable`]: a remote whose link is down.
    Unreachable,
}

impl ErrorKind {
    /// The error an operation on `lba` returns.
    pub fn error(self, lba: u64, op: Op) -> BlockError {
        let what = format!("injected {op:?} failure");
        match self {
            ErrorKind::Io => io_error(lba, &what),
            ErrorKind::NoSpace => BlockError::NoSpace(what),
            ErrorKind::WriteProtected => BlockError::WriteProtected(what),
            ErrorKind::Reserved => BlockError::Reserved { holder: None },
            ErrorKind::Busy => BlockError::Busy(what),
            ErrorKind::Unreachable => BlockError::Unreachable(what),
        }
    }
}

/// Picks operations by kind and, optionally, LBA range; skips the first `after` matches and then
/// acts on the next `times` (all of them without a count).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub op: Op,
    pub lbas: Option<Range<u64>>,
    pub after: u64,
    pub times: Option<u64>,
    pub effect: Effect,
}

impl Rule {
    /// Every `op` fails (narrow it with [`Rule::lbas`], [`Rule::after`], [`Rule::times`]).
    pub fn fail(op: Op) -> Rule {
        Rule { op, lbas: None, after: 0, times: None, effect: Effect::Fail }
    }

    /// Every `op` fails with an error of `kind`.
    pub fn error(op: Op, kind: ErrorKind) -> Rule {
        Rule { op, lbas: None, after: 0, times: None, effect: Effect::Error(kind) }
    }

    /// Every `op` is delayed by `by`.
    pub fn delay(op: Op, by: Duration) -> Rule {
        Rule { op, lbas: None, after: 0, times: None, effect: Effect::Delay(by) }
    }

    /// Only operations touching a block in `lbas` (a flush touches none, so never matches).
    pub fn lbas(mut self, lbas: Range<u64>) -> Rule {
        self.lbas = Some(lbas);
        self
    }

    /// Lets the first `n` matching operations through untouched.
    pub fn after(mut self, n: u64) -> Rule {
        self.after = n;
        self
    }

    /// Acts on `n` matching operations, then no more.
    pub fn times(mut self, n: u64) -> Rule {
        self.times = Some(n);
        self
    }

    fn matches(&self, op: Op, range: Option<Range<u64>>) -> bool {
        if op != self.op {
            return false;
        }
        match (&self.lbas, range) {
            (None, _) => true,
            (Some(want), Some(r)) => r.start < want.end && want.start < r.end,
            (Some(_), None) => false,
        }
    }
}

/// What a crash does with writes that completed but were not flushed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CrashMode {
    /// Every unflushed write is lost.
    #[default]
    DropAll,
    /// Each block keeps a random (seeded) number of its unflushed versions, oldest first: the
    /// disk had written some of its cache, in order, before power went.
    KeepRandom,
    /// Every unflushed write had reached the medium.
    KeepAll,
}

struct State {
    geometry: Geometry,
    volatile: bool,
    discard: bool,
    crash_mode: CrashMode,
    /// What survives a crash; blocks not present are zeros.
    durable: BTreeMap<u64, Arc<[u8]>>,
    /// Unflushed versions of each block, oldest first.
    pending: BTreeMap<u64, Vec<Arc<[u8]>>>,
    rules: Vec<(Rule, u64)>,
    /// (writes still to let through, byte at which the next one tears).
    tear: Option<(u64, usize)>,
    rng: StdRng,
    down: bool,
    counts: [u64; OPS],
    /// Power cycles so far ([`BlockDev::resets`]).
    resets: u64,
    /// Whether [`BlockDev::claim`] keeps a holder ([`FaultDev::set_claims`]).
    claims: bool,
    holder: Option<u64>,
}

impl State {
    fn new(geometry: Geometry, seed: u64) -> State {
        State {
            geometry,
            volatile: true,
            discard: true,
            crash_mode: CrashMode::DropAll,
            durable: BTreeMap::new(),
            pending: BTreeMap::new(),
            rules: Vec::new(),
            tear: None,
            rng: StdRng::seed_from_u64(seed),
            down: false,
            counts: [0; OPS],
            resets: 0,
            claims: false,
            holder: None,
        }
    }

    fn zero(&self) -> Arc<[u8]> {
        vec![0u8; self.geometry.block_size as usize].into()
    }

    fn durable_block(&self, lba: u64) -> Arc<[u8]> {
        self.durable.get(&lba).cloned().unwrap_or_else(|| self.zero())
    }

    fn volatile_block(&self, lba: u64) -> Arc<[u8]> {
        match self.pending.get(&lba).and_then(|h| h.last()) {
            Some(b) => b.clone(),
            None => self.durable_block(lba),
        }
    }

    /// Stores one block: in the volatile cache, or on the medium (which supersedes the cached
    /// versions: a disk does not write an older version over a newer one).
    fn put(&mut self, lba: u64, block: Arc<[u8]>, durable: bool) {
        if durable || !self.volatile {
            self.pending.remove(&lba);
            self.durable.insert(lba, block);
        } else {
            self.pending.entry(lba).or_default().push(block);
        }
    }

    fn crash(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        for (lba, history) in pending {
            let keep = match self.crash_mode {
                CrashMode::DropAll => 0,
                CrashMode::KeepAll => history.len(),
                CrashMode::KeepRandom => self.rng.gen_range(0..=history.len()),
            };
            if keep > 0 {
                self.durable.insert(lba, history[keep - 1].clone());
            }
        }
        self.down = true;
    }

    /// Counts the operation, applies the rules; returns the delay to wait and how it fails, if
    /// it does.
    fn admit(&mut self, op: Op, range: Option<Range<u64>>) -> Result<(Duration, Option<ErrorKind>), BlockError> {
        let lba = range.as_ref().map_or(0, |r| r.start);
        if self.down {
            return Err(io_error(lba, "device is down after a crash"));
        }
        if let Some(r) = &range {
            self.geometry.check_range(r.start, r.end - r.start)?;
        }
        self.counts[op as usize] += 1;
        let (mut delay, mut fail) = (Duration::ZERO, None);
        for (rule, seen) in &mut self.rules {
            if !rule.matches(op, range.clone()) {
                continue;
            }
            *seen += 1;
            let acted = seen.saturating_sub(rule.after + 1);
            if *seen <= rule.after || rule.times.is_some_and(|t| acted >= t) {
                continue;
            }
            match rule.effect {
                Effect::Fail => fail = Some(ErrorKind::Io),
                Effect::Error(kind) => fail = Some(kind),
                Effect::Delay(d) => delay += d,
            }
        }
        Ok((delay, fail))
    }
}

fn io_error(lba: u64, what: &str) -> BlockError {
    BlockError::Io { lba, source: std::io::Error::other(what.to_owned()) }
}

/// A RAM block device with a volatile write cache and faults on demand; deterministic under
/// its seed. Cloning gives another handle on the same device.
#[derive(Clone)]
pub struct FaultDev {
    state: Arc<Mutex<State>>,
    geometry: Geometry,
}

impl FaultDev {
    /// A zeroed device of `num_blocks` blocks of `block_size` bytes, with a volatile cache and
    /// discard, whose random choices follow `seed`.
    pub fn new(block_size: u32, num_blocks: u64, seed: u64) -> FaultDev {
        let geometry = Geometry { block_size, num_blocks };
        FaultDev { state: Arc::new(Mutex::new(State::new(geometry, seed))), geometry }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Without a volatile cache every completed write is durable.
    pub fn set_volatile_cache(&self, on: bool) {
        self.lock().volatile = on;
    }

    pub fn set_discard(&self, on: bool) {
        self.lock().discard = on;
    }

    /// What [`FaultDev::crash`] (and a torn write) does with unflushed writes.
    pub fn set_crash_mode(&self, mode: CrashMode) {
        self.lock().crash_mode = mode;
    }

    pub fn add_rule(&self, rule: Rule) {
        self.lock().rules.push((rule, 0));
    }

    pub fn clear_rules(&self) {
        self.lock().rules.clear();
    }

    /// Lets `skip` more writes through, then tears the next one after `at_byte` bytes of its
    /// buffer: power fails while the medium writes it, so that prefix lands (a block it cuts
    /// through holds new bytes, then old), the write returns an I/O error, and the device
    /// crashes as [`FaultDev::crash`] does.
    pub fn tear_write(&self, skip: u64, at_byte: usize) {
        self.lock().tear = Some((skip, at_byte));
    }

    /// Power loss: unflushed writes are dropped (or some kept, see [`CrashMode`]) and every
    /// later operation on this device fails, as on a disk that is gone; [`FaultDev::reopen`]
    /// gives the disk back.
    pub fn crash(&self) {
        self.lock().crash();
    }

    /// A power cycle seen from the remote's initiator: the unflushed writes are lost (or some
    /// kept, see [`CrashMode`]) as on a crash, the device works again at once on this same
    /// handle, and its reset count ([`BlockDev::resets`]) moves, as an initiator's does when it
    /// reconnects and sees the power-on unit attention.
    pub fn power_cycle(&self) {
        let mut s = self.lock();
        s.crash();
        s.down = false;
        s.resets += 1;
    }

    /// With claims on, [`BlockDev::claim`] keeps one holder's key as a reserved LUN does: the
    /// first key holds it, the same key again takes it over, another key is refused naming the
    /// holder. Writes are not fenced. Off (the default), claims are unsupported, as on a local disk.
    pub fn set_claims(&self, on: bool) {
        self.lock().claims = on;
    }

    /// The key that holds the device, with claims on.
    pub fn holder(&self) -> Option<u64> {
        self.lock().holder
    }

    pub fn is_down(&self) -> bool {
        self.lock().down
    }

    /// A new, working device holding what this one had made durable (after a crash: what
    /// survived it). Rules and the tear are not carried over; the crash mode and cache settings are.
    pub fn reopen(&self) -> FaultDev {
        let mut old = self.lock();
        let mut s = State::new(self.geometry, old.rng.next_u64());
        s.durable = old.durable.clone();
        for (lba, h) in &old.pending {
            if let Some(b) = h.last() {
                // A device reopened without a crash has nothing to lose: its cache is the medium's.
                s.durable.insert(*lba, b.clone());
            }
        }
        (s.volatile, s.discard, s.crash_mode) = (old.volatile, old.discard, old.crash_mode);
        old.down = true;
        FaultDev { state: Arc::new(Mutex::new(s)), geometry: self.geometry }
    }

    /// The medium's content of `blocks` blocks from `lba` (what a crash now would leave, with
    /// [`CrashMode::DropAll`]).
    pub fn read_durable(&self, lba: u64, blocks: u64) -> Vec<u8> {
        let s = self.lock();
        (lba..lba + blocks).flat_map(|l| s.durable_block(l).to_vec()).collect()
    }

    /// What a read sees: the medium with the cached writes over it.
    pub fn read_volatile(&self, lba: u64, blocks: u64) -> Vec<u8> {
        let s = self.lock();
        (lba..lba + blocks).flat_map(|l| s.volatile_block(l).to_vec()).collect()
    }

    /// Blocks with writes not yet flushed.
    pub fn dirty_blocks(&self) -> usize {
        self.lock().pending.len()
    }

    /// How many operations of kind `op` were asked for (including failed ones).
    pub fn count(&self, op: Op) -> u64 {
        self.lock().counts[op as usize]
    }

    /// Counts and applies rules, then waits out any delay; Err if the operation fails.
    async fn admit(&self, op: Op, range: Option<Range<u64>>) -> Result<(), BlockError> {
        let lba = range.as_ref().map_or(0, |r| r.start);
        let (delay, fail) = self.lock().admit(op, range)?;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
            if self.lock().down {
                return Err(io_error(lba, "device went down during the operation"));
            }
        }
        match fail {
            Some(kind) => Err(kind.error(lba, op)),
            None => Ok(()),
        }
    }

    fn store(&self, lba: u64, data: &[u8], fua: bool) -> Result<(), BlockError> {
        let mut s = self.lock();
        if s.down {
            return Err(io_error(lba, "device went down during the operation"));
        }
        let bs = s.geometry.block_size as usize;
        for (i, chunk) in data.chunks(bs).enumerate() {
            s.put(lba + i as u64, chunk.into(), fua);
        }
        Ok(())
    }

    /// The torn write of [`FaultDev::tear_write`], if this write is the one.
    fn torn(&self, lba: u64, data: &[u8]) -> Result<(), BlockError> {
        let mut s = self.lock();
        let at = match &mut s.tear {
            Some((0, at)) => *at,
            Some((skip, _)) => {
                *skip -= 1;
                return Ok(());
            }
            None => return Ok(()),
        };
        s.tear = None;
        let bs = s.geometry.block_size as usize;
        let prefix = &data[..at.min(data.len())];
        for (i, chunk) in prefix.chunks(bs).enumerate() {
            let l = lba + i as u64;
            let mut block = s.durable_block(l).to_vec();
            block[..chunk.len()].copy_from_slice(chunk);
            s.put(l, block.into(), true);
        }
        s.crash();
        Err(io_error(lba + (at / bs) as u64, "power failed during the write"))
    }
}

#[async_trait]
impl BlockDev for FaultDev {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn resets(&self) -> u64 {
        self.lock().resets
    }

    fn volatile_cache(&self) -> bool {
        self.lock().volatile
    }

    fn supports_discard(&self) -> bool {
        self.lock().discard
    }

    async fn claim(&self, key: u64) -> Result<Claim, BlockError> {
        let mut s = self.lock();
        if !s.claims {
            return Ok(Claim::Unsupported);
        }
        match s.holder {
            Some(k) if k != key => Err(BlockError::Reserved { holder: Some(k) }),
            Some(_) => Ok(Claim::TakenOver),
            None => {
                s.holder = Some(key);
                Ok(Claim::Held)
            }
        }
    }

    async fn read(&self, lba: u64, blocks: u32) -> Result<Bytes, BlockError> {
        self.admit(Op::Read, Some(lba..lba + u64::from(blocks))).await?;
        let s = self.lock();
        if s.down {
            return Err(io_error(lba, "device went down during the operation"));
        }
        Ok((lba..lba + u64::from(blocks)).flat_map(|l| s.volatile_block(l).to_vec()).collect::<Vec<u8>>().into())
    }

    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> Result<(), BlockError> {
        let blocks = blocks_in(&data, self.geometry.block_size)?;
        self.admit(Op::Write, Some(lba..lba + blocks)).await?;
        self.torn(lba, &data)?;
        self.store(lba, &data, fua)
    }

    async fn flush(&self) -> Result<(), BlockError> {
        self.admit(Op::Flush, None).await?;
        let mut s = self.lock();
        if s.down {
            return Err(io_error(0, "device went down during the operation"));
        }
        let pending = std::mem::take(&mut s.pending);
        for (lba, mut history) in pending {
            if let Some(b) = history.pop() {
                s.durable.insert(lba, b);
            }
        }
        Ok(())
    }

    async fn write_zeros(&self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        self.admit(Op::WriteZeros, Some(lba..lba + blocks)).await?;
        self.zero_range(lba, blocks)
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        if !self.supports_discard() {
            return Err(BlockError::Unsupported("discard"));
        }
        self.admit(Op::Discard, Some(lba..lba + blocks)).await?;
        self.zero_range(lba, blocks)
    }
}

impl FaultDev {
    fn zero_range(&self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        let mut s = self.lock();
        if s.down {
            return Err(io_error(lba, "device went down during the operation"));
        }
        let zero = s.zero();
        for l in lba..lba + blocks {
            s.put(l, zero.clone(), false);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pattern::{check, check_at, stamp, stamp_run, Bad};

    const BS: usize = 512;

    fn dev(seed: u64) -> FaultDev {
        FaultDev::new(BS as u32, 1024, seed)
    }

    async fn write(d: &FaultDev, lba: u64, version: u64, blocks: u64, fua: bool) -> Result<(), BlockError> {
        d.write(lba, stamp_run(lba, blocks, version, BS), fua).await
    }

    #[tokio::test]
    async fn claims_keep_one_holder_when_asked_to() {
        let d = FaultDev::new(BS as u32, 16, 1);
        assert_eq!(d.claim(7).await.unwrap(), Claim::Unsupported);
        d.set_claims(true);
        assert_eq!(d.claim(7).await.unwrap(), Claim::Held);
        assert_eq!(d.claim(7).await.unwrap(), Claim::TakenOver);
        assert!(matches!(d.claim(8).await, Err(BlockError::Reserved { holder: Some(7) })));
        assert_eq!(d.holder(), Some(7));
    }

    #[tokio::test]
    async fn writes_read_back_at_once_and_reach_the_medium_on_flush() {
        let d = dev(1);
        assert!(d.volatile_cache());
        write(&d, 10, 1, 4, false).await.unwrap();
        assert_eq!(&d.read(10, 4).await.unwrap()[..], &stamp_run(10, 4, 1, BS)[..]);
        assert_eq!(d.read_durable(10, 4), vec![0u8; 4 * BS]);
        assert_eq!(d.dirty_blocks(), 4);
        d.flush().await.unwrap();
        assert_eq!(d.read_durable(10, 4), stamp_run(10, 4, 1, BS));
        assert_eq!(d.dirty_blocks(), 0);
        assert_eq!((d.count(Op::Write), d.count(Op::Read), d.count(Op::Flush)), (1, 1, 1));
    }

    #[tokio::test]
    async fn fua_and_cacheless_writes_are_durable_on_completion() {
        let d = dev(1);
        write(&d, 0, 1, 1, false).await.unwrap();
        write(&d, 0, 2, 1, true).await.unwrap();
        d.crash();
        let r = d.reopen();
        assert_eq!(check_at(&r.read(0, 1).await.unwrap(), 0, 2..=2), Ok(2));
        r.set_volatile_cache(false);
        assert!(!r.volatile_cache());
        write(&r, 1, 1, 1, false).await.unwrap();
        r.crash();
        assert_eq!(check(&r.reopen().read_durable(1, 1)), Ok((1, 1)));
    }

    #[tokio::test]
    async fn crash_drops_unflushed_writes_and_the_device_is_gone_until_reopened() {
        let d = dev(1);
        write(&d, 0, 1, 8, false).await.unwrap();
        d.flush().await.unwrap();
        write(&d, 4, 2, 8, false).await.unwrap();
        d.crash();
        assert!(d.is_down());
        assert!(matches!(d.read(0, 1).await, Err(BlockError::Io { .. })));
        assert!(matches!(write(&d, 0, 3, 1, true).await, Err(BlockError::Io { .. })));
        let r = d.reopen();
        let b = r.read(0, 12).await.unwrap();
        for l in 0..12u64 {
            let block = &b[l as usize * BS..][..BS];
            let want = if l < 8 { 1..=1 } else { 0..=0 };
            assert_eq!(check_at(block, l, want.clone()), Ok(*want.start()), "lba {l}");
        }
    }

    async fn crash_keeping_random(seed: u64) -> Vec<u64> {
        let d = dev(seed);
        d.set_crash_mode(CrashMode::KeepRandom);
        for v in 1..=3 {
            write(&d, 0, v, 64, false).await.unwrap();
        }
        d.crash();
        let r = d.reopen();
        (0..64).map(|l| check_at(&r.read_durable(l, 1), l, 0..=3).unwrap()).collect()
    }

    #[tokio::test]
    async fn crash_keeps_a_seeded_random_subset_in_write_order() {
        let a = crash_keeping_random(7).await;
        assert_eq!(a, crash_keeping_random(7).await, "same seed, same survivors");
        assert_ne!(a, crash_keeping_random(8).await);
        // Every version 0..=3 survives somewhere among 64 blocks; a block never holds a torn mix.
        for v in 0..=3 {
            assert!(a.contains(&v), "version {v} in {a:?}");
        }
        let d = dev(1);
        d.set_crash_mode(CrashMode::KeepAll);
        write(&d, 0, 1, 2, false).await.unwrap();
        d.crash();
        assert_eq!(d.reopen().read_durable(0, 2), stamp_run(0, 2, 1, BS));
    }

    #[tokio::test]
    async fn a_torn_write_lands_only_its_prefix_and_crashes_the_device() {
        let d = dev(1);
        write(&d, 0, 1, 3, false).await.unwrap();
        d.flush().await.unwrap();
        write(&d, 5, 1, 1, false).await.unwrap();
        d.tear_write(1, BS + 100);
        write(&d, 3, 1, 1, false).await.unwrap();
        let e = write(&d, 0, 2, 3, false).await.unwrap_err();
        assert!(matches!(e, BlockError::Io { lba: 1, .. }), "{e}");
        assert!(d.is_down());
        let r = d.reopen();
        let got = r.read(0, 6).await.unwrap();
        let block = |l: usize| &got[l * BS..(l + 1) * BS];
        assert_eq!(check(block(0)), Ok((0, 2)));
        assert!(matches!(check(block(1)), Err(Bad::Torn { .. })));
        assert_eq!(&block(1)[..100], &stamp(1, 2, BS)[..100]);
        assert_eq!(&block(1)[100..], &stamp(1, 1, BS)[100..]);
        assert_eq!(check(block(2)), Ok((2, 1)));
        // The unflushed writes before the torn one were lost with the power.
        assert_eq!(check(block(3)), Err(Bad::Blank));
        assert_eq!(check(block(5)), Err(Bad::Blank));
    }

    #[tokio::test]
    async fn rules_fail_chosen_operations_by_kind_count_and_range() {
        let d = dev(1);
        d.add_rule(Rule::fail(Op::Write).lbas(100..200).after(1).times(2));
        d.add_rule(Rule::fail(Op::Flush).times(1));
        for _ in 0..3 {
            write(&d, 0, 1, 1, false).await.unwrap();
        }
        write(&d, 150, 1, 1, false).await.unwrap();
        assert!(matches!(write(&d, 199, 1, 2, false).await, Err(BlockError::Io { lba: 199, .. })));
        assert!(write(&d, 150, 2, 1, false).await.is_err());
        write(&d, 150, 3, 1, false).await.unwrap();
        assert!(d.flush().await.is_err());
        d.flush().await.unwrap();
        assert_eq!(check(&d.read_durable(150, 1)), Ok((150, 3)));
        // A failed write leaves nothing behind.
        assert_eq!(check(&d.read_durable(199, 1)), Err(Bad::Blank));
        assert!(d.read(1000, 100).await.is_err(), "out of range");
        d.add_rule(Rule::fail(Op::Read));
        assert!(d.read(0, 1).await.is_err());
        d.clear_rules();
        d.read(0, 1).await.unwrap();
        assert_eq!(d.count(Op::Write), 7);
    }

    #[tokio::test]
    async fn error_rules_return_the_chosen_kind_until_cleared() {
        let d = dev(1);
        d.add_rule(Rule::error(Op::Write, ErrorKind::NoSpace));
        d.add_rule(Rule::error(Op::Flush, ErrorKind::Reserved));
        assert!(matches!(write(&d, 3, 1, 1, false).await, Err(BlockError::NoSpace(_))));
        assert!(matches!(d.flush().await, Err(BlockError::Reserved { holder: None })));
        d.read(3, 1).await.unwrap();
        d.clear_rules();
        for (kind, want) in
            [(ErrorKind::Io, "I/O"), (ErrorKind::WriteProtected, "write-protected"), (ErrorKind::Busy, "busy")]
        {
            d.add_rule(Rule::error(Op::Write, kind).times(1));
            let e = write(&d, 3, 2, 1, false).await.unwrap_err();
            assert!(e.to_string().to_lowercase().contains(&want.to_lowercase()), "{kind:?}: {e}");
            assert!(matches!(kind, ErrorKind::Io) == matches!(e, BlockError::Io { lba: 3, .. }), "{kind:?}: {e:?}");
        }
        write(&d, 3, 3, 1, false).await.unwrap();
        assert_eq!(check(&d.read_volatile(3, 1)), Ok((3, 3)), "a refused write leaves nothing behind");
    }

    #[tokio::test(start_paused = true)]
    async fn rules_delay_operations_in_tokio_time() {
        let d = dev(1);
        d.add_rule(Rule::delay(Op::Read, Duration::from_secs(30)).lbas(0..1));
        let t0 = tokio::time::Instant::now();
        d.read(1, 1).await.unwrap();
        assert_eq!(t0.elapsed(), Duration::ZERO);
        d.read(0, 1).await.unwrap();
        assert!(t0.elapsed() >= Duration::from_secs(30));
        // A crash while an operation waits fails it.
        let slow = tokio::spawn({
            let d = d.clone();
            async move { d.read(0, 1).await }
        });
        tokio::task::yield_now().await;
        d.crash();
        assert!(slow.await.unwrap().is_err());
    }

    #[tokio::test]
    async fn zeroing_and_discard_are_cached_writes_of_zeros() {
        let d = dev(1);
        write(&d, 0, 1, 4, true).await.unwrap();
        d.write_zeros(0, 2).await.unwrap();
        d.discard(2, 1).await.unwrap();
        assert!(d.read(0, 3).await.unwrap().iter().all(|&b| b == 0));
        assert_eq!(check(&d.read_durable(2, 1)), Ok((2, 1)), "not durable before a flush");
        d.set_discard(false);
        assert!(matches!(d.discard(0, 1).await, Err(BlockError::Unsupported(_))));
        assert_eq!((d.count(Op::WriteZeros), d.count(Op::Discard)), (1, 1));
    }
}

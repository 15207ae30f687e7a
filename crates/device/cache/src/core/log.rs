//! Group commit: host writes wait in RAM, go to the log in records (each one write and one flush
//! of the log device, for every write waiting), and are acknowledged by the mode's rule; epochs
//! are cut here; log space is given back once a durable checkpoint has left it behind.

use std::collections::VecDeque;

use bytes::Bytes;

use super::{Core, CoreError, Loc, Submitted, Ticket, Version};
use crate::config::Mode;
use crate::format::{Checkpoint, Entry, ExtentKind, RecordHeader, LOG_BLOCK};

/// One host write waiting for the log.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    lba: u64,
    blocks: u32,
    kind: ExtentKind,
    data: Bytes,
    write_seq: u64,
    epoch: u64,
}

/// A live (or pinned) record on the ring.
#[derive(Debug, Clone)]
pub(crate) struct RecInfo {
    pub(crate) seq: u64,
    pub(crate) offset: u64,
    pub(crate) len: u64,
    pub(crate) max_epoch: u64,
    /// Destaged and synchronised: kept only while a read may still be using its slots.
    pub(crate) freed: bool,
    pub(crate) pins: u32,
}

/// What a waiting request needs.
#[derive(Debug, Clone, Copy)]
enum Until {
    /// Every write with a lower write sequence number durable in the log.
    Log(u64),
    /// This epoch on the remote (write-through while the log holds dirty data).
    Remote(u64),
}

/// A request that waits.
#[derive(Debug, Clone, Copy)]
struct Waiter {
    ticket: Ticket,
    until: Until,
}

/// What the driver writes to the log next: one record at `offset`, then a flush of the log. If
/// either fails it writes the same bytes at the same place again: a record retried elsewhere, or
/// under another sequence number, would leave an intact first copy that ends recovery's scan of
/// the chain early.
#[derive(Debug, Clone)]
pub struct RecordWrite {
    /// Sequence number, to report back in [`Core::record_durable`].
    pub seq: u64,
    /// Device offset.
    pub offset: u64,
    /// Header followed by the slots, padded to the log block.
    pub bytes: Vec<u8>,
}

/// Group commit's state.
#[derive(Debug)]
pub(crate) struct LogState {
    next_write_seq: u64,
    /// The open epoch.
    pub(crate) epoch: u64,
    epoch_has_writes: bool,
    epoch_acked: bool,
    epoch_writes: u64,
    epoch_bytes: u64,
    pending: VecDeque<Pending>,
    pending_bytes: u64,
    /// The record being written: its sequence number, its writes and its offset.
    in_flight: Option<(u64, Vec<Pending>, u64)>,
    next_seq: u64,
    tail: u64,
    /// Live records in sequence order (consecutive numbers, so a record's index is its number
    /// minus the first's); their offsets ascend from the head, then wrap to the ring's start.
    pub(crate) records: VecDeque<RecInfo>,
    /// How many records at the front are freed.
    freed_prefix: usize,
    /// Bytes of the ring the records take.
    used: u64,
    waiters: Vec<Waiter>,
    next_ticket: Ticket,
    /// The checkpoint last handed out by [`Core::take_checkpoint`].
    last_checkpoint: Checkpoint,
    /// Head sequence number of the newest checkpoint known durable: records before it may be
    /// overwritten (before that, a crash would scan from an older head into reused space).
    durable_head_seq: u64,
    /// The destaged epoch of the newest checkpoint known durable. The next epoch's destage waits
    /// for it: were epoch `k` replayed after a crash on top of epoch `k + 1`'s writes, the
    /// remote would go back to a state the host never saw.
    pub(crate) durable_destaged_epoch: u64,
}

impl LogState {
    pub(crate) fn new(checkpoint: Checkpoint) -> LogState {
        LogState {
            next_write_seq: 1,
            epoch: checkpoint.destaged_epoch + 1,
            epoch_has_writes: false,
            epoch_acked: false,
            epoch_writes: 0,
            epoch_bytes: 0,
            pending: VecDeque::new(),
            pending_bytes: 0,
            in_flight: None,
            next_seq: checkpoint.head_seq,
            tail: checkpoint.head_offset,
            records: VecDeque::new(),
            freed_prefix: 0,
            used: 0,
            waiters: Vec::new(),
            next_ticket: 1,
            last_checkpoint: checkpoint,
            durable_head_seq: checkpoint.head_seq,
            durable_destaged_epoch: checkpoint.destaged_epoch,
        }
    }

    /// A record recovery found, in sequence order.
    pub(crate) fn push_record(&mut self, offset: u64, seq: u64, len: u64, max_epoch: u64, freed: bool) {
        if freed && self.freed_prefix == self.records.len() {
            self.freed_prefix += 1;
        }
        self.records.push_back(RecInfo { seq, offset, len, max_epoch, freed, pins: 0 });
        self.used += len;
    }

    /// Where recovery leaves the log: the open epoch, the next write's number, where the next
    /// record goes and its sequence number.
    pub(crate) fn resume(&mut self, epoch: u64, next_write_seq: u64, tail: u64, next_seq: u64) {
        self.epoch = epoch;
        self.next_write_seq = next_write_seq;
        self.tail = tail;
        self.next_seq = next_seq;
    }

    /// Writes wait in RAM and no record is being written: the ring has no room for the next.
    pub(crate) fn waiting_for_room(&self) -> bool {
        !self.pending.is_empty() && self.in_flight.is_none()
    }

    /// Nothing waits in RAM or is being written.
    pub(crate) fn is_idle(&self) -> bool {
        self.pending.is_empty() && self.in_flight.is_none()
    }

    /// The lowest write sequence number not yet durable in the log: records are written one at
    /// a time and in order, so it is the first write in flight, else the first still in RAM.
    pub(crate) fn durable_write(&self) -> u64 {
        if let Some(p) = self.in_flight.as_ref().and_then(|(_, w, _)| w.first()) {
            return p.write_seq;
        }
        self.pending.front().map_or(self.next_write_seq, |p| p.write_seq)
    }

    fn record_index(&self, seq: u64) -> Option<usize> {
        let first = self.records.front()?.seq;
        let i = usize::try_from(seq.checked_sub(first)?).ok()?;
        (i < self.records.len()).then_some(i)
    }

    /// The record whose bytes hold device offset `offset`.
    pub(crate) fn record_of(&self, offset: u64) -> Option<u64> {
        let head = self.records.front()?.offset;
        let n = self.records.len();
        // Records at or after the head come first, then those that wrapped to the ring's start.
        let wrap = partition(n, |i| self.records[i].offset >= head);
        let (lo, hi) = if offset >= head { (0, wrap) } else { (wrap, n) };
        let after = lo + partition(hi - lo, |i| self.records[lo + i].offset <= offset);
        let r = &self.records[after.checked_sub(1).filter(|&i| i >= lo)?];
        (offset < r.offset + r.len).then_some(r.seq)
    }

    pub(crate) fn pin(&mut self, seq: u64) {
        if let Some(i) = self.record_index(seq) {
            self.records[i].pins += 1;
        }
    }

    pub(crate) fn unpin(&mut self, seq: u64) {
        if let Some(i) = self.record_index(seq) {
            self.records[i].pins = self.records[i].pins.saturating_sub(1);
        }
    }

    /// Marks freed the records that hold only epochs up to `epoch` (they form a prefix: a
    /// record takes the oldest writes waiting, so records' newest epochs never go down).
    pub(crate) fn free_up_to(&mut self, epoch: u64) {
        while self.freed_prefix < self.records.len() && self.records[self.freed_prefix].max_epoch <= epoch {
            // The record in flight holds newer writes than any destaged epoch: never freed here.
            if self.in_flight.as_ref().is_some_and(|(s, _, _)| *s == self.records[self.freed_prefix].seq) {
                break;
            }
            self.records[self.freed_prefix].freed = true;
            self.freed_prefix += 1;
        }
    }
}

/// The number of leading indices in `0..n` for which `pred` holds (it must hold for a prefix).
fn partition(n: usize, pred: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pred(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

impl Core {
    /// Bytes of the ring in use by live or pinned records.
    pub fn log_used(&self) -> u64 {
        self.log.used
    }

    /// Fraction of the ring in use, 0.0–1.0.
    pub fn log_fill(&self) -> f64 {
        self.log.used as f64 / (self.layout.ring_end - self.layout.ring_start).max(1) as f64
    }

    /// Bytes of host writes in RAM waiting for the log.
    pub fn ram_used(&self) -> u64 {
        self.log.pending_bytes
    }

    /// True when a write of `bytes` fits in RAM now; otherwise the driver waits for the log.
    pub fn ram_has_room(&self, bytes: u64) -> bool {
        self.log.pending_bytes == 0 || self.log.pending_bytes + bytes <= self.cfg.ram_bytes
    }

    /// Bytes in RAM that were acknowledged and are not in the log yet: what a shutdown must
    /// write out before it may end (only `immediate` mode acknowledges before the log).
    pub fn acknowledged_in_ram(&self) -> u64 {
        if self.cfg.mode != Mode::Immediate {
            return 0;
        }
        let in_flight: u64 =
            self.log.in_flight.as_ref().map_or(0, |(_, w, _)| w.iter().map(|p| p.data.len() as u64).sum());
        self.log.pending_bytes + in_flight
    }

    /// Starts a new epoch if the rules ask for one before a write arrives.
    fn before_write(&mut self, bytes: u64) {
        let l = &self.log;
        let full = l.epoch_writes >= self.cfg.epoch_max_writes || l.epoch_bytes >= self.cfg.epoch_max_bytes;
        if full || self.cfg.mode == Mode::Log && l.epoch_acked {
            self.close_epoch();
        }
        self.log.epoch_writes += 1;
        self.log.epoch_bytes += bytes;
    }

    pub(crate) fn close_epoch(&mut self) {
        let l = &mut self.log;
        if l.epoch_has_writes {
            l.epoch += 1;
            l.epoch_has_writes = false;
            l.epoch_acked = false;
            l.epoch_writes = 0;
            l.epoch_bytes = 0;
        }
    }

    fn ticket(&mut self) -> Ticket {
        let t = self.log.next_ticket;
        self.log.next_ticket += 1;
        t
    }

    fn wait_for_all(&mut self) -> Submitted {
        let until_write = self.log.next_write_seq;
        if self.log.durable_write() >= until_write {
            return Submitted::Done;
        }
        let ticket = self.ticket();
        self.log.waiters.push(Waiter { ticket, until: Until::Log(until_write) });
        Submitted::Wait(ticket)
    }

    /// A write-through request finds nothing dirty: the remote takes it directly. The read
    /// cache's copy of those blocks goes now, and once more when the remote has answered (a
    /// read that raced the write may have put the old content back).
    fn direct(&mut self, lba: u64, blocks: u64) -> Submitted {
        self.read.cache.remove_range(lba, lba + blocks);
        self.stats.direct_writes += 1;
        Submitted::Remote
    }

    /// A host write of whole blocks at `lba`.
    pub fn write(&mut self, lba: u64, data: Bytes, fua: bool) -> Result<Submitted, CoreError> {
        let bs = self.layout.block_size as usize;
        if data.is_empty() || !data.len().is_multiple_of(bs) {
            return Err(CoreError::Misaligned { len: data.len(), block_size: self.layout.block_size });
        }
        let blocks = (data.len() / bs) as u64;
        self.check(lba, blocks)?;
        if self.direct_writes() {
            return Ok(self.direct(lba, blocks));
        }
        self.before_write(data.len() as u64);
        let (epoch, write_seq) = (self.log.epoch, self.log.next_write_seq);
        self.log.next_write_seq += 1;
        self.install(lba, blocks, Version::new(Loc::Ram(data.clone()), write_seq, epoch, false));
        self.log.pending_bytes += data.len() as u64;
        self.push_pending(lba, blocks, ExtentKind::Data, data, write_seq, epoch);
        Ok(self.after_write(fua))
    }

    /// A host request to zero (or, with `discard`, deallocate) blocks: they read as zeros.
    pub fn zero(&mut self, lba: u64, blocks: u64, discard: bool) -> Result<Submitted, CoreError> {
        self.check(lba, blocks)?;
        if self.direct_writes() {
            return Ok(self.direct(lba, blocks));
        }
        self.before_write(0);
        let (epoch, write_seq) = (self.log.epoch, self.log.next_write_seq);
        self.log.next_write_seq += 1;
        self.install(lba, blocks, Version::new(Loc::Zero, write_seq, epoch, discard));
        let kind = if discard { ExtentKind::Discard } else { ExtentKind::Zero };
        // Extents of at most u32::MAX blocks each.
        let mut at = lba;
        while at < lba + blocks {
            let n = (lba + blocks - at).min(u64::from(u32::MAX));
            self.push_pending(at, n, kind, Bytes::new(), write_seq, epoch);
            at += n;
        }
        Ok(self.after_write(false))
    }

    /// Drops what blocks `lba..lba + blocks` hold dirty: they never reach the remote, and read as
    /// the remote has them from now on. The drop is logged (a `Forget` extent), so that recovery
    /// does not bring them back; done once that record is durable.
    pub fn forget(&mut self, lba: u64, blocks: u64) -> Result<Submitted, CoreError> {
        self.check(lba, blocks)?;
        self.before_write(0);
        let (epoch, write_seq) = (self.log.epoch, self.log.next_write_seq);
        self.log.next_write_seq += 1;
        self.drop_dirty(lba, blocks, epoch);
        let mut at = lba;
        while at < lba + blocks {
            let n = (lba + blocks - at).min(u64::from(u32::MAX));
            self.push_pending(at, n, ExtentKind::Forget, Bytes::new(), write_seq, epoch);
            at += n;
        }
        Ok(self.wait_for_all())
    }

    /// A write-through request the remote carried out (or failed: the remote may hold either
    /// content now): remote data read before this point may be stale.
    pub fn direct_done(&mut self, lba: u64, blocks: u64) {
        self.invalidate(lba, lba + blocks);
    }

    fn push_pending(&mut self, lba: u64, blocks: u64, kind: ExtentKind, data: Bytes, write_seq: u64, epoch: u64) {
        self.log.epoch_has_writes = true;
        self.log.pending.push_back(Pending { lba, blocks: blocks as u32, kind, data, write_seq, epoch });
    }

    fn after_write(&mut self, fua: bool) -> Submitted {
        let r = match (self.cfg.mode, fua) {
            (Mode::WriteThrough, _) => {
                // The log holds dirty data from an earlier run: this write reaches the remote
                // through it, in order, and is acknowledged once destage put it there.
                let (ticket, epoch) = (self.ticket(), self.log.epoch);
                self.log.waiters.push(Waiter { ticket, until: Until::Remote(epoch) });
                self.close_epoch();
                return Submitted::Wait(ticket);
            }
            (Mode::Immediate, false) => Submitted::Done,
            _ => self.wait_for_all(),
        };
        // In `log` mode every write is durable once acknowledged, FUA or not (a target with
        // WCE=0 sends every write with FUA): the acknowledgement ends the epoch for whatever
        // the host issues after it, and closing it here would give each write an epoch of its
        // own, with a remote flush of its own.
        if fua && self.cfg.mode == Mode::Immediate {
            self.close_epoch();
        }
        if r == Submitted::Done {
            self.log.epoch_acked = true;
        }
        r
    }

    /// A host flush: every write acknowledged before it becomes durable; ends the epoch. In
    /// write-through mode the remote flushes, or, while the log holds dirty data, the flush
    /// waits until destage has put every earlier write on the remote and flushed it there.
    pub fn flush(&mut self) -> Submitted {
        if self.cfg.mode == Mode::WriteThrough {
            if self.direct_writes() {
                return Submitted::Remote;
            }
            // Writes that went through the log are acknowledged once destaged and flushed;
            // the flush waits for every one issued before it, as the other modes' flushes do.
            self.close_epoch();
            let last = self.log.epoch - 1;
            if last <= self.destaged_epoch {
                return Submitted::Done;
            }
            let ticket = self.ticket();
            self.log.waiters.push(Waiter { ticket, until: Until::Remote(last) });
            return Submitted::Wait(ticket);
        }
        self.close_epoch();
        self.wait_for_all()
    }

    /// The next record to write to the log, when none is in flight, writes are waiting and the
    /// ring has room. The driver writes it, flushes the log device, then calls
    /// [`Core::record_durable`].
    pub fn next_record(&mut self) -> Option<RecordWrite> {
        if self.log.in_flight.is_some() || self.log.pending.is_empty() {
            return None;
        }
        let bs = u64::from(self.layout.block_size);
        // Take writes while the record stays under the limit (always at least one).
        let mut take = 0usize;
        let mut data = 0u64;
        for p in &self.log.pending {
            let d = if p.kind.has_slots() { u64::from(p.blocks) * bs } else { 0 };
            let len = RecordHeader::header_len(take + 1) + (data + d).div_ceil(LOG_BLOCK) * LOG_BLOCK;
            if take > 0 && len > self.cfg.max_record_bytes {
                break;
            }
            take += 1;
            data += d;
        }
        let len = RecordHeader::header_len(take) + data.div_ceil(LOG_BLOCK) * LOG_BLOCK;
        let offset = self.place(len)?;
        let writes: Vec<Pending> = self.log.pending.drain(..take).collect();
        let entries = writes
            .iter()
            .map(|p| Entry {
                lba: p.lba,
                blocks: p.blocks,
                kind: p.kind,
                write_seq: p.write_seq,
                epoch: p.epoch,
                data_crc: 0,
            })
            .collect();
        let header = RecordHeader {
            log_uuid: self.log_uuid,
            seq: self.log.next_seq,
            offset,
            block_size: self.layout.block_size,
            entries,
        };
        let bufs: Vec<&[u8]> = writes.iter().map(|p| p.data.as_ref()).collect();
        let Ok((_, bytes)) = crate::format::encode_record(header, &bufs) else {
            // The record is made from the cache's own entries; it cannot be refused. Put the
            // writes back rather than lose them.
            for p in writes.into_iter().rev() {
                self.log.pending.push_front(p);
            }
            return None;
        };
        let seq = self.log.next_seq;
        self.log.next_seq += 1;
        self.log.tail = offset + len;
        let max_epoch = writes.iter().map(|p| p.epoch).max().unwrap_or(0);
        self.log.push_record(offset, seq, len, max_epoch, false);
        self.log.in_flight = Some((seq, writes, offset));
        self.stats.records += 1;
        Some(RecordWrite { seq, offset, bytes })
    }

    /// Where a record of `len` bytes goes, if the ring has room for it.
    fn place(&self, len: u64) -> Option<u64> {
        let (start, end) = (self.layout.ring_start, self.layout.ring_end);
        if len > end - start {
            return None;
        }
        let tail = self.log.tail;
        let Some(head) = self.log.records.front().map(|r| r.offset) else {
            return Some(crate::scan::place(tail, len, end));
        };
        if tail > head {
            if tail + len <= end {
                return Some(tail);
            }
            return (start + len <= head).then_some(start);
        }
        // Wrapped: the free space is between the tail and the head.
        (tail + len <= head).then_some(tail)
    }

    /// The record `seq` and everything before it are durable on the log: returns the tickets
    /// to acknowledge.
    pub fn record_durable(&mut self, seq: u64) -> Vec<Ticket> {
        if let Some((_, writes, offset)) = self.log.in_flight.take_if(|(s, _, _)| *s == seq) {
            let bs = u64::from(self.layout.block_size);
            let mut slot = offset + RecordHeader::header_len(writes.len());
            for p in &writes {
                if p.kind.has_slots() {
                    self.log.pending_bytes -= p.data.len() as u64;
                    self.relocate(p.lba, &p.data, p.write_seq, p.epoch, slot);
                    slot += u64::from(p.blocks) * bs;
                }
            }
        }
        let durable = self.log.durable_write();
        let mut done = Vec::new();
        self.log.waiters.retain(|w| match w.until {
            Until::Log(until) if durable >= until => {
                done.push(w.ticket);
                false
            }
            _ => true,
        });
        if !done.is_empty() {
            self.log.epoch_acked = true;
        }
        done
    }

    /// Epoch `epoch` is on the remote: write-through writes waiting for it are done.
    pub(crate) fn remote_reached(&mut self, epoch: u64) {
        let acks = &mut self.acks;
        self.log.waiters.retain(|w| match w.until {
            Until::Remote(e) if e <= epoch => {
                acks.push(w.ticket);
                false
            }
            _ => true,
        });
    }

    /// A read that pinned these records has finished with the log.
    pub fn unpin(&mut self, pinned: &[u64]) {
        for &seq in pinned {
            self.log.unpin(seq);
        }
        self.release_freed();
    }

    /// Gives the space of freed records back to the ring: those no read uses and that a durable
    /// checkpoint has left behind.
    pub(crate) fn release_freed(&mut self) {
        let l = &mut self.log;
        while l.records.front().is_some_and(|r| r.freed && r.pins == 0 && r.seq < l.durable_head_seq) {
            if let Some(r) = l.records.pop_front() {
                l.used -= r.len;
                l.freed_prefix -= 1;
            }
        }
    }

    /// The checkpoint to write to the superblock (then flush the log and report it with
    /// [`Core::checkpoint_durable`]), if it changed since the last call.
    pub fn take_checkpoint(&mut self) -> Option<Checkpoint> {
        let cp = self.checkpoint();
        if cp == self.log.last_checkpoint {
            return None;
        }
        self.log.last_checkpoint = cp;
        Some(cp)
    }

    /// The checkpoint as of now: the oldest record not yet freed and the newest destaged epoch.
    pub fn checkpoint(&self) -> Checkpoint {
        let l = &self.log;
        let (head_offset, head_seq) = match l.records.get(l.freed_prefix) {
            Some(r) => (r.offset, r.seq),
            None => (l.tail, l.next_seq),
        };
        Checkpoint { head_offset, head_seq, destaged_epoch: self.destaged_epoch }
    }

    /// A checkpoint is durable on the log: the space before its head may be reused.
    pub fn checkpoint_durable(&mut self, cp: Checkpoint) {
        self.log.durable_head_seq = self.log.durable_head_seq.max(cp.head_seq);
        self.log.durable_destaged_epoch = self.log.durable_destaged_epoch.max(cp.destaged_epoch);
        let durable = self.log.durable_destaged_epoch;
        while self.destage.undurable.front().is_some_and(|&(e, _)| e <= durable) {
            self.destage.undurable.pop_front();
        }
        self.release_freed();
    }
}

#[cfg(test)]
mod tests {
    use super::partition;

    #[test]
    fn partition_counts_the_prefix_that_holds() {
        assert_eq!(partition(0, |_| true), 0);
        assert_eq!(partition(5, |i| i < 3), 3);
        assert_eq!(partition(5, |_| true), 5);
        assert_eq!(partition(5, |_| false), 0);
    }
}

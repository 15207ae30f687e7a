//! Write data of SCSI commands (RFC 7143 §4.2.5, §11.7, §11.8): immediate and unsolicited
//! data up to FirstBurstLength, then R2Ts of at most MaxBurstLength with at most
//! MaxOutstandingR2T outstanding, each Data-Out checked for TTT, DataSN, offset and length.
//! A session-wide budget bounds the write data buffered for commands still waiting for more.

#![deny(clippy::unwrap_used, clippy::indexing_slicing)]

use std::collections::{HashMap, VecDeque};

use bytes::{Bytes, BytesMut};
use stics_wire::pdu::{DataOut, RESERVED_TAG};

/// Negotiated limits that govern write data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Burst {
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub first_burst: u32,
    pub max_burst: u32,
    pub max_outstanding_r2t: u32,
}

/// A Data-Out or write command that breaks the rules; the task cannot complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DataError {
    /// More data than the Expected Data Transfer Length, or than FirstBurstLength unsolicited.
    #[error("data beyond the allowed length")]
    Overflow,
    /// Immediate or unsolicited data where the negotiation forbids it.
    #[error("unsolicited data not allowed")]
    Unsolicited,
    /// A DataSN other than the next one of its sequence.
    #[error("DataSN {got}, expected {want}")]
    DataSn { got: u32, want: u32 },
    /// A buffer offset other than where the data stands.
    #[error("buffer offset {got}, expected {want}")]
    Offset { got: u32, want: u32 },
    /// A Target Transfer Tag that names no outstanding R2T of this task.
    #[error("unknown target transfer tag {0:#x}")]
    Ttt(u32),
    /// The F bit set before the end of a sequence or missing at its end.
    #[error("F bit does not match the end of the sequence")]
    Final,
}

/// An R2T to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct R2tReq {
    pub itt: u32,
    pub lun: u64,
    pub ttt: u32,
    pub r2t_sn: u32,
    pub offset: u32,
    pub len: u32,
}

#[derive(Debug, Clone, Copy)]
struct Seq {
    ttt: u32,
    end: u32,
    data_sn: u32,
}

#[derive(Debug, Default)]
enum Buf {
    #[default]
    Empty,
    One(Bytes),
    Many(BytesMut),
}

impl Buf {
    fn push(&mut self, b: Bytes) {
        if b.is_empty() {
            return;
        }
        *self = match std::mem::take(self) {
            Buf::Empty => Buf::One(b),
            Buf::One(a) => {
                let mut m = BytesMut::with_capacity(a.len() + b.len());
                m.extend_from_slice(&a);
                m.extend_from_slice(&b);
                Buf::Many(m)
            }
            Buf::Many(mut m) => {
                m.extend_from_slice(&b);
                Buf::Many(m)
            }
        };
    }

    fn take(&mut self) -> Bytes {
        match std::mem::take(self) {
            Buf::Empty => Bytes::new(),
            Buf::One(b) => b,
            Buf::Many(m) => m.freeze(),
        }
    }
}

/// One write command collecting its data.
#[derive(Debug)]
pub struct WriteTask {
    itt: u32,
    lun: u64,
    edtl: u32,
    received: u32,
    buf: Buf,
    /// Unsolicited Data-Out still expected up to this offset (`None` once that phase ended).
    unsolicited: Option<(u32, u32)>,
    outstanding: VecDeque<Seq>,
    next_offset: u32,
    next_r2t_sn: u32,
    admitted: bool,
}

impl WriteTask {
    /// Starts a write with its immediate data. `final_` is the command's F bit.
    pub fn new(
        itt: u32,
        lun: u64,
        edtl: u32,
        immediate: Bytes,
        final_: bool,
        b: &Burst,
    ) -> Result<WriteTask, DataError> {
        let imm = u32::try_from(immediate.len()).map_err(|_| DataError::Overflow)?;
        if imm > 0 && !b.immediate_data {
            return Err(DataError::Unsolicited);
        }
        if imm > edtl || imm > b.first_burst {
            return Err(DataError::Overflow);
        }
        let unsolicited = if final_ {
            None
        } else {
            if b.initial_r2t {
                return Err(DataError::Unsolicited);
            }
            Some((b.first_burst.min(edtl), 0))
        };
        let mut buf = Buf::Empty;
        buf.push(immediate);
        Ok(WriteTask {
            itt,
            lun,
            edtl,
            received: imm,
            buf,
            unsolicited: unsolicited.filter(|(end, _)| *end > imm),
            outstanding: VecDeque::new(),
            next_offset: imm,
            next_r2t_sn: 0,
            admitted: false,
        })
    }

    /// True when every byte has arrived.
    pub fn complete(&self) -> bool {
        self.received >= self.edtl
    }

    /// The LUN field of the command.
    pub fn lun(&self) -> u64 {
        self.lun
    }

    /// The data collected so far (all of it once [`WriteTask::complete`]).
    pub fn take_data(&mut self) -> Bytes {
        self.buf.take()
    }

    /// Number of R2Ts sent so far (for ExpDataSN in the response).
    pub fn r2t_count(&self) -> u32 {
        self.next_r2t_sn
    }

    fn wants_r2t(&self, b: &Burst) -> bool {
        self.unsolicited.is_none()
            && self.next_offset < self.edtl
            && (self.outstanding.len() as u32) < b.max_outstanding_r2t
    }

    fn issue(&mut self, b: &Burst, next_ttt: &mut u32, out: &mut Vec<R2tReq>) {
        while self.wants_r2t(b) {
            let len = (self.edtl - self.next_offset).min(b.max_burst);
            let ttt = *next_ttt;
            *next_ttt = next_ttt.wrapping_add(1);
            if *next_ttt == RESERVED_TAG {
                *next_ttt = 0;
            }
            out.push(R2tReq {
                itt: self.itt,
                lun: self.lun,
                ttt,
                r2t_sn: self.next_r2t_sn,
                offset: self.next_offset,
                len,
            });
            self.outstanding.push_back(Seq { ttt, end: self.next_offset + len, data_sn: 0 });
            self.next_r2t_sn += 1;
            self.next_offset += len;
        }
    }

    /// Takes one Data-Out.
    fn data_out(&mut self, h: &DataOut, data: Bytes) -> Result<(), DataError> {
        let len = u32::try_from(data.len()).map_err(|_| DataError::Overflow)?;
        if h.buffer_offset != self.received {
            return Err(DataError::Offset { got: h.buffer_offset, want: self.received });
        }
        let end = self.received.checked_add(len).ok_or(DataError::Overflow)?;
        if h.ttt == RESERVED_TAG {
            let Some((limit, data_sn)) = self.unsolicited else { return Err(DataError::Unsolicited) };
            if h.data_sn != data_sn {
                return Err(DataError::DataSn { got: h.data_sn, want: data_sn });
            }
            if end > limit {
                return Err(DataError::Overflow);
            }
            self.unsolicited = if h.final_ || end == limit { None } else { Some((limit, data_sn + 1)) };
            if self.unsolicited.is_none() {
                self.next_offset = end;
            }
        } else {
            let seq = self.outstanding.front_mut().ok_or(DataError::Ttt(h.ttt))?;
            if seq.ttt != h.ttt {
                return Err(DataError::Ttt(h.ttt));
            }
            if h.data_sn != seq.data_sn {
                return Err(DataError::DataSn { got: h.data_sn, want: seq.data_sn });
            }
            if end > seq.end {
                return Err(DataError::Overflow);
            }
            if h.final_ != (end == seq.end) {
                return Err(DataError::Final);
            }
            seq.data_sn += 1;
            if end == seq.end {
                self.outstanding.pop_front();
            }
        }
        self.received = end;
        self.buf.push(data);
        Ok(())
    }
}

/// What a Data-Out did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// The task whose data is now complete (take it with [`Writes::take`]).
    pub complete: Option<u32>,
    /// R2Ts to send, for this or other tasks.
    pub r2ts: Vec<R2tReq>,
}

/// The write tasks of one session that still wait for data.
#[derive(Debug)]
pub struct Writes {
    burst: Burst,
    tasks: HashMap<u32, WriteTask>,
    /// Bytes the admitted tasks may still bring in, plus what they hold.
    reserved: u64,
    budget: u64,
    waiting: VecDeque<u32>,
    next_ttt: u32,
}

impl Writes {
    /// `budget` bounds the write data held for commands that are not complete yet.
    pub fn new(burst: Burst, budget: u64) -> Writes {
        Writes { burst, tasks: HashMap::new(), reserved: 0, budget, waiting: VecDeque::new(), next_ttt: 1 }
    }

    /// The negotiated limits.
    pub fn burst(&self) -> &Burst {
        &self.burst
    }

    /// Tasks waiting for data.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// True when no task waits for data.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// True if a task with this ITT waits for data.
    pub fn contains(&self, itt: u32) -> bool {
        self.tasks.contains_key(&itt)
    }

    /// Adds a task that needs more data and returns the R2Ts it can have now.
    pub fn add(&mut self, task: WriteTask) -> Vec<R2tReq> {
        let itt = task.itt;
        self.tasks.insert(itt, task);
        let mut out = Vec::new();
        self.try_admit(itt, &mut out);
        out
    }

    fn try_admit(&mut self, itt: u32, out: &mut Vec<R2tReq>) {
        let Some(t) = self.tasks.get_mut(&itt) else { return };
        if t.unsolicited.is_some() {
            return;
        }
        if !t.admitted {
            let need = u64::from(t.edtl);
            // A task larger than the whole budget still runs when it is alone.
            if self.reserved > 0 && self.reserved + need > self.budget {
                if !self.waiting.contains(&itt) {
                    self.waiting.push_back(itt);
                }
                return;
            }
            t.admitted = true;
            self.reserved += need;
        }
        t.issue(&self.burst, &mut self.next_ttt, out);
    }

    /// Takes one Data-Out for task `h.itt`. An error removes the task.
    pub fn data_out(&mut self, h: &DataOut, data: Bytes) -> Result<Progress, DataError> {
        let t = self.tasks.get_mut(&h.itt).ok_or(DataError::Ttt(h.ttt))?;
        if let Err(e) = t.data_out(h, data) {
            self.remove(h.itt);
            return Err(e);
        }
        let mut p = Progress::default();
        if t.complete() {
            p.complete = Some(h.itt);
        } else {
            self.try_admit(h.itt, &mut p.r2ts);
        }
        Ok(p)
    }

    /// Removes a task (complete or aborted), releasing its share of the budget; returns it and
    /// the R2Ts that waiting tasks may now have.
    pub fn take(&mut self, itt: u32) -> (Option<WriteTask>, Vec<R2tReq>) {
        let t = self.remove(itt);
        (t, self.admit_waiting())
    }

    /// Removes several tasks (aborted together), then admits waiting ones: none of the removed
    /// tasks gets an R2T on its way out.
    pub fn take_all(&mut self, itts: &[u32]) -> Vec<R2tReq> {
        for &itt in itts {
            self.remove(itt);
        }
        self.admit_waiting()
    }

    fn admit_waiting(&mut self) -> Vec<R2tReq> {
        let mut out = Vec::new();
        while let Some(&next) = self.waiting.front() {
            let before = self.reserved;
            let was_admitted = self.tasks.get(&next).is_some_and(|t| t.admitted);
            self.waiting.pop_front();
            self.try_admit(next, &mut out);
            if !was_admitted && self.reserved == before && self.tasks.contains_key(&next) {
                // Still no room: it went back to the end of the queue; stop here.
                break;
            }
        }
        out
    }

    fn remove(&mut self, itt: u32) -> Option<WriteTask> {
        let t = self.tasks.remove(&itt)?;
        if t.admitted {
            self.reserved = self.reserved.saturating_sub(u64::from(t.edtl));
        }
        self.waiting.retain(|&i| i != itt);
        Some(t)
    }

    /// ITTs of the tasks on a LUN field (`None`: every task).
    pub fn itts(&self, lun: Option<u64>) -> Vec<u32> {
        self.tasks.values().filter(|t| lun.is_none_or(|l| t.lun == l)).map(|t| t.itt).collect()
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::*;

    fn burst(initial_r2t: bool, first: u32, max: u32, outstanding: u32) -> Burst {
        Burst {
            initial_r2t,
            immediate_data: true,
            first_burst: first,
            max_burst: max,
            max_outstanding_r2t: outstanding,
        }
    }

    fn dout(itt: u32, ttt: u32, data_sn: u32, offset: u32, final_: bool) -> DataOut {
        DataOut { final_, itt, ttt, data_sn, buffer_offset: offset, ..Default::default() }
    }

    fn bytes(n: usize) -> Bytes {
        Bytes::from(vec![7u8; n])
    }

    #[test]
    fn immediate_data_covering_the_whole_write_needs_no_r2t() {
        let t = WriteTask::new(1, 0, 4096, bytes(4096), true, &burst(true, 65536, 262144, 1)).unwrap();
        assert!(t.complete());
    }

    #[test]
    fn r2ts_follow_max_burst_and_max_outstanding_r2t() {
        let b = burst(true, 1024, 1024, 2);
        let mut w = Writes::new(b, 1 << 30);
        let t = WriteTask::new(5, 0, 4096, bytes(512), true, &b).unwrap();
        let r = w.add(t);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].offset, r[0].len, r[0].r2t_sn), (512, 1024, 0));
        assert_eq!((r[1].offset, r[1].len, r[1].r2t_sn), (1536, 1024, 1));
        // First sequence in two PDUs: DataSN 0 and 1, F on the last.
        let p = w.data_out(&dout(5, r[0].ttt, 0, 512, false), bytes(512)).unwrap();
        assert!(p.r2ts.is_empty() && p.complete.is_none());
        let p = w.data_out(&dout(5, r[0].ttt, 1, 1024, true), bytes(512)).unwrap();
        assert_eq!(p.r2ts.len(), 1);
        assert_eq!((p.r2ts[0].offset, p.r2ts[0].len, p.r2ts[0].r2t_sn), (2560, 1024, 2));
        let third = p.r2ts[0];
        let p = w.data_out(&dout(5, r[1].ttt, 0, 1536, true), bytes(1024)).unwrap();
        assert_eq!(p.r2ts.len(), 1, "last R2T covers the remaining 512 bytes");
        assert_eq!((p.r2ts[0].offset, p.r2ts[0].len), (3584, 512));
        let last = p.r2ts[0];
        assert!(w.data_out(&dout(5, third.ttt, 0, 2560, true), bytes(1024)).unwrap().r2ts.is_empty());
        let p = w.data_out(&dout(5, last.ttt, 0, 3584, true), bytes(512)).unwrap();
        assert_eq!(p.complete, Some(5));
        let (t, _) = w.take(5);
        let mut t = t.unwrap();
        assert_eq!(t.take_data().len(), 4096);
        assert_eq!(t.r2t_count(), 4);
    }

    #[test]
    fn unsolicited_data_up_to_first_burst_then_r2t() {
        let b = burst(false, 1024, 65536, 1);
        let mut w = Writes::new(b, 1 << 30);
        let t = WriteTask::new(9, 0, 3000, bytes(512), false, &b).unwrap();
        assert!(w.add(t).is_empty(), "no R2T while unsolicited data is due");
        let p = w.data_out(&dout(9, RESERVED_TAG, 0, 512, true), bytes(512)).unwrap();
        assert_eq!(p.r2ts.len(), 1);
        assert_eq!((p.r2ts[0].offset, p.r2ts[0].len), (1024, 1976));
        let p = w.data_out(&dout(9, p.r2ts[0].ttt, 0, 1024, true), bytes(1976)).unwrap();
        assert_eq!(p.complete, Some(9));
    }

    #[test]
    fn wrong_datasn_offset_ttt_or_final_bit_fails_the_task() {
        let b = burst(true, 1024, 1024, 1);
        let cases: [(DataOut, DataError); 4] = [
            (dout(1, 1, 1, 0, false), DataError::DataSn { got: 1, want: 0 }),
            (dout(1, 1, 0, 512, false), DataError::Offset { got: 512, want: 0 }),
            (dout(1, 77, 0, 0, false), DataError::Ttt(77)),
            (dout(1, 1, 0, 0, true), DataError::Final),
        ];
        for (h, want) in cases {
            let mut w = Writes::new(b, 1 << 30);
            let r = w.add(WriteTask::new(1, 0, 1024, Bytes::new(), true, &b).unwrap());
            assert_eq!(r[0].ttt, 1);
            assert_eq!(w.data_out(&h, bytes(512)), Err(want));
            assert!(!w.contains(1));
        }
    }

    #[test]
    fn data_beyond_the_expected_length_is_overflow() {
        let b = burst(false, 65536, 65536, 1);
        assert_eq!(WriteTask::new(1, 0, 512, bytes(1024), true, &b).unwrap_err(), DataError::Overflow);
        let mut w = Writes::new(b, 1 << 30);
        w.add(WriteTask::new(1, 0, 1024, Bytes::new(), false, &b).unwrap());
        assert_eq!(w.data_out(&dout(1, RESERVED_TAG, 0, 0, true), bytes(2048)), Err(DataError::Overflow));
    }

    #[test]
    fn unsolicited_data_is_refused_when_initial_r2t_is_yes() {
        let b = burst(true, 65536, 65536, 1);
        assert_eq!(WriteTask::new(1, 0, 4096, Bytes::new(), false, &b).unwrap_err(), DataError::Unsolicited);
        let mut nb = b;
        nb.immediate_data = false;
        assert_eq!(WriteTask::new(1, 0, 4096, bytes(512), true, &nb).unwrap_err(), DataError::Unsolicited);
    }

    #[test]
    fn budget_holds_r2ts_until_earlier_writes_finish() {
        let b = burst(true, 512, 1 << 20, 1);
        let mut w = Writes::new(b, 1 << 20);
        let r1 = w.add(WriteTask::new(1, 0, 1 << 20, Bytes::new(), true, &b).unwrap());
        assert_eq!(r1.len(), 1);
        let r2 = w.add(WriteTask::new(2, 0, 4096, Bytes::new(), true, &b).unwrap());
        assert!(r2.is_empty(), "over budget: task 2 waits");
        let (_, r) = w.take(1);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].itt, 2);
    }

    #[test]
    fn a_task_larger_than_the_budget_runs_alone() {
        let b = burst(true, 512, 1 << 20, 1);
        let mut w = Writes::new(b, 1 << 20);
        assert_eq!(w.add(WriteTask::new(1, 0, 4 << 20, Bytes::new(), true, &b).unwrap()).len(), 1);
    }
}

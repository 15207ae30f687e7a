//! The LUN table of one target and command execution: unit attentions, reservation checks,
//! dispatch to each command, and the residual of every response.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use stics_block::{BlockError, Provisioning};

use stics_link::cdb::LinkCdb;
use stics_sam::cdb::{decode_cdb, Cdb, ModeSense, RwForm, WriteSame};
use stics_sam::op::{self, mode_page, pr_in};
use stics_sam::sense::{asc, Sense};
use stics_sam::{lun, status};

use crate::link::{StageError, Taken};
use crate::lu::LogicalUnit;
use crate::pr::{Access, PrError, PrOutParams, PrState};
use crate::spc;
use crate::{Command, Nexus, Residual, Response, TmfResult};

/// A failed command: status, optional sense and the transfer length the CDB implied (for the
/// residual).
struct Fail {
    status: u8,
    sense: Option<Sense>,
    xfer: u64,
}

impl From<Sense> for Fail {
    fn from(s: Sense) -> Self {
        Fail { status: status::CHECK_CONDITION, sense: Some(s), xfer: 0 }
    }
}

impl Fail {
    fn conflict() -> Self {
        Fail { status: status::RESERVATION_CONFLICT, sense: None, xfer: 0 }
    }
    fn with_xfer(mut self, xfer: u64) -> Self {
        self.xfer = xfer;
        self
    }
}

/// A successful command: data-in (before cutting to the expected length) and the transfer
/// length the command implies.
struct Done {
    data: Bytes,
    xfer: u64,
}

impl Done {
    fn none() -> Self {
        Done { data: Bytes::new(), xfer: 0 }
    }
    fn out(xfer: u64) -> Self {
        Done { data: Bytes::new(), xfer }
    }
    /// Data-in cut to the allocation length.
    fn data_in(mut v: Vec<u8>, alloc: u32) -> Self {
        v.truncate(alloc as usize);
        let xfer = v.len() as u64;
        Done { data: Bytes::from(v), xfer }
    }
}

type Outcome = Result<Done, Fail>;

fn residual(expected: u32, xfer: u64) -> Residual {
    let e = u64::from(expected);
    match xfer.cmp(&e) {
        std::cmp::Ordering::Greater => Residual::Overflow((xfer - e).min(u64::from(u32::MAX)) as u32),
        std::cmp::Ordering::Less => Residual::Underflow((e - xfer) as u32),
        std::cmp::Ordering::Equal => Residual::None,
    }
}

fn respond(cmd: &Command, out: Outcome) -> Response {
    match out {
        Ok(Done { mut data, xfer }) => {
            if data.len() > cmd.expected_len as usize {
                data.truncate(cmd.expected_len as usize);
            }
            Response { status: status::GOOD, sense: None, data_in: data, residual: residual(cmd.expected_len, xfer) }
        }
        Err(f) => Response {
            status: f.status,
            sense: f.sense.map(|s| s.to_bytes()),
            data_in: Bytes::new(),
            residual: residual(cmd.expected_len, f.xfer),
        },
    }
}

fn block_error(e: BlockError, write: bool) -> Fail {
    match e {
        BlockError::OutOfRange { .. } => Sense::lba_out_of_range().into(),
        BlockError::Io { lba, .. } => {
            let lba = lba.min(u64::from(u32::MAX)) as u32;
            if write { Sense::write_error(lba) } else { Sense::medium_error(lba) }.into()
        }
        BlockError::Unsupported(_) => Sense::invalid_opcode().into(),
        // A remote device that timed out, or one busy: BUSY makes the initiator retry later.
        BlockError::Unreachable(_) | BlockError::Busy(_) => Fail { status: status::BUSY, sense: None, xfer: 0 },
        BlockError::Reserved { .. } => Fail { status: status::RESERVATION_CONFLICT, sense: None, xfer: 0 },
        BlockError::NoSpace(_) => Sense::space_allocation_failed().into(),
        BlockError::WriteProtected(_) => Sense::write_protected().into(),
        BlockError::Stalled(_) => Sense::communication_timeout().into(),
        BlockError::Rejected(_) => Sense::invalid_param_field(0, None).into(),
        _ => Sense::internal_target_failure().into(),
    }
}

fn stage_fail(e: StageError) -> Fail {
    match e {
        StageError::Sense(s) => Fail::from(s),
        StageError::Busy => Fail { status: status::BUSY, sense: None, xfer: 0 },
    }
}

/// How each command is treated under a persistent reservation (SPC-4 table 46 and SBC-3).
fn access_of(c: &Cdb) -> Access {
    match c {
        Cdb::TestUnitReady
        | Cdb::Inquiry { .. }
        | Cdb::ReportLuns { .. }
        | Cdb::RequestSense { .. }
        | Cdb::ReadCapacity10
        | Cdb::ReadCapacity16 { .. }
        | Cdb::PrIn { .. }
        | Cdb::PrOut { .. }
        | Cdb::ReportSupportedOpcodes { .. }
        | Cdb::ReportSupportedTmfs { .. }
        | Cdb::LogSense { .. }
        | Cdb::PreventAllow { prevent: 0 } => Access::Always,
        Cdb::Read(_)
        | Cdb::Verify { .. }
        | Cdb::ModeSense { .. }
        | Cdb::GetLbaStatus { .. }
        | Cdb::PreFetch { .. }
        | Cdb::ReceiveDiagnostic { .. }
        | Cdb::ReadDefectData { .. } => Access::Read,
        _ => Access::Write,
    }
}

/// Commands a RESERVE(6/10) held by another nexus still lets through (SPC-2 5.5.1).
fn allowed_under_spc2(c: &Cdb) -> bool {
    matches!(
        c,
        Cdb::Inquiry { .. }
            | Cdb::ReportLuns { .. }
            | Cdb::RequestSense { .. }
            | Cdb::Release { .. }
            | Cdb::ReportSupportedOpcodes { .. }
            | Cdb::ReportSupportedTmfs { .. }
            | Cdb::LogSense { .. }
            | Cdb::PreventAllow { prevent: 0 }
    )
}

fn xfer_len_byte(form: RwForm) -> u16 {
    match form {
        RwForm::Six => 4,
        RwForm::Ten => 7,
        RwForm::Twelve => 6,
        RwForm::Sixteen => 10,
    }
}

/// First byte where `a` and `b` differ (over the shorter of the two).
pub(crate) fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    // Slices compare with memcmp; walking bytes only inside the first chunk that differs keeps
    // VERIFY and COMPARE AND WRITE of large blocks cheap even in unoptimised builds.
    const CHUNK: usize = 512;
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let (i, (x, y)) = a.chunks(CHUNK).zip(b.chunks(CHUNK)).enumerate().find(|(_, (x, y))| x != y)?;
    x.iter().zip(y).position(|(p, q)| p != q).map(|at| i * CHUNK + at)
}

/// The LUN table of one target.
pub struct Device {
    luns: Vec<Arc<LogicalUnit>>,
}

impl Device {
    /// LUN n is `luns[n]`.
    pub fn new(luns: Vec<Arc<LogicalUnit>>) -> Self {
        Device { luns }
    }

    pub fn lun_count(&self) -> usize {
        self.luns.len()
    }

    /// The logical unit behind a LUN.
    pub fn lu(&self, lun: u64) -> Option<&Arc<LogicalUnit>> {
        usize::try_from(lun).ok().and_then(|i| self.luns.get(i))
    }

    /// The number of data-out bytes the command will consume, from the CDB, or None if it is
    /// not a data-out command (or the LUN or CDB is invalid).
    pub fn expected_data_out(&self, lun: u64, cdb: &[u8]) -> Option<u64> {
        let bs = u64::from(self.lu(lun)?.geo.block_size);
        let c = decode_cdb(cdb).ok()?;
        Some(match c {
            Cdb::Write(rw) | Cdb::WriteVerify { rw, .. } | Cdb::Verify { rw, bytchk: true } | Cdb::OrWrite(rw) => {
                u64::from(rw.blocks) * bs
            }
            Cdb::CompareAndWrite { blocks, .. } => 2 * u64::from(blocks) * bs,
            Cdb::WriteSame(WriteSame { ndob, .. }) => {
                if ndob {
                    0
                } else {
                    bs
                }
            }
            Cdb::Unmap { param_len, .. }
            | Cdb::ModeSelect { param_len, .. }
            | Cdb::PrOut { param_len, .. }
            | Cdb::SendDiagnostic { param_len, .. } => u64::from(param_len),
            _ => return None,
        })
    }

    /// A new session: it will see POWER ON, RESET, OR BUS DEVICE RESET OCCURRED on every LUN.
    pub fn nexus_added(&self, nexus: &Nexus) {
        for lu in &self.luns {
            lu.add_nexus(nexus.id, nexus.key());
        }
    }

    /// A session is gone: its RESERVE(6/10) reservation goes, persistent reservations stay.
    pub fn nexus_removed(&self, nexus: &Nexus) {
        for lu in &self.luns {
            lu.remove_nexus(nexus.id);
        }
    }

    /// LOGICAL UNIT RESET: clears RESERVE(6/10) and tells every other session (29h/03h). The
    /// session that asked learns of the reset from the task management response; initiators do
    /// not expect a unit attention for their own reset (libiscsi's conformance suite fails on one).
    pub fn lun_reset(&self, lun: u64, by: &Nexus) -> TmfResult {
        match self.lu(lun) {
            Some(lu) => {
                lu.reset(asc::BUS_DEVICE_RESET, false, Some(by.id));
                TmfResult::Complete
            }
            None => TmfResult::LunDoesNotExist,
        }
    }

    /// TARGET WARM RESET (29h/02h... reported as BUS DEVICE RESET 29h/03h, to every session but
    /// the one that asked, as for a LUN reset) or COLD RESET (POWER ON 29h/01h for every session,
    /// which also drops persistent reservations: we do not offer APTPL).
    pub fn target_reset(&self, by: &Nexus, cold: bool) -> TmfResult {
        for lu in &self.luns {
            if cold {
                lu.reset(asc::POWER_ON_OCCURRED, true, None);
            } else {
                lu.reset(asc::BUS_DEVICE_RESET, false, Some(by.id));
            }
        }
        TmfResult::Complete
    }

    /// CLEAR TASK SET: with TST=000 the task set is shared, so other sessions learn that their
    /// commands were cleared (2Fh/00h). Aborting the tasks themselves is the transport's job.
    pub fn clear_task_set(&self, lun: u64, by: &Nexus) -> TmfResult {
        let Some(lu) = self.lu(lun) else { return TmfResult::LunDoesNotExist };
        let mut st = lu.lock();
        lu.queue_ua_all(&mut st, Some(by.id), asc::COMMANDS_CLEARED_BY_ANOTHER_INITIATOR);
        TmfResult::Complete
    }

    /// Executes one command. Never panics.
    pub async fn execute(&self, nexus: &Nexus, cmd: Command) -> Response {
        let out = match self.lu(cmd.lun) {
            Some(lu) => self.run(lu, nexus, &cmd).await,
            None => self.no_lun(&cmd),
        };
        respond(&cmd, out)
    }

    fn report_luns(&self, select: u8, alloc: u32) -> Outcome {
        if !matches!(select, 0..=2) {
            return Err(Sense::invalid_cdb_field(2, None).into());
        }
        if alloc < 16 {
            return Err(Sense::invalid_cdb_field(6, None).into());
        }
        let n = if select == 1 { 0 } else { self.luns.len() };
        let mut v = Vec::with_capacity(8 + 8 * n);
        v.extend_from_slice(&((8 * n) as u32).to_be_bytes());
        v.extend_from_slice(&[0; 4]);
        for i in 0..n {
            v.extend_from_slice(&lun::to_bytes(i as u64));
        }
        Ok(Done::data_in(v, alloc))
    }

    fn no_lun(&self, cmd: &Command) -> Outcome {
        match decode_cdb(&cmd.cdb) {
            Ok(Cdb::Inquiry { evpd: false, alloc, .. }) => Ok(Done::data_in(spc::missing_lun_inquiry(), alloc)),
            Ok(Cdb::ReportLuns { select, alloc }) => self.report_luns(select, alloc),
            Ok(Cdb::RequestSense { alloc, .. }) => {
                Ok(Done::data_in(Sense::lun_not_supported().to_array().to_vec(), alloc))
            }
            _ => Err(Sense::lun_not_supported().into()),
        }
    }

    /// Runs a command, watching the device's reset count: a reset seen before it is reported
    /// first, and one that came while a command that writes or flushes ran replaces its answer
    /// (what it did may rest on what was lost; the initiator sends it again).
    async fn run(&self, lu: &LogicalUnit, nexus: &Nexus, cmd: &Command) -> Outcome {
        let before = lu.dev.resets();
        lu.notice_resets(before);
        let out = self.run_inner(lu, nexus, cmd).await;
        let writes = decode_cdb(&cmd.cdb).is_ok_and(|c| access_of(&c) == Access::Write);
        if writes && out.is_ok() && lu.notice_resets(lu.dev.resets()) {
            let mut st = lu.lock();
            if let Some(ua) = lu.take_ua(&mut st, nexus.id) {
                return Err(Sense::unit_attention(ua).into());
            }
        }
        out
    }

    async fn run_inner(&self, lu: &LogicalUnit, nexus: &Nexus, cmd: &Command) -> Outcome {
        let opcode = cmd.cdb.first().copied().unwrap_or(0xff);
        if lu.may_have_ua(nexus.id) && !matches!(opcode, op::INQUIRY | op::REPORT_LUNS | op::REQUEST_SENSE) {
            let mut st = lu.lock();
            if let Some(ua) = lu.take_ua(&mut st, nexus.id) {
                return Err(Sense::unit_attention(ua).into());
            }
        }
        if stics_link::cdb::is_link(opcode) && lu.dev.group_sink().is_some() {
            return self.link(lu, nexus, cmd).await;
        }
        let c = decode_cdb(&cmd.cdb).map_err(|e| Fail::from(e.sense()))?;
        if lu.reserved.load(Ordering::Acquire) {
            let st = lu.lock();
            let me = nexus.key();
            let spc2_blocks = st.resv.spc2.as_ref().is_some_and(|h| *h != me) && !allowed_under_spc2(&c);
            if spc2_blocks || st.resv.pr.conflicts(&me, access_of(&c)) {
                return Err(Fail::conflict());
            }
        }
        let bs = u64::from(lu.geo.block_size);
        let edtl = u64::from(cmd.expected_len);
        match c {
            Cdb::Read(rw) => {
                check_range(lu, rw.lba, u64::from(rw.blocks), Some(xfer_len_byte(rw.form)))?;
                let total = u64::from(rw.blocks) * bs;
                // Read only what the initiator can take; the residual still reflects the CDB.
                let blocks = total.min(edtl).div_ceil(bs) as u32;
                if blocks == 0 {
                    return Ok(Done::out(total));
                }
                let data = lu.dev.read(rw.lba, blocks).await.map_err(|e| block_error(e, false))?;
                Ok(Done { data, xfer: total })
            }
            Cdb::Write(rw) | Cdb::WriteVerify { rw, .. } => {
                let total = u64::from(rw.blocks) * bs;
                if lu.cfg.read_only {
                    return Err(Fail::from(Sense::write_protected()).with_xfer(total));
                }
                check_range(lu, rw.lba, u64::from(rw.blocks), Some(xfer_len_byte(rw.form)))
                    .map_err(|f| f.with_xfer(total))?;
                if total == 0 {
                    return Ok(Done::none());
                }
                // RFC 7143 11.4.5.1: with an Expected Data Transfer Length shorter than the CDB's,
                // only the whole blocks the initiator sent are written and the rest is reported
                // as overflow. A partial block is never written.
                let usable = total.min(edtl);
                if (cmd.data_out.len() as u64) < usable {
                    return Err(Fail::from(Sense::invalid_field_in_iu()).with_xfer(total));
                }
                let whole = usable / bs * bs;
                if whole > 0 {
                    let data = cmd.data_out.slice(..whole as usize);
                    let fua = rw.fua || !lu.wce.load(Ordering::Relaxed);
                    let _shared = lu.write_lock.read().await;
                    lu.dev.write(rw.lba, data, fua).await.map_err(|e| block_error(e, true).with_xfer(total))?;
                }
                Ok(Done::out(total))
            }
            Cdb::Verify { rw, bytchk } => {
                check_range(lu, rw.lba, u64::from(rw.blocks), Some(xfer_len_byte(rw.form)))?;
                if rw.blocks == 0 || !bytchk {
                    return Ok(Done::none());
                }
                let total = out_len_checks(cmd, u64::from(rw.blocks) * bs)?;
                let have = lu.dev.read(rw.lba, rw.blocks).await.map_err(|e| block_error(e, false))?;
                if let Some(at) = first_difference(&have, &cmd.data_out[..total as usize]) {
                    return Err(Fail::from(Sense::miscompare(at as u32)).with_xfer(total));
                }
                Ok(Done::out(total))
            }
            Cdb::OrWrite(rw) => {
                let total = write_checks(lu, cmd, rw.lba, u64::from(rw.blocks), 10)?;
                if total == 0 {
                    return Ok(Done::none());
                }
                let _excl = lu.write_lock.write().await;
                let have = lu.dev.read(rw.lba, rw.blocks).await.map_err(|e| block_error(e, false))?;
                let mut merged = BytesMut::from(&have[..]);
                for (m, d) in merged.iter_mut().zip(cmd.data_out.iter()) {
                    *m |= *d;
                }
                let fua = rw.fua || !lu.wce.load(Ordering::Relaxed);
                lu.dev.write(rw.lba, merged.freeze(), fua).await.map_err(|e| block_error(e, true))?;
                Ok(Done::out(total))
            }
            Cdb::CompareAndWrite { lba, blocks, fua } => self.compare_and_write(lu, cmd, lba, blocks, fua).await,
            Cdb::WriteSame(ws) => self.write_same(lu, cmd, ws).await,
            Cdb::Unmap { anchor, param_len } => self.unmap(lu, cmd, anchor, param_len).await,
            Cdb::SyncCache { lba, blocks, .. } => {
                let n = if blocks == 0 { lu.geo.num_blocks.saturating_sub(lba) } else { u64::from(blocks) };
                check_range(lu, lba, n, None)?;
                lu.dev.flush().await.map_err(|e| block_error(e, true))?;
                Ok(Done::none())
            }
            Cdb::PreFetch { lba, blocks, .. } => {
                check_range(lu, lba, u64::from(blocks), None)?;
                Ok(Done::none())
            }
            Cdb::GetLbaStatus { lba, alloc } => self.get_lba_status(lu, lba, alloc).await,
            Cdb::TestUnitReady | Cdb::StartStopUnit { .. } | Cdb::PreventAllow { .. } => Ok(Done::none()),
            Cdb::Inquiry { evpd, page, alloc } => {
                if !evpd {
                    return Ok(Done::data_in(spc::standard_inquiry(lu), alloc));
                }
                let v = spc::vpd_page(lu, nexus, page).ok_or(Sense::invalid_cdb_field(2, None))?;
                Ok(Done::data_in(v, alloc))
            }
            Cdb::ReportLuns { select, alloc } => self.report_luns(select, alloc),
            Cdb::RequestSense { desc, alloc } => {
                if desc {
                    return Err(Sense::invalid_cdb_field(1, Some(0)).into());
                }
                let sense = {
                    let mut st = lu.lock();
                    match lu.take_ua(&mut st, nexus.id) {
                        Some(ua) => Sense::unit_attention(ua),
                        None => Sense::no_sense(),
                    }
                };
                Ok(Done::data_in(sense.to_array().to_vec(), alloc))
            }
            Cdb::ReadCapacity10 => Ok(Done::data_in(spc::read_capacity10(lu), 8)),
            Cdb::ReadCapacity16 { alloc } => Ok(Done::data_in(spc::read_capacity16(lu), alloc)),
            Cdb::ModeSense(ms) => mode_sense(lu, &ms),
            Cdb::ModeSelect { ten, sp, param_len, .. } => self.mode_select(lu, nexus, cmd, ten, sp, param_len),
            Cdb::Reserve { .. } => {
                let mut st = lu.lock();
                let me = nexus.key();
                if st.resv.pr.has_registrations() || st.resv.pr.reserved() {
                    return Err(Fail::conflict());
                }
                match &st.resv.spc2 {
                    Some(h) if *h != me => return Err(Fail::conflict()),
                    _ => st.resv.spc2 = Some(me),
                }
                lu.refresh_reserved(&st);
                Ok(Done::none())
            }
            Cdb::Release { .. } => {
                let mut st = lu.lock();
                if st.resv.pr.reserved() {
                    return Err(Fail::conflict());
                }
                if st.resv.spc2.as_ref() == Some(&nexus.key()) {
                    st.resv.spc2 = None;
                }
                lu.refresh_reserved(&st);
                Ok(Done::none())
            }
            Cdb::PrIn { sa, alloc } => {
                let st = lu.lock();
                let v = match sa {
                    pr_in::READ_KEYS => st.resv.pr.read_keys(),
                    pr_in::READ_RESERVATION => st.resv.pr.read_reservation(),
                    pr_in::REPORT_CAPABILITIES => PrState::report_capabilities(),
                    pr_in::READ_FULL_STATUS => st.resv.pr.read_full_status(),
                    _ => return Err(Sense::invalid_cdb_field(1, Some(4)).into()),
                };
                Ok(Done::data_in(v, alloc))
            }
            Cdb::PrOut { sa, scope, ptype, param_len } => {
                let xfer = u64::from(param_len);
                let data = param_data(cmd, param_len);
                let p = PrOutParams::parse(param_len, data).map_err(|s| Fail::from(s).with_xfer(xfer))?;
                let mut st = lu.lock();
                if st.resv.spc2.is_some() {
                    return Err(Fail::conflict().with_xfer(xfer));
                }
                let me = nexus.key();
                let result = st.resv.pr.out(&me, sa, scope, ptype, &p);
                let out = match result {
                    Ok(uas) => {
                        for ua in uas {
                            lu.queue_ua_key(&mut st, &ua.nexus, (ua.asc, ua.ascq));
                        }
                        Ok(Done::out(xfer))
                    }
                    Err(PrError::Conflict) => Err(Fail::conflict().with_xfer(xfer)),
                    Err(PrError::Check(s)) => Err(Fail::from(s).with_xfer(xfer)),
                };
                lu.refresh_reserved(&st);
                out
            }
            Cdb::ReportSupportedOpcodes { rctd, options, opcode, sa, alloc } => {
                report_opcodes(lu, rctd, options, opcode, sa, alloc)
            }
            Cdb::ReportSupportedTmfs { repd, alloc } => {
                // ABORT TASK, ABORT TASK SET, CLEAR TASK SET, LOGICAL UNIT RESET, TARGET RESET.
                let mut v = vec![0xda, 0x00, 0x00, 0x00];
                if repd {
                    v[3] = 0x0c;
                    v.resize(16, 0);
                }
                Ok(Done::data_in(v, alloc))
            }
            Cdb::LogSense { ppc, sp, page, subpage, alloc, .. } => {
                if sp {
                    return Err(Sense::invalid_cdb_field(1, Some(0)).into());
                }
                if ppc {
                    return Err(Sense::invalid_cdb_field(1, Some(1)).into());
                }
                let v = match (page, subpage) {
                    (0x00, 0x00) => vec![0x00, 0x00, 0x00, 0x01, 0x00],
                    (0x00, 0xff) => vec![0x40, 0xff, 0x00, 0x04, 0x00, 0x00, 0x00, 0xff],
                    _ => return Err(Sense::invalid_cdb_field(2, Some(5)).into()),
                };
                Ok(Done::data_in(v, alloc))
            }
            Cdb::SendDiagnostic { selftest, param_len } => {
                if !selftest && param_len != 0 {
                    return Err(Fail::from(Sense::invalid_cdb_field(3, None)).with_xfer(u64::from(param_len)));
                }
                Ok(Done::out(u64::from(param_len)))
            }
            Cdb::ReceiveDiagnostic { page, alloc, .. } => {
                if page != 0 {
                    return Err(Sense::invalid_cdb_field(2, None).into());
                }
                Ok(Done::data_in(vec![0x00, 0x00, 0x00, 0x01, 0x00], alloc))
            }
            Cdb::ReadDefectData { twelve, alloc } => {
                let fmt = cmd.cdb.get(if twelve { 1 } else { 2 }).copied().unwrap_or(0) & 0x1f;
                let v = if twelve { vec![0, fmt, 0, 0, 0, 0, 0, 0] } else { vec![0, fmt, 0, 0] };
                Ok(Done::data_in(v, alloc))
            }
        }
    }

    /// The link's commands (`stics_link::cdb`), on a device that takes groups. They are
    /// writes (LINK STATUS a read) to reservations: a gateway that claimed the LUN fences others.
    async fn link(&self, lu: &LogicalUnit, nexus: &Nexus, cmd: &Command) -> Outcome {
        let Some(sink) = lu.dev.group_sink() else { return Err(Sense::invalid_opcode().into()) };
        let c = stics_link::cdb::decode(&cmd.cdb).map_err(|_| Fail::from(Sense::invalid_cdb_field(0, None)))?;
        // Token traffic is how several gateways share a LUN: reservations do not fence it.
        let access = match c {
            LinkCdb::Status { .. } | LinkCdb::Tokens { .. } | LinkCdb::Poll { .. } => Access::Read,
            LinkCdb::Write { .. } | LinkCdb::Commit { .. } => Access::Write,
        };
        if lu.reserved.load(Ordering::Acquire) && lu.lock().resv.pr.conflicts(&nexus.key(), access) {
            return Err(Fail::conflict());
        }
        if lu.cfg.read_only && access == Access::Write {
            return Err(Sense::write_protected().into());
        }
        match c {
            LinkCdb::Write { seq, offset } => {
                let data = cmd.data_out.get(..cmd.expected_len as usize).unwrap_or(&cmd.data_out);
                let n = data.len() as u64;
                let staged = lu.staging().write(nexus.id, seq, offset, data, sink.max_group());
                lu.staged.notify_waiters();
                staged.map_err(|e| stage_fail(e).with_xfer(n))?;
                Ok(Done::out(n))
            }
            LinkCdb::Commit { seq, len } => {
                // Fenced from now on (its gateway restarted and read the status), the group must
                // not land, however long it waits for its pieces.
                let mark = sink.fence_mark();
                let until = tokio::time::Instant::now() + crate::link::COMMIT_WAIT;
                let group = loop {
                    let news = lu.staged.notified();
                    tokio::pin!(news);
                    news.as_mut().enable();
                    // A session that ended while its commit waited here has a successor that may
                    // have read the status since (its group must not land now), and the pieces
                    // it waits for will not come.
                    if !lu.lock().nexuses.contains_key(&nexus.id) {
                        return Err(Sense::command_sequence_error().into());
                    }
                    let taken = lu.staging().take(nexus.id, seq, len).map_err(stage_fail)?;
                    if let Taken::Group(g) = taken {
                        break g;
                    }
                    if tokio::time::timeout_at(until, news).await.is_err() {
                        lu.staging().abandon(nexus.id, seq);
                        return Err(Sense::command_sequence_error().into());
                    }
                };
                sink.commit_marked(group, mark).await.map_err(|e| block_error(e, true))?;
                Ok(Done::none())
            }
            LinkCdb::Status { fence, alloc } => {
                let st = sink.link_status(fence).await.map_err(|e| block_error(e, false))?;
                Ok(Done::data_in(st.to_vec(), alloc))
            }
            LinkCdb::Tokens { new_connection, len } => {
                let data = cmd.data_out.get(..cmd.expected_len as usize).unwrap_or(&cmd.data_out);
                if data.len() != len as usize {
                    return Err(Fail::from(Sense::invalid_cdb_field(10, None)).with_xfer(data.len() as u64));
                }
                let n = data.len() as u64;
                let exchange = bytes::Bytes::copy_from_slice(data);
                sink.tokens(exchange, new_connection).await.map_err(|e| block_error(e, false).with_xfer(n))?;
                Ok(Done::out(n))
            }
            LinkCdb::Poll { gateway, from, wait_ms } => {
                let wait = std::time::Duration::from_millis(u64::from(wait_ms));
                let alloc = cmd.expected_len;
                let answer =
                    sink.token_poll(gateway, from, wait, alloc as usize).await.map_err(|e| block_error(e, false))?;
                Ok(Done::data_in(answer.to_vec(), alloc))
            }
        }
    }

    async fn compare_and_write(&self, lu: &LogicalUnit, cmd: &Command, lba: u64, blocks: u8, fua: bool) -> Outcome {
        if lu.cfg.read_only {
            return Err(Sense::write_protected().into());
        }
        if blocks > lu.max_caw_blocks() {
            return Err(Sense::invalid_cdb_field(13, None).into());
        }
        check_range(lu, lba, u64::from(blocks), None)?;
        let half = u64::from(blocks) * u64::from(lu.geo.block_size);
        let total = 2 * half;
        // The Expected Data Transfer Length must be exactly the verify and the write data: a
        // partial COMPARE AND WRITE would break its atomicity, and a transfer length that the
        // NUMBER OF LOGICAL BLOCKS field does not describe (a 256-block request encodes as 0)
        // is an invalid CDB.
        if u64::from(cmd.expected_len) != total {
            return Err(Fail::from(Sense::invalid_cdb_field(13, None)).with_xfer(total));
        }
        if blocks == 0 {
            return Ok(Done::none());
        }
        if cmd.data_out.len() as u64 != total {
            return Err(Fail::from(Sense::invalid_field_in_iu()).with_xfer(total));
        }
        let _excl = lu.write_lock.write().await;
        let fua = fua || !lu.wce.load(Ordering::Relaxed);
        let (compare, write) = (cmd.data_out.slice(..half as usize), cmd.data_out.slice(half as usize..));
        // The medium's own step, when it has one, also keeps out writers that do not go
        // through this target; the lock above keeps out those that do.
        match lu.dev.compare_and_write(lba, compare, write.clone(), fua).await {
            Ok(None) => return Ok(Done::out(total)),
            Ok(Some(at)) => return Err(Fail::from(Sense::miscompare(at as u32)).with_xfer(total)),
            Err(BlockError::Unsupported(_)) => {}
            Err(e) => return Err(block_error(e, true)),
        }
        let have = lu.dev.read(lba, u32::from(blocks)).await.map_err(|e| block_error(e, false))?;
        if let Some(at) = first_difference(&have, &cmd.data_out[..half as usize]) {
            return Err(Fail::from(Sense::miscompare(at as u32)).with_xfer(total));
        }
        lu.dev.write(lba, write, fua).await.map_err(|e| block_error(e, true))?;
        Ok(Done::out(total))
    }

    async fn write_same(&self, lu: &LogicalUnit, cmd: &Command, ws: WriteSame) -> Outcome {
        let WriteSame { lba, blocks, unmap, anchor, ndob, sixteen } = ws;
        let bs = u64::from(lu.geo.block_size);
        let xfer = if ndob { 0 } else { bs };
        if lu.cfg.read_only {
            return Err(Sense::write_protected().into());
        }
        if anchor {
            // ANCHOR needs UNMAP, and anchored blocks are not offered (ANC_SUP = 0).
            return Err(Sense::invalid_cdb_field(1, Some(4)).into());
        }
        if lba > lu.geo.num_blocks {
            return Err(Sense::lba_out_of_range().into());
        }
        let n = if blocks == 0 { lu.geo.num_blocks - lba } else { u64::from(blocks) };
        if n > lu.max_write_same_blocks() {
            return Err(Sense::invalid_cdb_field(if sixteen { 10 } else { 7 }, None).into());
        }
        check_range(lu, lba, n, None)?;
        if u64::from(cmd.expected_len) != xfer || (cmd.data_out.len() as u64) < xfer {
            return Err(Fail::from(Sense::invalid_field_in_iu()).with_xfer(xfer));
        }
        if n == 0 {
            return Ok(Done::out(xfer));
        }
        let block = if ndob { Bytes::from(vec![0u8; bs as usize]) } else { cmd.data_out.slice(..bs as usize) };
        let _shared = lu.write_lock.read().await;
        // UNMAP asks for the blocks to be unmapped whatever the data block holds; with LBPRZ they
        // then read as zeros. Without discard support the data is written instead.
        if unmap && lu.discard {
            lu.dev.discard(lba, n).await.map_err(|e| block_error(e, true))?;
            return Ok(Done::out(xfer));
        }
        let per = ((1u64 << 20) / bs).clamp(1, n);
        let mut buf = BytesMut::with_capacity((per * bs) as usize);
        for _ in 0..per {
            buf.extend_from_slice(&block);
        }
        let buf = buf.freeze();
        let fua = !lu.wce.load(Ordering::Relaxed);
        let mut at = lba;
        let end = lba + n;
        while at < end {
            let k = (end - at).min(per);
            lu.dev.write(at, buf.slice(..(k * bs) as usize), fua).await.map_err(|e| block_error(e, true))?;
            at += k;
        }
        Ok(Done::out(xfer))
    }

    async fn unmap(&self, lu: &LogicalUnit, cmd: &Command, anchor: bool, param_len: u32) -> Outcome {
        let xfer = u64::from(param_len);
        let fail = |s: Sense| Fail::from(s).with_xfer(xfer);
        if !lu.discard {
            return Err(Sense::invalid_opcode().into());
        }
        if lu.cfg.read_only {
            return Err(fail(Sense::write_protected()));
        }
        if anchor {
            return Err(fail(Sense::invalid_cdb_field(1, Some(0))));
        }
        if param_len == 0 {
            return Ok(Done::none());
        }
        let data = param_data(cmd, param_len);
        if param_len < 8 || data.len() < 8 {
            return Err(fail(Sense::param_list_length_error()));
        }
        let be = |at: usize, n: usize| {
            data.get(at..at + n).map_or(0, |s| s.iter().fold(0u64, |a, &b| (a << 8) | u64::from(b)))
        };
        let bd_len = be(2, 2) as usize;
        let count = bd_len.min(data.len() - 8) / 16;
        if count as u64 > u64::from(spc::MAX_UNMAP_DESCRIPTORS) {
            return Err(fail(Sense::invalid_param_field(2, None)));
        }
        let mut ranges = Vec::with_capacity(count);
        for i in 0..count {
            let at = 8 + 16 * i;
            let (lba, n) = (be(at, 8), be(at + 8, 4));
            if n > u64::from(spc::MAX_UNMAP_LBAS) {
                return Err(fail(Sense::invalid_param_field((at + 8) as u16, None)));
            }
            if !matches!(lba.checked_add(n), Some(e) if e <= lu.geo.num_blocks) {
                return Err(fail(Sense::lba_out_of_range()));
            }
            if n > 0 {
                ranges.push((lba, n));
            }
        }
        let _shared = lu.write_lock.read().await;
        for (lba, n) in ranges {
            lu.dev.discard(lba, n).await.map_err(|e| block_error(e, true).with_xfer(xfer))?;
        }
        Ok(Done::out(xfer))
    }

    async fn get_lba_status(&self, lu: &LogicalUnit, lba: u64, alloc: u32) -> Outcome {
        if lba >= lu.geo.num_blocks {
            return Err(Sense::lba_out_of_range().into());
        }
        let max = ((alloc.saturating_sub(8)) / 16).clamp(1, 64);
        let mut descs = Vec::new();
        let mut at = lba;
        while (descs.len() as u32) < max && at < lu.geo.num_blocks {
            let (state, n) = lu.dev.provisioning(at).await.map_err(|e| block_error(e, false))?;
            let n = n.clamp(1, u64::from(u32::MAX));
            descs.push((at, n as u32, state));
            at = at.saturating_add(n);
        }
        let mut v = Vec::with_capacity(8 + 16 * descs.len());
        v.extend_from_slice(&((4 + 16 * descs.len()) as u32).to_be_bytes());
        v.extend_from_slice(&[0; 4]);
        for (l, n, s) in descs {
            v.extend_from_slice(&l.to_be_bytes());
            v.extend_from_slice(&n.to_be_bytes());
            v.push(u8::from(s != Provisioning::Mapped));
            v.extend_from_slice(&[0; 3]);
        }
        Ok(Done::data_in(v, alloc))
    }

    #[expect(clippy::unused_self, reason = "one of the device's command handlers, called like the others")]
    fn mode_select(
        &self,
        lu: &LogicalUnit,
        nexus: &Nexus,
        cmd: &Command,
        ten: bool,
        sp: bool,
        param_len: u32,
    ) -> Outcome {
        let xfer = u64::from(param_len);
        let fail = |s: Sense| Fail::from(s).with_xfer(xfer);
        if sp {
            return Err(fail(Sense::invalid_cdb_field(1, Some(0))));
        }
        if param_len == 0 {
            return Ok(Done::none());
        }
        let data = param_data(cmd, param_len);
        let hdr = if ten { 8 } else { 4 };
        if data.len() < hdr {
            return Err(fail(Sense::param_list_length_error()));
        }
        let get = |i: usize| data.get(i).copied().unwrap_or(0);
        let bdl = if ten { usize::from(u16::from_be_bytes([get(6), get(7)])) } else { usize::from(get(3)) };
        match bdl {
            0 => {}
            8 => {
                let bl = u32::from_be_bytes([0, get(hdr + 5), get(hdr + 6), get(hdr + 7)]);
                if bl != 0 && bl != lu.geo.block_size {
                    return Err(fail(Sense::invalid_param_field((hdr + 5) as u16, None)));
                }
            }
            16 if ten && get(4) & 1 != 0 => {
                let bl = u32::from_be_bytes([get(hdr + 12), get(hdr + 13), get(hdr + 14), get(hdr + 15)]);
                if bl != 0 && bl != lu.geo.block_size {
                    return Err(fail(Sense::invalid_param_field((hdr + 12) as u16, None)));
                }
            }
            _ => return Err(fail(Sense::invalid_param_field(if ten { 6 } else { 3 }, None))),
        }
        let mut off = hdr + bdl;
        if off > data.len() {
            return Err(fail(Sense::param_list_length_error()));
        }
        let mut new_wce = None;
        while off < data.len() {
            let code = get(off) & 0x3f;
            if get(off) & 0x40 != 0 {
                return Err(fail(Sense::invalid_param_field(off as u16, Some(6))));
            }
            let plen = usize::from(get(off + 1));
            let page = data.get(off..off + 2 + plen).ok_or_else(|| fail(Sense::param_list_length_error()))?;
            let cur = spc::mode_page(lu, code, spc::PC_CURRENT)
                .ok_or_else(|| fail(Sense::invalid_param_field(off as u16, Some(5))))?;
            let mask = spc::mode_page(lu, code, spc::PC_CHANGEABLE).unwrap_or_default();
            if plen + 2 != cur.len() {
                return Err(fail(Sense::invalid_param_field((off + 1) as u16, None)));
            }
            for i in 2..cur.len() {
                let m = mask.get(i).copied().unwrap_or(0);
                if (page[i] ^ cur[i]) & !m != 0 {
                    return Err(fail(Sense::invalid_param_field((off + i) as u16, None)));
                }
            }
            if code == mode_page::CACHING {
                new_wce = Some(page[2] & 0x04 != 0);
            }
            off += 2 + plen;
        }
        if let Some(w) = new_wce {
            if lu.wce.swap(w, Ordering::AcqRel) != w {
                let mut st = lu.lock();
                lu.queue_ua_all(&mut st, Some(nexus.id), asc::MODE_PARAMETERS_CHANGED);
            }
        }
        Ok(Done::out(xfer))
    }
}

/// The parameter data of a command: at most `param_len` bytes of what the initiator sent.
fn param_data(cmd: &Command, param_len: u32) -> &[u8] {
    let n = (param_len as usize).min(cmd.data_out.len());
    &cmd.data_out[..n]
}

fn check_range(lu: &LogicalUnit, lba: u64, blocks: u64, len_byte: Option<u16>) -> Result<(), Fail> {
    if let Some(b) = len_byte {
        if blocks > lu.max_transfer_blocks() {
            return Err(Sense::invalid_cdb_field(b, None).into());
        }
    }
    match lba.checked_add(blocks) {
        Some(end) if end <= lu.geo.num_blocks => Ok(()),
        _ => Err(Sense::lba_out_of_range().into()),
    }
}

/// Checks the data-out buffer against the length the CDB implies, for VERIFY with BYTCHK and
/// ORWRITE. Less data than the CDB asks for is refused (RFC 7143 allows this instead of a partial
/// operation), with the overflow reported. WRITE instead writes the whole blocks it received.
fn out_len_checks(cmd: &Command, total: u64) -> Result<u64, Fail> {
    if u64::from(cmd.expected_len) < total || (cmd.data_out.len() as u64) < total {
        return Err(Fail::from(Sense::invalid_field_in_iu()).with_xfer(total));
    }
    Ok(total)
}

fn write_checks(lu: &LogicalUnit, cmd: &Command, lba: u64, blocks: u64, len_byte: u16) -> Result<u64, Fail> {
    let total = blocks * u64::from(lu.geo.block_size);
    if lu.cfg.read_only {
        return Err(Fail::from(Sense::write_protected()).with_xfer(total));
    }
    check_range(lu, lba, blocks, Some(len_byte)).map_err(|f| f.with_xfer(total))?;
    if blocks == 0 {
        return Ok(0);
    }
    out_len_checks(cmd, total)
}

fn mode_sense(lu: &LogicalUnit, ms: &ModeSense) -> Outcome {
    let &ModeSense { ten, dbd, llbaa, pc, page, subpage, alloc } = ms;
    if pc == spc::PC_SAVED {
        return Err(Sense::saving_not_supported().into());
    }
    let mut pages = Vec::new();
    if page == mode_page::ALL {
        if subpage != 0 && subpage != 0xff {
            return Err(Sense::invalid_cdb_field(3, None).into());
        }
        for p in spc::MODE_PAGES {
            pages.extend(spc::mode_page(lu, p, pc).unwrap_or_default());
        }
    } else {
        if subpage != 0 {
            return Err(Sense::invalid_cdb_field(3, None).into());
        }
        pages = spc::mode_page(lu, page, pc).ok_or(Sense::invalid_cdb_field(2, Some(5)))?;
    }
    let dsp = 0x10 | if lu.cfg.read_only { 0x80 } else { 0 };
    let mut bd = Vec::new();
    if !dbd {
        let bs = lu.geo.block_size;
        if llbaa {
            bd.extend_from_slice(&lu.geo.num_blocks.to_be_bytes());
            bd.extend_from_slice(&[0; 4]);
            bd.extend_from_slice(&bs.to_be_bytes());
        } else {
            bd.extend_from_slice(&(lu.geo.num_blocks.min(0xffff_ffff) as u32).to_be_bytes());
            bd.push(0);
            bd.extend_from_slice(&bs.to_be_bytes()[1..]);
        }
    }
    let mut v = Vec::with_capacity(8 + bd.len() + pages.len());
    if ten {
        let len = (6 + bd.len() + pages.len()) as u16;
        v.extend_from_slice(&len.to_be_bytes());
        v.extend_from_slice(&[0, dsp, u8::from(llbaa && !dbd), 0]);
        v.extend_from_slice(&(bd.len() as u16).to_be_bytes());
    } else {
        let len = (3 + bd.len() + pages.len()).min(255) as u8;
        v.extend_from_slice(&[len, 0, dsp, bd.len() as u8]);
    }
    v.extend_from_slice(&bd);
    v.extend_from_slice(&pages);
    if !ten {
        v.truncate(256);
    }
    Ok(Done::data_in(v, alloc))
}

fn report_opcodes(lu: &LogicalUnit, rctd: bool, options: u8, opcode: u8, sa: u16, alloc: u32) -> Outcome {
    let ops = || spc::OPS.iter().filter(|o| spc::op_supported(lu, o));
    let mut v = Vec::new();
    match options {
        0 => {
            for o in ops() {
                v.push(o.opcode);
                v.push(0);
                v.extend_from_slice(&u16::from(o.sa.unwrap_or(0)).to_be_bytes());
                v.push(0);
                v.push(if rctd { 0x02 } else { 0 } | u8::from(o.sa.is_some()));
                v.extend_from_slice(&(o.usage.len() as u16).to_be_bytes());
                if rctd {
                    v.extend_from_slice(&spc::timeouts_descriptor());
                }
            }
            let mut out = (v.len() as u32).to_be_bytes().to_vec();
            out.extend(v);
            return Ok(Done::data_in(out, alloc));
        }
        1..=3 => {
            let has_sa = ops().any(|o| o.opcode == opcode && o.sa.is_some());
            let found = match options {
                1 if has_sa => return Err(Sense::invalid_cdb_field(2, Some(2)).into()),
                1 => ops().find(|o| o.opcode == opcode),
                2 if !has_sa && ops().any(|o| o.opcode == opcode) => {
                    return Err(Sense::invalid_cdb_field(2, Some(2)).into())
                }
                _ => ops().find(|o| o.opcode == opcode && (o.sa.is_none() || o.sa.map(u16::from) == Some(sa))),
            };
            match found {
                Some(o) => {
                    v.extend_from_slice(&[0, 0x03 | if rctd { 0x80 } else { 0 }]);
                    v.extend_from_slice(&(o.usage.len() as u16).to_be_bytes());
                    v.extend_from_slice(o.usage);
                    if rctd {
                        v.extend_from_slice(&spc::timeouts_descriptor());
                    }
                }
                None => v.extend_from_slice(&[0, 0x01, 0, 0]),
            }
        }
        _ => return Err(Sense::invalid_cdb_field(2, Some(2)).into()),
    }
    Ok(Done::data_in(v, alloc))
}

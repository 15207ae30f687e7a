//! The full-feature session core of the target: every protocol decision of a logged-in
//! session (CmdSN window, task table, R2T and Data-Out, task management, text, logout, NOP,
//! keep-alive). Pure: frames, completions and `now` in, [`Action`]s out; it neither logs nor
//! touches sockets, tasks or devices, which are the driver's (`conn.rs`).

#![deny(clippy::unwrap_used, clippy::indexing_slicing)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use stics_scsi::{Command, Direction, Residual, Response, Sense, TaskAttr, TmfResult};
use stics_wire::frame::{self, DecodeError, Digests};
use stics_wire::keepalive::{Keepalive, Tick};
use stics_wire::keys::SessionType;
use stics_wire::lun as wire_lun;
use stics_wire::pdu::{
    attr, logout, reject, tmf, DataOut, Header, HeaderError, LogoutRequest, LogoutResponse, NopIn, NopOut, Opcode, Pdu,
    R2t, Reject, ScsiCommand, TaskMgmtRequest, TaskMgmtResponse, TextRequest, BHS_LEN, RESERVED_TAG,
};
use stics_wire::serial;

use crate::cmdsn::{Verdict, Window};
use crate::datain::{self, Shape};
use crate::dataout::{Burst, DataError, R2tReq, WriteTask, Writes};
use crate::order::{Kind, TaskOrder};
use crate::textreq::{Context as TextContext, Listing, TextError, TextState};

/// What a session is, fixed at login.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub session_type: SessionType,
    /// The connection's CID (MaxConnections is 1).
    pub cid: u16,
    /// ExpCmdSN after login.
    pub exp_cmd_sn: u32,
    /// Commands the initiator may have outstanding (the CmdSN window).
    pub queue_depth: u32,
    pub digests: Digests,
    pub burst: Burst,
    /// Bytes of write data held for commands still waiting for more.
    pub write_buffer: u64,
    /// Largest Expected Data Transfer Length of a write.
    pub max_command_bytes: u32,
    pub shape: Shape,
    /// LUNs of the target (0 for discovery).
    pub lun_count: usize,
    /// The target of a normal session.
    pub target: Option<String>,
    /// Targets this initiator may see in SendTargets.
    pub listings: Vec<Listing>,
    /// NOP-In ping interval (`None`: no pings) and how long a ping may go unanswered.
    pub nop_interval: Option<Duration>,
    pub nop_timeout: Duration,
}

/// A reset the SCSI device must perform before the task management response goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reset {
    ClearTaskSet(u64),
    Lun(u64),
    Target { cold: bool },
}

/// Why the session ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// A successful logout (its response is already queued).
    Logout,
    /// A header digest failed: the lengths cannot be trusted (RFC 7143 §7.8).
    HeaderDigest,
    /// A frame shorter than its own lengths.
    Truncated,
    /// The initiator did not answer a NOP-In ping.
    PingUnanswered,
}

impl CloseReason {
    /// A short description for the session-ended log line.
    pub fn describe(self) -> &'static str {
        match self {
            CloseReason::Logout | CloseReason::HeaderDigest | CloseReason::Truncated => "logout or protocol error",
            CloseReason::PingUnanswered => "initiator stopped answering pings",
        }
    }
}

/// Something worth a log line; the core reports, the driver logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    TaskManagement { function: u8, response: u8 },
    OutsideWindow { cmd_sn: u32, exp: u32, max: u32 },
    WriteTooLarge { len: u32 },
    WriteRefused(DataError),
    DataOutRefused { itt: u32, error: DataError },
    DataOutForNoTask { itt: u32 },
    TextRefused(TextError),
    DataDigest { opcode: Opcode },
    BadHeader(HeaderError),
}

/// What the driver must do, in order.
#[derive(Debug)]
pub enum Action {
    /// Queue a PDU for the writer (sequence numbers are stamped there).
    Send(Pdu),
    /// Run a SCSI command and report with [`SessionCore::on_command_done`], naming `task`: an
    /// ITT may be reused once its command was aborted, the task number never is.
    Execute {
        itt: u32,
        task: u64,
        command: Command,
    },
    /// Cancel the running command `itt`; it gets no response (its slot is freed already).
    Abort(u32),
    /// Abort the tasks of every other session of this target on a LUN (`None`: all LUNs).
    AbortOtherSessions(Option<u64>),
    /// Reset the device and report with [`SessionCore::on_reset_done`].
    Reset {
        itt: u32,
        reset: Reset,
    },
    /// End every session of this target (after a successful cold reset).
    DropTargetSessions,
    /// End the connection once what was queued is written.
    Close(CloseReason),
    Log(Event),
}

/// A command PDU that arrived, as the CmdSN window holds it until its turn.
#[derive(Debug)]
struct Arrived {
    pdu: Pdu,
    /// The whole frame (rejects quote its header).
    raw: Bytes,
    /// Its data failed the digest: the header stands, the data is zeros of the same length.
    lost: bool,
}

/// A command waiting for its write data.
#[derive(Debug)]
struct PendingWrite {
    h: ScsiCommand,
    cdb: Bytes,
    counted: bool,
    /// Its place in the task set.
    arrival: u64,
    /// Some of its data was lost to a digest error: once the initiator has sent the rest, the
    /// command ends with CHECK CONDITION instead of being executed (RFC 7143 §7.8, option b).
    lost: bool,
}

/// A command the driver is executing.
#[derive(Debug, Clone, Copy)]
struct Running {
    task: u64,
    lun: u64,
    r2ts: u32,
    counted: bool,
    arrival: u64,
}

/// A command with all its data, held until its task attribute lets it start.
#[derive(Debug)]
struct Ready {
    h: ScsiCommand,
    cdb: Bytes,
    data: Bytes,
    counted: bool,
    r2ts: u32,
}

/// A task management function waiting for the device's reset.
#[derive(Debug, Clone, Copy)]
struct PendingReset {
    function: u8,
    counted: bool,
}

/// The state of one full-feature session.
#[derive(Debug)]
pub struct SessionCore {
    cfg: SessionConfig,
    /// `None`: a CmdSN counted as received without a command (an ABORT TASK named it).
    window: Window<Option<Arrived>>,
    max_cmd_sn: u32,
    writes: Writes,
    pending: HashMap<u32, PendingWrite>,
    running: HashMap<u32, Running>,
    /// Every task from its arrival to its end, for the task attributes; commands whose turn
    /// has not come wait in it (`held`: ITT to arrival).
    order: TaskOrder<Ready>,
    held: HashMap<u32, u64>,
    resets: HashMap<u32, PendingReset>,
    text: TextState,
    shape: Shape,
    alive: Keepalive,
    next_ping_ttt: u32,
    next_task: u64,
    closed: bool,
}

impl SessionCore {
    /// A session that just logged in at `now`.
    pub fn new(cfg: SessionConfig, now: Instant) -> SessionCore {
        let depth = cfg.queue_depth.max(1);
        SessionCore {
            window: Window::new(cfg.exp_cmd_sn),
            max_cmd_sn: cfg.exp_cmd_sn.wrapping_add(depth - 1),
            writes: Writes::new(cfg.burst, cfg.write_buffer),
            pending: HashMap::new(),
            running: HashMap::new(),
            order: TaskOrder::default(),
            held: HashMap::new(),
            resets: HashMap::new(),
            text: TextState::default(),
            shape: cfg.shape,
            alive: Keepalive::new(cfg.nop_interval, cfg.nop_timeout.max(Duration::from_secs(1)), now),
            next_ping_ttt: 1,
            next_task: 1,
            closed: false,
            cfg,
        }
    }

    /// ExpCmdSN: the next CmdSN the session expects.
    pub fn exp_cmd_sn(&self) -> u32 {
        self.window.exp_cmd_sn()
    }

    /// MaxCmdSN: the last CmdSN the initiator may send now.
    pub fn max_cmd_sn(&self) -> u32 {
        self.max_cmd_sn
    }

    /// True while a command `itt` is executing (not finished, not aborted).
    pub fn is_running(&self, itt: u32) -> bool {
        self.running.contains_key(&itt)
    }

    /// True while task `task` (command `itt`) is executing.
    pub fn runs(&self, itt: u32, task: u64) -> bool {
        self.running.get(&itt).is_some_and(|r| r.task == task)
    }

    /// Bytes arrived from the initiator: it is alive, whatever it sent.
    pub fn on_received(&mut self, now: Instant) {
        self.alive.received(now);
        self.alive.answered();
    }

    /// When [`SessionCore::on_tick`] has something to do next.
    pub fn deadline(&self) -> Option<Instant> {
        self.alive.deadline()
    }

    /// Runs the keep-alive timer.
    pub fn on_tick(&mut self, now: Instant) -> Vec<Action> {
        if self.closed {
            return Vec::new();
        }
        match self.alive.tick(now) {
            Tick::Wait => Vec::new(),
            Tick::Ping => {
                let ttt = self.next_ping_ttt;
                // 0xffffffff would mean "no answer wanted".
                self.next_ping_ttt = match self.next_ping_ttt.wrapping_add(1) {
                    u32::MAX => 1,
                    n => n,
                };
                let ping = NopIn { itt: RESERVED_TAG, ttt, ..Default::default() };
                vec![Action::Send(Pdu::new(ping, Bytes::new()))]
            }
            Tick::Dead => {
                self.closed = true;
                vec![Action::Close(CloseReason::PingUnanswered)]
            }
        }
    }

    /// Takes one whole frame (checked for length by the driver).
    pub fn on_frame(&mut self, raw: Bytes) -> Vec<Action> {
        match frame::parse(raw.clone(), self.cfg.digests) {
            Ok(pdu) => self.on_pdu(pdu, raw),
            Err(e) => self.on_bad_frame(e, &raw),
        }
    }

    /// A frame that could not be decoded.
    pub fn on_bad_frame(&mut self, e: DecodeError, raw: &Bytes) -> Vec<Action> {
        let mut out = Vec::new();
        if self.closed {
            return out;
        }
        match e {
            DecodeError::HeaderDigest { .. } => {
                self.closed = true;
                out.push(Action::Close(CloseReason::HeaderDigest));
            }
            DecodeError::Truncated => {
                self.closed = true;
                out.push(Action::Close(CloseReason::Truncated));
            }
            DecodeError::DataDigest { bhs, opcode } => {
                out.push(Action::Log(Event::DataDigest { opcode }));
                reject(reject::DIGEST_ERROR, raw, &mut out);
                // The header passed its own check (or has none): only the data is lost. The
                // PDU goes on with zeros in place of its data so that its CmdSN and its place
                // in a write's data sequence are kept (RFC 7143 §7.8).
                if let Ok(header) = Header::decode(&bhs) {
                    let (ahs_len, dsl) = frame::segment_lengths(&bhs);
                    let ahs = raw.slice(BHS_LEN.min(raw.len())..(BHS_LEN + ahs_len).min(raw.len()));
                    let pdu = Pdu { header, ahs, data: Bytes::from(vec![0u8; dsl as usize]) };
                    out.extend(self.arrived(pdu, raw.clone(), true));
                }
            }
            DecodeError::Header { source, .. } => {
                out.push(Action::Log(Event::BadHeader(source)));
                reject(reject::COMMAND_NOT_SUPPORTED, raw, &mut out);
            }
        }
        out
    }

    /// Takes one decoded PDU; `raw` is its frame (rejects quote its header).
    pub fn on_pdu(&mut self, pdu: Pdu, raw: Bytes) -> Vec<Action> {
        self.arrived(pdu, raw, false)
    }

    fn arrived(&mut self, pdu: Pdu, raw: Bytes, lost: bool) -> Vec<Action> {
        let mut out = Vec::new();
        if self.closed {
            return out;
        }
        let (cmd_sn, immediate) = match &pdu.header {
            Header::ScsiCommand(h) => (h.cmd_sn, h.immediate),
            // A reply to a target ping, or a one-way ping: nothing to answer.
            Header::NopOut(h) if h.itt == RESERVED_TAG => return out,
            Header::NopOut(h) => (h.cmd_sn, h.immediate),
            Header::TaskMgmtRequest(h) => (h.cmd_sn, h.immediate),
            Header::TextRequest(h) => (h.cmd_sn, h.immediate),
            Header::LogoutRequest(h) => (h.cmd_sn, h.immediate),
            Header::DataOut(h) => {
                let h = *h;
                self.data_out(h, pdu.data, lost, &mut out);
                self.start_ready(&mut out);
                return out;
            }
            // ERL 0 has no SNACK; anything else has no place here.
            _ => {
                if !lost {
                    reject(reject::PROTOCOL_ERROR, &raw, &mut out);
                }
                return out;
            }
        };
        let max = self.max_cmd_sn;
        match self.window.offer(cmd_sn, immediate, max, Some(Arrived { pdu, raw, lost })) {
            Verdict::Deliver(a) => {
                self.deliver(a, !immediate, &mut out);
                while !self.closed {
                    let Some(a) = self.window.next_ready() else { break };
                    self.deliver(a, true, &mut out);
                }
            }
            Verdict::Queued => {}
            Verdict::Dropped(_) => {
                let exp = self.window.exp_cmd_sn();
                out.push(Action::Log(Event::OutsideWindow { cmd_sn, exp, max }));
            }
        }
        self.start_ready(&mut out);
        out
    }

    /// The SCSI layer finished task `task` (command `itt`); a command aborted meanwhile gets no
    /// response, and neither does a new command that reuses its ITT.
    pub fn on_command_done(&mut self, itt: u32, task: u64, resp: &Response) -> Vec<Action> {
        let mut out = Vec::new();
        if self.runs(itt, task) {
            if let Some(r) = self.running.remove(&itt) {
                self.order.end(r.arrival);
                self.respond(itt, r.lun, r.r2ts, r.counted, resp, &mut out);
                self.start_ready(&mut out);
            }
        }
        out
    }

    /// The device performed the reset that task management request `itt` asked for.
    pub fn on_reset_done(&mut self, itt: u32, result: TmfResult) -> Vec<Action> {
        let mut out = Vec::new();
        let Some(p) = self.resets.remove(&itt) else { return out };
        let response = match result {
            TmfResult::Complete => tmf::FUNCTION_COMPLETE,
            TmfResult::LunDoesNotExist => tmf::LUN_DOES_NOT_EXIST,
            TmfResult::NotSupported => tmf::NOT_SUPPORTED,
            TmfResult::Rejected => tmf::REJECTED,
        };
        self.tmf_response(itt, p.function, response, p.counted, &mut out);
        if p.function == tmf::TARGET_COLD_RESET && response == tmf::FUNCTION_COMPLETE {
            // RFC 7143 §11.5.1: after a cold reset the target drops every session of the target.
            out.push(Action::DropTargetSessions);
        }
        out
    }

    /// Another session's reset aborts this session's tasks on a LUN (`None`: all); SAM-5: a
    /// reset aborts the tasks of every I_T nexus. They end without a response (TAS is 0).
    pub fn on_abort_request(&mut self, lun: Option<u64>) -> Vec<Action> {
        let mut out = Vec::new();
        self.abort_where(|field| lun.is_none_or(|l| wire_lun::decode(field) == Some(l)), &mut out);
        self.start_ready(&mut out);
        out
    }

    fn release(&mut self, counted: bool) {
        if counted {
            // A command slot became free: the window moves up by one.
            self.max_cmd_sn = self.max_cmd_sn.wrapping_add(1);
        }
    }

    fn deliver(&mut self, arrived: Option<Arrived>, counted: bool, out: &mut Vec<Action>) {
        let Some(a) = arrived else {
            // A CmdSN an ABORT TASK counted as received: its slot is free at once.
            self.release(counted);
            return;
        };
        let normal = self.cfg.session_type == SessionType::Normal;
        if let Header::ScsiCommand(h) = a.pdu.header {
            if normal {
                return self.scsi_command(h, a, counted, out);
            }
        }
        let Arrived { pdu, raw, lost } = a;
        match pdu.header {
            // Only the command part of a SCSI command survives a data digest error; other
            // requests are answered by the Reject alone, their CmdSN counted.
            _ if lost => self.release(counted),
            Header::TaskMgmtRequest(h) if normal => self.task_mgmt(h, counted, out),
            Header::NopOut(h) => self.nop_out(h, pdu.data, counted, out),
            Header::TextRequest(h) => self.text(h, pdu.data, &raw, counted, out),
            Header::LogoutRequest(h) => self.logout(h, counted, out),
            _ => {
                // SCSI commands and task management have no place in a discovery session.
                self.release(counted);
                reject(reject::PROTOCOL_ERROR, &raw, out);
            }
        }
    }

    fn nop_out(&mut self, h: NopOut, data: Bytes, counted: bool, out: &mut Vec<Action>) {
        self.release(counted);
        let n = data.len().min(self.shape.max_xmit as usize);
        let echo = NopIn { lun: h.lun, itt: h.itt, ttt: RESERVED_TAG, ..Default::default() };
        out.push(Action::Send(Pdu::new(echo, data.slice(..n))));
    }

    fn scsi_command(&mut self, h: ScsiCommand, a: Arrived, counted: bool, out: &mut Vec<Action>) {
        let Arrived { pdu: Pdu { ahs, data, .. }, raw, lost } = a;
        if self.pending.contains_key(&h.itt) || self.running.contains_key(&h.itt) || self.held.contains_key(&h.itt) {
            self.release(counted);
            reject(reject::TASK_IN_PROGRESS, &raw, out);
            return;
        }
        let cdb = cdb_of(&h, &ahs);
        if !(h.write && h.expected_len > 0) {
            // Data on a command without W is ignored, as SAM asks of unexpected data.
            let arrival = self.arrive(&h);
            self.execute(arrival, Ready { h, cdb, data: Bytes::new(), counted, r2ts: 0 }, out);
            return;
        }
        if h.expected_len > self.cfg.max_command_bytes {
            out.push(Action::Log(Event::WriteTooLarge { len: h.expected_len }));
            self.fail(h.itt, h.lun, counted, Sense::invalid_cdb_field(0, None), out);
            return;
        }
        match WriteTask::new(h.itt, h.lun, h.expected_len, data, h.final_, self.writes.burst()) {
            Err(e) => {
                out.push(Action::Log(Event::WriteRefused(e)));
                self.fail(h.itt, h.lun, counted, Sense::data_phase_error(), out);
            }
            Ok(t) if lost && t.complete() => {
                // All the data came in the lost PDU; nothing more will come.
                self.fail(h.itt, h.lun, counted, Sense::protocol_crc_error(), out);
            }
            Ok(mut t) if t.complete() => {
                let d = t.take_data();
                let arrival = self.arrive(&h);
                self.execute(arrival, Ready { h, cdb, data: d, counted, r2ts: 0 }, out);
            }
            Ok(t) => {
                let arrival = self.arrive(&h);
                self.pending.insert(h.itt, PendingWrite { h, cdb, counted, arrival, lost });
                let r2ts = self.writes.add(t);
                send_r2ts(r2ts, out);
            }
        }
    }

    fn data_out(&mut self, h: DataOut, data: Bytes, lost: bool, out: &mut Vec<Action>) {
        if lost {
            if let Some(pw) = self.pending.get_mut(&h.itt) {
                pw.lost = true;
            }
        }
        match self.writes.data_out(&h, data) {
            Ok(p) => {
                send_r2ts(p.r2ts, out);
                if let Some(itt) = p.complete {
                    let (task, more) = self.writes.take(itt);
                    send_r2ts(more, out);
                    match (task, self.pending.remove(&itt)) {
                        (Some(_), Some(pw)) if pw.lost => {
                            self.order.end(pw.arrival);
                            self.fail(pw.h.itt, pw.h.lun, pw.counted, Sense::protocol_crc_error(), out);
                        }
                        (Some(mut t), Some(pw)) => {
                            let d = t.take_data();
                            let ready =
                                Ready { h: pw.h, cdb: pw.cdb, data: d, counted: pw.counted, r2ts: t.r2t_count() };
                            self.execute(pw.arrival, ready, out);
                        }
                        (None, Some(pw)) => {
                            self.order.end(pw.arrival);
                        }
                        _ => {}
                    }
                }
            }
            Err(error) => {
                let (_, more) = self.writes.take(h.itt);
                send_r2ts(more, out);
                match self.pending.remove(&h.itt) {
                    Some(pw) => {
                        self.order.end(pw.arrival);
                        out.push(Action::Log(Event::DataOutRefused { itt: h.itt, error }));
                        self.fail(pw.h.itt, pw.h.lun, pw.counted, Sense::data_phase_error(), out);
                    }
                    // Data for a task that failed or was aborted: dropped quietly.
                    None => out.push(Action::Log(Event::DataOutForNoTask { itt: h.itt })),
                }
            }
        }
    }

    fn respond(&mut self, itt: u32, lun: u64, r2ts: u32, counted: bool, resp: &Response, out: &mut Vec<Action>) {
        let mut pdus = Vec::with_capacity(1);
        datain::reply(itt, lun, resp, r2ts, self.shape, &mut pdus);
        self.release(counted);
        out.extend(pdus.into_iter().map(Action::Send));
    }

    fn fail(&mut self, itt: u32, lun: u64, counted: bool, sense: Sense, out: &mut Vec<Action>) {
        let resp =
            Response { status: 0x02, sense: Some(sense.to_bytes()), data_in: Bytes::new(), residual: Residual::None };
        self.respond(itt, lun, 0, counted, &resp, out);
    }

    /// Places a command in the task set.
    fn arrive(&mut self, h: &ScsiCommand) -> u64 {
        let kind = match h.attr {
            attr::ORDERED => Kind::Ordered,
            attr::HEAD_OF_QUEUE => Kind::HeadOfQueue,
            _ => Kind::Simple,
        };
        self.order.arrive(h.lun, kind)
    }

    /// Starts a command whose data is all in, or holds it until its task attribute allows.
    fn execute(&mut self, arrival: u64, ready: Ready, out: &mut Vec<Action>) {
        if self.order.may_start(arrival) {
            self.start(arrival, ready, out);
        } else {
            self.held.insert(ready.h.itt, arrival);
            self.order.hold(arrival, ready);
        }
    }

    /// Starts the held commands whose turn came.
    fn start_ready(&mut self, out: &mut Vec<Action>) {
        for (arrival, ready) in self.order.startable() {
            self.held.remove(&ready.h.itt);
            self.start(arrival, ready, out);
        }
    }

    fn start(&mut self, arrival: u64, ready: Ready, out: &mut Vec<Action>) {
        let Ready { h, cdb, data: data_out, counted, r2ts } = ready;
        let command = Command {
            lun: wire_lun::decode(h.lun).unwrap_or(u64::MAX),
            cdb,
            expected_len: h.expected_len,
            direction: match (h.read, h.write) {
                (false, false) => Direction::None,
                (true, false) => Direction::Read,
                (false, true) => Direction::Write,
                (true, true) => Direction::Bidi,
            },
            data_out,
            attr: match h.attr {
                attr::UNTAGGED => TaskAttr::Untagged,
                attr::ORDERED => TaskAttr::Ordered,
                attr::HEAD_OF_QUEUE => TaskAttr::HeadOfQueue,
                attr::ACA => TaskAttr::Aca,
                _ => TaskAttr::Simple,
            },
        };
        let task = self.next_task;
        self.next_task += 1;
        self.running.insert(h.itt, Running { task, lun: h.lun, r2ts, counted, arrival });
        out.push(Action::Execute { itt: h.itt, task, command });
    }

    /// Aborts one task; true if it existed.
    fn abort_task(&mut self, itt: u32, out: &mut Vec<Action>) -> bool {
        if let Some(pw) = self.pending.remove(&itt) {
            let (_, more) = self.writes.take(itt);
            send_r2ts(more, out);
            self.order.end(pw.arrival);
            self.release(pw.counted);
            return true;
        }
        if let Some(r) = self.running.remove(&itt) {
            out.push(Action::Abort(itt));
            self.order.end(r.arrival);
            self.release(r.counted);
            return true;
        }
        if let Some(arrival) = self.held.remove(&itt) {
            if let Some(ready) = self.order.end(arrival) {
                self.release(ready.counted);
            }
            return true;
        }
        false
    }

    /// ABORT TASK of a command not yet delivered: one that waits in the window for earlier
    /// CmdSNs is dropped there; one never received whose RefCmdSN lies in the window before the
    /// request's own CmdSN is counted as received (RFC 7143 §11.5.1), so that the commands after
    /// it are not held forever. True if either applied.
    fn abort_unstarted(&mut self, h: &TaskMgmtRequest) -> bool {
        for (_, item) in self.window.held_mut() {
            let named = matches!(item, Some(Arrived { pdu: Pdu { header: Header::ScsiCommand(c), .. }, .. }) if c.itt == h.referenced_tag);
            if named {
                *item = None;
                return true;
            }
        }
        let (exp, sn) = (self.window.exp_cmd_sn(), h.ref_cmd_sn);
        if serial::lt(sn, exp) || serial::lt(self.max_cmd_sn, sn) || !serial::lt(sn, h.cmd_sn) {
            return false;
        }
        match self.window.offer(sn, false, self.max_cmd_sn, None) {
            // The hole was at ExpCmdSN: its slot frees now, and `on_pdu` delivers what waited.
            Verdict::Deliver(_) => {
                self.release(true);
                true
            }
            Verdict::Queued => true,
            Verdict::Dropped(_) => false,
        }
    }

    /// Aborts every task whose LUN field matches. The waiting writes go first, all together,
    /// so that none of them is given an R2T on its way out.
    fn abort_where(&mut self, matches: impl Fn(u64) -> bool, out: &mut Vec<Action>) {
        let pending: Vec<u32> = self.pending.iter().filter(|(_, p)| matches(p.h.lun)).map(|(i, _)| *i).collect();
        for itt in &pending {
            if let Some(pw) = self.pending.remove(itt) {
                self.order.end(pw.arrival);
                self.release(pw.counted);
            }
        }
        send_r2ts(self.writes.take_all(&pending), out);
        let held: Vec<u32> = self.order.held().filter(|(_, r)| matches(r.h.lun)).map(|(_, r)| r.h.itt).collect();
        for itt in held {
            self.abort_task(itt, out);
        }
        let running: Vec<u32> = self.running.iter().filter(|(_, r)| matches(r.lun)).map(|(i, _)| *i).collect();
        for itt in running {
            self.abort_task(itt, out);
        }
    }

    fn task_mgmt(&mut self, h: TaskMgmtRequest, counted: bool, out: &mut Vec<Action>) {
        if self.resets.contains_key(&h.itt) {
            // Its ITT names a request still in progress: the earlier one keeps it.
            return self.tmf_response(h.itt, h.function, tmf::REJECTED, counted, out);
        }
        let lun_count = self.cfg.lun_count;
        let lun = wire_lun::decode(h.lun).filter(|&l| usize::try_from(l).is_ok_and(|l| l < lun_count));
        let reset = match h.function {
            tmf::ABORT_TASK => {
                let response = if self.abort_task(h.referenced_tag, out) || self.abort_unstarted(&h) {
                    tmf::FUNCTION_COMPLETE
                } else {
                    tmf::TASK_DOES_NOT_EXIST
                };
                return self.tmf_response(h.itt, h.function, response, counted, out);
            }
            tmf::ABORT_TASK_SET | tmf::CLEAR_TASK_SET | tmf::LOGICAL_UNIT_RESET => {
                let Some(l) = lun else {
                    return self.tmf_response(h.itt, h.function, tmf::LUN_DOES_NOT_EXIST, counted, out);
                };
                self.abort_where(|field| field == h.lun, out);
                match h.function {
                    tmf::CLEAR_TASK_SET => Reset::ClearTaskSet(l),
                    tmf::LOGICAL_UNIT_RESET => {
                        out.push(Action::AbortOtherSessions(Some(l)));
                        Reset::Lun(l)
                    }
                    _ => return self.tmf_response(h.itt, h.function, tmf::FUNCTION_COMPLETE, counted, out),
                }
            }
            tmf::TARGET_WARM_RESET | tmf::TARGET_COLD_RESET => {
                self.abort_where(|_| true, out);
                out.push(Action::AbortOtherSessions(None));
                Reset::Target { cold: h.function == tmf::TARGET_COLD_RESET }
            }
            tmf::CLEAR_ACA => return self.tmf_response(h.itt, h.function, tmf::NOT_SUPPORTED, counted, out),
            tmf::TASK_REASSIGN => {
                return self.tmf_response(h.itt, h.function, tmf::REASSIGNMENT_NOT_SUPPORTED, counted, out)
            }
            _ => return self.tmf_response(h.itt, h.function, tmf::REJECTED, counted, out),
        };
        self.resets.insert(h.itt, PendingReset { function: h.function, counted });
        out.push(Action::Reset { itt: h.itt, reset });
    }

    fn tmf_response(&mut self, itt: u32, function: u8, response: u8, counted: bool, out: &mut Vec<Action>) {
        out.push(Action::Log(Event::TaskManagement { function, response }));
        self.release(counted);
        out.push(Action::Send(Pdu::new(TaskMgmtResponse { response, itt, ..Default::default() }, Bytes::new())));
    }

    fn text(&mut self, h: TextRequest, data: Bytes, raw: &Bytes, counted: bool, out: &mut Vec<Action>) {
        let ctx = TextContext {
            session_type: self.cfg.session_type,
            target: self.cfg.target.as_deref(),
            visible: &self.cfg.listings,
            max_xmit: self.shape.max_xmit,
        };
        let result = self.text.request(&h, &data, &ctx);
        self.release(counted);
        match result {
            Ok(a) => {
                if let Some(m) = a.max_xmit {
                    self.shape.max_xmit = m;
                }
                out.push(Action::Send(a.pdu));
            }
            Err(e) => {
                out.push(Action::Log(Event::TextRefused(e)));
                reject(reject::INVALID_PDU_FIELD, raw, out);
            }
        }
    }

    fn logout(&mut self, h: LogoutRequest, counted: bool, out: &mut Vec<Action>) {
        let response = match h.reason {
            logout::CLOSE_SESSION => logout::SUCCESS,
            logout::CLOSE_CONNECTION if h.cid == self.cfg.cid => logout::SUCCESS,
            logout::CLOSE_CONNECTION => logout::CID_NOT_FOUND,
            _ => logout::RECOVERY_NOT_SUPPORTED,
        };
        self.release(counted);
        out.push(Action::Send(Pdu::new(LogoutResponse { response, itt: h.itt, ..Default::default() }, Bytes::new())));
        if response == logout::SUCCESS {
            self.closed = true;
            out.push(Action::Close(CloseReason::Logout));
        }
    }
}

fn reject(reason: u8, raw: &Bytes, out: &mut Vec<Action>) {
    let bhs = raw.slice(..BHS_LEN.min(raw.len()));
    out.push(Action::Send(Pdu::new(Reject { reason, ..Default::default() }, bhs)));
}

fn send_r2ts(r2ts: Vec<R2tReq>, out: &mut Vec<Action>) {
    out.extend(r2ts.into_iter().map(|r| {
        let h = R2t {
            lun: r.lun,
            itt: r.itt,
            ttt: r.ttt,
            r2t_sn: r.r2t_sn,
            buffer_offset: r.offset,
            desired_len: r.len,
            ..Default::default()
        };
        Action::Send(Pdu::new(h, Bytes::new()))
    }));
}

/// The CDB: the 16 bytes of the BHS, extended by an Extended CDB AHS (RFC 7143 §11.2.2.3).
/// An AHS cut short gives what it holds; one with fewer than its 4 header bytes is ignored.
fn cdb_of(h: &ScsiCommand, ahs: &Bytes) -> Bytes {
    let mut rest: &[u8] = ahs;
    while let &[hi, lo, kind, _, ref tail @ ..] = rest {
        let len = usize::from(u16::from_be_bytes([hi, lo]));
        if kind == 1 && len > 1 {
            // AHSLength counts the reserved byte before the CDB's bytes past the 16th.
            let ext = tail.get(..len - 1).unwrap_or(tail);
            let mut v = Vec::with_capacity(16 + ext.len());
            v.extend_from_slice(&h.cdb);
            v.extend_from_slice(ext);
            return Bytes::from(v);
        }
        rest = rest.get((3 + len).div_ceil(4) * 4..).unwrap_or_default();
    }
    Bytes::copy_from_slice(&h.cdb)
}

/// Stamps StatSN, ExpCmdSN and MaxCmdSN on an outgoing header (RFC 7143 §4.2.2.2, §11):
/// status-bearing PDUs take the next StatSN; R2T, Data-In without status, pings (NOP-In with
/// the reserved ITT) and asynchronous messages show it without advancing it.
pub fn stamp(h: &mut Header, stat_sn: &mut u32, exp: u32, max: u32) {
    let mut next = |advance: bool| {
        let v = *stat_sn;
        if advance {
            *stat_sn = stat_sn.wrapping_add(1);
        }
        v
    };
    match h {
        Header::ScsiResponse(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn) = (next(true), exp, max),
        Header::DataIn(d) => {
            if d.status_present {
                d.stat_sn = next(true);
            }
            (d.exp_cmd_sn, d.max_cmd_sn) = (exp, max);
        }
        Header::NopIn(n) => {
            let advance = n.itt != RESERVED_TAG;
            (n.stat_sn, n.exp_cmd_sn, n.max_cmd_sn) = (next(advance), exp, max);
        }
        Header::TaskMgmtResponse(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn) = (next(true), exp, max),
        Header::TextResponse(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn) = (next(true), exp, max),
        Header::LogoutResponse(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn) = (next(true), exp, max),
        Header::R2t(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn) = (next(false), exp, max),
        Header::Reject(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn) = (next(true), exp, max),
        Header::AsyncMessage(a) => (a.stat_sn, a.exp_cmd_sn, a.max_cmd_sn) = (next(false), exp, max),
        _ => {}
    }
}

#[cfg(test)]
#[expect(clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::*;
    use stics_wire::pdu::{DataIn, ScsiResponse, TextResponse};

    const S: Duration = Duration::from_secs(1);
    const DEPTH: u32 = 4;

    fn config(kind: SessionType) -> SessionConfig {
        SessionConfig {
            session_type: kind,
            cid: 7,
            exp_cmd_sn: 100,
            queue_depth: DEPTH,
            digests: Digests::default(),
            burst: Burst {
                initial_r2t: true,
                immediate_data: true,
                first_burst: 8192,
                max_burst: 8192,
                max_outstanding_r2t: 1,
            },
            write_buffer: 1 << 20,
            max_command_bytes: 1 << 20,
            shape: Shape { max_xmit: 8192, max_burst: 65536 },
            lun_count: 2,
            target: Some("iqn.2024-01.test:t".into()),
            listings: Vec::new(),
            nop_interval: Some(10 * S),
            nop_timeout: 5 * S,
        }
    }

    fn core() -> (SessionCore, Instant) {
        let t0 = Instant::now();
        (SessionCore::new(config(SessionType::Normal), t0), t0)
    }

    /// Completes whatever task runs under `itt` now.
    fn done(c: &mut SessionCore, itt: u32, resp: &Response) -> Vec<Action> {
        let task = c.running.get(&itt).map_or(0, |r| r.task);
        c.on_command_done(itt, task, resp)
    }

    fn feed(c: &mut SessionCore, pdu: Pdu) -> Vec<Action> {
        let mut raw = bytes::BytesMut::new();
        frame::encode(&pdu, Digests::default(), &mut raw);
        c.on_frame(raw.freeze())
    }

    fn read(itt: u32, cmd_sn: u32, lun: u64) -> Pdu {
        let h = ScsiCommand {
            final_: true,
            read: true,
            lun: wire_lun::encode(lun),
            itt,
            expected_len: 512,
            cmd_sn,
            cdb: [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0],
            ..Default::default()
        };
        Pdu::new(h, Bytes::new())
    }

    fn write(itt: u32, cmd_sn: u32, lun: u64, len: u32) -> Pdu {
        let h = ScsiCommand {
            final_: true,
            write: true,
            lun: wire_lun::encode(lun),
            itt,
            expected_len: len,
            cmd_sn,
            cdb: [0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0],
            ..Default::default()
        };
        Pdu::new(h, Bytes::new())
    }

    fn tmf(function: u8, itt: u32, cmd_sn: u32, lun: u64, referenced_tag: u32) -> Pdu {
        let h = TaskMgmtRequest {
            immediate: true,
            function: function | 0x80,
            lun: wire_lun::encode(lun),
            itt,
            referenced_tag,
            cmd_sn,
            ..Default::default()
        };
        Pdu::new(h, Bytes::new())
    }

    fn sends(a: &[Action]) -> Vec<&Pdu> {
        a.iter().filter_map(|a| if let Action::Send(p) = a { Some(p) } else { None }).collect()
    }

    fn executed(a: &[Action]) -> Vec<u32> {
        a.iter().filter_map(|a| if let Action::Execute { itt, .. } = a { Some(*itt) } else { None }).collect()
    }

    fn aborted(a: &[Action]) -> Vec<u32> {
        let mut v: Vec<u32> =
            a.iter().filter_map(|a| if let Action::Abort(itt) = a { Some(*itt) } else { None }).collect();
        v.sort_unstable();
        v
    }

    fn tmf_response(a: &[Action]) -> u8 {
        match sends(a).iter().find_map(|p| if let Header::TaskMgmtResponse(r) = p.header { Some(r) } else { None }) {
            Some(r) => r.response,
            None => panic!("no task management response in {a:?}"),
        }
    }

    fn good() -> Response {
        Response { status: 0, sense: None, data_in: Bytes::from(vec![0u8; 512]), residual: Residual::None }
    }

    #[test]
    fn status_pdus_advance_statsn_and_others_do_not() {
        let mut sn = 10;
        let mut h = Header::from(ScsiResponse::default());
        stamp(&mut h, &mut sn, 5, 20);
        let mut r = Header::from(R2t::default());
        stamp(&mut r, &mut sn, 5, 20);
        let mut d = Header::from(DataIn::default());
        stamp(&mut d, &mut sn, 5, 20);
        let mut ping = Header::from(NopIn { itt: RESERVED_TAG, ..Default::default() });
        stamp(&mut ping, &mut sn, 5, 20);
        assert_eq!(sn, 11);
        match (h, r) {
            (Header::ScsiResponse(h), Header::R2t(r)) => {
                assert_eq!((h.stat_sn, h.exp_cmd_sn, h.max_cmd_sn), (10, 5, 20));
                assert_eq!(r.stat_sn, 11);
            }
            _ => panic!(),
        }
        let mut t = Header::from(TextResponse::default());
        stamp(&mut t, &mut sn, 5, 20);
        assert_eq!(sn, 12);
    }

    #[test]
    fn extended_cdb_ahs_is_appended() {
        let mut h = ScsiCommand::default();
        h.cdb[0] = 0x7f;
        let ahs = Bytes::from_static(&[0, 5, 1, 0, 0xaa, 0xbb, 0xcc, 0xdd]);
        let cdb = cdb_of(&h, &ahs);
        assert_eq!(cdb.len(), 20);
        assert_eq!(&cdb[16..], &[0xaa, 0xbb, 0xcc, 0xdd]);
        assert_eq!(cdb_of(&h, &Bytes::new()).len(), 16);
        assert_eq!(cdb_of(&h, &Bytes::from_static(&[0xff, 0xff, 1, 0])).len(), 16);
    }

    #[test]
    fn extended_cdb_ahs_after_another_ahs_or_cut_short() {
        let mut h = ScsiCommand::default();
        h.cdb[0] = 0x7f;
        // A Bidirectional Read Expected Data Transfer Length AHS (type 2), padded to 8 bytes, first.
        let ahs = Bytes::from_static(&[0, 5, 2, 0, 0, 0, 2, 0, 0, 3, 1, 0, 0xaa, 0xbb, 0, 0]);
        assert_eq!(cdb_of(&h, &ahs).get(16..), Some(&[0xaa, 0xbb][..]));
        // The AHS says 8 CDB bytes follow, the segment holds 2: those 2 are taken.
        let cut = Bytes::from_static(&[0, 9, 1, 0, 0xaa, 0xbb]);
        assert_eq!(cdb_of(&h, &cut).get(16..), Some(&[0xaa, 0xbb][..]));
        // A header cut short, or a first AHS whose length runs past the segment, adds nothing.
        assert_eq!(cdb_of(&h, &Bytes::from_static(&[0, 5, 1])).len(), 16);
        assert_eq!(cdb_of(&h, &Bytes::from_static(&[0, 9, 2, 0, 0, 5, 1, 0, 1, 2, 3, 4])).len(), 16);
    }

    fn with_attr(mut p: Pdu, a: u8) -> Pdu {
        if let Header::ScsiCommand(h) = &mut p.header {
            h.attr = a;
        }
        p
    }

    #[test]
    fn an_ordered_command_waits_for_older_ones_and_holds_back_newer_ones() {
        let (mut c, _) = core();
        assert_eq!(executed(&feed(&mut c, read(1, 100, 0))), vec![1]);
        // ORDERED: held while command 1 runs.
        assert!(executed(&feed(&mut c, with_attr(read(2, 101, 0), attr::ORDERED))).is_empty());
        // SIMPLE after it: held; on another LUN: runs.
        assert!(executed(&feed(&mut c, read(3, 102, 0))).is_empty());
        assert_eq!(executed(&feed(&mut c, read(4, 103, 1))), vec![4]);
        assert_eq!(executed(&done(&mut c, 1, &good())), vec![2]);
        assert!(executed(&done(&mut c, 4, &good())).is_empty());
        assert_eq!(executed(&done(&mut c, 2, &good())), vec![3]);
        let a = done(&mut c, 3, &good());
        assert_eq!(sends(&a).len(), 1, "every command was answered");
    }

    #[test]
    fn aborting_a_held_command_frees_its_slot_and_the_ones_behind_it() {
        let (mut c, _) = core();
        feed(&mut c, read(1, 100, 0));
        feed(&mut c, with_attr(read(2, 101, 0), attr::ORDERED));
        feed(&mut c, read(3, 102, 0));
        let max = c.max_cmd_sn();
        let a = feed(&mut c, tmf(tmf::ABORT_TASK, 9, 103, 0, 2));
        assert_eq!(executed(&a), vec![3], "the barrier went with the aborted task");
        assert_eq!(c.max_cmd_sn(), max.wrapping_add(1), "its slot is free (the TMF was immediate)");
        // A new command may reuse the aborted ITT.
        assert_eq!(executed(&feed(&mut c, read(2, 103, 0))), vec![2]);
        // A LUN reset drops held ones too: nothing starts after it.
        feed(&mut c, with_attr(read(5, 104, 0), attr::ORDERED));
        feed(&mut c, read(6, 105, 0));
        let a = feed(&mut c, tmf(tmf::ABORT_TASK_SET, 10, 106, 0, 0));
        assert!(executed(&a).is_empty());
        assert!(c.held.is_empty() && c.running.is_empty());
    }

    #[test]
    fn a_write_waiting_for_data_blocks_an_ordered_command_behind_it() {
        let (mut c, _) = core();
        let a = feed(&mut c, write(1, 100, 0, 4096));
        assert!(executed(&a).is_empty() && !sends(&a).is_empty(), "an R2T goes out");
        assert!(executed(&feed(&mut c, with_attr(read(2, 101, 0), attr::ORDERED))).is_empty());
        let mut h = DataOut { final_: true, lun: wire_lun::encode(0), itt: 1, ..Default::default() };
        h.ttt = match sends(&a)[0].header {
            Header::R2t(r) => r.ttt,
            _ => panic!("an R2T"),
        };
        assert_eq!(executed(&feed(&mut c, Pdu::new(h, Bytes::from(vec![7u8; 4096])))), vec![1]);
        assert_eq!(executed(&done(&mut c, 1, &good())), vec![2]);
    }

    #[test]
    fn in_window_command_is_executed_and_answered_when_done() {
        let (mut c, _) = core();
        let a = feed(&mut c, read(1, 100, 0));
        assert_eq!(executed(&a), vec![1]);
        assert_eq!(c.exp_cmd_sn(), 101);
        let a = done(&mut c, 1, &good());
        let p = sends(&a);
        assert_eq!(p.len(), 1);
        assert!(matches!(p[0].header, Header::DataIn(d) if d.itt == 1 && d.status_present));
    }

    #[test]
    fn commands_outside_the_window_are_ignored() {
        let (mut c, _) = core();
        let max = c.max_cmd_sn();
        assert_eq!(max, 100 + DEPTH - 1);
        let a = feed(&mut c, read(1, 99, 0));
        assert!(matches!(a[..], [Action::Log(Event::OutsideWindow { cmd_sn: 99, exp: 100, .. })]));
        let a = feed(&mut c, read(2, max + 1, 0));
        assert!(matches!(a[..], [Action::Log(Event::OutsideWindow { .. })]));
        assert_eq!(c.exp_cmd_sn(), 100);
    }

    #[test]
    fn a_gap_holds_later_commands_until_it_fills() {
        let (mut c, _) = core();
        assert!(feed(&mut c, read(2, 101, 0)).is_empty());
        assert!(feed(&mut c, read(3, 102, 0)).is_empty());
        assert_eq!(c.exp_cmd_sn(), 100);
        let a = feed(&mut c, read(1, 100, 0));
        assert_eq!(executed(&a), vec![1, 2, 3]);
        assert_eq!(c.exp_cmd_sn(), 103);
    }

    #[test]
    fn immediate_commands_bypass_the_window_and_take_no_slot() {
        let (mut c, _) = core();
        let mut p = read(1, 100, 0);
        if let Header::ScsiCommand(h) = &mut p.header {
            h.immediate = true;
        }
        let a = feed(&mut c, p);
        assert_eq!(executed(&a), vec![1]);
        assert_eq!(c.exp_cmd_sn(), 100);
        let max = c.max_cmd_sn();
        done(&mut c, 1, &good());
        assert_eq!(c.max_cmd_sn(), max, "an immediate command frees no slot");
    }

    #[test]
    fn max_cmd_sn_advances_as_slots_free() {
        let (mut c, _) = core();
        let max = c.max_cmd_sn();
        for i in 0..DEPTH {
            feed(&mut c, read(i, 100 + i, 0));
        }
        assert_eq!(c.max_cmd_sn(), max);
        let a = feed(&mut c, read(9, 100 + DEPTH, 0));
        assert!(executed(&a).is_empty(), "the window is full");
        done(&mut c, 0, &good());
        assert_eq!(c.max_cmd_sn(), max.wrapping_add(1));
        let a = feed(&mut c, read(9, 100 + DEPTH, 0));
        assert_eq!(executed(&a), vec![9]);
    }

    #[test]
    fn a_reused_itt_of_a_running_command_is_rejected() {
        let (mut c, _) = core();
        feed(&mut c, read(1, 100, 0));
        let max = c.max_cmd_sn();
        let a = feed(&mut c, read(1, 101, 0));
        assert!(executed(&a).is_empty());
        assert!(matches!(sends(&a)[0].header, Header::Reject(r) if r.reason == reject::TASK_IN_PROGRESS));
        assert_eq!(c.max_cmd_sn(), max.wrapping_add(1));
    }

    #[test]
    fn abort_task_of_a_running_command_cancels_it_without_a_response() {
        let (mut c, _) = core();
        feed(&mut c, read(1, 100, 0));
        let max = c.max_cmd_sn();
        let a = feed(&mut c, tmf(tmf::ABORT_TASK, 50, 101, 0, 1));
        assert_eq!(aborted(&a), vec![1]);
        assert_eq!(tmf_response(&a), tmf::FUNCTION_COMPLETE);
        assert_eq!(c.max_cmd_sn(), max.wrapping_add(1), "the aborted command's slot is free");
        assert!(!c.is_running(1));
        assert!(done(&mut c, 1, &good()).is_empty(), "an aborted command gets no response");
    }

    #[test]
    fn abort_task_of_a_write_waiting_for_data_drops_it() {
        let (mut c, _) = core();
        let a = feed(&mut c, write(1, 100, 0, 4096));
        assert!(matches!(sends(&a)[0].header, Header::R2t(r) if r.itt == 1 && r.desired_len == 4096));
        let a = feed(&mut c, tmf(tmf::ABORT_TASK, 50, 101, 0, 1));
        assert_eq!(tmf_response(&a), tmf::FUNCTION_COMPLETE);
        assert!(aborted(&a).is_empty(), "nothing was executing");
        let d = DataOut { final_: true, itt: 1, ttt: 1, ..Default::default() };
        let a = feed(&mut c, Pdu::new(d, Bytes::from(vec![0u8; 4096])));
        assert!(executed(&a).is_empty());
        assert!(matches!(a[..], [Action::Log(Event::DataOutForNoTask { itt: 1 })]));
    }

    #[test]
    fn abort_task_of_an_unknown_tag_says_it_does_not_exist() {
        let (mut c, _) = core();
        let a = feed(&mut c, tmf(tmf::ABORT_TASK, 50, 100, 0, 77));
        assert_eq!(tmf_response(&a), tmf::TASK_DOES_NOT_EXIST);
    }

    #[test]
    fn abort_task_set_aborts_only_the_tasks_of_its_lun() {
        let (mut c, _) = core();
        feed(&mut c, read(1, 100, 0));
        feed(&mut c, read(2, 101, 1));
        feed(&mut c, write(3, 102, 0, 4096));
        let a = feed(&mut c, tmf(tmf::ABORT_TASK_SET, 50, 103, 0, 0));
        assert_eq!(aborted(&a), vec![1]);
        assert_eq!(tmf_response(&a), tmf::FUNCTION_COMPLETE);
        assert!(!a.iter().any(|a| matches!(a, Action::AbortOtherSessions(_) | Action::Reset { .. })));
        assert!(c.is_running(2));
        assert!(!c.is_running(1));
        let d = DataOut { final_: true, itt: 3, ttt: 1, ..Default::default() };
        assert!(executed(&feed(&mut c, Pdu::new(d, Bytes::from(vec![0u8; 4096])))).is_empty());
    }

    #[test]
    fn task_management_on_a_missing_lun_says_so() {
        let (mut c, _) = core();
        let a = feed(&mut c, tmf(tmf::LOGICAL_UNIT_RESET, 50, 100, 5, 0));
        assert_eq!(tmf_response(&a), tmf::LUN_DOES_NOT_EXIST);
    }

    #[test]
    fn clear_task_set_aborts_the_luns_tasks_and_asks_the_device_to_clear() {
        let (mut c, _) = core();
        feed(&mut c, read(1, 100, 1));
        let a = feed(&mut c, tmf(tmf::CLEAR_TASK_SET, 50, 101, 1, 0));
        assert_eq!(aborted(&a), vec![1]);
        assert!(matches!(a.last(), Some(Action::Reset { itt: 50, reset: Reset::ClearTaskSet(1) })));
        assert!(sends(&a).is_empty(), "the response waits for the device");
        let a = c.on_reset_done(50, TmfResult::Complete);
        assert_eq!(tmf_response(&a), tmf::FUNCTION_COMPLETE);
    }

    #[test]
    fn lun_reset_aborts_the_tasks_of_other_sessions_on_that_lun() {
        let (mut a_core, _) = core();
        let (mut b_core, _) = core();
        feed(&mut a_core, read(1, 100, 0));
        feed(&mut b_core, read(1, 100, 0));
        feed(&mut b_core, read(2, 101, 1));
        feed(&mut b_core, write(3, 102, 0, 4096));
        let b_max = b_core.max_cmd_sn();
        let a = feed(&mut a_core, tmf(tmf::LOGICAL_UNIT_RESET, 50, 101, 0, 0));
        assert_eq!(aborted(&a), vec![1]);
        assert!(a.iter().any(|x| matches!(x, Action::AbortOtherSessions(Some(0)))));
        assert!(matches!(a.last(), Some(Action::Reset { itt: 50, reset: Reset::Lun(0) })));
        // The driver hands the abort to the other session's core.
        let b = b_core.on_abort_request(Some(0));
        assert_eq!(aborted(&b), vec![1]);
        assert!(sends(&b).is_empty(), "aborted tasks of another session get no response");
        assert!(b_core.is_running(2), "tasks on other LUNs go on");
        assert_eq!(b_core.max_cmd_sn(), b_max.wrapping_add(2), "both aborted tasks free their slots");
        let d = DataOut { final_: true, itt: 3, ttt: 1, ..Default::default() };
        assert!(executed(&feed(&mut b_core, Pdu::new(d, Bytes::from(vec![0u8; 4096])))).is_empty());
        assert_eq!(tmf_response(&a_core.on_reset_done(50, TmfResult::Complete)), tmf::FUNCTION_COMPLETE);
    }

    #[test]
    fn target_cold_reset_drops_every_session_of_the_target_when_done() {
        let (mut c, _) = core();
        feed(&mut c, read(1, 100, 0));
        feed(&mut c, read(2, 101, 1));
        let a = feed(&mut c, tmf(tmf::TARGET_COLD_RESET, 50, 102, 0, 0));
        assert_eq!(aborted(&a), vec![1, 2]);
        assert!(a.iter().any(|x| matches!(x, Action::AbortOtherSessions(None))));
        assert!(matches!(a.last(), Some(Action::Reset { reset: Reset::Target { cold: true }, .. })));
        let a = c.on_reset_done(50, TmfResult::Complete);
        assert_eq!(tmf_response(&a), tmf::FUNCTION_COMPLETE);
        assert!(matches!(a.last(), Some(Action::DropTargetSessions)));
    }

    #[test]
    fn task_management_is_refused_in_a_discovery_session() {
        let mut c = SessionCore::new(config(SessionType::Discovery), Instant::now());
        let a = feed(&mut c, tmf(tmf::LOGICAL_UNIT_RESET, 50, 100, 0, 0));
        assert!(matches!(sends(&a)[0].header, Header::Reject(r) if r.reason == reject::PROTOCOL_ERROR));
        let a = feed(&mut c, read(1, 100, 0));
        assert!(executed(&a).is_empty());
    }

    fn logout(reason: u8, cid: u16) -> Pdu {
        let h =
            LogoutRequest { immediate: true, reason: reason | 0x80, itt: 9, cid, cmd_sn: 100, ..Default::default() };
        Pdu::new(h, Bytes::new())
    }

    fn logout_response(a: &[Action]) -> u8 {
        match sends(a)[0].header {
            Header::LogoutResponse(r) => r.response,
            ref h => panic!("{h:?}"),
        }
    }

    #[test]
    fn logout_closing_the_session_answers_then_closes() {
        let (mut c, _) = core();
        let a = feed(&mut c, logout(logout::CLOSE_SESSION, 0));
        assert_eq!(logout_response(&a), logout::SUCCESS);
        assert!(matches!(a.last(), Some(Action::Close(CloseReason::Logout))));
        assert!(feed(&mut c, read(1, 100, 0)).is_empty(), "nothing is taken after a logout");
    }

    #[test]
    fn logout_closing_this_connection_answers_then_closes() {
        let (mut c, _) = core();
        let a = feed(&mut c, logout(logout::CLOSE_CONNECTION, 7));
        assert_eq!(logout_response(&a), logout::SUCCESS);
        assert!(matches!(a.last(), Some(Action::Close(CloseReason::Logout))));
    }

    #[test]
    fn logout_of_another_cid_is_refused_and_the_session_goes_on() {
        let (mut c, _) = core();
        let a = feed(&mut c, logout(logout::CLOSE_CONNECTION, 8));
        assert_eq!(logout_response(&a), logout::CID_NOT_FOUND);
        assert!(!a.iter().any(|x| matches!(x, Action::Close(_))));
        assert_eq!(executed(&feed(&mut c, read(1, 100, 0))), vec![1]);
    }

    #[test]
    fn nop_out_is_echoed_with_its_data() {
        let (mut c, _) = core();
        let h = NopOut { immediate: true, itt: 4, ttt: RESERVED_TAG, cmd_sn: 100, lun: 0, exp_stat_sn: 0 };
        let a = feed(&mut c, Pdu::new(h, Bytes::from_static(b"ping")));
        let p = sends(&a);
        assert!(matches!(p[0].header, Header::NopIn(n) if n.itt == 4 && n.ttt == RESERVED_TAG));
        assert_eq!(&p[0].data[..], b"ping");
    }

    #[test]
    fn nop_out_answering_a_ping_gets_no_reply() {
        let (mut c, _) = core();
        let h = NopOut { immediate: true, itt: RESERVED_TAG, ttt: 1, cmd_sn: 100, lun: 0, exp_stat_sn: 0 };
        assert!(feed(&mut c, Pdu::new(h, Bytes::new())).is_empty());
    }

    #[test]
    fn idle_session_is_pinged_after_the_interval_and_closed_when_silent() {
        let (mut c, t0) = core();
        assert_eq!(c.deadline(), Some(t0 + 10 * S));
        assert!(c.on_tick(t0 + 9 * S).is_empty());
        let a = c.on_tick(t0 + 10 * S);
        assert!(matches!(sends(&a)[0].header, Header::NopIn(n) if n.itt == RESERVED_TAG && n.ttt == 1));
        assert_eq!(c.deadline(), Some(t0 + 15 * S));
        assert!(matches!(c.on_tick(t0 + 15 * S)[..], [Action::Close(CloseReason::PingUnanswered)]));
    }

    #[test]
    fn any_traffic_answers_a_ping_and_the_next_ping_has_a_new_tag() {
        let (mut c, t0) = core();
        c.on_tick(t0 + 10 * S);
        c.on_received(t0 + 12 * S);
        assert_eq!(c.deadline(), Some(t0 + 22 * S));
        let a = c.on_tick(t0 + 22 * S);
        assert!(matches!(sends(&a)[0].header, Header::NopIn(n) if n.ttt == 2));
    }

    #[test]
    fn write_data_that_breaks_the_sequence_fails_the_command() {
        let (mut c, _) = core();
        feed(&mut c, write(1, 100, 0, 4096));
        let max = c.max_cmd_sn();
        let d = DataOut { final_: true, itt: 1, ttt: 1, buffer_offset: 512, ..Default::default() };
        let a = feed(&mut c, Pdu::new(d, Bytes::from(vec![0u8; 512])));
        assert!(matches!(sends(&a)[0].header, Header::ScsiResponse(r) if r.itt == 1 && r.status == 0x02));
        assert_eq!(c.max_cmd_sn(), max.wrapping_add(1));
    }

    #[test]
    fn a_write_is_executed_once_its_data_is_complete() {
        let (mut c, _) = core();
        feed(&mut c, write(1, 100, 0, 4096));
        let d = DataOut { final_: true, itt: 1, ttt: 1, ..Default::default() };
        let a = feed(&mut c, Pdu::new(d, Bytes::from(vec![7u8; 4096])));
        match &a[..] {
            [Action::Execute { itt: 1, command, .. }] => assert_eq!(command.data_out.len(), 4096),
            other => panic!("{other:?}"),
        }
        let a = done(&mut c, 1, &Response { data_in: Bytes::new(), ..good() });
        assert!(matches!(sends(&a)[0].header, Header::ScsiResponse(r) if r.exp_data_sn == 1));
    }

    #[test]
    fn a_write_beyond_max_command_bytes_is_refused() {
        let (mut c, _) = core();
        let a = feed(&mut c, write(1, 100, 0, (1 << 20) + 512));
        assert!(executed(&a).is_empty());
        assert!(sends(&a).iter().any(|p| matches!(p.header, Header::ScsiResponse(r) if r.status == 0x02)));
    }

    #[test]
    fn a_data_digest_error_rejects_the_pdu_and_a_header_digest_error_closes() {
        let mut cfg = config(SessionType::Normal);
        cfg.digests = Digests { header: true, data: true };
        let mut c = SessionCore::new(cfg, Instant::now());
        let mut raw = bytes::BytesMut::new();
        let h = NopOut { immediate: true, itt: 4, ttt: RESERVED_TAG, cmd_sn: 100, lun: 0, exp_stat_sn: 0 };
        frame::encode(&Pdu::new(h, Bytes::from_static(b"data")), cfg_digests(), &mut raw);
        let n = raw.len();
        raw[n - 1] ^= 1;
        let a = c.on_frame(raw.clone().freeze());
        assert!(matches!(sends(&a)[0].header, Header::Reject(r) if r.reason == reject::DIGEST_ERROR));
        raw[n - 1] ^= 1;
        raw[BHS_LEN] ^= 1;
        assert!(matches!(c.on_frame(raw.clone().freeze())[..], [Action::Close(CloseReason::HeaderDigest)]));
        assert!(c.on_frame(raw.freeze()).is_empty(), "nothing more once closed");
        assert!(c.on_tick(Instant::now() + 60 * S).is_empty());
    }

    fn cfg_digests() -> Digests {
        Digests { header: true, data: true }
    }

    /// A core with digests on, and a feeder that corrupts the data digest when asked.
    fn digest_core() -> SessionCore {
        let mut cfg = config(SessionType::Normal);
        cfg.digests = cfg_digests();
        SessionCore::new(cfg, Instant::now())
    }

    fn feed_digest(c: &mut SessionCore, pdu: &Pdu, corrupt: bool) -> Vec<Action> {
        let mut raw = bytes::BytesMut::new();
        frame::encode(pdu, cfg_digests(), &mut raw);
        if corrupt {
            let n = raw.len();
            raw[n - 1] ^= 1;
        }
        c.on_frame(raw.freeze())
    }

    fn check_condition(a: &[Action], itt: u32) -> Option<Sense> {
        sends(a).iter().find_map(|p| match p.header {
            Header::ScsiResponse(r) if r.itt == itt && r.status == 0x02 => p.data.get(2..).and_then(Sense::parse),
            _ => None,
        })
    }

    fn rejected_for_digest(a: &[Action]) -> bool {
        sends(a).iter().any(|p| matches!(p.header, Header::Reject(r) if r.reason == reject::DIGEST_ERROR))
    }

    fn with_immediate_data(mut p: Pdu, data: usize) -> Pdu {
        p.data = Bytes::from(vec![5u8; data]);
        p
    }

    #[test]
    fn a_digest_error_on_all_the_immediate_data_ends_the_write_and_keeps_the_cmdsn() {
        let mut c = digest_core();
        let a = feed_digest(&mut c, &with_immediate_data(write(1, 100, 0, 4096), 4096), true);
        assert!(rejected_for_digest(&a));
        assert!(executed(&a).is_empty());
        assert_eq!(check_condition(&a, 1), Some(Sense::protocol_crc_error()));
        // The next command is not held behind a hole.
        assert_eq!(c.exp_cmd_sn(), 101);
        assert_eq!(executed(&feed_digest(&mut c, &read(2, 101, 0), false)), vec![2]);
    }

    #[test]
    fn a_digest_error_on_part_of_the_immediate_data_ends_the_write_once_the_rest_is_in() {
        let mut c = digest_core();
        let mut p = with_immediate_data(write(1, 100, 0, 8192), 4096);
        if let Header::ScsiCommand(h) = &mut p.header {
            h.final_ = true;
        }
        // InitialR2T: the rest comes by R2T, which still goes out.
        let a = feed_digest(&mut c, &p, true);
        assert!(rejected_for_digest(&a));
        let r2t = sends(&a).iter().find_map(|p| match p.header {
            Header::R2t(r) => Some(r),
            _ => None,
        });
        let r2t = r2t.expect("an R2T for the data not yet sent");
        assert_eq!((r2t.buffer_offset, r2t.desired_len), (4096, 4096));
        assert!(check_condition(&a, 1).is_none());
        let d = DataOut { final_: true, itt: 1, ttt: r2t.ttt, buffer_offset: 4096, ..Default::default() };
        let a = feed_digest(&mut c, &Pdu::new(d, Bytes::from(vec![1u8; 4096])), false);
        assert!(executed(&a).is_empty());
        assert_eq!(check_condition(&a, 1), Some(Sense::protocol_crc_error()));
    }

    #[test]
    fn a_digest_error_on_a_data_out_ends_the_write_once_its_sequence_ends() {
        let mut c = digest_core();
        let mut cfg_write = write(1, 100, 0, 8192);
        if let Header::ScsiCommand(h) = &mut cfg_write.header {
            h.expected_len = 8192;
        }
        let a = feed_digest(&mut c, &cfg_write, false);
        let ttt = sends(&a)
            .iter()
            .find_map(|p| match p.header {
                Header::R2t(r) => Some(r.ttt),
                _ => None,
            })
            .expect("an R2T");
        let first = DataOut { final_: false, itt: 1, ttt, buffer_offset: 0, ..Default::default() };
        let a = feed_digest(&mut c, &Pdu::new(first, Bytes::from(vec![1u8; 4096])), true);
        assert!(rejected_for_digest(&a));
        assert!(check_condition(&a, 1).is_none());
        let last = DataOut { final_: true, itt: 1, ttt, data_sn: 1, buffer_offset: 4096, ..Default::default() };
        let max = c.max_cmd_sn();
        let a = feed_digest(&mut c, &Pdu::new(last, Bytes::from(vec![1u8; 4096])), false);
        assert!(executed(&a).is_empty());
        assert_eq!(check_condition(&a, 1), Some(Sense::protocol_crc_error()));
        assert_eq!(c.max_cmd_sn(), max.wrapping_add(1));
    }

    #[test]
    fn a_digest_error_on_a_nop_out_counts_its_cmdsn() {
        let mut c = digest_core();
        let h = NopOut { immediate: false, itt: 4, ttt: RESERVED_TAG, cmd_sn: 100, lun: 0, exp_stat_sn: 0 };
        let a = feed_digest(&mut c, &Pdu::new(h, Bytes::from_static(b"data")), true);
        assert!(rejected_for_digest(&a));
        assert_eq!(c.exp_cmd_sn(), 101);
        assert_eq!(c.max_cmd_sn(), 100 + DEPTH);
    }

    fn abort_ref(itt: u32, cmd_sn: u32, referenced_tag: u32, ref_cmd_sn: u32) -> Pdu {
        let mut p = tmf(tmf::ABORT_TASK, itt, cmd_sn, 0, referenced_tag);
        if let Header::TaskMgmtRequest(h) = &mut p.header {
            h.ref_cmd_sn = ref_cmd_sn;
        }
        p
    }

    #[test]
    fn abort_task_of_a_command_never_received_counts_its_cmdsn_and_frees_the_ones_after() {
        let (mut c, _) = core();
        // CmdSN 100 never arrives; 101 waits behind it.
        assert!(executed(&feed(&mut c, read(2, 101, 0))).is_empty());
        let a = feed(&mut c, abort_ref(9, 102, 1, 100));
        assert_eq!(tmf_response(&a), tmf::FUNCTION_COMPLETE);
        assert_eq!(executed(&a), vec![2]);
        assert_eq!(c.exp_cmd_sn(), 102);
        // The lost command's slot is free: only the running one holds a slot.
        assert_eq!(c.max_cmd_sn(), 101 + DEPTH - 1);
    }

    #[test]
    fn abort_task_of_a_command_waiting_in_the_window_drops_it() {
        let (mut c, _) = core();
        assert!(executed(&feed(&mut c, read(2, 101, 0))).is_empty());
        let a = feed(&mut c, abort_ref(9, 102, 2, 101));
        assert_eq!(tmf_response(&a), tmf::FUNCTION_COMPLETE);
        assert!(executed(&a).is_empty());
        // When the gap fills, the aborted command is skipped and its slot freed.
        assert_eq!(executed(&feed(&mut c, read(1, 100, 0))), vec![1]);
        assert_eq!(c.exp_cmd_sn(), 102);
        assert_eq!(c.max_cmd_sn(), 100 + DEPTH);
    }

    #[test]
    fn abort_task_naming_a_cmdsn_outside_the_window_or_after_itself_does_not_exist() {
        let (mut c, _) = core();
        for (ref_sn, own_sn) in [(99, 100), (100, 100), (100 + DEPTH, 100 + DEPTH)] {
            let a = feed(&mut c, abort_ref(9, own_sn, 1, ref_sn));
            assert_eq!(tmf_response(&a), tmf::TASK_DOES_NOT_EXIST, "RefCmdSN {ref_sn}");
        }
        assert_eq!(c.exp_cmd_sn(), 100);
    }

    fn task_of(a: &[Action], want: u32) -> u64 {
        a.iter()
            .find_map(|a| match a {
                Action::Execute { itt, task, .. } if *itt == want => Some(*task),
                _ => None,
            })
            .expect("an Execute")
    }

    #[test]
    fn a_late_completion_of_an_aborted_command_does_not_answer_a_new_one_with_its_itt() {
        let (mut c, _) = core();
        let old = task_of(&feed(&mut c, read(1, 100, 0)), 1);
        assert_eq!(tmf_response(&feed(&mut c, tmf(tmf::ABORT_TASK, 9, 101, 0, 1))), tmf::FUNCTION_COMPLETE);
        let new = task_of(&feed(&mut c, read(1, 101, 0)), 1);
        assert_ne!(old, new);
        assert!(c.on_command_done(1, old, &good()).is_empty(), "the old task's result is dropped");
        assert!(c.runs(1, new));
        assert!(!sends(&c.on_command_done(1, new, &good())).is_empty());
    }

    #[test]
    fn a_second_reset_under_the_itt_of_one_in_progress_is_refused_and_loses_no_slot() {
        let (mut c, _) = core();
        let a = feed(&mut c, tmf(tmf::LOGICAL_UNIT_RESET, 50, 100, 0, 0));
        assert!(a.iter().any(|x| matches!(x, Action::Reset { itt: 50, .. })));
        let a = feed(&mut c, tmf(tmf::LOGICAL_UNIT_RESET, 50, 100, 0, 0));
        assert_eq!(tmf_response(&a), tmf::REJECTED);
        assert_eq!(tmf_response(&c.on_reset_done(50, TmfResult::Complete)), tmf::FUNCTION_COMPLETE);
        assert_eq!(c.max_cmd_sn(), 100 + DEPTH - 1, "immediate requests take no slot");
    }

    #[test]
    fn aborting_a_lun_gives_no_r2t_to_writes_aborted_with_it() {
        let mut cfg = config(SessionType::Normal);
        // Room for one write's data at a time: the second waits for the first.
        cfg.write_buffer = 4096;
        let mut c = SessionCore::new(cfg, Instant::now());
        assert!(sends(&feed(&mut c, write(1, 100, 0, 4096))).iter().any(|p| matches!(p.header, Header::R2t(_))));
        assert!(sends(&feed(&mut c, write(2, 101, 0, 4096))).is_empty(), "the second write waits for room");
        let a = c.on_abort_request(None);
        assert!(!sends(&a).iter().any(|p| matches!(p.header, Header::R2t(_))), "{a:?}");
        assert_eq!(c.max_cmd_sn(), 100 + DEPTH + 1);
    }

    #[test]
    fn max_cmd_sn_starts_a_queue_depth_above_exp() {
        let (c, _) = core();
        assert_eq!(c.exp_cmd_sn(), 100);
        assert_eq!(c.max_cmd_sn(), 100 + DEPTH - 1);
    }
}

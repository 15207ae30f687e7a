//! The full-feature session core: CmdSN window, task table, immediate/unsolicited/R2T write
//! planning, Data-In reassembly with status collapse, NOP-Out keep-alive, and reissue of every
//! unfinished command after a reconnection (save those sent [`Request::once`]). Pure: inputs
//! and `now` in, [`Action`]s out.

#![deny(clippy::unwrap_used, clippy::indexing_slicing)]

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use stics_wire::keepalive::{Keepalive, Tick};
use stics_wire::keys::Params;
use stics_wire::serial;
use stics_wire::{attr, logout, lun, reject, DataOut, Header, LogoutRequest, NopOut, Pdu, ScsiCommand, RESERVED_TAG};

use crate::login::Outcome;
use crate::recovery::{Decision, Recovery, RecoveryPolicy};
use crate::scsi::ScsiOutcome;

/// Timers of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timers {
    /// Send a NOP-Out when nothing was received for this long.
    pub nop_interval: Duration,
    /// Declare the connection dead when a NOP-Out goes unanswered this long.
    pub nop_timeout: Duration,
    /// Declare the connection dead when a command stays unanswered this long.
    pub cmd_timeout: Duration,
    pub recovery: RecoveryPolicy,
}

impl Default for Timers {
    fn default() -> Self {
        Timers {
            nop_interval: Duration::from_secs(5),
            nop_timeout: Duration::from_secs(10),
            cmd_timeout: Duration::from_secs(60),
            recovery: RecoveryPolicy::default(),
        }
    }
}

/// Direction and data of a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Data {
    None,
    /// Read up to this many bytes.
    Read(u32),
    /// Write these bytes.
    Write(Bytes),
}

/// A SCSI command to run on the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub lun: u64,
    pub cdb: [u8; 16],
    pub data: Data,
    /// SAM task attribute (`stics_wire::attr`): SIMPLE unless the caller needs ordering.
    pub attr: u8,
    /// Failed instead of reissued when its connection is lost (see [`Request::once`]).
    pub once: bool,
}

impl Request {
    /// A SIMPLE command.
    pub fn new(lun: u64, cdb: [u8; 16], data: Data) -> Request {
        Request { lun, cdb, data, attr: attr::SIMPLE, once: false }
    }

    /// The same command, never reissued: if its connection is lost before it finishes, it fails
    /// with [`TaskError::Unreachable`] ("connection lost; not reissued"), and so does every
    /// such command submitted after that until [`Core::rearm`]. For a caller that queued a
    /// sequence whose order matters: a reissue after reconnection could land some of it after
    /// what came later, or run it twice around other work.
    pub fn once(self) -> Request {
        Request { once: true, ..self }
    }

    /// The same command as an ORDERED task: the target starts it once every older task ended,
    /// and newer ones once it ended.
    pub fn ordered(self) -> Request {
        Request { attr: attr::ORDERED, ..self }
    }
}

/// Why a command did not produce a SCSI status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskError {
    /// The target could not be reached within the recovery window.
    #[error("target unreachable: {0}")]
    Unreachable(String),
    /// The iSCSI response code said the target failed the command.
    #[error("target failure (iSCSI response {0:#04x})")]
    TargetFailure(u8),
    /// The target rejected the command PDU.
    #[error("command rejected by the target (reason {0:#04x})")]
    Rejected(u8),
    /// The session was closed.
    #[error("session closed")]
    Closed,
}

/// What the driver must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send this PDU on the current connection.
    Send(Pdu),
    /// Hand the caller of `token` its result.
    Complete(u64, Result<ScsiOutcome, TaskError>),
    /// Open a new connection and log in (session reinstatement); report back with this generation.
    Connect(u64),
    /// Close the current connection; its commands are queued for reissue already.
    Disconnect(String),
    /// The target confirmed the logout.
    LoggedOut,
}

#[derive(Debug)]
struct Task {
    token: u64,
    seq: u64,
    req: Request,
    /// When the command went out on the current connection; `None` while queued.
    sent: Option<Instant>,
    /// Data-In segments received so far: (offset, bytes).
    parts: Vec<(u32, Bytes)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    Up {
        gen: u64,
        alive: Keepalive,
        /// The ITT of the NOP-Out ping awaiting its answer.
        ping: Option<u32>,
    },
    Connecting {
        gen: u64,
    },
    Waiting {
        until: Instant,
    },
    /// Recovery gave up; the next command starts a new attempt.
    Down,
    Closed,
}

/// The session core.
#[derive(Debug)]
pub struct Core {
    timers: Timers,
    params: Params,
    cmd_sn: u32,
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
    exp_stat_sn: u32,
    tasks: HashMap<u32, Task>,
    /// Tasks waiting for the window or for a connection, in submission order.
    queue: VecDeque<u32>,
    next_itt: u32,
    next_seq: u64,
    next_gen: u64,
    link: Link,
    recovery: Recovery,
    last_error: String,
    /// A lost connection failed commands sent [`Request::once`]: later ones fail too, until
    /// [`Core::rearm`], so that none of them lands without those before it.
    fenced: bool,
}

impl Core {
    /// A core for a session whose first login (connection generation `gen`) just succeeded.
    pub fn new(timers: Timers, login: &Outcome, gen: u64, now: Instant) -> Core {
        let mut c = Core {
            timers,
            params: login.params.clone(),
            cmd_sn: 0,
            exp_cmd_sn: 0,
            max_cmd_sn: 0,
            exp_stat_sn: 0,
            tasks: HashMap::new(),
            queue: VecDeque::new(),
            next_itt: 1,
            next_seq: 0,
            next_gen: gen + 1,
            link: Link::Connecting { gen },
            recovery: Recovery::new(timers.recovery),
            last_error: String::new(),
            fenced: false,
        };
        c.on_login_ok(gen, login, now);
        c
    }

    /// Parameters in force.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// Commands submitted and not finished.
    pub fn outstanding(&self) -> usize {
        self.tasks.len()
    }

    /// Commands on the wire now.
    pub fn in_flight(&self) -> usize {
        self.tasks.len() - self.queue.len()
    }

    /// True while a connection is in full-feature phase.
    pub fn is_up(&self) -> bool {
        matches!(self.link, Link::Up { .. })
    }

    /// The connection generation now in use, if any.
    pub fn current_gen(&self) -> Option<u64> {
        match self.link {
            Link::Up { gen, .. } | Link::Connecting { gen } => Some(gen),
            _ => None,
        }
    }

    fn alloc_itt(&mut self) -> u32 {
        loop {
            let itt = self.next_itt;
            self.next_itt = self.next_itt.wrapping_add(1);
            if itt != RESERVED_TAG
                && !self.tasks.contains_key(&itt)
                && !matches!(self.link, Link::Up { ping: Some(p), .. } if p == itt)
            {
                return itt;
            }
        }
    }

    /// Queues a command for `token`.
    pub fn submit(&mut self, token: u64, req: Request, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        match self.link {
            Link::Closed => {
                out.push(Action::Complete(token, Err(TaskError::Closed)));
                return out;
            }
            _ if req.once && self.fenced => {
                out.push(Action::Complete(token, Err(not_reissued(&self.last_error))));
                return out;
            }
            Link::Down => self.start_recovery(now, &mut out),
            _ => {}
        }
        let itt = self.alloc_itt();
        let seq = self.next_seq;
        self.next_seq += 1;
        self.tasks.insert(itt, Task { token, seq, req, sent: None, parts: Vec::new() });
        self.queue.push_back(itt);
        self.pump(now, &mut out);
        out
    }

    fn window_open(&self) -> bool {
        !serial::lt(self.max_cmd_sn, self.cmd_sn)
    }

    fn pump(&mut self, now: Instant, out: &mut Vec<Action>) {
        if !self.is_up() {
            return;
        }
        while self.window_open() {
            let Some(itt) = self.queue.pop_front() else { break };
            self.send_task(itt, now, out);
        }
    }

    fn send_task(&mut self, itt: u32, now: Instant, out: &mut Vec<Action>) {
        let cmd_sn = self.cmd_sn;
        let exp_stat_sn = self.exp_stat_sn;
        let p = &self.params;
        let Some(task) = self.tasks.get_mut(&itt) else { return };
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        task.sent = Some(now);
        task.parts.clear();
        let lun_field = lun::encode(task.req.lun);
        let (read, write, expected_len, payload) = match &task.req.data {
            Data::None => (false, false, 0, None),
            Data::Read(n) => (true, false, *n, None),
            Data::Write(b) => (false, true, b.len() as u32, Some(b.clone())),
        };
        let plan = payload.as_ref().map(|b| WritePlan::new(p, b.len() as u32));
        let (imm, unsolicited_end) = plan.map_or((0, 0), |w| (w.immediate, w.unsolicited_end));
        let cmd = ScsiCommand {
            immediate: false,
            final_: unsolicited_end == imm,
            read,
            write,
            attr: task.req.attr,
            lun: lun_field,
            itt,
            expected_len,
            cmd_sn,
            exp_stat_sn,
            cdb: task.req.cdb,
        };
        let imm_data = payload.as_ref().map(|b| b.slice(..imm as usize)).unwrap_or_default();
        out.push(Action::Send(Pdu::new(cmd, imm_data)));
        if let Some(b) = &payload {
            let max_seg = p.max_xmit_data_segment_length;
            for pdu in data_out_sequence(itt, lun_field, RESERVED_TAG, b, imm, unsolicited_end, max_seg, exp_stat_sn) {
                out.push(Action::Send(pdu));
            }
        }
    }

    fn note_status(&mut self, stat_sn: u32) {
        let next = stat_sn.wrapping_add(1);
        if serial::lt(self.exp_stat_sn, next) {
            self.exp_stat_sn = next;
        }
    }

    fn note_window(&mut self, exp: u32, max: u32) {
        // RFC 7143 §4.2.2.1: a MaxCmdSN below ExpCmdSN-1 is ignored, with its ExpCmdSN.
        if serial::lt(max, exp.wrapping_sub(1)) {
            return;
        }
        if serial::lt(self.exp_cmd_sn, exp) {
            self.exp_cmd_sn = exp;
        }
        if serial::lt(self.max_cmd_sn, max) {
            self.max_cmd_sn = max;
        }
    }

    fn complete(&mut self, itt: u32, result: Result<ScsiOutcome, TaskError>, out: &mut Vec<Action>) {
        if let Some(t) = self.tasks.remove(&itt) {
            out.push(Action::Complete(t.token, result));
        }
    }

    fn finish_read(
        &mut self,
        itt: u32,
        status: u8,
        residual: Option<(bool, u32)>,
        sense: Option<Bytes>,
        out: &mut Vec<Action>,
    ) {
        let Some(t) = self.tasks.get_mut(&itt) else { return };
        let expected = match t.req.data {
            Data::Read(n) => n,
            _ => 0,
        };
        let len = match residual {
            Some((true, r)) => expected.saturating_sub(r),
            _ => expected,
        };
        let parts = std::mem::take(&mut t.parts);
        let data = assemble(parts, len);
        self.complete(itt, Ok(ScsiOutcome { status, data, sense }), out);
    }

    /// Handles a PDU received on connection `gen`.
    pub fn on_pdu(&mut self, gen: u64, pdu: Pdu, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        match &mut self.link {
            // Any traffic proves the connection alive.
            Link::Up { gen: g, alive, .. } if *g == gen => alive.received(now),
            _ => return out,
        }
        match pdu.header {
            Header::ScsiResponse(r) => {
                self.note_status(r.stat_sn);
                self.note_window(r.exp_cmd_sn, r.max_cmd_sn);
                if r.response != 0 {
                    self.complete(r.itt, Err(TaskError::TargetFailure(r.response)), &mut out);
                } else {
                    let sense = if pdu.data.is_empty() { None } else { stics_wire::sense_from_segment(&pdu.data) };
                    let residual = if r.underflow { Some((true, r.residual)) } else { None };
                    self.finish_read(r.itt, r.status, residual, sense, &mut out);
                }
            }
            Header::DataIn(d) => {
                self.note_window(d.exp_cmd_sn, d.max_cmd_sn);
                let Some(t) = self.tasks.get_mut(&d.itt) else {
                    return out;
                };
                let Data::Read(expected) = t.req.data else {
                    self.lose(now, "Data-In for a command that reads nothing", &mut out);
                    return out;
                };
                let end = u64::from(d.buffer_offset) + pdu.data.len() as u64;
                if end > u64::from(expected) {
                    self.lose(now, "Data-In beyond the expected transfer length", &mut out);
                    return out;
                }
                if !pdu.data.is_empty() {
                    t.parts.push((d.buffer_offset, pdu.data.clone()));
                }
                if d.status_present {
                    self.note_status(d.stat_sn);
                    let residual = if d.underflow { Some((true, d.residual)) } else { None };
                    self.finish_read(d.itt, d.status, residual, None, &mut out);
                }
            }
            Header::R2t(r) => {
                self.note_window(r.exp_cmd_sn, r.max_cmd_sn);
                let Some(t) = self.tasks.get(&r.itt) else { return out };
                let Data::Write(b) = &t.req.data else {
                    self.lose(now, "R2T for a command that writes nothing", &mut out);
                    return out;
                };
                let end = u64::from(r.buffer_offset) + u64::from(r.desired_len);
                if r.desired_len == 0 || end > b.len() as u64 || r.desired_len > self.params.max_burst_length {
                    self.lose(now, "R2T outside the command's data or above MaxBurstLength", &mut out);
                    return out;
                }
                let b = b.clone();
                let lun_field = lun::encode(t.req.lun);
                let max_seg = self.params.max_xmit_data_segment_length;
                for p in data_out_sequence(
                    r.itt,
                    lun_field,
                    r.ttt,
                    &b,
                    r.buffer_offset,
                    end as u32,
                    max_seg,
                    self.exp_stat_sn,
                ) {
                    out.push(Action::Send(p));
                }
            }
            Header::NopIn(n) => {
                self.note_window(n.exp_cmd_sn, n.max_cmd_sn);
                if n.itt != RESERVED_TAG {
                    self.note_status(n.stat_sn);
                    if let Link::Up { ping, alive, .. } = &mut self.link {
                        if *ping == Some(n.itt) {
                            *ping = None;
                            alive.answered();
                        }
                    }
                }
                if n.ttt != RESERVED_TAG {
                    let reply = NopOut {
                        immediate: true,
                        lun: n.lun,
                        itt: RESERVED_TAG,
                        ttt: n.ttt,
                        cmd_sn: self.cmd_sn,
                        exp_stat_sn: self.exp_stat_sn,
                    };
                    out.push(Action::Send(Pdu::new(reply, pdu.data.clone())));
                }
            }
            Header::AsyncMessage(a) => {
                self.note_status(a.stat_sn);
                self.note_window(a.exp_cmd_sn, a.max_cmd_sn);
                // Events 1-3: the target wants this connection or session gone; reconnecting
                // reinstates the session and reissues what was in flight.
                if matches!(a.event, 1..=3) {
                    self.lose(now, "target asked to close the connection", &mut out);
                    return out;
                }
            }
            Header::Reject(rj) => {
                self.note_status(rj.stat_sn);
                self.note_window(rj.exp_cmd_sn, rj.max_cmd_sn);
                let rejected =
                    pdu.data.get(..48).and_then(|b| <[u8; 48]>::try_from(b).ok()).and_then(|b| Header::decode(&b).ok());
                match rejected {
                    Some(Header::ScsiCommand(c)) if rj.reason != reject::DIGEST_ERROR => {
                        self.complete(c.itt, Err(TaskError::Rejected(rj.reason)), &mut out);
                    }
                    _ => {
                        // A rejected Data-Out or a digest error leaves a command that cannot
                        // finish at error recovery level 0: start over on a new connection.
                        self.lose(now, "target rejected a PDU", &mut out);
                        return out;
                    }
                }
            }
            Header::LogoutResponse(l) => {
                self.note_status(l.stat_sn);
                self.link = Link::Closed;
                out.push(Action::LoggedOut);
                self.fail_all(TaskError::Closed, &mut out);
                return out;
            }
            Header::TaskMgmtResponse(t) => self.note_status(t.stat_sn),
            Header::TextResponse(t) => self.note_status(t.stat_sn),
            other => {
                self.lose(now, &format!("unexpected {:?} PDU from the target", other.opcode()), &mut out);
                return out;
            }
        }
        self.pump(now, &mut out);
        out
    }

    fn fail_all(&mut self, err: TaskError, out: &mut Vec<Action>) {
        let mut all: Vec<(u32, u64)> = self.tasks.iter().map(|(itt, t)| (*itt, t.seq)).collect();
        all.sort_by_key(|(_, s)| *s);
        for (itt, _) in all {
            self.complete(itt, Err(err.clone()), out);
        }
        self.queue.clear();
    }

    fn start_recovery(&mut self, now: Instant, out: &mut Vec<Action>) {
        match self.recovery.on_lost(now) {
            Decision::RetryAt(t) => {
                self.link = Link::Waiting { until: t };
                if t <= now {
                    self.fire_connect(out);
                }
            }
            Decision::GiveUp => self.give_up(out),
        }
    }

    fn fire_connect(&mut self, out: &mut Vec<Action>) {
        let gen = self.next_gen;
        self.next_gen += 1;
        self.link = Link::Connecting { gen };
        out.push(Action::Connect(gen));
    }

    fn give_up(&mut self, out: &mut Vec<Action>) {
        self.link = Link::Down;
        let why = if self.last_error.is_empty() { "connection lost".to_owned() } else { self.last_error.clone() };
        self.fail_all(TaskError::Unreachable(why), out);
    }

    /// Drops the current connection: every command on it goes back to the queue, in submission
    /// order, to be reissued after the next login; those sent [`Request::once`] fail instead,
    /// whether they were on the wire or still waiting for the window.
    fn lose(&mut self, now: Instant, reason: &str, out: &mut Vec<Action>) {
        if !self.is_up() {
            return;
        }
        reason.clone_into(&mut self.last_error);
        out.push(Action::Disconnect(reason.to_owned()));
        let mut all: Vec<(u32, u64, bool)> = self.tasks.iter().map(|(itt, t)| (*itt, t.seq, t.req.once)).collect();
        all.sort_by_key(|(_, s, _)| *s);
        for &(itt, _, once) in &all {
            if once {
                self.fenced = true;
                self.complete(itt, Err(not_reissued(reason)), out);
            }
        }
        self.queue = all.into_iter().filter(|(_, _, once)| !once).map(|(itt, _, _)| itt).collect();
        for t in self.tasks.values_mut() {
            t.sent = None;
            t.parts.clear();
        }
        self.link = Link::Waiting { until: now };
        self.start_recovery(now, out);
    }

    /// The connection of generation `gen` closed or failed.
    pub fn on_closed(&mut self, gen: u64, reason: &str, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        if matches!(self.link, Link::Up { gen: g, .. } if g == gen) {
            self.lose(now, reason, &mut out);
            // The driver already knows the socket is gone.
            out.retain(|a| !matches!(a, Action::Disconnect(_)));
        }
        out
    }

    /// A login for generation `gen` succeeded (session reinstated).
    pub fn on_login_ok(&mut self, gen: u64, login: &Outcome, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        if !matches!(self.link, Link::Connecting { gen: g } if g == gen) {
            return out;
        }
        self.params = login.params.clone();
        self.cmd_sn = login.exp_cmd_sn;
        self.exp_cmd_sn = login.exp_cmd_sn;
        self.max_cmd_sn = login.max_cmd_sn;
        self.exp_stat_sn = login.exp_stat_sn;
        let alive = Keepalive::new(Some(self.timers.nop_interval), self.timers.nop_timeout, now);
        self.link = Link::Up { gen, alive, ping: None };
        self.recovery.on_success();
        self.last_error.clear();
        self.pump(now, &mut out);
        out
    }

    /// A login for generation `gen` failed; `permanent` failures (bad credentials) are not retried.
    pub fn on_login_failed(&mut self, gen: u64, reason: &str, permanent: bool, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        if !matches!(self.link, Link::Connecting { gen: g } if g == gen) {
            return out;
        }
        reason.clone_into(&mut self.last_error);
        match self.recovery.on_attempt_failed(now, permanent) {
            Decision::RetryAt(t) => self.link = Link::Waiting { until: t },
            Decision::GiveUp => self.give_up(&mut out),
        }
        out
    }

    /// Runs timers: keep-alive pings, dead-connection detection, reconnection attempts.
    pub fn on_tick(&mut self, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        match self.link {
            Link::Up { .. } => {
                let tick = match &mut self.link {
                    Link::Up { alive, .. } => alive.tick(now),
                    _ => Tick::Wait,
                };
                if tick == Tick::Dead {
                    self.lose(now, "connection silent: NOP-Out unanswered", &mut out);
                    return out;
                }
                if tick == Tick::Ping {
                    let itt = self.alloc_itt();
                    let nop = NopOut {
                        immediate: true,
                        lun: 0,
                        itt,
                        ttt: RESERVED_TAG,
                        cmd_sn: self.cmd_sn,
                        exp_stat_sn: self.exp_stat_sn,
                    };
                    out.push(Action::Send(Pdu::new(nop, Bytes::new())));
                    if let Link::Up { ping, .. } = &mut self.link {
                        *ping = Some(itt);
                    }
                }
                if self
                    .tasks
                    .values()
                    .any(|t| t.sent.is_some_and(|s| now.saturating_duration_since(s) >= self.timers.cmd_timeout))
                {
                    self.lose(now, "command timed out", &mut out);
                }
            }
            Link::Waiting { until } if now >= until => self.fire_connect(&mut out),
            _ => {}
        }
        out
    }

    /// When [`Core::on_tick`] next has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        match self.link {
            Link::Up { alive, .. } => {
                let oldest = self.tasks.values().filter_map(|t| t.sent).min();
                alive.deadline().into_iter().chain(oldest.map(|o| o + self.timers.cmd_timeout)).min()
            }
            Link::Waiting { until } => Some(until),
            _ => None,
        }
    }

    /// Starts a logout (close the session); `None` when no connection is up.
    pub fn logout(&mut self) -> Option<Pdu> {
        if !self.is_up() {
            self.link = Link::Closed;
            return None;
        }
        let itt = self.alloc_itt();
        let req = LogoutRequest {
            immediate: true,
            reason: logout::CLOSE_SESSION,
            itt,
            cid: 0,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        };
        Some(Pdu::new(req, Bytes::new()))
    }

    /// Lets commands sent [`Request::once`] through again after a lost connection failed some:
    /// the caller has seen those failures and starts its sequence over.
    pub fn rearm(&mut self) {
        self.fenced = false;
    }

    /// Closes the core without a logout, failing every command.
    pub fn close(&mut self) -> Vec<Action> {
        let mut out = Vec::new();
        self.link = Link::Closed;
        self.fail_all(TaskError::Closed, &mut out);
        out
    }
}

fn not_reissued(reason: &str) -> TaskError {
    let why = if reason.is_empty() { String::new() } else { format!(" ({reason})") };
    TaskError::Unreachable(format!("connection lost; not reissued{why}"))
}

/// How a write of `len` bytes splits into immediate data, unsolicited Data-Out and solicited
/// bursts under the negotiated parameters (RFC 7143 §13.13-13.14).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WritePlan {
    /// Bytes carried in the command PDU.
    pub immediate: u32,
    /// Bytes sent without an R2T (immediate included); the rest waits for R2Ts.
    pub unsolicited_end: u32,
}

impl WritePlan {
    pub fn new(p: &Params, len: u32) -> WritePlan {
        let first = p.first_burst_length.min(len);
        let immediate = if p.immediate_data { first.min(p.max_xmit_data_segment_length) } else { 0 };
        let unsolicited_end = if p.initial_r2t { immediate } else { first };
        WritePlan { immediate, unsolicited_end }
    }
}

/// Data-Out PDUs carrying `data[start..end]` as one sequence (DataSN from 0, F on the last).
#[allow(clippy::too_many_arguments)]
pub fn data_out_sequence(
    itt: u32,
    lun: u64,
    ttt: u32,
    data: &Bytes,
    start: u32,
    end: u32,
    max_seg: u32,
    exp_stat_sn: u32,
) -> Vec<Pdu> {
    let mut out = Vec::new();
    let max_seg = max_seg.max(512);
    let mut off = start;
    let mut data_sn = 0u32;
    while off < end {
        let n = (end - off).min(max_seg);
        let h = DataOut { final_: off + n == end, lun, itt, ttt, exp_stat_sn, data_sn, buffer_offset: off };
        out.push(Pdu::new(h, data.slice(off as usize..(off + n) as usize)));
        off += n;
        data_sn = data_sn.wrapping_add(1);
    }
    out
}

/// Joins Data-In segments into `len` bytes; one segment covering everything is passed through
/// without copying. Bytes the target never sent read as zeros.
fn assemble(mut parts: Vec<(u32, Bytes)>, len: u32) -> Bytes {
    let len = len as usize;
    if let [(0, b)] = parts.as_slice() {
        if b.len() >= len {
            return b.slice(..len);
        }
    }
    parts.sort_by_key(|(o, _)| *o);
    let mut buf = BytesMut::zeroed(len);
    for (off, b) in parts {
        // What lies past `len` was never asked for: dropped.
        let Some(to) = buf.get_mut(off as usize..) else { continue };
        let n = b.len().min(to.len());
        if let (Some(to), Some(from)) = (to.get_mut(..n), b.get(..n)) {
            to.copy_from_slice(from);
        }
    }
    buf.freeze()
}

#[cfg(test)]
#[expect(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::*;
    use stics_wire::{DataIn, NopIn, R2t, ScsiResponse};

    fn outcome(immediate: bool, initial_r2t: bool, first: u32, mxdsl: u32) -> Outcome {
        let params = Params {
            immediate_data: immediate,
            initial_r2t,
            first_burst_length: first,
            max_xmit_data_segment_length: mxdsl,
            max_burst_length: 262_144,
            ..Params::default()
        };
        Outcome {
            params,
            tsih: 1,
            exp_stat_sn: 10,
            exp_cmd_sn: 5,
            max_cmd_sn: 6,
            target_alias: None,
            target_portal_group_tag: None,
            private: Vec::new(),
        }
    }

    fn sends(a: &[Action]) -> Vec<&Pdu> {
        a.iter().filter_map(|x| if let Action::Send(p) = x { Some(p) } else { None }).collect()
    }

    fn read_req(n: u32) -> Request {
        Request::new(1, stics_sam::cdb::read16(0, n / 512), Data::Read(n))
    }

    #[test]
    fn commands_beyond_max_cmd_sn_wait_for_the_window() {
        let t0 = Instant::now();
        let mut c = Core::new(Timers::default(), &outcome(true, true, 65536, 8192), 1, t0);
        let a = c.submit(1, read_req(512), t0);
        let b = c.submit(2, read_req(512), t0);
        let third = c.submit(3, read_req(512), t0);
        assert_eq!(sends(&a).len(), 1);
        assert_eq!(sends(&b).len(), 1);
        assert!(sends(&third).is_empty(), "CmdSN 7 is beyond MaxCmdSN 6");
        let Header::ScsiCommand(cmd) = sends(&b)[0].header else { panic!() };
        assert_eq!((cmd.cmd_sn, cmd.exp_stat_sn), (6, 10));
        // A response that opens the window lets the third command out.
        let resp = ScsiResponse { itt: 1, stat_sn: 10, exp_cmd_sn: 6, max_cmd_sn: 9, ..Default::default() };
        let r = c.on_pdu(1, Pdu::new(resp, Bytes::new()), t0);
        assert!(matches!(r[0], Action::Complete(1, Ok(_))));
        let Header::ScsiCommand(cmd) = sends(&r)[0].header else { panic!() };
        assert_eq!((cmd.cmd_sn, cmd.exp_stat_sn), (7, 11));
    }

    #[test]
    fn stale_max_cmd_sn_below_exp_minus_one_is_ignored() {
        let t0 = Instant::now();
        let mut c = Core::new(Timers::default(), &outcome(true, true, 65536, 8192), 1, t0);
        c.note_window(100, 50);
        assert_eq!((c.exp_cmd_sn, c.max_cmd_sn), (5, 6));
        assert!(serial::lt(u32::MAX, 0));
    }

    #[test]
    fn data_in_segments_reassemble_and_status_collapses_into_the_last() {
        let t0 = Instant::now();
        let mut c = Core::new(Timers::default(), &outcome(true, true, 65536, 8192), 1, t0);
        c.submit(9, read_req(1024), t0);
        let second = DataIn {
            itt: 1,
            buffer_offset: 512,
            data_sn: 1,
            final_: true,
            status_present: true,
            stat_sn: 10,
            exp_cmd_sn: 6,
            max_cmd_sn: 6,
            ..Default::default()
        };
        let first = DataIn { itt: 1, buffer_offset: 0, data_sn: 0, exp_cmd_sn: 6, max_cmd_sn: 6, ..Default::default() };
        assert!(c.on_pdu(1, Pdu::new(first, Bytes::from(vec![1u8; 512])), t0).is_empty());
        let r = c.on_pdu(1, Pdu::new(second, Bytes::from(vec![2u8; 512])), t0);
        let Action::Complete(9, Ok(o)) = &r[0] else { panic!("{r:?}") };
        assert_eq!(o.data.len(), 1024);
        assert_eq!((o.data[0], o.data[1023]), (1, 2));
        assert_eq!(c.exp_stat_sn, 11);
    }

    #[test]
    fn assembly_drops_what_lies_past_the_length_and_zeros_the_gaps() {
        let seg = |off: u32, byte: u8, n: usize| (off, Bytes::from(vec![byte; n]));
        let out = assemble(vec![seg(6, 3, 4), seg(0, 1, 2), seg(8, 4, 1), seg(100, 5, 4)], 8);
        assert_eq!(&out[..], &[1, 1, 0, 0, 0, 0, 3, 3]);
        assert_eq!(&assemble(vec![seg(0, 9, 6)], 4)[..], &[9; 4]);
        assert_eq!(&assemble(vec![seg(0, 9, 2)], 4)[..], &[9, 9, 0, 0]);
        assert!(assemble(vec![seg(0, 9, 2)], 0).is_empty());
    }

    #[test]
    fn underflow_residual_shortens_the_data() {
        let t0 = Instant::now();
        let mut c = Core::new(Timers::default(), &outcome(true, true, 65536, 8192), 1, t0);
        c.submit(1, read_req(4096), t0);
        let d = DataIn {
            itt: 1,
            final_: true,
            status_present: true,
            underflow: true,
            residual: 4000,
            exp_cmd_sn: 6,
            max_cmd_sn: 6,
            ..Default::default()
        };
        let r = c.on_pdu(1, Pdu::new(d, Bytes::from(vec![7u8; 96])), t0);
        let Action::Complete(1, Ok(o)) = &r[0] else { panic!() };
        assert_eq!(o.data.len(), 96);
    }

    #[test]
    fn data_in_past_the_buffer_drops_the_connection() {
        let t0 = Instant::now();
        let mut c = Core::new(Timers::default(), &outcome(true, true, 65536, 8192), 1, t0);
        c.submit(1, read_req(512), t0);
        let d = DataIn { itt: 1, buffer_offset: 256, exp_cmd_sn: 6, max_cmd_sn: 6, ..Default::default() };
        let r = c.on_pdu(1, Pdu::new(d, Bytes::from(vec![0u8; 512])), t0);
        assert!(matches!(r[0], Action::Disconnect(_)));
        assert!(matches!(r[1], Action::Connect(2)));
    }

    #[test]
    fn immediate_data_then_unsolicited_data_out_up_to_first_burst() {
        let p = outcome(true, false, 65536, 8192).params;
        assert_eq!(WritePlan::new(&p, 100_000), WritePlan { immediate: 8192, unsolicited_end: 65536 });
        assert_eq!(WritePlan::new(&p, 4096), WritePlan { immediate: 4096, unsolicited_end: 4096 });
        let p = outcome(false, true, 65536, 8192).params;
        assert_eq!(WritePlan::new(&p, 100_000), WritePlan { immediate: 0, unsolicited_end: 0 });
        let p = outcome(true, true, 65536, 8192).params;
        assert_eq!(WritePlan::new(&p, 100_000), WritePlan { immediate: 8192, unsolicited_end: 8192 });

        let t0 = Instant::now();
        let mut c = Core::new(Timers::default(), &outcome(true, false, 65536, 8192), 1, t0);
        let data: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let a = c.submit(1, Request::new(1, [0; 16], Data::Write(Bytes::from(data))), t0);
        let s = sends(&a);
        assert_eq!(s.len(), 8, "command + 7 unsolicited Data-Out");
        let Header::ScsiCommand(cmd) = s[0].header else { panic!() };
        assert!(!cmd.final_ && cmd.write && cmd.expected_len == 100_000);
        assert_eq!(s[0].data.len(), 8192);
        let Header::DataOut(last) = s[7].header else { panic!() };
        assert!(last.final_);
        assert_eq!((last.ttt, last.data_sn, last.buffer_offset, s[7].data.len()), (RESERVED_TAG, 6, 57344, 8192));
    }

    #[test]
    fn r2t_is_answered_with_a_data_out_sequence_of_its_own() {
        let t0 = Instant::now();
        let mut c = Core::new(Timers::default(), &outcome(true, true, 65536, 8192), 1, t0);
        let data = Bytes::from(vec![3u8; 40_000]);
        c.submit(1, Request::new(1, [0; 16], Data::Write(data)), t0);
        let r2t = R2t {
            itt: 1,
            ttt: 0x77,
            r2t_sn: 0,
            buffer_offset: 8192,
            desired_len: 20_000,
            exp_cmd_sn: 6,
            max_cmd_sn: 6,
            ..Default::default()
        };
        let a = c.on_pdu(1, Pdu::new(r2t, Bytes::new()), t0);
        let s = sends(&a);
        assert_eq!(s.len(), 3);
        let offsets: Vec<(u32, u32, bool, usize)> = s
            .iter()
            .map(|p| match p.header {
                Header::DataOut(d) => (d.buffer_offset, d.data_sn, d.final_, p.data.len()),
                _ => panic!(),
            })
            .collect();
        assert_eq!(offsets, vec![(8192, 0, false, 8192), (16384, 1, false, 8192), (24576, 2, true, 3616)]);
        // A second R2T outstanding at the same time gets its own sequence.
        let r2t = R2t {
            itt: 1,
            ttt: 0x78,
            r2t_sn: 1,
            buffer_offset: 28192,
            desired_len: 11_808,
            exp_cmd_sn: 6,
            max_cmd_sn: 6,
            ..Default::default()
        };
        let s2 = c.on_pdu(1, Pdu::new(r2t, Bytes::new()), t0);
        assert_eq!(sends(&s2).len(), 2);
        // An R2T past the end of the data is a protocol error.
        let bad = R2t {
            itt: 1,
            ttt: 0x79,
            buffer_offset: 39_000,
            desired_len: 2000,
            exp_cmd_sn: 6,
            max_cmd_sn: 6,
            ..Default::default()
        };
        assert!(matches!(c.on_pdu(1, Pdu::new(bad, Bytes::new()), t0)[0], Action::Disconnect(_)));
    }

    #[test]
    fn lost_connection_requeues_in_order_and_reissues_after_reinstatement() {
        let t0 = Instant::now();
        let mut o = outcome(true, true, 65536, 8192);
        o.max_cmd_sn = 100;
        let mut c = Core::new(Timers::default(), &o, 1, t0);
        for tok in 1..=3 {
            c.submit(tok, read_req(512), t0);
        }
        let a = c.on_closed(1, "reset by peer", t0);
        assert_eq!(a, vec![Action::Connect(2)]);
        assert!(
            c.on_pdu(1, Pdu::new(NopIn { itt: 5, ..Default::default() }, Bytes::new()), t0).is_empty(),
            "old connection is ignored"
        );
        let mut again = o.clone();
        again.exp_cmd_sn = 1;
        again.exp_stat_sn = 1;
        let r = c.on_login_ok(2, &again, t0);
        let s = sends(&r);
        let sns: Vec<(u32, u32)> = s
            .iter()
            .map(|p| match p.header {
                Header::ScsiCommand(c) => (c.itt, c.cmd_sn),
                _ => panic!(),
            })
            .collect();
        assert_eq!(sns, vec![(1, 1), (2, 2), (3, 3)]);
    }

    #[test]
    fn once_commands_fail_on_a_lost_connection_and_later_ones_fail_until_rearmed() {
        let t0 = Instant::now();
        let mut o = outcome(true, true, 65536, 8192);
        o.max_cmd_sn = 6;
        let mut c = Core::new(Timers::default(), &o, 1, t0);
        let write =
            |lba| Request::new(1, stics_sam::cdb::write16(lba, 1, false), Data::Write(Bytes::from(vec![1; 512])));
        let barrier = Request::new(1, stics_sam::cdb::synchronize_cache10(), Data::None).ordered().once();
        c.submit(1, read_req(512), t0);
        c.submit(2, write(0).once(), t0);
        // Beyond MaxCmdSN: queued, never sent; it may not go out without the write before it.
        assert!(sends(&c.submit(3, barrier, t0)).is_empty());
        let a = c.on_closed(1, "reset by peer", t0);
        let failed: Vec<u64> = a
            .iter()
            .filter_map(|x| match x {
                Action::Complete(t, Err(TaskError::Unreachable(m))) => {
                    assert!(m.starts_with("connection lost; not reissued"), "{m}");
                    Some(*t)
                }
                _ => None,
            })
            .collect();
        assert_eq!(failed, vec![2, 3], "{a:?}");
        assert!(a.contains(&Action::Connect(2)));
        // Queued after the loss, before the caller has seen it: fails too, at once.
        let r = c.submit(4, write(8).once(), t0);
        assert!(matches!(&r[..], [Action::Complete(4, Err(TaskError::Unreachable(_)))]), "{r:?}");
        let mut again = o.clone();
        again.exp_cmd_sn = 1;
        let r = c.on_login_ok(2, &again, t0);
        let itts: Vec<u32> = sends(&r)
            .iter()
            .map(|p| match p.header {
                Header::ScsiCommand(c) => c.itt,
                _ => panic!(),
            })
            .collect();
        assert_eq!(itts, vec![1], "only the plain command is reissued");
        assert_eq!(c.outstanding(), 1);
        c.rearm();
        let r = c.submit(5, write(16).once(), t0);
        let Header::ScsiCommand(cmd) = sends(&r)[0].header else { panic!("{r:?}") };
        assert!(cmd.write);
        // A loss with no such command outstanding fences nothing.
        let mut c = Core::new(Timers::default(), &o, 1, t0);
        c.submit(1, read_req(512), t0);
        c.on_closed(1, "eof", t0);
        assert!(c.submit(2, write(0).once(), t0).is_empty(), "queued for the next connection");
    }

    #[test]
    fn failed_logins_back_off_then_give_up_with_unreachable() {
        let t0 = Instant::now();
        let timers = Timers {
            recovery: RecoveryPolicy {
                timeout: Duration::from_secs(1),
                min_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_millis(400),
            },
            ..Timers::default()
        };
        let mut c = Core::new(timers, &outcome(true, true, 65536, 8192), 1, t0);
        c.submit(1, read_req(512), t0);
        c.on_closed(1, "eof", t0);
        assert!(c.on_login_failed(2, "refused", false, t0).is_empty());
        assert_eq!(c.next_deadline(), Some(t0 + Duration::from_millis(100)));
        assert_eq!(c.on_tick(t0 + Duration::from_millis(100)), vec![Action::Connect(3)]);
        let r = c.on_login_failed(3, "connection refused", false, t0 + Duration::from_secs(1));
        assert!(matches!(&r[0], Action::Complete(1, Err(TaskError::Unreachable(m))) if m.contains("refused")));
        // The next command starts a fresh attempt.
        assert!(c.submit(2, read_req(512), t0 + Duration::from_secs(5)).contains(&Action::Connect(4)));
    }

    #[test]
    fn bad_credentials_on_reconnect_fail_at_once_without_retry() {
        let t0 = Instant::now();
        let mut c = Core::new(Timers::default(), &outcome(true, true, 65536, 8192), 1, t0);
        c.submit(1, read_req(512), t0);
        c.on_closed(1, "eof", t0);
        let r = c.on_login_failed(2, "authentication failed", true, t0);
        assert!(matches!(r[0], Action::Complete(1, Err(TaskError::Unreachable(_)))));
        assert_eq!(c.next_deadline(), None);
    }

    #[test]
    fn idle_connection_is_pinged_and_dropped_when_silent() {
        let t0 = Instant::now();
        let timers =
            Timers { nop_interval: Duration::from_secs(5), nop_timeout: Duration::from_secs(2), ..Timers::default() };
        let mut c = Core::new(timers, &outcome(true, true, 65536, 8192), 1, t0);
        assert!(c.on_tick(t0 + Duration::from_secs(4)).is_empty());
        let a = c.on_tick(t0 + Duration::from_secs(5));
        let Header::NopOut(n) = sends(&a)[0].header else { panic!() };
        assert!(n.immediate && n.ttt == RESERVED_TAG && n.itt != RESERVED_TAG);
        // The answer clears the ping.
        let ans =
            NopIn { itt: n.itt, ttt: RESERVED_TAG, stat_sn: 10, exp_cmd_sn: 5, max_cmd_sn: 6, ..Default::default() };
        c.on_pdu(1, Pdu::new(ans, Bytes::new()), t0 + Duration::from_secs(6));
        let a = c.on_tick(t0 + Duration::from_secs(11));
        assert_eq!(sends(&a).len(), 1);
        let a = c.on_tick(t0 + Duration::from_secs(13));
        assert!(matches!(a[0], Action::Disconnect(_)));
    }

    #[test]
    fn target_ping_is_echoed_with_its_ttt() {
        let t0 = Instant::now();
        let mut c = Core::new(Timers::default(), &outcome(true, true, 65536, 8192), 1, t0);
        let ping = NopIn { itt: RESERVED_TAG, ttt: 0x1234, lun: 0, exp_cmd_sn: 5, max_cmd_sn: 6, ..Default::default() };
        let a = c.on_pdu(1, Pdu::new(ping, Bytes::from_static(b"hi")), t0);
        let Header::NopOut(n) = sends(&a)[0].header else { panic!() };
        assert_eq!((n.itt, n.ttt, n.immediate), (RESERVED_TAG, 0x1234, true));
        assert_eq!(&sends(&a)[0].data[..], b"hi");
    }

    #[test]
    fn check_condition_carries_sense() {
        let t0 = Instant::now();
        let mut c = Core::new(Timers::default(), &outcome(true, true, 65536, 8192), 1, t0);
        c.submit(1, read_req(512), t0);
        let resp = ScsiResponse { itt: 1, status: 2, exp_cmd_sn: 6, max_cmd_sn: 6, ..Default::default() };
        let sense = stics_wire::sense_segment(&[0x70, 0, 0x06, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x29, 0]);
        let r = c.on_pdu(1, Pdu::new(resp, sense), t0);
        let Action::Complete(1, Ok(o)) = &r[0] else { panic!() };
        assert_eq!(o.status, 2);
        assert_eq!(o.sense().unwrap().key, 6);
    }
}

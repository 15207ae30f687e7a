//! The connection driver, the only code that touches sockets: the login phase, then a reader
//! that feeds PDUs to the session's state machines and runs SCSI commands, and a writer task
//! that stamps sequence numbers on outgoing PDUs and writes them in vectored batches.

use std::collections::HashMap;
use std::future::Future;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use rand::Rng;
use stics_scsi::sense::key;
use stics_scsi::{Command, Direction, Nexus, Residual, Response, Sense, TaskAttr, TmfResult};
use stics_wire::frame::{self, DecodeError, Digests, FrameError};
use stics_wire::keys::SessionType;
use stics_wire::pdu::{
    attr, login_status, logout, reject, tmf, Header, LogoutRequest, LogoutResponse, NopIn, NopOut, Pdu, R2t, Reject,
    ScsiCommand, TaskMgmtRequest, TaskMgmtResponse, TextRequest, BHS_LEN, RESERVED_TAG,
};
use stics_wire::{digest, lun as wire_lun, DataOut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Notify};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::cmdsn::{Verdict, Window};
use crate::datain::{self, Shape};
use crate::dataout::{Burst, R2tReq, WriteTask, Writes};
use crate::keepalive::{Keepalive, Tick};
use crate::login::{Login, Outcome, Step};
use crate::registry::{RegistryError, SessionCtl};
use crate::server::{Shared, Target};
use crate::textreq::{Context as TextContext, Listing, TextState};

/// Largest data segment accepted during login: RFC 7143's 8192 default, with slack for
/// initiators that round up.
const LOGIN_MAX_DATA: u32 = 16 * 1024;
/// How much the read buffer grows by when it runs out: many PDUs per read system call.
const READ_CHUNK: usize = 256 * 1024;
/// Most PDUs one vectored write carries (IOV_MAX is 1024).
const MAX_IOV: usize = 1024;
/// Data segments up to this size are copied next to their header instead of getting an iovec.
const COPY_BELOW: usize = 1024;

/// Bytes queued for the writer beyond which the reader stops taking new requests: a peer that
/// sends but never reads cannot make the target buffer its answers without bound.
const MAX_QUEUED: usize = 16 << 20;

/// Sequence numbers the reader sets and the writer reads when it stamps PDUs, and the amount
/// of output queued for the writer.
#[derive(Debug)]
struct SeqNums {
    exp_cmd_sn: AtomicU32,
    max_cmd_sn: AtomicU32,
    queued: AtomicUsize,
    drained: Notify,
}

impl SeqNums {
    /// A command slot became free: the window moves up by one.
    fn release(&self) {
        self.max_cmd_sn.fetch_add(1, Ordering::AcqRel);
    }
}

/// What the reader and command tasks hand to the writer.
enum Out {
    One(Pdu),
    Many(Vec<Pdu>),
    /// Write everything before this, then close the connection.
    Close,
}

impl Out {
    /// What this costs in the writer's queue (headers counted at 64 bytes).
    fn cost(&self) -> usize {
        match self {
            Out::One(p) => 64 + p.data.len(),
            Out::Many(v) => v.iter().map(|p| 64 + p.data.len()).sum(),
            Out::Close => 0,
        }
    }
}

/// The sending end of the writer's queue, with its accounting.
#[derive(Clone)]
struct Outbox {
    tx: mpsc::UnboundedSender<Out>,
    seq: Arc<SeqNums>,
}

impl Outbox {
    fn push(&self, out: Out) {
        self.seq.queued.fetch_add(out.cost(), Ordering::AcqRel);
        let _ = self.tx.send(out);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why a frame could not be read.
enum ReadEnd {
    Closed,
    TooLarge(u32),
}

/// Reads one whole frame, growing the buffer only to sizes the limit allows.
async fn read_frame<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    digests: Digests,
    max: u32,
) -> Result<Bytes, ReadEnd> {
    loop {
        match frame::check(buf, digests, max) {
            Ok(n) => return Ok(buf.split_to(n).freeze()),
            Err(FrameError::TooLarge { len, .. }) => return Err(ReadEnd::TooLarge(len)),
            Err(FrameError::Incomplete(need)) => {
                buf.reserve(need.saturating_sub(buf.len()).max(4096));
                match rd.read_buf(buf).await {
                    Ok(0) | Err(_) => return Err(ReadEnd::Closed),
                    Ok(_) => {}
                }
            }
        }
    }
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

fn encode_one(pdu: &Pdu, digests: Digests) -> BytesMut {
    let mut out = BytesMut::new();
    frame::encode(pdu, digests, &mut out);
    out
}

/// A logged-in connection, ready for full feature phase.
struct LoggedIn {
    outcome: Outcome,
    tsih: u16,
    ctl: Arc<SessionCtl>,
}

/// Serves one TCP connection from login to close.
pub(crate) async fn serve(mut stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let local = stream.local_addr().ok();
    let mut buf = BytesMut::with_capacity(8192);
    let timeout = Duration::from_secs(shared.limits.login_timeout_secs);
    let login = login_phase(&mut stream, &mut buf, &shared, peer);
    let logged_in = tokio::select! {
        r = tokio::time::timeout(timeout, login) => match r {
            Ok(Some(l)) => l,
            Ok(None) => return,
            Err(_) => {
                tracing::info!(%peer, "login timed out");
                return;
            }
        },
        _ = shared.stopping.killed() => return,
    };
    full_feature(stream, buf, peer, local, shared, logged_in).await;
}

async fn login_phase(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    shared: &Arc<Shared>,
    peer: SocketAddr,
) -> Option<LoggedIn> {
    let (challenge, id) = {
        let mut rng = rand::thread_rng();
        let mut c = vec![0u8; 16];
        rng.fill(&mut c[..]);
        (c, rng.gen::<u8>())
    };
    let mut machine = Login::new(Arc::clone(&shared.policy), challenge, id);
    let none = Digests::default();
    // A login slot is taken only once a whole first PDU has arrived, so that connections
    // that send nothing cannot keep real logins waiting; the login timeout ends them all.
    let mut slot = None;
    loop {
        let frame = match read_frame(stream, buf, none, LOGIN_MAX_DATA).await {
            Ok(f) => f,
            Err(ReadEnd::TooLarge(len)) => {
                tracing::warn!(%peer, len, "login PDU too large; closing");
                return None;
            }
            Err(ReadEnd::Closed) => return None,
        };
        if slot.is_none() {
            slot = Some(Arc::clone(&shared.logins).acquire_owned().await.ok()?);
        }
        let pdu = match frame::parse(frame, none) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(%peer, "bad PDU during login: {e}; closing");
                return None;
            }
        };
        let Header::LoginRequest(req) = pdu.header else {
            // RFC 7143 §6.2: before login completes, only Login Requests are allowed.
            tracing::warn!(%peer, opcode = ?pdu.header.opcode(), "non-login PDU during login; closing");
            return None;
        };
        match machine.step(&req, &pdu.data) {
            Step::Continue(p) => {
                stream.write_all(&encode_one(&p, none)).await.ok()?;
            }
            Step::Fail(p) => {
                if let Header::LoginResponse(h) = p.header {
                    tracing::info!(%peer, class = h.status_class, detail = h.status_detail, "login refused");
                }
                let _ = stream.write_all(&encode_one(&p, none)).await;
                return None;
            }
            Step::Ready(mut p, outcome) => {
                let fail = |machine: &mut Login, status| machine.fail(&req, status);
                if outcome.tsih != 0 {
                    // MaxConnections is 1: a login that names an existing session adds nothing.
                    let f = fail(&mut machine, login_status::SESSION_DOES_NOT_EXIST);
                    let _ = stream.write_all(&encode_one(&f, none)).await;
                    return None;
                }
                let reg = shared.registry().register(&outcome.initiator_name, outcome.isid, outcome.target);
                let reg = match reg {
                    Ok(r) => r,
                    Err(RegistryError::Full) => {
                        tracing::warn!(%peer, "session limit reached; login refused");
                        let f = fail(&mut machine, login_status::OUT_OF_RESOURCES);
                        let _ = stream.write_all(&encode_one(&f, none)).await;
                        return None;
                    }
                };
                if reg.replaced.is_some() {
                    tracing::info!(initiator = %outcome.initiator_name, "session reinstated; the old one ends");
                }
                if let Header::LoginResponse(h) = &mut p.header {
                    h.tsih = reg.tsih;
                }
                if stream.write_all(&encode_one(&p, none)).await.is_err() {
                    shared.registry().unregister(reg.tsih, &reg.ctl);
                    return None;
                }
                return Some(LoggedIn { outcome: *outcome, tsih: reg.tsih, ctl: reg.ctl });
            }
        }
    }
}

/// A command waiting for its write data.
struct PendingWrite {
    h: ScsiCommand,
    cdb: Bytes,
    counted: bool,
}

/// A command running in its own task.
struct Running {
    abort: AbortHandle,
    lun: u64,
    counted: bool,
}

/// The tasks of one session, shared so that a LUN or target reset from another session of the
/// same target can abort them too (SAM-5: a reset aborts the tasks of every I_T nexus).
pub(crate) struct TaskSet {
    target: Option<usize>,
    running: Mutex<HashMap<u32, Running>>,
    seq: Arc<SeqNums>,
    /// LUNs (`None`: all) whose commands still waiting for write data must go. Only the owning
    /// session holds those, so it applies these requests itself before it handles more PDUs.
    aborts: Mutex<Vec<Option<u64>>>,
    wake: Notify,
}

impl TaskSet {
    /// Aborts the running commands on a LUN (`None`: all). Aborted tasks of another session
    /// end without a response (TAS is 0); their CmdSN slots are freed.
    fn abort_running(&self, lun: Option<u64>) {
        let mut map = lock(&self.running);
        let itts: Vec<u32> = map.iter().filter(|(_, r)| lun_matches(r.lun, lun)).map(|(i, _)| *i).collect();
        for itt in itts {
            if let Some(r) = map.remove(&itt) {
                r.abort.abort();
                if r.counted {
                    self.seq.release();
                }
            }
        }
    }

    /// Called by another session's reset: running commands go now, waiting writes as soon as
    /// the owning session looks.
    fn abort_from_elsewhere(&self, lun: Option<u64>) {
        self.abort_running(lun);
        lock(&self.aborts).push(lun);
        self.wake.notify_one();
    }
}

/// True when a LUN field names `lun` (`None` matches every LUN).
fn lun_matches(field: u64, lun: Option<u64>) -> bool {
    lun.is_none_or(|l| wire_lun::decode(field) == Some(l))
}

/// What a command needs to answer itself once the SCSI layer is done.
struct Reply {
    out: Outbox,
    itt: u32,
    lun: u64,
    r2ts: u32,
    counted: bool,
    shape: Shape,
}

impl Reply {
    fn send(&self, resp: &Response) {
        let mut pdus = Vec::with_capacity(1);
        datain::reply(self.itt, self.lun, resp, self.r2ts, self.shape, &mut pdus);
        if self.counted {
            self.out.seq.release();
        }
        let out = if pdus.len() == 1 { pdus.pop().map(Out::One) } else { Some(Out::Many(pdus)) };
        if let Some(o) = out {
            self.out.push(o);
        }
    }
}

struct NoopWake;
impl Wake for NoopWake {
    fn wake(self: Arc<Self>) {}
}

#[derive(PartialEq, Eq)]
enum Flow {
    Continue,
    Close,
}

/// The full-feature state of one session (one connection: MaxConnections is 1).
struct Session {
    shared: Arc<Shared>,
    target: Option<usize>,
    nexus: Arc<Nexus>,
    session_type: SessionType,
    cid: u16,
    local: Option<SocketAddr>,
    out: Outbox,
    seq: Arc<SeqNums>,
    window: Window<(Pdu, Bytes)>,
    writes: Writes,
    pending: HashMap<u32, PendingWrite>,
    tasks: Arc<TaskSet>,
    text: TextState,
    shape: Shape,
    noop: Waker,
}

async fn full_feature(
    stream: TcpStream,
    mut buf: BytesMut,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    shared: Arc<Shared>,
    li: LoggedIn,
) {
    let o = &li.outcome;
    let p = &o.params;
    let digests = Digests { header: p.header_digest, data: p.data_digest };
    let target_name = o.target.and_then(|i| shared.targets.get(i)).map(|t| t.iqn.clone()).unwrap_or_default();
    let nexus = Arc::new(Nexus {
        id: shared.next_nexus.fetch_add(1, Ordering::Relaxed),
        initiator_name: o.initiator_name.clone(),
        isid: o.isid,
        target_name: target_name.clone(),
        tpgt: shared.policy.tpgt,
    });
    let depth = shared.limits.queue_depth.max(1);
    let seq = Arc::new(SeqNums {
        exp_cmd_sn: AtomicU32::new(o.exp_cmd_sn),
        max_cmd_sn: AtomicU32::new(o.exp_cmd_sn.wrapping_add(depth - 1)),
        queued: AtomicUsize::new(0),
        drained: Notify::new(),
    });
    let device = o.target.and_then(|i| shared.targets.get(i)).map(|t: &Target| Arc::clone(&t.device));
    if let Some(d) = &device {
        d.nexus_added(&nexus);
    }
    tracing::info!(
        initiator = %o.initiator_name, target = %target_name, tsih = li.tsih, %peer,
        kind = %o.session_type, header_digest = p.header_digest, data_digest = p.data_digest,
        "session started"
    );
    let (rd, wr) = stream.into_split();
    let (tx, rx) = mpsc::unbounded_channel();
    let writer = tokio::spawn(writer(wr, rx, Arc::clone(&seq), o.next_stat_sn, digests));
    let burst = Burst {
        initial_r2t: p.initial_r2t,
        immediate_data: p.immediate_data,
        first_burst: p.first_burst_length,
        max_burst: p.max_burst_length,
        max_outstanding_r2t: p.max_outstanding_r2t,
    };
    let tasks = Arc::new(TaskSet {
        target: o.target,
        running: Mutex::new(HashMap::new()),
        seq: Arc::clone(&seq),
        aborts: Mutex::new(Vec::new()),
        wake: Notify::new(),
    });
    shared.task_sets().insert(nexus.id, Arc::clone(&tasks));
    let mut s = Session {
        target: o.target,
        nexus: Arc::clone(&nexus),
        session_type: o.session_type,
        cid: o.cid,
        local,
        out: Outbox { tx, seq: Arc::clone(&seq) },
        seq,
        window: Window::new(o.exp_cmd_sn),
        writes: Writes::new(burst, shared.limits.session_write_buffer_bytes),
        pending: HashMap::new(),
        tasks: Arc::clone(&tasks),
        text: TextState::default(),
        shape: Shape { max_xmit: p.max_xmit_data_segment_length, max_burst: p.max_burst_length },
        noop: Waker::from(Arc::new(NoopWake)),
        shared: Arc::clone(&shared),
    };
    let max_recv = p.max_recv_data_segment_length;
    let reason = s.read_loop(rd, &mut buf, digests, max_recv, &li.ctl).await;
    // Tasks of an ended session are aborted (ERL 0: nothing survives the connection).
    shared.task_sets().remove(&nexus.id);
    for (_, r) in lock(&s.tasks.running).drain() {
        r.abort.abort();
    }
    drop(s);
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
    shared.registry().unregister(li.tsih, &li.ctl);
    if let Some(d) = &device {
        d.nexus_removed(&nexus);
    }
    tracing::info!(initiator = %li.outcome.initiator_name, target = %target_name, tsih = li.tsih, %peer, reason, "session ended");
}

impl Session {
    async fn read_loop(
        &mut self,
        mut rd: tokio::net::tcp::OwnedReadHalf,
        buf: &mut BytesMut,
        digests: Digests,
        max_recv: u32,
        ctl: &Arc<SessionCtl>,
    ) -> &'static str {
        let stopping = &self.shared.clone();
        let tasks = Arc::clone(&self.tasks);
        let limits = &stopping.limits;
        let interval = (limits.nop_in_interval_secs > 0).then(|| Duration::from_secs(limits.nop_in_interval_secs));
        let mut alive =
            Keepalive::new(interval, Duration::from_secs(limits.nop_in_timeout_secs.max(1)), Instant::now());
        loop {
            // Everything already buffered is handled before the next read.
            loop {
                match frame::check(buf, digests, max_recv) {
                    Ok(n) => {
                        if !lock(&self.tasks.aborts).is_empty() {
                            self.apply_aborts();
                        }
                        let f = buf.split_to(n).freeze();
                        if self.on_frame(f, digests) == Flow::Close {
                            return "logout or protocol error";
                        }
                    }
                    Err(FrameError::Incomplete(need)) => {
                        let missing = need.saturating_sub(buf.len());
                        if buf.capacity() - buf.len() < missing.max(4096) {
                            buf.reserve(missing.max(READ_CHUNK));
                        }
                        break;
                    }
                    Err(FrameError::TooLarge { len, max }) => {
                        tracing::warn!(len, max, "data segment beyond MaxRecvDataSegmentLength; closing");
                        return "oversized PDU";
                    }
                }
            }
            // Backpressure: while the writer is far behind, take no new requests.
            while self.seq.queued.load(Ordering::Acquire) > MAX_QUEUED {
                tokio::select! {
                    biased;
                    _ = ctl.killed() => return "replaced or reset",
                    _ = stopping.stopping.killed() => return "target shutting down",
                    _ = self.seq.drained.notified() => {}
                }
            }
            let deadline = alive.deadline();
            tokio::select! {
                biased;
                _ = ctl.killed() => return "replaced or reset",
                _ = stopping.stopping.killed() => return "target shutting down",
                _ = tasks.wake.notified() => self.apply_aborts(),
                _ = sleep_until_some(deadline) => match alive.tick(Instant::now()) {
                    Tick::Wait => {}
                    Tick::Ping(ttt) => {
                        let ping = NopIn { itt: RESERVED_TAG, ttt, ..Default::default() };
                        self.send(Pdu::new(ping, Bytes::new()));
                    }
                    Tick::Dead => {
                        tracing::warn!("initiator did not answer a NOP-In ping; closing");
                        return "initiator stopped answering pings";
                    }
                },
                r = rd.read_buf(buf) => match r {
                    Ok(0) => return "connection closed by initiator",
                    Err(_) => return "connection error",
                    Ok(_) => alive.received(Instant::now()),
                },
            }
        }
    }

    fn send(&self, pdu: Pdu) {
        self.out.push(Out::One(pdu));
    }

    fn reject(&self, reason: u8, raw: &Bytes) {
        let bhs = raw.slice(..BHS_LEN.min(raw.len()));
        self.send(Pdu::new(Reject { reason, ..Default::default() }, bhs));
    }

    fn on_frame(&mut self, f: Bytes, digests: Digests) -> Flow {
        match frame::parse(f.clone(), digests) {
            Ok(pdu) => self.on_pdu(pdu, f),
            Err(DecodeError::HeaderDigest { .. }) => {
                // The lengths cannot be trusted any more (RFC 7143 §7.8): drop the connection.
                tracing::warn!("header digest error; closing");
                Flow::Close
            }
            Err(DecodeError::Truncated) => Flow::Close,
            Err(DecodeError::DataDigest { opcode, .. }) => {
                tracing::warn!(?opcode, "data digest error; PDU rejected");
                self.reject(reject::DIGEST_ERROR, &f);
                Flow::Continue
            }
            Err(DecodeError::Header { source, .. }) => {
                tracing::warn!("{source}; PDU rejected");
                self.reject(reject::COMMAND_NOT_SUPPORTED, &f);
                Flow::Continue
            }
        }
    }

    fn on_pdu(&mut self, pdu: Pdu, raw: Bytes) -> Flow {
        let (cmd_sn, immediate) = match &pdu.header {
            Header::ScsiCommand(h) => (h.cmd_sn, h.immediate),
            Header::NopOut(h) => {
                if h.itt == RESERVED_TAG {
                    // A reply to a target ping, or a one-way ping: nothing to answer.
                    return Flow::Continue;
                }
                (h.cmd_sn, h.immediate)
            }
            Header::TaskMgmtRequest(h) => (h.cmd_sn, h.immediate),
            Header::TextRequest(h) => (h.cmd_sn, h.immediate),
            Header::LogoutRequest(h) => (h.cmd_sn, h.immediate),
            Header::DataOut(h) => {
                let h = *h;
                self.data_out(h, pdu.data);
                return Flow::Continue;
            }
            Header::SnackRequest(_) => {
                // ERL 0 has no SNACK.
                self.reject(reject::PROTOCOL_ERROR, &raw);
                return Flow::Continue;
            }
            _ => {
                self.reject(reject::PROTOCOL_ERROR, &raw);
                return Flow::Continue;
            }
        };
        let max = self.seq.max_cmd_sn.load(Ordering::Acquire);
        match self.window.offer(cmd_sn, immediate, max, (pdu, raw)) {
            Verdict::Deliver((pdu, raw)) => {
                self.publish_exp();
                if self.deliver(pdu, raw, !immediate) == Flow::Close {
                    return Flow::Close;
                }
                while let Some((pdu, raw)) = self.window.next_ready() {
                    self.publish_exp();
                    if self.deliver(pdu, raw, true) == Flow::Close {
                        return Flow::Close;
                    }
                }
            }
            Verdict::Queued => {}
            Verdict::Dropped(_) => {
                tracing::debug!(
                    cmd_sn,
                    exp = self.window.exp_cmd_sn(),
                    max,
                    "command outside the CmdSN window ignored"
                );
            }
        }
        Flow::Continue
    }

    fn publish_exp(&self) {
        self.seq.exp_cmd_sn.store(self.window.exp_cmd_sn(), Ordering::Release);
    }

    /// Frees the CmdSN slot of a non-immediate command that ends without a SCSI response.
    fn release(&self, counted: bool) {
        if counted {
            self.seq.release();
        }
    }

    fn deliver(&mut self, pdu: Pdu, raw: Bytes, counted: bool) -> Flow {
        let normal = self.session_type == SessionType::Normal;
        match pdu.header {
            Header::ScsiCommand(h) if normal => self.scsi_command(h, pdu.ahs, pdu.data, &raw, counted),
            Header::TaskMgmtRequest(h) if normal => self.task_mgmt(h, counted),
            Header::NopOut(h) => self.nop_out(h, pdu.data, counted),
            Header::TextRequest(h) => self.text(h, pdu.data, &raw, counted),
            Header::LogoutRequest(h) => return self.logout(h, counted),
            _ => {
                // SCSI commands and task management have no place in a discovery session.
                self.release(counted);
                self.reject(reject::PROTOCOL_ERROR, &raw);
            }
        }
        Flow::Continue
    }

    fn nop_out(&mut self, h: NopOut, data: Bytes, counted: bool) {
        self.release(counted);
        let n = data.len().min(self.shape.max_xmit as usize);
        self.send(Pdu::new(NopIn { lun: h.lun, itt: h.itt, ttt: RESERVED_TAG, ..Default::default() }, data.slice(..n)));
    }

    fn scsi_command(&mut self, h: ScsiCommand, ahs: Bytes, data: Bytes, raw: &Bytes, counted: bool) {
        if self.pending.contains_key(&h.itt) || lock(&self.tasks.running).contains_key(&h.itt) {
            self.release(counted);
            self.reject(reject::TASK_IN_PROGRESS, raw);
            return;
        }
        let cdb = cdb_of(&h, &ahs);
        if !(h.write && h.expected_len > 0) {
            // Data on a command without W is ignored, as SAM asks of unexpected data.
            self.execute(h, cdb, Bytes::new(), counted, 0);
            return;
        }
        if h.expected_len > self.shared.limits.max_command_bytes {
            tracing::debug!(len = h.expected_len, "write larger than max_command_bytes refused");
            self.fail(h.itt, h.lun, counted, Sense::invalid_cdb_field(0, None));
            return;
        }
        match WriteTask::new(h.itt, h.lun, h.expected_len, data, h.final_, self.writes.burst()) {
            Err(e) => {
                tracing::debug!("write refused: {e}");
                self.fail(h.itt, h.lun, counted, data_phase_error());
            }
            Ok(mut t) if t.complete() => {
                let d = t.take_data();
                self.execute(h, cdb, d, counted, 0);
            }
            Ok(t) => {
                self.pending.insert(h.itt, PendingWrite { h, cdb, counted });
                let r2ts = self.writes.add(t);
                self.send_r2ts(r2ts);
            }
        }
    }

    fn send_r2ts(&self, r2ts: Vec<R2tReq>) {
        if r2ts.is_empty() {
            return;
        }
        let pdus = r2ts
            .into_iter()
            .map(|r| {
                let h = R2t {
                    lun: r.lun,
                    itt: r.itt,
                    ttt: r.ttt,
                    r2t_sn: r.r2t_sn,
                    buffer_offset: r.offset,
                    desired_len: r.len,
                    ..Default::default()
                };
                Pdu::new(h, Bytes::new())
            })
            .collect();
        self.out.push(Out::Many(pdus));
    }

    fn data_out(&mut self, h: DataOut, data: Bytes) {
        match self.writes.data_out(&h, data) {
            Ok(p) => {
                self.send_r2ts(p.r2ts);
                if let Some(itt) = p.complete {
                    let (task, more) = self.writes.take(itt);
                    self.send_r2ts(more);
                    if let (Some(mut t), Some(pw)) = (task, self.pending.remove(&itt)) {
                        let d = t.take_data();
                        self.execute(pw.h, pw.cdb, d, pw.counted, t.r2t_count());
                    }
                }
            }
            Err(e) => {
                let (_, more) = self.writes.take(h.itt);
                self.send_r2ts(more);
                match self.pending.remove(&h.itt) {
                    Some(pw) => {
                        tracing::debug!(itt = h.itt, "Data-Out refused: {e}");
                        self.fail(pw.h.itt, pw.h.lun, pw.counted, data_phase_error());
                    }
                    // Data for a task that failed or was aborted: dropped quietly.
                    None => tracing::debug!(itt = h.itt, "Data-Out for no pending task ignored"),
                }
            }
        }
    }

    fn reply(&self, itt: u32, lun: u64, r2ts: u32, counted: bool) -> Reply {
        Reply { out: self.out.clone(), itt, lun, r2ts, counted, shape: self.shape }
    }

    fn fail(&self, itt: u32, lun: u64, counted: bool, sense: Sense) {
        let resp =
            Response { status: 0x02, sense: Some(sense.to_bytes()), data_in: Bytes::new(), residual: Residual::None };
        self.reply(itt, lun, 0, counted).send(&resp);
    }

    fn execute(&mut self, h: ScsiCommand, cdb: Bytes, data_out: Bytes, counted: bool, r2ts: u32) {
        let reply = self.reply(h.itt, h.lun, r2ts, counted);
        let Some(target) = self.target.and_then(|i| self.shared.targets.get(i)) else {
            return;
        };
        let device = Arc::clone(&target.device);
        let nexus = Arc::clone(&self.nexus);
        let cmd = Command {
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
        let mut fut = Box::pin(async move { device.execute(&nexus, cmd).await });
        // Most commands (memory, page-cached files) finish on the first poll: answer at once
        // and spare a task. The rest continue in their own task.
        if let Poll::Ready(resp) = fut.as_mut().poll(&mut Context::from_waker(&self.noop)) {
            reply.send(&resp);
            return;
        }
        let tasks = Arc::clone(&self.tasks);
        let mut map = lock(&self.tasks.running);
        let itt = h.itt;
        let handle = tokio::spawn(async move {
            let resp = fut.await;
            let mut map = lock(&tasks.running);
            // Sent under the lock so that an abort either wins entirely or not at all.
            if map.remove(&itt).is_some() {
                reply.send(&resp);
            }
        });
        map.insert(itt, Running { abort: handle.abort_handle(), lun: h.lun, counted });
    }

    /// Aborts one task; true if it existed.
    fn abort_task(&mut self, itt: u32) -> bool {
        if let Some(pw) = self.pending.remove(&itt) {
            let (_, more) = self.writes.take(itt);
            self.send_r2ts(more);
            self.release(pw.counted);
            return true;
        }
        let r = lock(&self.tasks.running).remove(&itt);
        if let Some(r) = r {
            r.abort.abort();
            self.release(r.counted);
            return true;
        }
        false
    }

    /// Aborts every task on a LUN field (`None`: all).
    fn abort_where(&mut self, lun: Option<u64>) {
        let mut itts: Vec<u32> =
            self.pending.iter().filter(|(_, p)| lun.is_none_or(|l| p.h.lun == l)).map(|(i, _)| *i).collect();
        itts.extend(lock(&self.tasks.running).iter().filter(|(_, r)| lun.is_none_or(|l| r.lun == l)).map(|(i, _)| *i));
        for itt in itts {
            self.abort_task(itt);
        }
    }

    /// Applies the aborts other sessions' resets asked for: running commands are gone already,
    /// writes still waiting for data go now, so that none of them runs after the reset.
    fn apply_aborts(&mut self) {
        let requests = std::mem::take(&mut *lock(&self.tasks.aborts));
        for lun in requests {
            let itts: Vec<u32> =
                self.pending.iter().filter(|(_, p)| lun_matches(p.h.lun, lun)).map(|(i, _)| *i).collect();
            for itt in itts {
                self.abort_task(itt);
            }
            self.tasks.abort_running(lun);
        }
    }

    /// Aborts the tasks of every other session of this target on `lun` (`None`: all LUNs).
    fn abort_other_sessions(&self, lun: Option<u64>) {
        let others: Vec<Arc<TaskSet>> = self
            .shared
            .task_sets()
            .iter()
            .filter(|(id, t)| **id != self.nexus.id && t.target == self.target)
            .map(|(_, t)| Arc::clone(t))
            .collect();
        for t in others {
            t.abort_from_elsewhere(lun);
        }
    }

    fn task_mgmt(&mut self, h: TaskMgmtRequest, counted: bool) {
        let Some((idx, device)) =
            self.target.and_then(|i| self.shared.targets.get(i).map(|t| (i, Arc::clone(&t.device))))
        else {
            return;
        };
        let lun = wire_lun::decode(h.lun).filter(|&l| usize::try_from(l).is_ok_and(|l| l < device.lun_count()));
        let map = |r: TmfResult| match r {
            TmfResult::Complete => tmf::FUNCTION_COMPLETE,
            TmfResult::LunDoesNotExist => tmf::LUN_DOES_NOT_EXIST,
            TmfResult::NotSupported => tmf::NOT_SUPPORTED,
            TmfResult::Rejected => tmf::REJECTED,
        };
        let mut cold = false;
        let response = match h.function {
            tmf::ABORT_TASK => {
                if self.abort_task(h.referenced_tag) {
                    tmf::FUNCTION_COMPLETE
                } else {
                    tmf::TASK_DOES_NOT_EXIST
                }
            }
            tmf::ABORT_TASK_SET | tmf::CLEAR_TASK_SET | tmf::LOGICAL_UNIT_RESET => match lun {
                None => tmf::LUN_DOES_NOT_EXIST,
                Some(l) => {
                    self.abort_where(Some(h.lun));
                    if h.function == tmf::LOGICAL_UNIT_RESET {
                        self.abort_other_sessions(Some(l));
                    }
                    match h.function {
                        tmf::CLEAR_TASK_SET => map(device.clear_task_set(l, &self.nexus)),
                        tmf::LOGICAL_UNIT_RESET => map(device.lun_reset(l, &self.nexus)),
                        _ => tmf::FUNCTION_COMPLETE,
                    }
                }
            },
            tmf::TARGET_WARM_RESET | tmf::TARGET_COLD_RESET => {
                cold = h.function == tmf::TARGET_COLD_RESET;
                self.abort_where(None);
                self.abort_other_sessions(None);
                map(device.target_reset(&self.nexus, cold))
            }
            tmf::CLEAR_ACA => tmf::NOT_SUPPORTED,
            tmf::TASK_REASSIGN => tmf::REASSIGNMENT_NOT_SUPPORTED,
            _ => tmf::REJECTED,
        };
        tracing::info!(function = h.function, response, initiator = %self.nexus.initiator_name, "task management");
        self.release(counted);
        self.send(Pdu::new(TaskMgmtResponse { response, itt: h.itt, ..Default::default() }, Bytes::new()));
        if cold && response == tmf::FUNCTION_COMPLETE {
            // RFC 7143 §11.5.1: after a cold reset the target drops every session of the target.
            self.shared.registry().kill_all(Some(idx));
        }
    }

    fn text(&mut self, h: TextRequest, data: Bytes, raw: &Bytes, counted: bool) {
        let portal = self.local.map(|a| format!("{a},{}", self.shared.policy.tpgt));
        let listings: Vec<Listing> = self
            .shared
            .policy
            .targets
            .iter()
            .filter(|t| t.allows(&self.nexus.initiator_name))
            .map(|t| Listing { iqn: t.iqn.clone(), addresses: portal.iter().cloned().collect() })
            .collect();
        let target = self.target.and_then(|i| self.shared.targets.get(i)).map(|t| t.iqn.as_str());
        let ctx =
            TextContext { session_type: self.session_type, target, visible: &listings, max_xmit: self.shape.max_xmit };
        let result = self.text.request(&h, &data, &ctx);
        self.release(counted);
        match result {
            Ok(a) => {
                if let Some(m) = a.max_xmit {
                    self.shape.max_xmit = m;
                }
                self.send(a.pdu);
            }
            Err(e) => {
                tracing::debug!("text request refused: {e}");
                self.reject(reject::INVALID_PDU_FIELD, raw);
            }
        }
    }

    fn logout(&mut self, h: LogoutRequest, counted: bool) -> Flow {
        let response = match h.reason {
            logout::CLOSE_SESSION => logout::SUCCESS,
            logout::CLOSE_CONNECTION if h.cid == self.cid => logout::SUCCESS,
            logout::CLOSE_CONNECTION => logout::CID_NOT_FOUND,
            _ => logout::RECOVERY_NOT_SUPPORTED,
        };
        self.release(counted);
        self.send(Pdu::new(LogoutResponse { response, itt: h.itt, ..Default::default() }, Bytes::new()));
        if response == logout::SUCCESS {
            self.out.push(Out::Close);
            return Flow::Close;
        }
        Flow::Continue
    }
}

/// ABORTED COMMAND, DATA PHASE ERROR: write data that broke the sequence rules.
fn data_phase_error() -> Sense {
    Sense::new(key::ABORTED_COMMAND, 0x4b, 0x00)
}

/// The CDB: the 16 bytes of the BHS, extended by an Extended CDB AHS (RFC 7143 §11.2.2.3).
fn cdb_of(h: &ScsiCommand, ahs: &Bytes) -> Bytes {
    let mut at = 0usize;
    while at + 4 <= ahs.len() {
        let len = usize::from(u16::from_be_bytes([ahs[at], ahs[at + 1]]));
        let kind = ahs[at + 2];
        let body = (at + 4)..(at + 3 + len).min(ahs.len());
        if kind == 1 && len > 1 {
            let mut v = Vec::with_capacity(16 + body.len());
            v.extend_from_slice(&h.cdb);
            v.extend_from_slice(&ahs[body]);
            return Bytes::from(v);
        }
        at += (3 + len).div_ceil(4) * 4;
    }
    Bytes::copy_from_slice(&h.cdb)
}

/// Stamps StatSN, ExpCmdSN and MaxCmdSN on an outgoing header (RFC 7143 §4.2.2.2, §11).
fn stamp(h: &mut Header, stat_sn: &mut u32, exp: u32, max: u32) {
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

/// Builds the wire form of a batch: headers (and small data) packed into one buffer, large
/// data segments referenced where they are.
struct Batch {
    heads: BytesMut,
    parts: Vec<Part>,
    run_start: usize,
}

enum Part {
    Head(std::ops::Range<usize>),
    Data(Bytes),
}

const PAD: [u8; 3] = [0; 3];

impl Batch {
    fn new() -> Batch {
        Batch { heads: BytesMut::with_capacity(8192), parts: Vec::new(), run_start: 0 }
    }

    fn push(&mut self, mut pdu: Pdu, stat_sn: &mut u32, exp: u32, max: u32, digests: Digests) {
        stamp(&mut pdu.header, stat_sn, exp, max);
        let mut bhs = pdu.header.encode();
        let dsl = (pdu.data.len() as u32).min(0x00ff_ffff).to_be_bytes();
        bhs[5..8].copy_from_slice(&dsl[1..4]);
        let start = self.heads.len();
        self.heads.put_slice(&bhs);
        if digests.header {
            let crc = digest::crc32c(&[&self.heads[start..]]);
            self.heads.put_slice(&digest::to_wire(crc));
        }
        if pdu.data.is_empty() {
            return;
        }
        let pad = (4 - pdu.data.len() % 4) % 4;
        if pdu.data.len() < COPY_BELOW {
            self.heads.put_slice(&pdu.data);
        } else {
            if self.heads.len() > self.run_start {
                self.parts.push(Part::Head(self.run_start..self.heads.len()));
            }
            self.parts.push(Part::Data(pdu.data.clone()));
            self.run_start = self.heads.len();
        }
        self.heads.put_slice(&PAD[..pad]);
        if digests.data {
            let crc = digest::crc32c(&[&pdu.data, &PAD[..pad]]);
            self.heads.put_slice(&digest::to_wire(crc));
        }
    }

    fn finish(mut self) -> Vec<Bytes> {
        if self.heads.len() > self.run_start {
            self.parts.push(Part::Head(self.run_start..self.heads.len()));
        }
        let heads = self.heads.freeze();
        self.parts
            .into_iter()
            .map(|p| match p {
                Part::Head(r) => heads.slice(r),
                Part::Data(b) => b,
            })
            .collect()
    }
}

async fn write_all_chunks(wr: &mut OwnedWriteHalf, mut chunks: Vec<Bytes>) -> std::io::Result<()> {
    let mut i = 0;
    while i < chunks.len() {
        let slices: Vec<IoSlice<'_>> = chunks[i..].iter().take(MAX_IOV).map(|b| IoSlice::new(b)).collect();
        let mut n = wr.write_vectored(&slices).await?;
        drop(slices);
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while n > 0 && i < chunks.len() {
            let len = chunks[i].len();
            if n >= len {
                n -= len;
                i += 1;
            } else {
                chunks[i].advance(n);
                n = 0;
            }
        }
    }
    Ok(())
}

/// The writer task: takes whatever is ready, stamps and encodes it, writes it in one go.
async fn writer(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Out>,
    seq: Arc<SeqNums>,
    mut stat_sn: u32,
    digests: Digests,
) {
    let mut msgs = Vec::with_capacity(64);
    loop {
        if rx.recv_many(&mut msgs, 256).await == 0 {
            return;
        }
        let exp = seq.exp_cmd_sn.load(Ordering::Acquire);
        let max = seq.max_cmd_sn.load(Ordering::Acquire);
        let mut batch = Batch::new();
        let mut close = false;
        let cost: usize = msgs.iter().map(Out::cost).sum();
        for m in msgs.drain(..) {
            match m {
                Out::One(p) => batch.push(p, &mut stat_sn, exp, max, digests),
                Out::Many(v) => {
                    for p in v {
                        batch.push(p, &mut stat_sn, exp, max, digests);
                    }
                }
                Out::Close => close = true,
            }
        }
        if write_all_chunks(&mut wr, batch.finish()).await.is_err() {
            return;
        }
        if seq.queued.fetch_sub(cost, Ordering::AcqRel).saturating_sub(cost) <= MAX_QUEUED {
            seq.drained.notify_one();
        }
        if close {
            let _ = wr.shutdown().await;
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stics_wire::pdu::{DataIn, ScsiResponse};

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
    }

    #[test]
    fn batch_matches_the_codec_byte_for_byte() {
        for digests in [Digests::default(), Digests { header: true, data: true }] {
            let pdus = vec![
                Pdu::new(
                    DataIn { itt: 1, status_present: true, final_: true, ..Default::default() },
                    Bytes::from(vec![3u8; 4097]),
                ),
                Pdu::new(ScsiResponse { itt: 2, ..Default::default() }, Bytes::from(vec![1u8; 5])),
                Pdu::new(R2t { itt: 3, ..Default::default() }, Bytes::new()),
            ];
            let mut sn = 1;
            let mut b = Batch::new();
            let mut expect = BytesMut::new();
            let mut sn2 = 1;
            for p in pdus {
                let mut q = p.clone();
                stamp(&mut q.header, &mut sn2, 7, 9);
                frame::encode(&q, digests, &mut expect);
                b.push(p, &mut sn, 7, 9, digests);
            }
            let got: Vec<u8> = b.finish().iter().flat_map(|c| c.iter().copied()).collect();
            assert_eq!(got, expect.to_vec());
        }
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
}

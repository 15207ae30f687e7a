//! The connection driver, the only code that touches sockets: the login phase, then a reader
//! that feeds frames to the session core (`core.rs`) and carries out its actions (SCSI
//! commands, resets, aborts across sessions), and a writer task that stamps sequence numbers
//! on outgoing PDUs and writes them in vectored batches.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use rand::Rng;
use stics_scsi::{Command, Device, Direction, Nexus, Response};
use stics_tls::{ReadHalf, Stream, WriteHalf};
use stics_wire::frame::{self, Batch, Digests, FrameError};
use stics_wire::pdu::{login_status, Header, Pdu};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::core::{stamp, Action, CloseReason, Event, Reset, SessionConfig, SessionCore};
use crate::datain::Shape;
use crate::dataout::Burst;
use crate::login::{Login, Outcome, Step};
use crate::registry::{RegistryError, SessionCtl};
use crate::server::{Exported, Shared, OUTPUT_UNIT};
use crate::stats::{Kind, TargetStats};
use crate::textreq::Listing;

/// Largest data segment accepted during login: RFC 7143's 8192 default, with slack for
/// initiators that round up.
const LOGIN_MAX_DATA: u32 = 16 * 1024;
/// How much the read buffer grows by when it runs out: many PDUs per read system call.
const READ_CHUNK: usize = 256 * 1024;
/// Most PDUs one vectored write carries (IOV_MAX is 1024).
const MAX_IOV: usize = 1024;
/// Data segments up to this size are copied next to their header instead of getting an iovec.
const COPY_BELOW: usize = 1024;

/// Sequence numbers the reader sets and the writer reads when it stamps PDUs, the amount of
/// output queued for the writer, and how the writer fares.
#[derive(Debug)]
struct SeqNums {
    exp_cmd_sn: AtomicU32,
    max_cmd_sn: AtomicU32,
    queued: AtomicUsize,
    /// Queued bytes beyond which the reader takes no new requests.
    budget: usize,
    drained: Notify,
    /// Bytes the writer has written: output leaving shows the peer alive while the reader waits.
    written: AtomicU64,
    /// Killed when a write fails: the connection is gone and the session must end.
    writer_gone: SessionCtl,
}

impl SeqNums {
    /// Resolves once the writer's queue is back under its budget.
    async fn drained(&self) {
        while self.queued.load(Ordering::Acquire) > self.budget {
            self.drained.notified().await;
        }
    }
}

/// Output memory reserved for a read's data; given back when the writer has written it.
struct Reservation {
    _session: OwnedSemaphorePermit,
    _target: OwnedSemaphorePermit,
}

/// What the reader and command tasks hand to the writer.
enum Out {
    One(Pdu),
    Many(Vec<Pdu>),
    /// Given back once what was queued before it is written.
    Release(Reservation),
    /// Write everything before this, then close the connection.
    Close,
}

impl Out {
    /// What this costs in the writer's queue (headers counted at 64 bytes).
    fn cost(&self) -> usize {
        match self {
            Out::One(p) => 64 + p.data.len(),
            Out::Many(v) => v.iter().map(|p| 64 + p.data.len()).sum(),
            Out::Release(_) | Out::Close => 0,
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
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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

/// Serves one TCP connection from login (after a TLS handshake where the target asks for one)
/// to close.
pub(crate) async fn serve(stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let local = stream.local_addr().ok();
    let mut buf = BytesMut::with_capacity(8192);
    let timeout = Duration::from_secs(shared.limits.login_timeout_secs);
    // The handshake counts against the login timeout: a peer that stalls in it is cut off too.
    let start = async {
        let mut stream = match &shared.tls {
            Some(tls) => match tls.accept(stream, &peer.to_string()).await {
                Ok(s) => s,
                Err(e) => {
                    if let Some(suppressed) = shared.may_warn(peer, "tls handshake") {
                        tracing::warn!(%peer, suppressed, "{e}; closing");
                    }
                    return None;
                }
            },
            None => Stream::Plain(stream),
        };
        let logged_in = login_phase(&mut stream, &mut buf, &shared, peer).await?;
        Some((stream, logged_in))
    };
    let (stream, logged_in) = tokio::select! {
        r = tokio::time::timeout(timeout, start) => match r {
            Ok(Some(l)) => l,
            Ok(None) => return,
            Err(_) => {
                if let Some(suppressed) = shared.may_warn(peer, "login timeout") {
                    tracing::info!(%peer, suppressed, "login timed out");
                }
                return;
            }
        },
        () = shared.stopping.killed() => return,
    };
    full_feature(stream, buf, peer, local, shared, logged_in).await;
}

/// Writes one PDU and flushes it: over TLS, written bytes may wait in the session until then.
async fn send_now(stream: &mut Stream, bytes: &[u8]) -> std::io::Result<()> {
    stream.write_all(bytes).await?;
    stream.flush().await
}

async fn login_phase(
    stream: &mut Stream,
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
                if let Some(suppressed) = shared.may_warn(peer, "login PDU too large") {
                    tracing::warn!(%peer, len, suppressed, "login PDU too large; closing");
                }
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
                if let Some(suppressed) = shared.may_warn(peer, "bad login PDU") {
                    tracing::warn!(%peer, suppressed, "bad PDU during login: {e}; closing");
                }
                return None;
            }
        };
        let Header::LoginRequest(req) = pdu.header else {
            // RFC 7143 §6.2: before login completes, only Login Requests are allowed.
            if let Some(suppressed) = shared.may_warn(peer, "non-login PDU") {
                tracing::warn!(%peer, opcode = ?pdu.header.opcode(), suppressed, "non-login PDU during login; closing");
            }
            return None;
        };
        match machine.step(&req, &pdu.data) {
            Step::Continue(p) => {
                send_now(stream, &encode_one(&p, none)).await.ok()?;
            }
            Step::Fail(p) => {
                shared.stats.login_refused();
                if let Header::LoginResponse(h) = p.header {
                    if let Some(suppressed) = shared.may_warn(peer, "login refused") {
                        tracing::info!(%peer, class = h.status_class, detail = h.status_detail, suppressed, "login refused");
                    }
                }
                let _ = send_now(stream, &encode_one(&p, none)).await;
                return None;
            }
            Step::Ready(mut p, outcome) => {
                let fail = |machine: &mut Login, status| machine.fail(&req, status);
                if outcome.tsih != 0 {
                    shared.stats.login_refused();
                    // MaxConnections is 1: a login that names an existing session adds nothing.
                    let f = fail(&mut machine, login_status::SESSION_DOES_NOT_EXIST);
                    let _ = send_now(stream, &encode_one(&f, none)).await;
                    return None;
                }
                let reg = shared.registry().register(&outcome.initiator_name, outcome.isid, outcome.target);
                let reg = match reg {
                    Ok(r) => r,
                    Err(RegistryError::Full) => {
                        shared.stats.login_refused();
                        if let Some(suppressed) = shared.may_warn(peer, "session limit") {
                            tracing::warn!(%peer, suppressed, "session limit reached; login refused");
                        }
                        let f = fail(&mut machine, login_status::OUT_OF_RESOURCES);
                        let _ = send_now(stream, &encode_one(&f, none)).await;
                        return None;
                    }
                };
                if reg.replaced.is_some() {
                    tracing::info!(initiator = %outcome.initiator_name, "session reinstated; the old one ends");
                }
                if let Header::LoginResponse(h) = &mut p.header {
                    h.tsih = reg.tsih;
                }
                if send_now(stream, &encode_one(&p, none)).await.is_err() {
                    shared.registry().unregister(reg.tsih, &reg.ctl);
                    return None;
                }
                return Some(LoggedIn { outcome: *outcome, tsih: reg.tsih, ctl: reg.ctl });
            }
        }
    }
}

/// What the driver keeps of one session behind one lock: the core and the abort handles of
/// commands running in their own tasks, by ITT, with their task numbers.
struct Live {
    core: SessionCore,
    handles: HashMap<u32, (u64, AbortHandle)>,
}

/// One session as its reader, its command tasks and other sessions' resets reach it.
pub(crate) struct SessionHandle {
    target: Option<usize>,
    live: Mutex<Live>,
    out: Outbox,
    /// Actions decided outside the reader (commands whose task attribute let them start when
    /// another ended), for the reader to carry out.
    deferred: mpsc::UnboundedSender<Vec<Action>>,
}

impl SessionHandle {
    /// Feeds the core under the lock. Sends and aborts are carried out there, so that the
    /// writer sees them in the core's order with the window they were decided in; the other
    /// actions are returned for the caller to carry out without the lock.
    fn run(&self, f: impl FnOnce(&mut Live) -> Vec<Action>) -> Vec<Action> {
        let mut live = lock(&self.live);
        let actions = f(&mut live);
        self.out.seq.exp_cmd_sn.store(live.core.exp_cmd_sn(), Ordering::Release);
        self.out.seq.max_cmd_sn.store(live.core.max_cmd_sn(), Ordering::Release);
        let mut rest = Vec::new();
        let mut sends = Vec::new();
        for a in actions {
            match a {
                Action::Send(p) => sends.push(p),
                Action::Abort(itt) => {
                    if let Some((_, h)) = live.handles.remove(&itt) {
                        h.abort();
                    }
                }
                other => {
                    self.flush(&mut sends);
                    rest.push(other);
                }
            }
        }
        self.flush(&mut sends);
        rest
    }

    fn flush(&self, sends: &mut Vec<Pdu>) {
        if sends.len() == 1 {
            if let Some(p) = sends.pop() {
                self.out.push(Out::One(p));
            }
        } else if !sends.is_empty() {
            self.out.push(Out::Many(std::mem::take(sends)));
        }
    }

    /// Another session's reset aborts this session's tasks on `lun` (`None`: all).
    /// Like [`SessionHandle::run`], from outside the reader (a command's completion, another
    /// session's reset): what is left goes to the reader.
    fn run_elsewhere(&self, f: impl FnOnce(&mut Live) -> Vec<Action>) {
        let rest = self.run(f);
        if !rest.is_empty() {
            let _ = self.deferred.send(rest);
        }
    }

    fn abort_from_elsewhere(&self, lun: Option<u64>) {
        self.run_elsewhere(|l| l.core.on_abort_request(lun));
    }
}

struct NoopWake;
impl Wake for NoopWake {
    fn wake(self: Arc<Self>) {}
}

/// The driver's side of a full-feature session (one connection: MaxConnections is 1).
struct Session {
    shared: Arc<Shared>,
    peer: SocketAddr,
    ctl: Arc<SessionCtl>,
    nexus: Arc<Nexus>,
    device: Option<Arc<Device>>,
    /// The target's counts (none in a discovery session).
    stats: Option<Arc<TargetStats>>,
    handle: Arc<SessionHandle>,
    /// The session's output budget in [`OUTPUT_UNIT`]s (reads reserve their data here).
    output: Arc<Semaphore>,
    output_units: u32,
    noop: Waker,
}

async fn full_feature(
    stream: Stream,
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
    let device = o.target.and_then(|i| shared.targets.get(i)).map(|t: &Exported| Arc::clone(&t.device));
    if let Some(d) = &device {
        d.nexus_added(&nexus);
    }
    let stats = o.target.and_then(|i| shared.targets.get(i)).map(|t| Arc::clone(&t.stats));
    match &stats {
        Some(s) => s.session_started(),
        None => shared.stats.discovery_started(),
    }
    tracing::info!(
        initiator = %o.initiator_name, target = %target_name, tsih = li.tsih, %peer,
        kind = %o.session_type, header_digest = p.header_digest, data_digest = p.data_digest,
        "session started"
    );
    let limits = &shared.limits;
    let portal = local.map(|a| format!("{a},{}", shared.policy.tpgt));
    let listings: Vec<Listing> = shared
        .policy
        .listed(&o.initiator_name, o.authenticated)
        .into_iter()
        .map(|t| Listing { iqn: t.iqn.clone(), addresses: portal.iter().cloned().collect() })
        .collect();
    let cfg = SessionConfig {
        session_type: o.session_type,
        cid: o.cid,
        exp_cmd_sn: o.exp_cmd_sn,
        queue_depth: limits.queue_depth,
        digests,
        burst: Burst {
            initial_r2t: p.initial_r2t,
            immediate_data: p.immediate_data,
            first_burst: p.first_burst_length,
            max_burst: p.max_burst_length,
            max_outstanding_r2t: p.max_outstanding_r2t,
        },
        write_buffer: limits.session_write_buffer_bytes,
        max_command_bytes: limits.max_command_bytes,
        shape: Shape { max_xmit: p.max_xmit_data_segment_length, max_burst: p.max_burst_length },
        lun_count: device.as_ref().map_or(0, |d| d.lun_count()),
        target: o.target.and_then(|i| shared.targets.get(i)).map(|t| t.iqn.clone()),
        listings,
        nop_interval: (limits.nop_in_interval_secs > 0).then(|| Duration::from_secs(limits.nop_in_interval_secs)),
        nop_timeout: Duration::from_secs(limits.nop_in_timeout_secs),
    };
    let core = SessionCore::new(cfg, std::time::Instant::now());
    let budget = limits.session_output_buffer_bytes;
    let seq = Arc::new(SeqNums {
        exp_cmd_sn: AtomicU32::new(core.exp_cmd_sn()),
        max_cmd_sn: AtomicU32::new(core.max_cmd_sn()),
        queued: AtomicUsize::new(0),
        budget: usize::try_from(budget).unwrap_or(usize::MAX),
        drained: Notify::new(),
        written: AtomicU64::new(0),
        writer_gone: SessionCtl::default(),
    });
    let (rd, wr) = stream.into_split();
    let (tx, rx) = mpsc::unbounded_channel();
    let mut writer = tokio::spawn(writer(wr, rx, Arc::clone(&seq), o.next_stat_sn, digests));
    let (deferred, deferred_rx) = mpsc::unbounded_channel();
    let handle = Arc::new(SessionHandle {
        target: o.target,
        live: Mutex::new(Live { core, handles: HashMap::new() }),
        out: Outbox { tx, seq },
        deferred,
    });
    shared.task_sets().insert(nexus.id, Arc::clone(&handle));
    let output_units = u32::try_from(budget / OUTPUT_UNIT).unwrap_or(u32::MAX).max(1);
    let mut s = Session {
        peer,
        ctl: Arc::clone(&li.ctl),
        nexus: Arc::clone(&nexus),
        device: device.clone(),
        stats: stats.clone(),
        handle: Arc::clone(&handle),
        output: Arc::new(Semaphore::new(output_units as usize)),
        output_units,
        noop: Waker::from(Arc::new(NoopWake)),
        shared: Arc::clone(&shared),
    };
    let max_recv = p.max_recv_data_segment_length;
    let reason = s.read_loop(rd, &mut buf, digests, max_recv, deferred_rx).await;
    // Tasks of an ended session are aborted (ERL 0: nothing survives the connection).
    shared.task_sets().remove(&nexus.id);
    for (_, (_, h)) in lock(&handle.live).handles.drain() {
        h.abort();
    }
    drop(s);
    drop(handle);
    // The slot is free as soon as the session has ended, not once its last bytes are out.
    shared.registry().unregister(li.tsih, &li.ctl);
    // A peer that does not read cannot keep the writer, and what it holds, alive.
    if tokio::time::timeout(Duration::from_secs(5), &mut writer).await.is_err() {
        writer.abort();
    }
    if let Some(d) = &device {
        d.nexus_removed(&nexus);
    }
    match &stats {
        Some(s) => s.session_ended(),
        None => shared.stats.discovery_ended(),
    }
    tracing::info!(initiator = %li.outcome.initiator_name, target = %target_name, tsih = li.tsih, %peer, reason, "session ended");
}

impl Session {
    async fn read_loop(
        &mut self,
        mut rd: ReadHalf,
        buf: &mut BytesMut,
        digests: Digests,
        max_recv: u32,
        mut deferred: mpsc::UnboundedReceiver<Vec<Action>>,
    ) -> &'static str {
        let seq = Arc::clone(&self.handle.out.seq);
        loop {
            // Everything already buffered is handled before the next read.
            loop {
                match frame::check(buf, digests, max_recv) {
                    Ok(n) => {
                        // Backpressure: while the writer is far behind, take no new requests.
                        if seq.queued.load(Ordering::Acquire) > seq.budget {
                            self.warn_bound("session output bound");
                            if let Err(reason) = self.watch(seq.drained()).await {
                                return reason;
                            }
                        }
                        let f = buf.split_to(n).freeze();
                        // Decoding (and its data digest) happens outside the session's lock.
                        let actions = match frame::parse(f.clone(), digests) {
                            Ok(pdu) => self.handle.run(|l| l.core.on_pdu(pdu, f)),
                            Err(e) => self.handle.run(|l| l.core.on_bad_frame(e, &f)),
                        };
                        if let Some(reason) = self.perform(actions).await {
                            return reason;
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
                        if let Some(suppressed) = self.shared.may_warn(self.peer, "oversized PDU") {
                            tracing::warn!(peer = %self.peer, len, max, suppressed, "data segment beyond MaxRecvDataSegmentLength; closing");
                        }
                        return "oversized PDU";
                    }
                }
            }
            let deadline = lock(&self.handle.live).core.deadline().map(Instant::from_std);
            tokio::select! {
                biased;
                reason = self.ended() => return reason,
                () = sleep_until_some(deadline) => {
                    let actions = self.handle.run(|l| l.core.on_tick(std::time::Instant::now()));
                    if let Some(reason) = self.perform(actions).await {
                        return reason;
                    }
                },
                Some(actions) = deferred.recv() => {
                    if let Some(reason) = self.perform(actions).await {
                        return reason;
                    }
                },
                r = rd.read_buf(buf) => match r {
                    Ok(0) => return "connection closed by initiator",
                    Err(_) => return "connection error",
                    Ok(_) => lock(&self.handle.live).core.on_received(std::time::Instant::now()),
                },
            }
        }
    }

    /// Waits for `fut` while the reader is not reading, still ending the session when it is
    /// killed, when the writer finds the connection gone, or when the peer stops answering
    /// pings. Output leaving counts as an answer: the peer is reading, only slowly.
    async fn watch<F: Future>(&mut self, fut: F) -> Result<F::Output, &'static str> {
        let seq = Arc::clone(&self.handle.out.seq);
        let mut seen = seq.written.load(Ordering::Acquire);
        tokio::pin!(fut);
        loop {
            let deadline = lock(&self.handle.live).core.deadline().map(Instant::from_std);
            tokio::select! {
                biased;
                reason = self.ended() => return Err(reason),
                r = &mut fut => return Ok(r),
                () = sleep_until_some(deadline) => {
                    let now = std::time::Instant::now();
                    let written = seq.written.load(Ordering::Acquire);
                    let actions = self.handle.run(|l| {
                        if written != seen {
                            l.core.on_received(now);
                        }
                        l.core.on_tick(now)
                    });
                    seen = written;
                    // A tick only pings (queued by `run`) or closes.
                    for a in actions {
                        if let Action::Close(reason) = a {
                            return Err(self.close(reason));
                        }
                    }
                },
            }
        }
    }

    /// Resolves, saying why, when the session must end whatever it waits for: it was replaced
    /// or reset, the target is stopping, or the writer found the connection gone.
    async fn ended(&self) -> &'static str {
        tokio::select! {
            biased;
            () = self.ctl.killed() => "replaced or reset",
            () = self.shared.stopping.killed() => "target shutting down",
            () = self.handle.out.seq.writer_gone.killed() => "connection error",
        }
    }

    /// Takes `units` from `sem`, waiting (and saying so, as `kind`) while it has too few.
    async fn acquire(
        &mut self,
        sem: Arc<Semaphore>,
        units: u32,
        kind: &'static str,
    ) -> Result<OwnedSemaphorePermit, &'static str> {
        if let Ok(p) = Arc::clone(&sem).try_acquire_many_owned(units) {
            return Ok(p);
        }
        self.warn_bound(kind);
        // The semaphores are never closed while a session runs.
        self.watch(sem.acquire_many_owned(units)).await?.map_err(|_| "target shutting down")
    }

    /// Logs (rate-limited) that this peer holds the session or target at its output bound.
    fn warn_bound(&self, kind: &'static str) {
        if let Some(suppressed) = self.shared.may_warn(self.peer, kind) {
            tracing::warn!(
                peer = %self.peer, initiator = %self.nexus.initiator_name, suppressed,
                "{kind} reached: the initiator reads its responses slower than it sends requests; taking no more until it does"
            );
        }
    }

    /// Queues the close and says why, for the session-ended line.
    fn close(&self, reason: CloseReason) -> &'static str {
        let kind = match reason {
            CloseReason::HeaderDigest => Some(("header digest", "header digest error; closing")),
            CloseReason::PingUnanswered => Some(("ping unanswered", "initiator did not answer a NOP-In ping; closing")),
            CloseReason::Logout | CloseReason::Truncated => None,
        };
        if let Some((kind, msg)) = kind {
            if let Some(suppressed) = self.shared.may_warn(self.peer, kind) {
                tracing::warn!(peer = %self.peer, suppressed, "{msg}");
            }
        }
        self.handle.out.push(Out::Close);
        reason.describe()
    }

    /// Carries out what [`SessionHandle::run`] left; `Some(reason)` when the session ends.
    async fn perform(&mut self, actions: Vec<Action>) -> Option<&'static str> {
        let mut actions: VecDeque<Action> = actions.into();
        while let Some(a) = actions.pop_front() {
            match a {
                Action::Execute { itt, task, command } => {
                    let reservation = match self.reserve(itt, task, &command).await {
                        Ok(Some(r)) => r,
                        // Aborted while it waited for room.
                        Ok(None) => continue,
                        Err(reason) => return Some(reason),
                    };
                    self.execute(itt, task, command, reservation);
                }
                Action::AbortOtherSessions(lun) => self.abort_other_sessions(lun),
                Action::Reset { itt, reset } => {
                    let Some(device) = &self.device else { continue };
                    let result = match reset {
                        Reset::ClearTaskSet(l) => device.clear_task_set(l, &self.nexus),
                        Reset::Lun(l) => device.lun_reset(l, &self.nexus),
                        Reset::Target { cold } => device.target_reset(&self.nexus, cold),
                    };
                    let more = self.handle.run(|l| l.core.on_reset_done(itt, result));
                    for m in more.into_iter().rev() {
                        actions.push_front(m);
                    }
                }
                Action::DropTargetSessions => {
                    if let Some(i) = self.handle.target {
                        self.shared.registry().kill_all(Some(i));
                    }
                }
                Action::Close(reason) => return Some(self.close(reason)),
                Action::Log(e) => self.log(e),
                // Carried out under the lock by `SessionHandle::run`.
                Action::Send(_) | Action::Abort(_) => {}
            }
        }
        None
    }

    /// Reserves the output a command's data will take, from the session's budget and then the
    /// target's, waiting while they are spent. `Ok(None)`: the command was aborted meanwhile.
    async fn reserve(&mut self, itt: u32, task: u64, command: &Command) -> Result<Option<Reservation>, &'static str> {
        let bytes = match command.direction {
            Direction::Read | Direction::Bidi => u64::from(command.expected_len),
            Direction::None | Direction::Write => 0,
        };
        // Whole units, at least one; a read larger than the budget takes the whole budget.
        let units = u32::try_from(bytes.div_ceil(OUTPUT_UNIT)).unwrap_or(u32::MAX).clamp(1, self.output_units);
        let session = self.acquire(Arc::clone(&self.output), units, "session output bound").await?;
        let target_units = units.min(self.shared.output_units);
        let target = self.acquire(Arc::clone(&self.shared.output), target_units, "target output bound").await?;
        if !lock(&self.handle.live).core.runs(itt, task) {
            return Ok(None);
        }
        Ok(Some(Reservation { _session: session, _target: target }))
    }

    fn log(&self, e: Event) {
        match e {
            Event::TaskManagement { function, response } => {
                tracing::info!(function, response, initiator = %self.nexus.initiator_name, "task management");
            }
            Event::OutsideWindow { cmd_sn, exp, max } => {
                tracing::debug!(cmd_sn, exp, max, "command outside the CmdSN window ignored");
            }
            Event::WriteTooLarge { len } => tracing::debug!(len, "write larger than max_command_bytes refused"),
            Event::WriteRefused(e) => tracing::debug!("write refused: {e}"),
            Event::DataOutRefused { itt, error } => tracing::debug!(itt, "Data-Out refused: {error}"),
            Event::DataOutForNoTask { itt } => tracing::debug!(itt, "Data-Out for no pending task ignored"),
            Event::TextRefused(e) => tracing::debug!("text request refused: {e}"),
            Event::DataDigest { opcode } => {
                if let Some(suppressed) = self.shared.may_warn(self.peer, "data digest") {
                    tracing::warn!(peer = %self.peer, ?opcode, suppressed, "data digest error; PDU rejected");
                }
            }
            Event::BadHeader(source) => {
                if let Some(suppressed) = self.shared.may_warn(self.peer, "bad header") {
                    tracing::warn!(peer = %self.peer, suppressed, "{source}; PDU rejected");
                }
            }
        }
    }

    /// Aborts the tasks of every other session of this target on `lun` (`None`: all LUNs).
    fn abort_other_sessions(&self, lun: Option<u64>) {
        let others: Vec<Arc<SessionHandle>> = self
            .shared
            .task_sets()
            .iter()
            .filter(|(id, t)| **id != self.nexus.id && t.target == self.handle.target)
            .map(|(_, t)| Arc::clone(t))
            .collect();
        for t in others {
            t.abort_from_elsewhere(lun);
        }
    }

    fn execute(&mut self, itt: u32, task: u64, command: Command, reservation: Reservation) {
        let Some(device) = &self.device else { return };
        let device = Arc::clone(device);
        let nexus = Arc::clone(&self.nexus);
        let timed = Timed::new(&command);
        let mut fut = Box::pin(async move { device.execute(&nexus, command).await });
        // Most commands (memory, page-cached files) finish on the first poll: answer at once
        // and spare a task. The rest continue in their own task.
        if let Poll::Ready(resp) = fut.as_mut().poll(&mut Context::from_waker(&self.noop)) {
            timed.done(self.stats.as_deref(), &resp);
            self.handle.run_elsewhere(|l| l.core.on_command_done(itt, task, &resp));
            self.handle.out.push(Out::Release(reservation));
            return;
        }
        let handle = Arc::clone(&self.handle);
        let stats = self.stats.clone();
        // Held across the spawn so that the task's completion finds its handle registered.
        let mut live = lock(&self.handle.live);
        let join = tokio::spawn(async move {
            let resp = fut.await;
            timed.done(stats.as_deref(), &resp);
            handle.run_elsewhere(|l| {
                // A new command may have taken the ITT since this one was aborted.
                if l.handles.get(&itt).is_some_and(|(t, _)| *t == task) {
                    l.handles.remove(&itt);
                }
                l.core.on_command_done(itt, task, &resp)
            });
            handle.out.push(Out::Release(reservation));
        });
        if live.core.runs(itt, task) {
            live.handles.insert(itt, (task, join.abort_handle()));
        } else {
            // Aborted by another session's reset before it could be registered.
            join.abort();
        }
    }
}

/// One command as the statistics see it: its kind, LUN, write data and when it started.
struct Timed {
    kind: Kind,
    lun: u64,
    data_in: usize,
    started: std::time::Instant,
}

impl Timed {
    fn new(command: &Command) -> Timed {
        Timed {
            kind: Kind::of(command.cdb.first().copied().unwrap_or_default()),
            lun: command.lun,
            data_in: command.data_out.len(),
            started: std::time::Instant::now(),
        }
    }

    /// Counts the command as done with `resp` (on a LUN the target has).
    fn done(&self, stats: Option<&TargetStats>, resp: &Response) {
        if let Some(lun) = stats.and_then(|s| s.lun(self.lun)) {
            lun.record(self.kind, self.started.elapsed(), self.data_in, resp.data_in.len(), resp.status);
        }
    }
}

async fn write_all_chunks(wr: &mut WriteHalf, mut chunks: Vec<Bytes>) -> std::io::Result<()> {
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
    mut wr: WriteHalf,
    mut rx: mpsc::UnboundedReceiver<Out>,
    seq: Arc<SeqNums>,
    mut stat_sn: u32,
    digests: Digests,
) {
    let mut msgs = Vec::with_capacity(64);
    let mut held = Vec::new();
    loop {
        if rx.recv_many(&mut msgs, 256).await == 0 {
            return;
        }
        let exp = seq.exp_cmd_sn.load(Ordering::Acquire);
        let max = seq.max_cmd_sn.load(Ordering::Acquire);
        let mut batch = Batch::new(COPY_BELOW);
        let mut close = false;
        let cost: usize = msgs.iter().map(Out::cost).sum();
        let mut push = |mut p: Pdu| {
            stamp(&mut p.header, &mut stat_sn, exp, max);
            batch.push(&p, digests);
        };
        for m in msgs.drain(..) {
            match m {
                Out::One(p) => push(p),
                Out::Many(v) => v.into_iter().for_each(&mut push),
                Out::Release(r) => held.push(r),
                Out::Close => close = true,
            }
        }
        let chunks = batch.finish();
        let bytes: usize = chunks.iter().map(Bytes::len).sum();
        // The flush costs nothing on plain TCP; over TLS it sends what the session still holds.
        if write_all_chunks(&mut wr, chunks).await.is_err() || wr.flush().await.is_err() {
            seq.writer_gone.kill();
            return;
        }
        held.clear();
        seq.written.fetch_add(bytes as u64, Ordering::AcqRel);
        if seq.queued.fetch_sub(cost, Ordering::AcqRel).saturating_sub(cost) <= seq.budget {
            seq.drained.notify_one();
        }
        if close {
            let _ = wr.shutdown().await;
            return;
        }
    }
}

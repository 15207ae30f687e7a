//! A full-feature iSCSI session: a thin tokio driver around [`crate::core::Core`]. Callers
//! submit commands from any task; one driver task owns the core, runs its timers and turns its
//! actions into socket writes, completions and reconnections.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stics_wire::keys::Params;
use stics_wire::{Digests, Pdu};
use tokio::sync::{mpsc, oneshot};

use crate::conn::{self, Connection};
use crate::core::{Action, Core, Request, TaskError, Timers};
use crate::counters::{Counters, Snapshot};
use crate::login::{LoginConfig, Offer, Outcome};
use crate::scsi::ScsiOutcome;
use crate::url::{Chap, IscsiUrl};
use crate::Error;

/// How a session logs in and behaves.
#[derive(Debug, Clone)]
pub struct Config {
    /// This initiator's IQN.
    pub initiator_name: String,
    pub offer: Offer,
    pub timers: Timers,
    /// Limit for TCP connect and for the whole login exchange.
    pub login_timeout: Duration,
    /// TLS 1.3 under every connection when set (the CA to trust, the name to expect).
    pub tls: Option<stics_tls::Connector>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            initiator_name: "iqn.2024-01.org.stics:initiator".into(),
            offer: Offer::default(),
            timers: Timers::default(),
            login_timeout: Duration::from_secs(5),
            tls: None,
        }
    }
}

/// A random ISID of the "random" type (RFC 7143 §11.12.5), distinct per session so that two
/// processes never reinstate each other's sessions; `index` tells sessions of one process apart.
pub fn random_isid(index: u16) -> [u8; 6] {
    let r: [u8; 3] = rand::random();
    let i = index.to_be_bytes();
    [0x80, r[0], r[1], r[2], i[0], i[1]]
}

enum UserMsg {
    Submit(Request, oneshot::Sender<Result<ScsiOutcome, TaskError>>),
    Rearm,
    Logout(oneshot::Sender<()>),
}

enum Event {
    LoginOk(u64, Box<(Connection, Outcome)>),
    LoginFailed(u64, String, bool),
}

/// Facts about a logged-in session.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    pub target: String,
    pub portal: String,
    pub tsih: u16,
    pub isid: [u8; 6],
    pub target_alias: Option<String>,
}

/// A logged-in session; cheap to clone, all clones share the connection.
#[derive(Clone)]
pub struct Session {
    tx: mpsc::UnboundedSender<UserMsg>,
    counters: Arc<Counters>,
    params: Arc<Mutex<Params>>,
    /// The target's answers to the private keys offered, at the last login.
    private: Arc<Mutex<Vec<(String, String)>>>,
    info: Arc<SessionInfo>,
    /// Successful logins: 1 after connect, one more for each reinstatement.
    logins: Arc<AtomicU64>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("info", &self.info).finish_non_exhaustive()
    }
}

fn login_config(cfg: &Config, target: &str, chap: Option<Chap>, isid: [u8; 6]) -> LoginConfig {
    LoginConfig {
        initiator_name: cfg.initiator_name.clone(),
        target_name: Some(target.to_owned()),
        isid,
        tsih: 0,
        cid: 0,
        itt: 0,
        cmd_sn: 1,
        chap,
        mutual_challenge: (rand::random(), rand::random()),
        offer: cfg.offer.clone(),
    }
}

impl Session {
    /// Logs in to the target named in `url` (its LUN is ignored here). Errors of this first
    /// login come back at once, without retries: a wrong secret is reported, not hammered.
    pub async fn connect(url: &IscsiUrl, cfg: &Config, isid: [u8; 6]) -> Result<Session, Error> {
        let target = url
            .target
            .clone()
            .ok_or_else(|| Error::Url(crate::url::UrlError { url: url.to_string(), reason: "missing target name" }))?;
        let portal = url.portal();
        let counters = Arc::new(Counters::default());
        let lcfg = login_config(cfg, &target, url.chap.clone(), isid);
        let (conn, outcome) = conn::open(&portal, lcfg, counters.clone(), cfg.login_timeout, cfg.tls.as_ref()).await?;
        let info = Arc::new(SessionInfo {
            target,
            portal,
            tsih: outcome.tsih,
            isid,
            target_alias: outcome.target_alias.clone(),
        });
        let params = Arc::new(Mutex::new(outcome.params.clone()));
        let private = Arc::new(Mutex::new(outcome.private.clone()));
        let logins = Arc::new(AtomicU64::new(1));
        let (tx, rx) = mpsc::unbounded_channel();
        let (events, events_rx) = mpsc::unbounded_channel();
        let driver = Driver {
            cfg: cfg.clone(),
            chap: url.chap.clone(),
            info: info.clone(),
            counters: counters.clone(),
            params: params.clone(),
            private: private.clone(),
            waiters: HashMap::new(),
            next_token: 0,
            link: None,
            digests: Digests::default(),
            events,
            logout_waiter: None,
            logins: logins.clone(),
        };
        tokio::spawn(driver.run(rx, events_rx, conn, outcome));
        Ok(Session { tx, counters, params, private, info, logins })
    }

    /// Runs one SCSI command; it is reissued after reconnections until it finishes or the
    /// recovery window closes.
    pub async fn execute(&self, req: Request) -> Result<ScsiOutcome, Error> {
        self.submit(req).await
    }

    /// Queues one SCSI command now (commands leave in the order of these calls, which is what
    /// ORDERED task attributes need) and returns the wait for its outcome; like
    /// [`Session::execute`] it is reissued after reconnections, unless it is [`Request::once`].
    pub fn submit(
        &self,
        req: Request,
    ) -> impl std::future::Future<Output = Result<ScsiOutcome, Error>> + Send + 'static {
        let (tx, rx) = oneshot::channel();
        let sent = self.tx.send(UserMsg::Submit(req, tx)).map_err(|_| Error::Task(TaskError::Closed));
        async move {
            sent?;
            rx.await.map_err(|_| Error::Task(TaskError::Closed))?.map_err(Error::Task)
        }
    }

    /// Lets commands sent [`Request::once`] through again after a lost connection failed some
    /// (see [`crate::core::Core::rearm`]); it takes effect before any command submitted after it.
    pub fn rearm(&self) {
        let _ = self.tx.send(UserMsg::Rearm);
    }

    /// Logs out (waits at most two seconds for the target's answer).
    pub async fn logout(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(UserMsg::Logout(tx)).is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(2), rx).await;
        }
    }

    /// Parameters negotiated at the last login.
    pub fn params(&self) -> Params {
        self.params.lock().map(|p| p.clone()).unwrap_or_default()
    }

    /// The target's answer to private key `key` at the last login, if it understood the key.
    pub fn private_answer(&self, key: &str) -> Option<String> {
        let p = self.private.lock().ok()?;
        p.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    pub fn info(&self) -> &SessionInfo {
        &self.info
    }

    pub fn counters(&self) -> Snapshot {
        self.counters.snapshot()
    }

    /// Successful logins so far: 1 after [`Session::connect`], one more after each reinstatement
    /// (what a caller watches to redo per-nexus state, such as a reservation, after a reconnect).
    pub fn logins(&self) -> u64 {
        self.logins.load(Relaxed)
    }

    pub(crate) fn counters_ref(&self) -> &Arc<Counters> {
        &self.counters
    }
}

/// The live connection, owned by the driver task: it reads PDUs and writes queued bytes itself,
/// so that a command costs no hops between tasks.
struct Link {
    gen: u64,
    reader: conn::PduReader,
    writer: conn::Writer,
    /// Encoded PDUs not yet accepted by the socket.
    out: bytes::BytesMut,
}

enum Wake {
    Pdu(Result<Pdu, Error>),
    Writable,
    Event(Option<Event>),
    User(Option<UserMsg>),
    Tick,
}

struct Driver {
    cfg: Config,
    chap: Option<Chap>,
    info: Arc<SessionInfo>,
    counters: Arc<Counters>,
    params: Arc<Mutex<Params>>,
    private: Arc<Mutex<Vec<(String, String)>>>,
    waiters: HashMap<u64, oneshot::Sender<Result<ScsiOutcome, TaskError>>>,
    next_token: u64,
    link: Option<Link>,
    digests: Digests,
    events: mpsc::UnboundedSender<Event>,
    logout_waiter: Option<oneshot::Sender<()>>,
    logins: Arc<AtomicU64>,
}

async fn next_pdu(r: Option<&mut conn::PduReader>) -> Result<Pdu, Error> {
    match r {
        Some(r) => r.next().await,
        None => std::future::pending().await,
    }
}

async fn writable(w: Option<&conn::Writer>) {
    match w {
        Some(w) => w.writable().await,
        None => std::future::pending().await,
    }
}

impl Driver {
    fn attach(&mut self, gen: u64, conn: Connection, outcome: &Outcome) {
        self.digests = Digests { header: outcome.params.header_digest, data: outcome.params.data_digest };
        if let Ok(mut p) = self.params.lock() {
            *p = outcome.params.clone();
        }
        if let Ok(mut p) = self.private.lock() {
            p.clone_from(&outcome.private);
        }
        let Connection { reader, writer, .. } = conn;
        self.link = Some(Link { gen, reader, writer, out: bytes::BytesMut::with_capacity(1 << 16) });
    }

    fn start_login(&self, gen: u64) {
        Counters::add(&self.counters.reconnects, 1);
        let lcfg = login_config(&self.cfg, &self.info.target, self.chap.clone(), self.info.isid);
        let portal = self.info.portal.clone();
        let counters = self.counters.clone();
        let timeout = self.cfg.login_timeout;
        let tls = self.cfg.tls.clone();
        let ev = self.events.clone();
        tokio::spawn(async move {
            let msg = match conn::open(&portal, lcfg, counters, timeout, tls.as_ref()).await {
                Ok(pair) => Event::LoginOk(gen, Box::new(pair)),
                Err(e) => {
                    // Every login here reinstates a session the target accepted before.
                    let permanent = e.is_permanent_on_reinstatement();
                    Event::LoginFailed(gen, e.to_string(), permanent)
                }
            };
            let _ = ev.send(msg);
        });
    }

    fn apply(&mut self, core: &Core, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Send(pdu) => {
                    if let Some(l) = &mut self.link {
                        let before = l.out.len();
                        stics_wire::frame::encode(&pdu, self.digests, &mut l.out);
                        conn::count_sent(&self.counters, &pdu, l.out.len() - before);
                    }
                }
                Action::Complete(token, result) => {
                    // Counted before the caller hears of it, so that a caller that looks at the
                    // counts after its command completed sees what that command saw.
                    if let Ok(o) = &result {
                        if o.is_reset_attention() {
                            Counters::add(&self.counters.reset_attentions, 1);
                        }
                        if o.is_preemption() {
                            Counters::add(&self.counters.preemptions, 1);
                        }
                    }
                    if let Some(w) = self.waiters.remove(&token) {
                        let _ = w.send(result);
                    }
                }
                Action::Connect(gen) => self.start_login(gen),
                Action::Disconnect(reason) => {
                    tracing::warn!(target = %self.info.target, %reason, "dropping connection; commands will be reissued");
                    self.link = None;
                }
                Action::LoggedOut => {
                    // The target closes the connection after a logout; that close is expected.
                    self.link = None;
                    if let Some(w) = self.logout_waiter.take() {
                        let _ = w.send(());
                    }
                }
            }
        }
        self.counters.max_in_flight.fetch_max(core.in_flight() as u64, Relaxed);
    }

    /// Writes as much queued output as the socket takes now; an error closes the link.
    fn push_out(&mut self) -> Option<(u64, String)> {
        let l = self.link.as_mut()?;
        match l.writer.push(&mut l.out) {
            Ok(()) => None,
            Err(e) => {
                let gen = l.gen;
                self.link = None;
                Some((gen, format!("write failed: {e}")))
            }
        }
    }

    async fn run(
        mut self,
        mut user: mpsc::UnboundedReceiver<UserMsg>,
        mut events: mpsc::UnboundedReceiver<Event>,
        conn: Connection,
        outcome: Outcome,
    ) {
        let now = Instant::now();
        let mut core = Core::new(self.cfg.timers, &outcome, 1, now);
        self.attach(1, conn, &outcome);
        let mut user_open = true;
        loop {
            if let Some((gen, reason)) = self.push_out() {
                if core.is_up() {
                    tracing::warn!(target = %self.info.target, %reason, "connection lost; reconnecting");
                }
                let actions = core.on_closed(gen, &reason, Instant::now());
                self.apply(&core, actions);
                continue;
            }
            let deadline = core.next_deadline();
            let sleep = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(tokio::time::Instant::from_std(d)).await,
                    None => std::future::pending::<()>().await,
                }
            };
            let (rd, wr, want_write) = match &mut self.link {
                Some(Link { reader, writer, out, .. }) => (Some(reader), Some(&*writer), !out.is_empty()),
                None => (None, None, false),
            };
            let wake = tokio::select! {
                biased;
                r = next_pdu(rd) => Wake::Pdu(r),
                () = writable(wr), if want_write => Wake::Writable,
                ev = events.recv() => Wake::Event(ev),
                m = user.recv(), if user_open => Wake::User(m),
                () = sleep => Wake::Tick,
            };
            let now = Instant::now();
            let actions = match wake {
                Wake::Writable => continue,
                Wake::Pdu(Ok(pdu)) => match self.link.as_ref().map(|l| l.gen) {
                    Some(gen) => core.on_pdu(gen, pdu, now),
                    None => continue,
                },
                Wake::Pdu(Err(e)) => {
                    let Some(gen) = self.link.take().map(|l| l.gen) else { continue };
                    if core.is_up() {
                        tracing::warn!(target = %self.info.target, reason = %e, "connection lost; reconnecting");
                    }
                    core.on_closed(gen, &e.to_string(), now)
                }
                Wake::Event(Some(Event::LoginOk(gen, pair))) => {
                    let (conn, outcome) = *pair;
                    if core.current_gen() == Some(gen) && !core.is_up() {
                        tracing::info!(target = %self.info.target, "session reinstated");
                        self.attach(gen, conn, &outcome);
                        self.logins.fetch_add(1, Relaxed);
                    }
                    core.on_login_ok(gen, &outcome, now)
                }
                Wake::Event(Some(Event::LoginFailed(gen, reason, permanent))) => {
                    tracing::debug!(target = %self.info.target, %reason, "reconnection attempt failed");
                    core.on_login_failed(gen, &reason, permanent, now)
                }
                Wake::Event(None) => break,
                Wake::User(Some(UserMsg::Submit(req, tx))) => {
                    let token = self.next_token;
                    self.next_token += 1;
                    self.waiters.insert(token, tx);
                    let mut actions = core.submit(token, req, now);
                    // Take every command already queued, so that they leave in one write.
                    let mut logout_asked = false;
                    loop {
                        match user.try_recv() {
                            Ok(UserMsg::Submit(req, tx)) => {
                                let token = self.next_token;
                                self.next_token += 1;
                                self.waiters.insert(token, tx);
                                actions.extend(core.submit(token, req, now));
                            }
                            Ok(UserMsg::Rearm) => core.rearm(),
                            Ok(UserMsg::Logout(t)) => {
                                self.logout_waiter = Some(t);
                                logout_asked = true;
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    if logout_asked {
                        if let Some(p) = core.logout() {
                            actions.push(Action::Send(p));
                        } else {
                            self.logout_waiter = None;
                            actions.extend(core.close());
                        }
                    }
                    actions
                }
                Wake::User(Some(UserMsg::Rearm)) => {
                    core.rearm();
                    continue;
                }
                Wake::User(Some(UserMsg::Logout(tx))) => {
                    self.logout_waiter = Some(tx);
                    if let Some(p) = core.logout() {
                        vec![Action::Send(p)]
                    } else {
                        self.logout_waiter = None;
                        core.close()
                    }
                }
                Wake::User(None) => {
                    // Every handle is gone: log out politely, then stop.
                    user_open = false;
                    let mut v: Vec<Action> = core.logout().map(Action::Send).into_iter().collect();
                    v.extend(core.close());
                    v
                }
                Wake::Tick => core.on_tick(now),
            };
            self.apply(&core, actions);
            if !user_open && core.outstanding() == 0 {
                let _ = self.push_out();
                break;
            }
        }
    }
}

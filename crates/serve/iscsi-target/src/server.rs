//! The listener side: puts SCSI logical units over the devices it is given, binds the portals,
//! admits connections within the limits and shuts everything down on request. It opens no
//! device and closes none: whoever opened them does both.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use stics_block::BlockDev;
use stics_scsi::{Device, LogicalUnit, LuConfig};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::config::{check_distinct, check_target, ConfigError, Credentials, DiscoveryAuth, Limits};
use crate::conn::SessionHandle;
use crate::login::{Policy, TargetAuth};
use crate::registry::{Registry, SessionCtl};
use crate::stats::{Stats, TargetStats};
use crate::warn::{Limiter, Verdict};
use crate::TargetError;

/// One iSCSI target to serve: its name, its LUNs and who may log in to it.
#[derive(Clone)]
pub struct Target {
    /// iSCSI name (iqn., eui. or naa. form).
    pub iqn: String,
    /// TargetAlias sent at login.
    pub alias: Option<String>,
    /// LUN n is the n-th device; each keeps its own block size and geometry.
    pub luns: Vec<Arc<dyn BlockDev>>,
    /// One-way CHAP: the initiator must prove it knows this user's secret.
    pub chap: Option<Credentials>,
    /// Mutual CHAP: what the target answers when the initiator challenges it.
    pub mutual_chap: Option<Credentials>,
    /// Initiator names allowed to log in and to see this target in discovery; empty allows all.
    pub initiators: Vec<String>,
}

impl Target {
    /// A target anyone may log in to, without CHAP or alias.
    pub fn new(iqn: impl Into<String>, luns: Vec<Arc<dyn BlockDev>>) -> Target {
        Target { iqn: iqn.into(), alias: None, luns, chap: None, mutual_chap: None, initiators: Vec::new() }
    }
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("iqn", &self.iqn)
            .field("alias", &self.alias)
            .field("luns", &self.luns.len())
            .field("chap", &self.chap)
            .field("mutual_chap", &self.mutual_chap)
            .field("initiators", &self.initiators)
            .finish()
    }
}

/// Everything a [`Server`] serves: its portals, limits, discovery's authentication and targets.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Addresses to listen on (port 0 for a free one; [`Server::local_addrs`] tells which).
    pub listen: Vec<SocketAddr>,
    /// Resource limits and the values the target offers in negotiation.
    pub limits: Limits,
    /// Who may open a discovery session; what discovery lists follows [`DiscoveryAuth`]'s rule.
    pub discovery: DiscoveryAuth,
    /// The targets, each with its own LUNs.
    pub targets: Vec<Target>,
    /// Set when every connection must begin with a TLS 1.3 handshake.
    pub tls: Option<stics_tls::Acceptor>,
}

impl ServerConfig {
    /// `targets` on `listen` with the default limits and open discovery.
    pub fn new(listen: Vec<SocketAddr>, targets: Vec<Target>) -> ServerConfig {
        ServerConfig { listen, limits: Limits::default(), discovery: DiscoveryAuth::default(), targets, tls: None }
    }

    /// Checks every rule a running target relies on.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.listen.is_empty() {
            return Err(ConfigError("no listen address".into()));
        }
        if self.targets.is_empty() {
            return Err(ConfigError("no target".into()));
        }
        self.limits.validate()?;
        self.discovery.validate()?;
        for t in &self.targets {
            check_target(&t.iqn, t.luns.len(), t.chap.as_ref(), t.mutual_chap.as_ref())?;
        }
        check_distinct(self.targets.iter().map(|t| t.iqn.as_str()))
    }
}

/// One target at run time.
pub(crate) struct Exported {
    pub iqn: String,
    pub device: Arc<Device>,
    pub stats: Arc<TargetStats>,
}

/// The output budgets count memory in units of this many bytes (semaphores take `u32` counts).
pub(crate) const OUTPUT_UNIT: u64 = 4096;

/// State every connection shares.
pub(crate) struct Shared {
    pub policy: Arc<Policy>,
    pub targets: Vec<Exported>,
    pub stats: Arc<Stats>,
    pub limits: Limits,
    registry: Mutex<Registry>,
    pub logins: Arc<Semaphore>,
    pub next_nexus: AtomicU64,
    /// Killed when the whole target shuts down.
    pub stopping: SessionCtl,
    /// The tasks of every session in full feature phase, by nexus id (resets reach across).
    task_sets: Mutex<HashMap<u64, Arc<SessionHandle>>>,
    /// Output reserved by all sessions, in [`OUTPUT_UNIT`]s, of `output_units`.
    pub output: Arc<Semaphore>,
    pub output_units: u32,
    warnings: Mutex<Limiter>,
    /// Set when every connection must begin with a TLS handshake.
    pub tls: Option<stics_tls::Acceptor>,
}

impl Shared {
    pub fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn task_sets(&self) -> MutexGuard<'_, HashMap<u64, Arc<SessionHandle>>> {
        self.task_sets.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a warning of `kind` caused by `peer` is logged, and if so how many like it
    /// were left out before it: a peer cannot flood the log.
    pub fn may_warn(&self, peer: SocketAddr, kind: &'static str) -> Option<u64> {
        let mut w = self.warnings.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match w.check(peer.ip(), kind, std::time::Instant::now()) {
            Verdict::Log { suppressed } => Some(suppressed),
            Verdict::Suppress => None,
        }
    }
}

/// A bound, ready target; [`Server::run`] serves it.
pub struct Server {
    listeners: Vec<TcpListener>,
    shared: Arc<Shared>,
}

/// A stable 64-bit identifier per (target, LUN), for NAA and serial numbers.
fn lun_id(iqn: &str, lun: usize) -> u64 {
    // FNV-1a: stable across runs and platforms, unlike the std hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in iqn.to_ascii_lowercase().bytes().chain((lun as u64).to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl Server {
    /// Validates `config`, puts a logical unit over every LUN and binds every listen address.
    pub async fn bind(config: ServerConfig) -> Result<Server, TargetError> {
        config.validate()?;
        let ServerConfig { listen, limits, discovery, targets: given, tls } = config;
        let mut targets = Vec::new();
        let mut auths = Vec::new();
        for t in given {
            let mut luns = Vec::new();
            let lun_count = t.luns.len();
            // A LUN that takes groups of epochs makes the target answer the link's login key.
            let link = t.luns.iter().any(|d| d.group_sink().is_some());
            for (i, dev) in t.luns.into_iter().enumerate() {
                let block = dev.geometry().block_size;
                if limits.max_command_bytes < block {
                    return Err(ConfigError(format!(
                        "target {} LUN {i}: limits.max_command_bytes = {} is less than one {block}-byte block",
                        t.iqn, limits.max_command_bytes
                    ))
                    .into());
                }
                let id = lun_id(&t.iqn, i);
                let cfg = LuConfig {
                    serial: format!("{id:016x}"),
                    // NAA 6 (registered extended) with the IEEE company id field left as our hash.
                    naa_id: (0x6u64 << 60) | (id >> 4),
                    // The Block Limits VPD page reports exactly the command size the target takes.
                    max_transfer_bytes: u64::from(limits.max_command_bytes),
                    read_only: dev.read_only(),
                    ..LuConfig::default()
                };
                luns.push(Arc::new(LogicalUnit::new(dev, cfg)));
            }
            let stats = Arc::new(TargetStats::new(t.iqn.clone(), lun_count));
            targets.push(Exported { iqn: t.iqn.clone(), device: Arc::new(Device::new(luns)), stats });
            auths.push(TargetAuth {
                iqn: t.iqn,
                alias: t.alias,
                chap: t.chap,
                mutual_chap: t.mutual_chap,
                initiators: t.initiators,
                link,
            });
        }
        let mut listeners = Vec::new();
        for addr in listen {
            let l = TcpListener::bind(addr).await.map_err(|error| TargetError::Bind { addr, error })?;
            listeners.push(l);
        }
        let output_units = u32::try_from(limits.target_output_buffer_bytes / OUTPUT_UNIT).unwrap_or(u32::MAX).max(1);
        let shared = Arc::new(Shared {
            output: Arc::new(Semaphore::new(output_units as usize)),
            output_units,
            warnings: Mutex::new(Limiter::new(Duration::from_secs(limits.warning_interval_secs))),
            policy: Arc::new(Policy { targets: auths, discovery, limits: limits.clone(), tpgt: 1 }),
            stats: Arc::new(Stats::new(targets.iter().map(|t| Arc::clone(&t.stats)).collect())),
            targets,
            registry: Mutex::new(Registry::new(limits.max_sessions)),
            logins: Arc::new(Semaphore::new(limits.max_logins)),
            next_nexus: AtomicU64::new(1),
            stopping: SessionCtl::default(),
            task_sets: Mutex::new(HashMap::new()),
            limits,
            tls,
        });
        Ok(Server { listeners, shared })
    }

    /// What the server counts (sessions, commands, latency, bytes), live for as long as anyone
    /// holds it.
    pub fn stats(&self) -> Arc<Stats> {
        Arc::clone(&self.shared.stats)
    }

    /// The addresses actually bound (useful with port 0).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners.iter().filter_map(|l| l.local_addr().ok()).collect()
    }

    /// Serves until `shutdown` resolves, then ends every session and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), TargetError> {
        let Server { listeners, shared } = self;
        let connections = Arc::new(Semaphore::new(shared.limits.max_connections));
        let mut conns = JoinSet::new();
        let mut accepts = JoinSet::new();
        let (conn_tx, mut conn_rx) = tokio::sync::mpsc::channel(64);
        for l in listeners {
            let tx = conn_tx.clone();
            accepts.spawn(async move {
                loop {
                    match l.accept().await {
                        Ok(c) => {
                            if tx.send(c).await.is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            // Out of file descriptors and the like: back off instead of spinning.
                            tracing::warn!("accept failed: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            });
        }
        drop(conn_tx);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                c = conn_rx.recv() => {
                    let Some((stream, peer)) = c else { break };
                    let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
                        tracing::warn!(%peer, "connection limit reached; closing new connection");
                        drop(stream);
                        continue;
                    };
                    let shared = Arc::clone(&shared);
                    conns.spawn(async move {
                        crate::conn::serve(stream, peer, shared).await;
                        drop(permit);
                    });
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
        tracing::info!("shutting down");
        accepts.abort_all();
        shared.stopping.kill();
        shared.registry().kill_all(None);
        // Sessions end promptly once killed; connections still logging in are cut off.
        let drain = async { while conns.join_next().await.is_some() {} };
        if tokio::time::timeout(Duration::from_secs(5), drain).await.is_err() {
            conns.abort_all();
        }
        Ok(())
    }
}

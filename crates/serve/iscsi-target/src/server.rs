//! The listener side: opens the LUNs, binds the portals, admits connections within the limits
//! and shuts everything down on request.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use stics_block::BlockDev;
use stics_scsi::{Device, LogicalUnit, LuConfig};
use stics_stack::{DeviceSpec, OpenContext};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::config::{Config, ConfigError, Limits, RbdConfig};
use crate::conn::SessionHandle;
use crate::login::{Policy, TargetAuth};
use crate::registry::{Registry, SessionCtl};
use crate::warn::{Limiter, Verdict};
use crate::TargetError;

/// One target at run time.
pub(crate) struct Target {
    pub iqn: String,
    pub device: Arc<Device>,
}

/// The output budgets count memory in units of this many bytes (semaphores take `u32` counts).
pub(crate) const OUTPUT_UNIT: u64 = 4096;

/// State every connection shares.
pub(crate) struct Shared {
    pub policy: Arc<Policy>,
    pub targets: Vec<Target>,
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
    /// What opened the LUNs; closed (remote LUNs logged out of) after the last session ends.
    devices: OpenContext,
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
    /// Validates `config`, opens every LUN and binds every listen address.
    pub async fn bind(config: &Config) -> Result<Server, TargetError> {
        Server::bind_with(config, OpenContext::default()).await
    }

    /// [`Server::bind`] with LUNs opened in `devices` (how `iscsi://` LUNs log in).
    pub async fn bind_with(config: &Config, mut devices: OpenContext) -> Result<Server, TargetError> {
        config.validate()?;
        if config.rbd != RbdConfig::default() {
            devices.rbd = config.rbd.defaults();
        }
        let mut opened = Vec::new();
        for t in &config.targets {
            let mut luns = Vec::new();
            for (i, spec) in t.luns.iter().enumerate() {
                let parsed: DeviceSpec =
                    spec.parse().map_err(|e| ConfigError::Invalid(format!("target {}: {e}", t.iqn)))?;
                let dev = stics_stack::open(&parsed, &devices).await.map_err(|error| TargetError::Device {
                    iqn: t.iqn.clone(),
                    lun: i,
                    error,
                })?;
                luns.push(dev);
            }
            opened.push(luns);
        }
        Server::assemble(config, devices, opened).await
    }

    /// [`Server::bind`] over devices already open (a test's fault-injecting device, say):
    /// `luns[i]` are the LUNs of `config.targets[i]` in order, one for each of its `luns`,
    /// which then only name them.
    pub async fn bind_devices(config: &Config, luns: Vec<Vec<Arc<dyn BlockDev>>>) -> Result<Server, TargetError> {
        config.validate_for_devices()?;
        let given: Vec<usize> = luns.iter().map(Vec::len).collect();
        let named: Vec<usize> = config.targets.iter().map(|t| t.luns.len()).collect();
        if given != named {
            let e = format!("devices for {given:?} LUNs given to targets that name {named:?} LUNs");
            return Err(ConfigError::Invalid(e).into());
        }
        Server::assemble(config, OpenContext::default(), luns).await
    }

    /// Puts SCSI logical units over the opened devices and binds every listen address.
    async fn assemble(
        config: &Config,
        devices: OpenContext,
        opened: Vec<Vec<Arc<dyn BlockDev>>>,
    ) -> Result<Server, TargetError> {
        let mut targets = Vec::new();
        let mut auths = Vec::new();
        for (t, devs) in config.targets.iter().zip(opened) {
            let mut luns = Vec::new();
            let link = devs.iter().any(|d| d.group_sink().is_some());
            for (i, dev) in devs.into_iter().enumerate() {
                let block = dev.geometry().block_size;
                if config.limits.max_command_bytes < block {
                    return Err(ConfigError::Invalid(format!(
                        "target {} LUN {i}: limits.max_command_bytes = {} is less than one {block}-byte block",
                        t.iqn, config.limits.max_command_bytes
                    ))
                    .into());
                }
                let id = lun_id(&t.iqn, i);
                let cfg = LuConfig {
                    serial: format!("{id:016x}"),
                    // NAA 6 (registered extended) with the IEEE company id field left as our hash.
                    naa_id: (0x6u64 << 60) | (id >> 4),
                    // The Block Limits VPD page reports exactly the command size the target takes.
                    max_transfer_bytes: u64::from(config.limits.max_command_bytes),
                    read_only: dev.read_only(),
                    ..LuConfig::default()
                };
                luns.push(Arc::new(LogicalUnit::new(dev, cfg)));
            }
            targets.push(Target { iqn: t.iqn.clone(), device: Arc::new(Device::new(luns)) });
            auths.push(TargetAuth {
                iqn: t.iqn.clone(),
                alias: t.alias.clone(),
                chap: t.chap.clone(),
                mutual_chap: t.mutual_chap.clone(),
                initiators: t.initiators.clone(),
                link,
            });
        }
        // Bad PEM files are reported before any port is bound.
        let tls = config.tls.as_ref().map(|t| stics_tls::Acceptor::new(&t.options())).transpose()?;
        let mut listeners = Vec::new();
        for addr in config.listen_addrs()? {
            let l = TcpListener::bind(addr).await.map_err(|error| TargetError::Bind { addr, error })?;
            listeners.push(l);
        }
        let limits = config.limits.clone();
        let output_units = u32::try_from(limits.target_output_buffer_bytes / OUTPUT_UNIT).unwrap_or(u32::MAX).max(1);
        let shared = Arc::new(Shared {
            output: Arc::new(Semaphore::new(output_units as usize)),
            output_units,
            warnings: Mutex::new(Limiter::new(Duration::from_secs(limits.warning_interval_secs))),
            policy: Arc::new(Policy {
                targets: auths,
                discovery: config.discovery.clone(),
                limits: limits.clone(),
                tpgt: 1,
            }),
            targets,
            registry: Mutex::new(Registry::new(limits.max_sessions)),
            logins: Arc::new(Semaphore::new(limits.max_logins)),
            next_nexus: AtomicU64::new(1),
            stopping: SessionCtl::default(),
            task_sets: Mutex::new(HashMap::new()),
            limits,
            tls,
        });
        Ok(Server { listeners, shared, devices })
    }

    /// The devices opened for the LUNs (remote LUNs, caches): for status and maintenance.
    pub fn devices(&self) -> &OpenContext {
        &self.devices
    }

    /// The addresses actually bound (useful with port 0).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners.iter().filter_map(|l| l.local_addr().ok()).collect()
    }

    /// Serves until `shutdown` resolves, then ends every session and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), TargetError> {
        let Server { listeners, shared, devices } = self;
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
        devices.close().await;
        Ok(())
    }
}

//! A configuration brought to life: every LUN opened (specs through the device stack, cached LUNs
//! as typed caches), the target bound over them, and, once it has stopped serving, the caches
//! closed and the remote LUNs logged out of.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use stics_block::BlockDev;
use stics_cache::Cache;
use stics_stack::{DeviceSpec, OpenContext, OpenError};
use stics_target::{Server, ServerConfig, Stats, Target, TargetError};

use crate::cached::CachedError;
use crate::config::{Config, ConfigError, LunConfig, RbdConfig};
use crate::http::Endpoint;

/// Why a service could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A LUN's device could not be opened.
    #[error("target {iqn} LUN {lun}: {source}")]
    Device {
        iqn: String,
        lun: usize,
        #[source]
        source: OpenError,
    },
    /// A cached LUN could not be opened.
    #[error("target {iqn} LUN {lun}: {source}")]
    Cached {
        iqn: String,
        lun: usize,
        #[source]
        source: CachedError,
    },
    /// The target refused the devices or could not listen.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// The TLS certificate, key or client CA cannot be used.
    #[error("TLS: {0}")]
    Tls(#[from] stics_tls::TlsError),
    /// The metrics endpoint could not listen.
    #[error("cannot listen for metrics on {addr}: {source}")]
    Metrics {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// One cached LUN of a running service: where it is served and its cache.
#[derive(Clone)]
pub struct ServedCache {
    /// The target that serves it.
    pub target: String,
    /// Its LUN number there.
    pub lun: usize,
    /// The cache: for status, drain and metrics.
    pub cache: Arc<Cache>,
    /// Its tokens, when other gateways share its remote.
    pub shared: Option<Arc<stics_shared::SharedCache>>,
}

impl std::fmt::Debug for ServedCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServedCache").field("target", &self.target).field("lun", &self.lun).finish_non_exhaustive()
    }
}

/// A bound target over the devices a [`Config`] names; [`Service::run`] serves it.
pub struct Service {
    server: Server,
    devices: OpenContext,
    caches: Vec<ServedCache>,
}

impl Service {
    /// Validates `config`, opens every LUN (remote ones with `devices`' initiator settings) and
    /// binds the target. What was opened is closed again when anything fails.
    pub async fn open(config: &Config, mut devices: OpenContext) -> Result<Service, ServiceError> {
        config.validate()?;
        if config.rbd != RbdConfig::default() {
            devices.rbd = config.rbd.defaults();
        }
        // Bad PEM files are reported before any device is opened or port bound.
        let tls = config.tls.as_ref().map(crate::config::TlsConfig::acceptor).transpose()?;
        let mut caches = Vec::new();
        let opened = match open_targets(config, &devices, &mut caches).await {
            Ok(targets) => {
                let server = ServerConfig {
                    listen: config.listen_addrs()?,
                    limits: config.limits.clone(),
                    discovery: config.discovery.clone(),
                    targets,
                    tls,
                };
                Server::bind(server).await.map_err(ServiceError::from)
            }
            Err(e) => Err(e),
        };
        match opened {
            Ok(server) => Ok(Service { server, devices, caches }),
            Err(e) => {
                close(&caches, std::future::pending()).await;
                devices.close().await;
                Err(e)
            }
        }
    }

    /// The addresses actually bound (useful with port 0).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.server.local_addrs()
    }

    /// The cached LUNs, in the order of the configuration.
    pub fn caches(&self) -> &[ServedCache] {
        &self.caches
    }

    /// What the target counts.
    pub fn stats(&self) -> Arc<Stats> {
        self.server.stats()
    }

    /// The HTTP endpoint over this service: `/metrics`, and `/status` and `POST /drain` of its
    /// cached LUNs.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint::new(self.stats(), self.caches.clone(), self.devices.journal_devices())
    }

    /// Serves until `shutdown` resolves; then every session ends, each cache closes (what is
    /// dirty stays in its log, destaged at the next start) and the remote LUNs are logged out
    /// of. A cache writes the acknowledged writes it still holds in RAM to its log before it
    /// closes, however long that takes (a full log empties only through destage), unless
    /// `abandon` resolves first: then what is left is lost, and said so.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()>,
        abandon: impl Future<Output = ()>,
    ) -> Result<(), ServiceError> {
        let Service { server, devices, caches } = self;
        let served = server.run(shutdown).await;
        close(&caches, abandon).await;
        devices.close().await;
        served.map_err(ServiceError::from)
    }
}

/// Opens the LUNs of every target, keeping the caches in `caches` as they open.
async fn open_targets(
    config: &Config,
    devices: &OpenContext,
    caches: &mut Vec<ServedCache>,
) -> Result<Vec<Target>, ServiceError> {
    let mut targets = Vec::new();
    for t in &config.targets {
        let mut luns: Vec<Arc<dyn BlockDev>> = Vec::new();
        for (i, lun) in t.luns.iter().enumerate() {
            let dev: Arc<dyn BlockDev> = match lun {
                LunConfig::Spec(text) => {
                    let spec: DeviceSpec =
                        text.parse().map_err(|e| ConfigError::Invalid(format!("target {}: {e}", t.iqn)))?;
                    stics_stack::open(&spec, devices).await.map_err(|source| ServiceError::Device {
                        iqn: t.iqn.clone(),
                        lun: i,
                        source,
                    })?
                }
                LunConfig::Cached(c) => {
                    let typed =
                        c.typed().map_err(|e| ConfigError::Invalid(format!("target {} LUN {i}: {e}", t.iqn)))?;
                    let opened = typed.open(devices).await.map_err(|source| ServiceError::Cached {
                        iqn: t.iqn.clone(),
                        lun: i,
                        source,
                    })?;
                    caches.push(ServedCache {
                        target: t.iqn.clone(),
                        lun: i,
                        cache: opened.cache,
                        shared: opened.shared,
                    });
                    opened.dev
                }
            };
            luns.push(dev);
        }
        targets.push(Target {
            iqn: t.iqn.clone(),
            alias: t.alias.clone(),
            luns,
            chap: t.chap.clone(),
            mutual_chap: t.mutual_chap.clone(),
            initiators: t.initiators.clone(),
        });
    }
    Ok(targets)
}

/// Closes every cache at once, unless `abandon` resolves first.
async fn close(caches: &[ServedCache], abandon: impl Future<Output = ()>) {
    let mut closing = tokio::task::JoinSet::new();
    for c in caches {
        let cache = Arc::clone(&c.cache);
        closing.spawn(async move { cache.close().await });
    }
    tokio::select! {
        () = async { while closing.join_next().await.is_some() {} } => {}
        () = abandon => {
            for c in caches {
                let left = c.cache.acknowledged_in_ram();
                if left > 0 {
                    tracing::error!(
                        iqn = %c.target, lun = c.lun,
                        "stopped before {left} bytes of acknowledged writes in RAM reached the log: they are lost"
                    );
                }
            }
        }
    }
}

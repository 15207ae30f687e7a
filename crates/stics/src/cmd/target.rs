//! `stics target`: serve block devices over iSCSI, from command-line options or a TOML file.

use std::path::PathBuf;

use anyhow::Context;
use stics_service::{Config, LunConfig, Service, TargetConfig, TlsConfig};
use stics_stack::OpenContext;
use stics_target::config::DEFAULT_IQN;
use stics_target::Credentials;

/// Serve block devices over iSCSI (RFC 7143).
///
/// With no options: a 1 GiB memory LUN as iqn.2024-01.org.stics:target0 on 127.0.0.1:3260.
/// With --config, the file's targets are served; --listen replaces its listen addresses and
/// --iqn/--lun add one more target.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to listen on, HOST:PORT; repeat for several. Default 127.0.0.1:3260 (or the config file's).
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: Vec<String>,

    /// Target name. Default iqn.2024-01.org.stics:target0.
    #[arg(long, value_name = "IQN")]
    pub iqn: Option<String>,

    /// A LUN, numbered from 0 in the order given: mem:SIZE, null:SIZE (reads zeros, drops
    /// writes), file:PATH[:SIZE] (created at SIZE if missing; block devices work too),
    /// iscsi://[user[%secret]@]host[:port]/IQN/LUN (a LUN of another target, served through)
    /// or rbd:POOL/IMAGE[@SNAP][?conf=PATH&id=NAME&keyring=PATH&block=4096&timeout=SECS] (a
    /// Ceph RBD image, with the rbd build feature; a snapshot is served read-only, an image is
    /// held under RBD's exclusive lock so no second target can serve it); :BLOCK after a size
    /// sets the block size (mem:1GiB:4096). Any of them may be wrapped: cache(SPEC, log=PATH,
    /// ...) (the STICS cache), journal(SPEC, journal=PATH[:SIZE][, max-group=SIZE,
    /// segment=SIZE, lease=SECS, break-after=SECS]) (an SG's journal; the last three are for
    /// its coherence tokens) or disk(SPEC,
    /// model=o7n3200|as010a1|91366u4|dnes|ddys|raid5[, rpm=N, seek=4.9ms, transfer=29.8MB/s,
    /// buffer=SIZE|off, queue=fifo|elevator]) (SPEC answering when the seeds' disk would: seek,
    /// rotation, transfer and its write buffer). Default: one mem:1GiB LUN when there is no
    /// config file.
    #[arg(long, value_name = "SPEC")]
    pub lun: Vec<String>,

    /// TargetAlias to announce at login.
    #[arg(long)]
    pub alias: Option<String>,

    /// TOML configuration with several targets, CHAP and limits (see examples/target.toml).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// CHAP user the initiator must log in as (with --chap-secret). Default: no CHAP.
    #[arg(long, requires = "chap_secret")]
    pub chap_user: Option<String>,

    /// CHAP secret of --chap-user; better passed in the environment than on the command line.
    #[arg(long, env = "STICS_CHAP_SECRET", hide_env_values = true, requires = "chap_user")]
    pub chap_secret: Option<String>,

    /// User name the target answers mutual CHAP with (with --mutual-secret).
    #[arg(long, requires = "mutual_secret")]
    pub mutual_user: Option<String>,

    /// Secret the target answers mutual CHAP with.
    #[arg(long, env = "STICS_MUTUAL_SECRET", hide_env_values = true, requires = "mutual_user")]
    pub mutual_secret: Option<String>,

    /// CHAP user every discovery (SendTargets) login must authenticate as (with
    /// --discovery-chap-secret); replaces the config file's [discovery] chap. Default: open
    /// discovery, which lists no target that has CHAP.
    #[arg(long, requires = "discovery_chap_secret")]
    pub discovery_chap_user: Option<String>,

    /// Secret of --discovery-chap-user; better passed in the environment.
    #[arg(long, env = "STICS_DISCOVERY_CHAP_SECRET", hide_env_values = true, requires = "discovery_chap_user")]
    pub discovery_chap_secret: Option<String>,

    /// User name the target answers mutual CHAP with in discovery (with --discovery-mutual-secret).
    #[arg(long, requires = "discovery_mutual_secret")]
    pub discovery_mutual_user: Option<String>,

    /// Secret the target answers mutual CHAP with in discovery.
    #[arg(long, env = "STICS_DISCOVERY_MUTUAL_SECRET", hide_env_values = true, requires = "discovery_mutual_user")]
    pub discovery_mutual_secret: Option<String>,

    /// Most sessions at once. Default 64 (or the config file's).
    #[arg(long)]
    pub max_sessions: Option<usize>,

    /// Commands a session may have outstanding (the CmdSN window). Default 128.
    #[arg(long)]
    pub queue_depth: Option<u32>,

    /// Seconds of initiator silence after which the target sends a NOP-In ping; 0 turns pings
    /// off. Default 30 (or the config file's).
    #[arg(long, value_name = "SECS")]
    pub nop_interval: Option<u64>,

    /// Seconds an initiator has to answer a NOP-In ping before its connection is dropped.
    /// Default 30 (or the config file's).
    #[arg(long, value_name = "SECS")]
    pub nop_timeout: Option<u64>,

    /// Serve Prometheus metrics (OpenMetrics text) at http://HOST:PORT/metrics: sessions,
    /// commands by kind, data bytes in and out and command latency, per target and LUN.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics: Option<String>,

    /// Runtime worker threads. Default 2.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,

    /// Serve TLS 1.3 on every listen address with this certificate chain (PEM, the target's
    /// certificate first; with --tls-key). Plain iSCSI initiators are then refused at the
    /// handshake; stics initiators connect with `?tls=on&tls_ca=PEM` on their iscsi:// URL
    /// (`stics ls --tls-ca PEM`). Replaces the config file's [tls].
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Mutual TLS: admit only clients whose certificate this CA (PEM) signed.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// Print the effective configuration as TOML (secrets redacted) and exit.
    #[arg(long)]
    pub print_config: bool,
}

fn build_config(args: &Args) -> anyhow::Result<Config> {
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
            Config::from_toml(&text).with_context(|| format!("in {}", path.display()))?
        }
        None => Config { targets: Vec::new(), ..Config::default() },
    };
    if !args.listen.is_empty() {
        config.listen.clone_from(&args.listen);
    }
    let cred = |u: &Option<String>, s: &Option<String>| {
        u.clone().zip(s.clone()).map(|(user, secret)| Credentials { user, secret })
    };
    if args.discovery_chap_user.is_some() {
        config.discovery.chap = cred(&args.discovery_chap_user, &args.discovery_chap_secret);
    }
    if args.discovery_mutual_user.is_some() {
        config.discovery.mutual_chap = cred(&args.discovery_mutual_user, &args.discovery_mutual_secret);
    }
    let cli_target = args.config.is_none() || args.iqn.is_some() || !args.lun.is_empty();
    if cli_target {
        let luns = if args.lun.is_empty() { vec!["mem:1GiB".to_string()] } else { args.lun.clone() };
        config.targets.push(TargetConfig {
            iqn: args.iqn.clone().unwrap_or_else(|| DEFAULT_IQN.to_string()),
            alias: args.alias.clone(),
            luns: luns.into_iter().map(LunConfig::Spec).collect(),
            chap: cred(&args.chap_user, &args.chap_secret),
            mutual_chap: cred(&args.mutual_user, &args.mutual_secret),
            initiators: Vec::new(),
        });
    }
    if let Some(n) = args.max_sessions {
        config.limits.max_sessions = n;
    }
    if let Some(n) = args.nop_interval {
        config.limits.nop_in_interval_secs = n;
    }
    if let Some(n) = args.nop_timeout {
        config.limits.nop_in_timeout_secs = n;
    }
    if let Some(n) = args.queue_depth {
        config.limits.queue_depth = n;
    }
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        config.tls = Some(TlsConfig { cert: cert.clone(), key: key.clone(), client_ca: args.tls_client_ca.clone() });
    }
    config.validate()?;
    Ok(config)
}

/// Starts the service's HTTP endpoint on `addr` in a task, saying where with `what` (in which
/// `{addr}` is replaced).
pub(crate) async fn serve_metrics(service: &Service, addr: &str, what: &str) -> anyhow::Result<()> {
    let listener =
        tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot listen for metrics on {addr}"))?;
    let bound = listener.local_addr().map_or_else(|_| addr.to_owned(), |a| a.to_string());
    tracing::info!("{}", what.replace("{addr}", &bound));
    let endpoint = service.endpoint();
    tokio::spawn(async move {
        if let Err(e) = endpoint.serve(listener).await {
            tracing::error!("the metrics endpoint stopped: {e}");
        }
    });
    Ok(())
}

pub(crate) async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let config = build_config(&args)?;
    if args.print_config {
        print!("{}", config.to_toml_redacted());
        return Ok(());
    }
    let rt = super::server_runtime(args.threads)?;
    rt.block_on(async {
        let service = Service::open(&config, OpenContext::default()).await?;
        let transport = match &config.tls {
            Some(t) if t.client_ca.is_some() => "TLS, client certificates required",
            Some(_) => "TLS",
            None => "plain TCP",
        };
        for a in service.local_addrs() {
            for t in &config.targets {
                tracing::info!("serving {} ({} LUNs) on {a} ({transport})", t.iqn, t.luns.len());
            }
        }
        if let Some(addr) = &args.metrics {
            serve_metrics(&service, addr, "metrics at http://{addr}/metrics").await?;
        }
        // A second signal while caches close gives up on what they still hold in RAM.
        service.run(shutdown_signal(), shutdown_signal()).await?;
        anyhow::Ok(())
    })?;
    tracing::info!("stopped");
    Ok(())
}

//! `stics gateway`: the STICS box, `target(cache(initiator(url)))`: remote LUNs served on the
//! local network through crash-safe write-back caches, with status and metrics over HTTP.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use stics_block::{BlockDev, MemDev};
use stics_service::config::SizeText;
use stics_service::{CachedLunConfig, Config, LunConfig, Service, TargetConfig};
use stics_stack::OpenContext;
use stics_target::{Server, ServerConfig, Target};

/// The flags that describe the one cached LUN of a gateway started without --config.
const LUN_FLAGS: [&str; 15] = [
    "iqn",
    "remote",
    "log",
    "mode",
    "ram",
    "read_cache",
    "policy",
    "full_timeout",
    "index_memory",
    "max_lag",
    "log_disk",
    "shared",
    "lease",
    "max_tokens",
    "no_grant_data",
];

/// Serve remote LUNs through the STICS cache (seed 004): writes are acknowledged from a local
/// write log and destaged to the remote in the background, in an order that keeps the remote
/// image crash-consistent; reads come from RAM, the log or a read cache before the remote.
///
/// With no options: an in-process `stics target` over mem:1GiB on a loopback port is the remote,
/// the log is a temporary file, and the cached LUN is served on 127.0.0.1:3260. With --config,
/// the file's targets and cached LUNs are served (see examples/gateway.toml).
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to serve on. Default 127.0.0.1:3260 (or the config file's).
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: Option<String>,

    /// TOML configuration: targets with CHAP, mutual CHAP and initiator lists, discovery CHAP,
    /// limits, and several cached LUNs, each with its own remote, log and cache options (see
    /// examples/gateway.toml). The flags of a single LUN (--remote, --log, --mode, ...) do not
    /// go with it.
    #[arg(long, value_name = "FILE", conflicts_with_all = LUN_FLAGS)]
    pub config: Option<PathBuf>,

    /// Target name of the cached LUN (LUN 0, with the remote's geometry). Default
    /// iqn.2024-01.org.stics:gateway0.
    #[arg(long, value_name = "IQN")]
    pub iqn: Option<String>,

    /// The remote LUN: iscsi://[user[%secret]@]host[:port]/IQN/LUN, or any device spec.
    /// Default: an in-process target over mem:1GiB.
    #[arg(long, value_name = "URL")]
    pub remote: Option<String>,

    /// The write log: a file (created at SIZE, default 1GiB, if missing) or a block device.
    /// Default: a temporary file, removed at exit (dirty data is destaged first).
    #[arg(long, value_name = "PATH[:SIZE]")]
    pub log: Option<String>,

    /// When writes are acknowledged: log (once on the local log, WCE=0), immediate (once in
    /// RAM, WCE=1; flushes and FUA wait for the log) or write-through (once the remote has them).
    #[arg(long, default_value = "log")]
    pub mode: String,

    /// RAM write buffer (writes waiting for the log).
    #[arg(long, value_name = "SIZE", default_value = "64MiB")]
    pub ram: String,

    /// DRAM read cache of clean blocks.
    #[arg(long, value_name = "SIZE", default_value = "256MiB")]
    pub read_cache: String,

    /// Read cache policy: s3fifo (scan-resistant) or lru.
    #[arg(long, default_value = "s3fifo")]
    pub policy: String,

    /// Seconds host writes wait for room once the log (or RAM, or the index) is full while the
    /// remote (or the log) keeps failing; then they end with a CHECK CONDITION that names the
    /// cause (SPACE ALLOCATION FAILED for a full thin remote, WRITE PROTECTED for a lost
    /// reservation, LOGICAL UNIT COMMUNICATION TIME-OUT for an unreachable one), as multipath's
    /// no_path_retry ends queueing. Acknowledged writes are never dropped; POST /drain answers
    /// with the same cause after as long.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    pub full_timeout: u64,

    /// Memory the dirty index may take (about 160 bytes per run of dirty blocks, whatever the
    /// run's length); when it is full, host writes wait for destage as they do for a full log.
    #[arg(long, value_name = "SIZE", default_value = "64MiB")]
    pub index_memory: String,

    /// Oldest a write the remote does not hold yet may get, in seconds (the recovery point a
    /// lost gateway leaves). Host writes wait, as for a full log, while the oldest is older, or
    /// what the remote lacks would take more than half of it to destage (to a stics SG: to
    /// ship) at the rate measured; groups to an SG are kept small enough to cross the link in a
    /// quarter of it. Default: no bound but the log's size.
    #[arg(long, value_name = "SECS")]
    pub max_lag: Option<u64>,

    /// Put the log's file behind a disk model, as seed 004's log was an IDE disk (appends are
    /// why it is a log): o7n3200, as010a1, 91366u4, dnes, ddys or raid5 (see `stics bench
    /// disk`). For reproducing the papers; default the file as it is.
    #[arg(long, value_name = "MODEL")]
    pub log_disk: Option<stics_disk::Preset>,

    /// Other gateways cache the same remote, a LUN of a stics SG (`stics target` over
    /// `journal(...)`): every command runs under tokens from the SG, shared to read and
    /// exclusive to write a segment, so each gateway reads what the others wrote and a volume
    /// moves between hosts with no drain (seed 004 §3.4). Mode log or immediate.
    #[arg(long)]
    pub shared: bool,

    /// With --shared: how long the SG's answers keep this gateway's tokens good, in seconds; at
    /// most the SG's `lease` (30 there by default).
    #[arg(long, value_name = "SECS", requires = "shared")]
    pub lease: Option<u64>,

    /// With --shared: most tokens this gateway keeps; past it, it gives its least recently used
    /// idle ones up (an exclusive one's writes shipped first), so that what it holds, and the
    /// SG's table, follow its working set [default: 65536, 4 GiB of 64 KiB segments]
    #[arg(long, value_name = "N", requires = "shared")]
    pub max_tokens: Option<u64>,

    /// With --shared: read what a read waits for after its shared grant, a round trip later,
    /// instead of taking it with the grant from an SG that sends it (for comparison).
    #[arg(long, requires = "shared")]
    pub no_grant_data: bool,

    /// Serve Prometheus metrics at http://HOST:PORT/metrics (every series labelled with its
    /// target and LUN), JSON at /status; POST /drain destages everything and answers when the
    /// remotes hold it all.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics: Option<String>,

    /// Runtime worker threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,

    /// Print the effective configuration as TOML (secrets redacted) and exit.
    #[arg(long)]
    pub print_config: bool,
}

/// Where the default log lives while the gateway runs.
struct Embedded {
    dir: PathBuf,
}

impl Drop for Embedded {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The name of the in-process remote's target.
const EMBEDDED_IQN: &str = "iqn.2024-01.org.stics:remote0";

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.print_config {
        let (config, _) = build_config(&args, "iscsi://127.0.0.1:0/embedded/0")?;
        print!("{}", config.to_toml_redacted());
        return Ok(());
    }
    let rt = super::server_runtime(args.threads)?;
    rt.block_on(serve(args))
}

/// `PATH[:SIZE]`: a trailing `:SIZE` is a size when it reads as one, as in `cache(log=…)`.
fn split_log(text: &str) -> (PathBuf, Option<SizeText>) {
    match text.rsplit_once(':') {
        Some((path, size)) if !path.is_empty() && stics_units::parse_size(size).is_ok() => {
            (PathBuf::from(path), Some(SizeText(size.to_owned())))
        }
        _ => (PathBuf::from(text), None),
    }
}

/// The configuration the gateway serves, from --config or from the flags of its one LUN (with
/// `remote` standing for a missing --remote); and the temporary log's directory when the flags
/// named no log.
fn build_config(args: &Args, remote: &str) -> anyhow::Result<(Config, Option<Embedded>)> {
    let mut embedded = None;
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
            let config = Config::from_toml(&text).with_context(|| format!("in {}", path.display()))?;
            for t in &config.targets {
                for (i, lun) in t.luns.iter().enumerate() {
                    if let LunConfig::Spec(_) = lun {
                        anyhow::bail!(
                            "in {}: target {} LUN {i} is a device spec; stics gateway serves cached LUNs, each a table \
                             with `remote` and `log` (a device spec is for stics target)",
                            path.display(),
                            t.iqn
                        );
                    }
                }
            }
            config
        }
        None => {
            let (log, log_size) = match &args.log {
                Some(l) => split_log(l),
                None => {
                    let dir = std::env::temp_dir().join(format!("stics-gateway-{}", std::process::id()));
                    let log = dir.join("log");
                    embedded = Some(Embedded { dir });
                    (log, Some(SizeText("1GiB".into())))
                }
            };
            let lun = CachedLunConfig {
                log_size,
                mode: Some(args.mode.clone()),
                ram: Some(SizeText(args.ram.clone())),
                read_cache: Some(SizeText(args.read_cache.clone())),
                policy: Some(args.policy.clone()),
                full_timeout_secs: Some(args.full_timeout),
                index_memory: Some(SizeText(args.index_memory.clone())),
                max_lag_secs: args.max_lag,
                log_disk: args.log_disk.map(|m| m.to_string()),
                shared: args.shared,
                lease_secs: args.lease,
                max_tokens: args.max_tokens,
                grant_data: args.no_grant_data.then_some(false),
                ..CachedLunConfig::new(args.remote.as_deref().unwrap_or(remote), log)
            };
            let iqn = args.iqn.clone().unwrap_or_else(|| "iqn.2024-01.org.stics:gateway0".into());
            let target = TargetConfig {
                alias: Some("stics gateway".into()),
                ..TargetConfig::new(iqn, vec![LunConfig::Cached(lun)])
            };
            Config { listen: vec!["127.0.0.1:3260".into()], targets: vec![target], ..Config::default() }
        }
    };
    if let Some(l) = &args.listen {
        config.listen = vec![l.clone()];
    }
    config.validate()?;
    Ok((config, embedded))
}

/// The embedded default remote: a target in this process over mem:1GiB on a free loopback port.
/// Returns its URL, and how to stop it.
async fn embedded_remote() -> anyhow::Result<(String, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>)> {
    let lun: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, (1 << 30) / 512));
    let config =
        ServerConfig::new(vec![SocketAddr::from(([127, 0, 0, 1], 0))], vec![Target::new(EMBEDDED_IQN, vec![lun])]);
    let server = Server::bind(config).await.context("starting the embedded remote target")?;
    let addr = server.local_addrs().first().copied().context("the embedded target has no address")?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        if let Err(e) = server.run(async { drop(rx.await) }).await {
            tracing::error!("the embedded remote target: {e}");
        }
    });
    Ok((format!("iscsi://{addr}/{EMBEDDED_IQN}/0"), tx, task))
}

async fn serve(args: Args) -> anyhow::Result<()> {
    if args.shared && args.remote.is_none() {
        anyhow::bail!(
            "--shared needs --remote: a LUN of a stics SG (`stics target` over `journal(...)`) that hands out tokens"
        );
    }
    // The embedded default: a remote target in this process and a log in a temporary directory.
    let remote = if args.config.is_none() && args.remote.is_none() {
        let (url, tx, task) = embedded_remote().await?;
        tracing::info!("no --remote: serving an in-process target over mem:1GiB at {url} as the remote");
        Some((url, tx, task))
    } else {
        None
    };
    let (config, embedded) = build_config(&args, remote.as_ref().map_or("", |(url, _, _)| url.as_str()))?;
    if let Some(e) = &embedded {
        std::fs::create_dir_all(&e.dir).with_context(|| format!("cannot create {}", e.dir.display()))?;
        tracing::info!("no --log: the write log is {} (1 GiB, removed at exit)", e.dir.join("log").display());
    }
    let service = Service::open(&config, OpenContext::default()).await.context("starting the gateway")?;
    let addrs: Vec<String> = service.local_addrs().iter().map(ToString::to_string).collect();
    for t in &config.targets {
        for (i, lun) in t.luns.iter().enumerate() {
            if let LunConfig::Cached(c) = lun {
                let remote = c.remote.parse::<stics_stack::DeviceSpec>().map(|s| s.redacted().to_string());
                tracing::info!(
                    "serving {} LUN {i} on {}: {} through the cache (mode {}, log {})",
                    t.iqn,
                    addrs.join(", "),
                    remote.as_deref().unwrap_or("the remote"),
                    c.mode.as_deref().unwrap_or("log"),
                    c.log.display()
                );
            }
        }
    }
    if let Some(m) = &args.metrics {
        super::target::serve_metrics(
            &service,
            m,
            "metrics at http://{addr}/metrics, status at /status, POST /drain to destage everything",
        )
        .await?;
    }
    // On SIGTERM or Ctrl-C: sessions end, then the caches close (what is dirty stays in the log,
    // destaged at the next start); the embedded remote and its log live only as long as this.
    // Acknowledged writes still in RAM are written to the log first, however long that takes
    // (a full log empties only through destage); a second signal gives up on them, saying so.
    service.run(super::target::shutdown_signal(), super::target::shutdown_signal()).await?;
    if let Some((_, tx, task)) = remote {
        let _ = tx.send(());
        let _ = task.await;
    }
    drop(embedded);
    tracing::info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::split_log;
    use std::path::PathBuf;

    #[test]
    fn a_log_flag_may_end_in_a_size() {
        assert_eq!(split_log("/var/log.img:4GiB").0, PathBuf::from("/var/log.img"));
        assert_eq!(split_log("/var/log.img:4GiB").1.map(|s| s.0), Some("4GiB".to_owned()));
        assert_eq!(split_log("/var/a:b").0, PathBuf::from("/var/a:b"));
        assert!(split_log("/var/log.img").1.is_none());
    }
}

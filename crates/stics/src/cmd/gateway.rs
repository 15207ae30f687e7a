//! `stics gateway`: the STICS box, `target(cache(initiator(url)))`: a remote LUN served on the
//! local network through a crash-safe write-back cache, with status and metrics over HTTP.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use stics_cache::Cache;
use stics_target::{Config, Server, TargetConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Serve a remote LUN through the STICS cache (seed 004): writes are acknowledged from a local
/// write log and destaged to the remote in the background, in an order that keeps the remote
/// image crash-consistent; reads come from RAM, the log or a read cache before the remote.
///
/// With no options: an in-process `stics target` over mem:1GiB on a loopback port is the remote,
/// the log is a temporary file, and the cached LUN is served on 127.0.0.1:3260.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to serve the cached LUN on.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:3260")]
    pub listen: String,

    /// Target name of the cached LUN (LUN 0, with the remote's geometry).
    #[arg(long, value_name = "IQN", default_value = "iqn.2024-01.org.stics:gateway0")]
    pub iqn: String,

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
    /// lost gateway leaves): beyond it host writes wait, as for a full log, and ship to a stics
    /// SG in groups small enough to cross the link in a quarter of it. Default: no bound but
    /// the log's size.
    #[arg(long, value_name = "SECS")]
    pub max_lag: Option<u64>,

    /// Serve Prometheus metrics at http://HOST:PORT/metrics, JSON at /status; POST /drain
    /// destages everything and answers when the remote holds it all.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics: Option<String>,

    /// Runtime worker threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
}

/// Where the default remote and log live while the gateway runs.
struct Embedded {
    dir: PathBuf,
}

impl Drop for Embedded {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let rt = super::server_runtime(args.threads)?;
    rt.block_on(serve(args))
}

async fn serve(args: Args) -> anyhow::Result<()> {
    // The embedded default: a remote target in this process and a log in a temporary directory.
    let mut embedded = None;
    let mut remote_server = None;
    let remote = match &args.remote {
        Some(r) => r.clone(),
        None => {
            let config = Config {
                listen: vec!["127.0.0.1:0".into()],
                targets: vec![TargetConfig {
                    iqn: "iqn.2024-01.org.stics:remote0".into(),
                    alias: None,
                    luns: vec!["mem:1GiB".into()],
                    chap: None,
                    mutual_chap: None,
                    initiators: Vec::new(),
                }],
                ..Config::default()
            };
            let server = Server::bind(&config).await.context("starting the embedded remote target")?;
            let addr = server.local_addrs().first().copied().context("the embedded target has no address")?;
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(server.run(async {
                let _ = rx.await;
            }));
            remote_server = Some((tx, task));
            let url = format!("iscsi://{addr}/iqn.2024-01.org.stics:remote0/0");
            tracing::info!("no --remote: serving an in-process target over mem:1GiB at {url} as the remote");
            url
        }
    };
    let log = match &args.log {
        Some(l) => l.clone(),
        None => {
            let dir = std::env::temp_dir().join(format!("stics-gateway-{}", std::process::id()));
            std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
            let path = dir.join("log");
            tracing::info!("no --log: the write log is {} (1 GiB, removed at exit)", path.display());
            embedded = Some(Embedded { dir });
            format!("{}:1GiB", path.display())
        }
    };
    let mut spec = format!(
        "cache({remote}, log={log}, mode={}, ram={}, read-cache={}, policy={}, full-timeout={}, index-memory={}",
        args.mode, args.ram, args.read_cache, args.policy, args.full_timeout, args.index_memory
    );
    if let Some(secs) = args.max_lag {
        spec += &format!(", max-lag={secs}");
    }
    spec.push(')');
    let config = Config {
        listen: vec![args.listen.clone()],
        targets: vec![TargetConfig {
            iqn: args.iqn.clone(),
            alias: Some("stics gateway".into()),
            luns: vec![spec],
            chap: None,
            mutual_chap: None,
            initiators: Vec::new(),
        }],
        ..Config::default()
    };
    let server = Server::bind(&config).await.context("starting the gateway")?;
    let caches = server.devices().cache_devices();
    let cache = caches.first().cloned().context("the gateway's LUN has no cache")?;
    for a in server.local_addrs() {
        tracing::info!("serving {} LUN 0 on {a}: {remote} through the cache (mode {})", args.iqn, args.mode);
    }
    if let Some(m) = &args.metrics {
        let listener =
            tokio::net::TcpListener::bind(m).await.with_context(|| format!("cannot listen for metrics on {m}"))?;
        tracing::info!("metrics at http://{m}/metrics, status at /status, POST /drain to destage everything");
        tokio::spawn(metrics(listener, Arc::clone(&cache)));
    }
    // On SIGTERM or Ctrl-C: sessions end, then the cache closes (what is dirty stays in the log,
    // destaged at the next start); the embedded remote and its log live only as long as this.
    // Acknowledged writes still in RAM are written to the log first, however long that takes
    // (a full log empties only through destage); a second signal gives up on them, saying so.
    server.run(super::target::shutdown_signal()).await?;
    tokio::select! {
        () = cache.close() => {}
        () = super::target::shutdown_signal() => {
            let left = cache.acknowledged_in_ram();
            if left > 0 {
                tracing::error!("stopped before {left} bytes of acknowledged writes in RAM reached the log: they are lost");
            }
        }
    }
    if let Some((tx, task)) = remote_server {
        let _ = tx.send(());
        let _ = task.await;
    }
    drop(embedded);
    tracing::info!("stopped");
    Ok(())
}

/// The status as Prometheus text exposition, every series labelled with the ack mode.
fn prometheus(s: &stics_cache::Status) -> String {
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::gauge::Gauge;
    use std::sync::atomic::AtomicU64;

    let labels = [("mode".into(), s.mode.clone().into())];
    let mut reg = prometheus_client::registry::Registry::with_prefix_and_labels("stics_cache", labels.into_iter());
    let mut gauge = |name: &str, help: &str, v: f64| {
        let g = Gauge::<f64, AtomicU64>::default();
        g.set(v);
        reg.register(name, help, g);
    };
    gauge("dirty_bytes", "Bytes not yet on the remote", s.dirty_bytes as f64);
    gauge("log_fill_ratio", "Fraction of the write log in use", s.log_fill);
    gauge("log_bytes", "Bytes of the write log's ring", s.log_bytes as f64);
    gauge("ram_bytes", "Host write bytes in RAM waiting for the log", s.ram_bytes as f64);
    gauge("epoch", "The open epoch", s.epoch as f64);
    gauge("destaged_epoch", "The newest epoch fully on the remote", s.destaged_epoch as f64);
    gauge("destage_rate_bytes_per_second", "Destage throughput over the last seconds", s.destage_bytes_per_sec);
    gauge("destage_lag_seconds", "Age of the oldest write not yet on the remote", s.destage_lag_secs);
    gauge("remote_write_seconds", "Moving average of a remote write's service time", s.remote_write_secs);
    gauge(
        "remote_rtt_seconds",
        "Moving average of a remote SYNCHRONIZE CACHE (about one round trip)",
        s.remote_sync_secs,
    );
    let reads = s.read_blocks_cache + s.read_blocks_remote;
    let ratio = |hit: u64, all: u64| if all == 0 { 0.0 } else { hit as f64 / all as f64 };
    gauge(
        "read_hit_ratio",
        "Fraction of read blocks served from RAM, the log or the read cache",
        ratio(s.read_blocks_cache, reads),
    );
    gauge(
        "read_cache_hit_ratio",
        "Fraction of read cache lookups that hit",
        ratio(s.read_cache_hits, s.read_cache_hits + s.read_cache_misses),
    );
    let state = match s.health.state {
        stics_cache::core::State::Healthy => 0.0,
        stics_cache::core::State::Degraded => 1.0,
        stics_cache::core::State::Stalled => 2.0,
    };
    gauge("health_state", "0 healthy, 1 degraded (retrying with backoff), 2 stalled (a lasting failure)", state);
    gauge("failing_seconds", "How long the failure in force has lasted", s.health.since_secs);
    gauge("index_extents", "Runs of blocks in the dirty index", s.index_extents as f64);
    let mut counter = |name: &str, help: &str, v: u64| {
        let c = Counter::<u64>::default();
        c.inc_by(v);
        reg.register(name, help, c);
    };
    counter("host_write_bytes", "Bytes the host wrote", s.host_write_bytes);
    counter("remote_write_bytes", "Bytes written to the remote", s.remote_write_bytes);
    counter("absorbed_blocks", "Host write blocks absorbed before destage", s.blocks_absorbed);
    counter("destaged_blocks", "Blocks written to the remote by destage", s.blocks_destaged);
    counter("records", "Log records written (group commits)", s.records);
    counter("read_cache_blocks", "Read blocks served from RAM or the log", s.read_blocks_cache);
    counter("read_remote_blocks", "Read blocks fetched from the remote", s.read_blocks_remote);
    counter("read_cache_hits", "Read cache lookups that hit", s.read_cache_hits);
    counter("read_cache_misses", "Read cache lookups that missed", s.read_cache_misses);
    counter("destage_retries", "Remote writes or flushes retried", s.destage_retries);
    counter("throttled_writes", "Host writes slowed by a filling log", s.throttled_writes);
    counter("refused_writes", "Host writes ended because the log was full past the full timeout", s.refused_writes);
    counter("resent_epochs", "Epochs sent again whole after a failure or a reset of the remote", s.epochs_resent);
    let errors = prometheus_client::metrics::family::Family::<Vec<(String, String)>, Counter>::default();
    for (kind, n) in &s.errors_by_kind {
        errors.get_or_create(&vec![("kind".to_owned(), (*kind).to_owned())]).inc_by(*n);
    }
    reg.register("errors", "Failures of the remote or the log, by kind", errors);
    if let Some(g) = &s.groups {
        let mut counter = |name: &str, help: &str, v: u64| {
            let c = Counter::<u64>::default();
            c.inc_by(v);
            reg.register(name, help, c);
        };
        counter("sg_groups", "Groups of epochs the stics SG took", g.groups);
        counter("sg_group_epochs", "Epochs in those groups", g.epochs);
        counter("sg_bytes_before_merge", "Bytes of the groups' epochs before merging", g.bytes_before_merge);
        counter("sg_bytes_merged", "Bytes of the groups' data after merging", g.bytes_merged);
        counter("sg_bytes_shipped", "Bytes of the groups as shipped (compressed, with tables)", g.bytes_shipped);
        counter("sg_groups_resent", "Groups sent again after a failure", g.resent);
        counter("sg_plain_epochs", "Epochs too large for a group, sent as plain writes", g.plain_epochs);
        let rate = Gauge::<f64, AtomicU64>::default();
        rate.set(g.ship_bytes_per_sec);
        reg.register("sg_ship_rate_bytes_per_second", "Rate groups were shipped at, smoothed", rate);
    }
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &reg) {
        out = format!("# cannot encode metrics: {e}\n");
    }
    out
}

/// A small HTTP/1.0 endpoint: GET /metrics, GET /status, POST /drain.
async fn metrics(listener: tokio::net::TcpListener, cache: Arc<Cache>) {
    loop {
        let Ok((mut conn, _)) = listener.accept().await else { continue };
        let cache = Arc::clone(&cache);
        tokio::spawn(async move {
            let mut buf = vec![0u8; 2048];
            let Ok(Ok(n)) = tokio::time::timeout(std::time::Duration::from_secs(5), conn.read(&mut buf)).await else {
                return;
            };
            let req = String::from_utf8_lossy(&buf[..n]);
            let line = req.lines().next().unwrap_or("");
            let (status, kind, body) = match line.split_whitespace().take(2).collect::<Vec<_>>().as_slice() {
                ["GET", "/metrics"] => (
                    "200 OK",
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    prometheus(&cache.status()),
                ),
                ["GET", "/status"] => {
                    ("200 OK", "application/json", serde_json::to_string_pretty(&cache.status()).unwrap_or_default())
                }
                ["POST", "/drain"] => match cache.drain().await {
                    Ok(()) => (
                        "200 OK",
                        "application/json",
                        serde_json::to_string_pretty(&cache.status()).unwrap_or_default(),
                    ),
                    Err(e) => {
                        let body = serde_json::json!({ "error": e.to_string(), "status": cache.status() });
                        (
                            "503 Service Unavailable",
                            "application/json",
                            serde_json::to_string_pretty(&body).unwrap_or_default(),
                        )
                    }
                },
                _ => ("404 Not Found", "text/plain", "GET /metrics, GET /status or POST /drain\n".to_owned()),
            };
            let head = format!(
                "HTTP/1.0 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(head.as_bytes()).await;
            let _ = conn.write_all(body.as_bytes()).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::prometheus;

    #[test]
    fn metrics_are_openmetrics_text_labelled_with_the_mode() {
        let s = stics_cache::Status {
            mode: "log".into(),
            dirty_bytes: 4096,
            host_write_bytes: 1 << 20,
            read_blocks_cache: 3,
            read_blocks_remote: 1,
            destage_lag_secs: 0.5,
            ..Default::default()
        };
        let text = prometheus(&s);
        for want in [
            "stics_cache_dirty_bytes{mode=\"log\"} 4096",
            "# TYPE stics_cache_host_write_bytes counter",
            "stics_cache_host_write_bytes_total{mode=\"log\"} 1048576",
            "stics_cache_read_hit_ratio{mode=\"log\"} 0.75",
            "stics_cache_destage_lag_seconds{mode=\"log\"} 0.5",
            "# EOF",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
    }
}

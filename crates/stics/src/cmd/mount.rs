//! `stics mount SPEC FILE`: exposes a device (usually a remote LUN, `iscsi://...`) as a regular
//! file through FUSE, so that `mkfs.ext4 FILE && mount -o loop FILE DIR` gives a file system on it.

use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use stics_initiator::LunOptions;
use stics_stack::{DeviceSpec, OpenContext};

#[derive(clap::Args)]
pub struct Args {
    /// Device: iscsi://[user[%secret]@]host[:port]/IQN/LUN (mutual CHAP:
    /// ?target_user=U&target_password=P), or any device spec (mem:SIZE, file:PATH[:SIZE], ...).
    pub url: String,
    /// Regular file to mount the LUN over; created (and removed afterwards) when missing.
    pub file: PathBuf,
    /// iSCSI sessions to open per remote LUN; commands are spread over them.
    #[arg(long, default_value_t = 1)]
    pub sessions: usize,
    /// Ask for CRC32C header and data digests.
    #[arg(long)]
    pub digests: bool,
    /// Export read-only.
    #[arg(long)]
    pub read_only: bool,
    /// Threads reading FUSE requests (each request is then handled asynchronously).
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Threads running the iSCSI sessions and the FUSE request handlers. One thread
    /// hands each request over fewer times, which keeps latency low when the CPUs are busy; more
    /// threads raise the IOPS of small requests at high queue depth on an idle machine.
    #[arg(long, default_value_t = 1)]
    pub io_threads: usize,
    /// Seconds to keep reconnecting after the target went away before I/O fails.
    #[arg(long, default_value_t = 60)]
    pub recovery_timeout: u64,
    /// Seconds of silence before a NOP-Out keep-alive is sent.
    #[arg(long, default_value_t = 5)]
    pub nop_interval: u64,
    /// Seconds a NOP-Out may stay unanswered before the connection counts as dead.
    #[arg(long, default_value_t = 10)]
    pub nop_timeout: u64,
    /// This initiator's name (IQN) [default: iqn.2024-01.org.stics:initiator].
    #[arg(long)]
    pub initiator_name: Option<String>,
    /// Print the traffic counters when stopping.
    #[arg(long)]
    pub stats: bool,
    /// Write the remote LUNs' iSCSI traffic counters (commands, PDUs, bytes, round trips) as JSON
    /// to FILE whenever the process gets SIGUSR1, and once more when it stops: how a benchmark
    /// counts the messages one system call costs.
    #[arg(long, value_name = "FILE")]
    pub counters: Option<std::path::PathBuf>,
    /// Put the STICS cache inside this process, with its write log at PATH[:SIZE] (seed 004's
    /// "software STICS"): the same as mounting `cache(URL, log=PATH[:SIZE], mode=MODE)`.
    #[arg(long, value_name = "PATH[:SIZE]")]
    pub cache_log: Option<String>,
    /// With --cache-log: when writes complete (log, immediate or write-through).
    #[arg(long, default_value = "log", requires = "cache_log")]
    pub cache_mode: String,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    super::logging::init("info");
    let text = match &args.cache_log {
        Some(log) => format!("cache({}, log={log}, mode={})", args.url, args.cache_mode),
        None => args.url.clone(),
    };
    let spec: DeviceSpec = text.parse()?;
    let mut opts = LunOptions { sessions: args.sessions.max(1), ..LunOptions::default() };
    if let Some(n) = &args.initiator_name {
        opts.config.initiator_name.clone_from(n);
    }
    opts.config.offer.header_digest = args.digests;
    opts.config.offer.data_digest = args.digests;
    opts.config.timers.recovery.timeout = Duration::from_secs(args.recovery_timeout);
    opts.config.timers.nop_interval = Duration::from_secs(args.nop_interval.max(1));
    opts.config.timers.nop_timeout = Duration::from_secs(args.nop_timeout.max(1));
    let rt = match args.io_threads {
        0 | 1 => tokio::runtime::Builder::new_current_thread().enable_all().build()?,
        n => tokio::runtime::Builder::new_multi_thread().worker_threads(n).enable_all().build()?,
    };
    let devices = OpenContext::new(opts);
    let dev =
        rt.block_on(stics_stack::open(&spec, &devices)).with_context(|| format!("opening {}", spec.redacted()))?;
    let g = dev.geometry();
    let remote = devices.remote_luns();
    if let Some(s) = remote.first().and_then(|lun| lun.sessions().first()) {
        let p = s.params();
        tracing::info!(
            immediate_data = p.immediate_data,
            initial_r2t = p.initial_r2t,
            first_burst = p.first_burst_length,
            max_burst = p.max_burst_length,
            max_send_segment = p.max_xmit_data_segment_length,
            header_digest = p.header_digest,
            data_digest = p.data_digest,
            write_cache = dev.volatile_cache(),
            "session parameters"
        );
    }
    let created = if args.file.exists() {
        false
    } else {
        std::fs::File::create(&args.file).with_context(|| format!("creating {}", args.file.display()))?;
        true
    };
    let export = stics_fuse::ExportOptions {
        threads: args.threads.max(1),
        read_only: args.read_only,
        fsname: format!("stics:{}", spec.redacted()),
    };
    let mut mounted = match stics_fuse::mount(Arc::clone(&dev), rt.handle().clone(), &args.file, &export) {
        Ok(m) => m,
        Err(e) => {
            if created {
                let _ = std::fs::remove_file(&args.file);
            }
            rt.block_on(devices.close());
            return Err(e.into());
        }
    };
    tracing::info!(file = %args.file.display(), bytes = g.bytes(), block_size = g.block_size, "device exported");
    let signalled = rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let mut usr1 = signal(SignalKind::user_defined1())?;
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                _ = term.recv() => return Ok::<bool, std::io::Error>(true),
                _ = int.recv() => return Ok(true),
                _ = usr1.recv() => if let Some(path) = &args.counters {
                    if let Err(e) = write_counters(path, &remote) {
                        tracing::warn!(file = %path.display(), "cannot write the counters: {e}");
                    }
                },
                _ = tick.tick() => if mounted.is_finished() { return Ok(false) },
            }
        }
    })?;
    if signalled {
        tracing::info!("signal received: unmounting");
        mounted.unmount().with_context(|| format!("unmounting {}", args.file.display()))?;
    }
    // Requests still queued by the kernel (a lazily detached export serves until its last user
    // lets go) run on this runtime: keep driving it until the request loop has ended.
    rt.block_on(async {
        while !mounted.is_finished() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let s = mounted.stats();
    let (r, w, rmw, f, z) = (
        s.reads.load(Relaxed),
        s.writes.load(Relaxed),
        s.read_modify_writes.load(Relaxed),
        s.flushes.load(Relaxed),
        s.zeroings.load(Relaxed),
    );
    let joined = mounted.join();
    if let Some(path) = &args.counters {
        write_counters(path, &remote)?;
    }
    rt.block_on(devices.close());
    if created {
        let _ = std::fs::remove_file(&args.file);
    }
    if args.stats {
        eprintln!(
            "fuse reads      {r:>14}\nfuse writes     {w:>14}\nread-mod-writes {rmw:>14}\nfuse flushes    {f:>14}\nfuse zeroings   {z:>14}"
        );
        for lun in &remote {
            eprintln!("flushes skipped {:>14}", lun.flushes_skipped());
            eprintln!("{}", lun.counters());
        }
    }
    joined.context("FUSE request loop")?;
    Ok(())
}

/// Writes the counters of `luns`, summed, to `path` as one JSON object; through a temporary file
/// and a rename, so that a reader never sees half of it.
fn write_counters(path: &std::path::Path, luns: &[Arc<stics_initiator::Lun>]) -> std::io::Result<()> {
    let c = luns.iter().map(|l| l.counters()).fold(stics_initiator::counters::Snapshot::default(), |a, b| a + b);
    let json = serde_json::json!({
        "commands": c.commands,
        "pdus_sent": c.pdus_sent,
        "pdus_received": c.pdus_received,
        "bytes_sent": c.bytes_sent,
        "bytes_received": c.bytes_received,
        "round_trips": c.round_trips,
        "retries": c.retries,
        "reconnects": c.reconnects,
    });
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, json.to_string() + "\n")?;
    std::fs::rename(&tmp, path)
}

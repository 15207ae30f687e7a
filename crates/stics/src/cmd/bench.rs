//! `stics bench`: the seeds' experiments on the real stack (the experiments live in stics-bench;
//! this module parses the command line, prints the reports and writes their folders).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Subcommand;
use stics_bench::exp::{
    app, cache_location, coherence, conformance, congestion, delay, disk, gateway, initiator, interop, micro, nfs,
    packets, postmark, rbd, target, tls, trace, wan, write_model,
};
use stics_bench::load::{self, Op, Pattern};
use stics_bench::machine::Machine;
use stics_bench::replay;
use stics_bench::{Bench, Options, Report};
use stics_report::{Column, Format, Table};

/// Reproduce the seeds' tables and figures on the real stack.
#[derive(clap::Args)]
#[command(long_about = "Reproduce the tables and figures of the seed papers on the real stack: stics target, \
initiator and gateway, tgt, `stics wan`, libiscsi's and qemu's clients and PostMark, each run as its own process. \
Each experiment prints a table with the paper's value beside ours where the paper prints one, draws its figure \
(--plot), and with --out DIR writes a folder with the report in Markdown, every table as CSV and JSON, the \
figures, the exact commands run and the machine's facts. Side-by-side comparisons alternate their order within \
one run; --reps N repeats each measurement and reports medians and the spread. --quick sizes every run for CI \
(a minute or two each).")]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
    #[command(flatten)]
    common: Common,
}

#[derive(clap::Args)]
struct Common {
    /// CI-sized runs: fewer requests, smaller LUNs.
    #[arg(long, global = true)]
    quick: bool,
    /// Repetitions of each measurement (medians and spread are reported).
    #[arg(long, global = true, default_value_t = 3)]
    reps: usize,
    /// Print the report as JSON: each table's rows an array of objects in SI base units.
    #[arg(long, global = true, conflicts_with = "csv")]
    json: bool,
    /// Print the tables as CSV (one block per table, each after a `# caption` line).
    #[arg(long, global = true)]
    csv: bool,
    /// Draw the experiment's figure into this PNG file (further figures beside it as FILE-2.png, …).
    #[arg(long, global = true, value_name = "FILE.png")]
    plot: Option<PathBuf>,
    /// Write the report folder (report.md, tables, figures, commands.txt, machine.json) under DIR.
    #[arg(long, global = true, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Keep the scratch files (LUN images, process logs) in DIR instead of a temporary folder.
    #[arg(long, global = true, value_name = "DIR")]
    keep: Option<PathBuf>,
    /// Bound the host's memory (PostMark, the ext4 it mounts and their page cache) with a v1
    /// memory cgroup, as the papers' hosts had little (seed 004: 128 MB); default unbounded.
    #[arg(long, global = true, value_name = "SIZE", value_parser = stics_units::parse_size)]
    host_memory: Option<u64>,
    /// Put the remote's medium (the plain target's file LUN and the SG's) behind this disk
    /// model, as the papers' targets stored on disks: o7n3200, as010a1 (seed 004 Table 2),
    /// 91366u4, dnes, ddys, raid5 (seed 000); default the page-cached file.
    #[arg(long, global = true, value_name = "MODEL")]
    remote_disk: Option<stics_disk::Preset>,
    /// Put every gateway's log behind this disk model (`stics gateway --log-disk`), as seed
    /// 004's log was an IDE disk (as010a1 is its Maxtor); default the file as it is.
    #[arg(long, global = true, value_name = "MODEL")]
    log_disk: Option<stics_disk::Preset>,
    /// The read cache policy of every gateway (`stics gateway --policy`): lru, as seed 004's,
    /// keeps a written block while it is among the most recently used; s3fifo, the gateway's
    /// default, lets a block through a small probation queue first.
    #[arg(long, global = true, value_name = "POLICY", value_parser = ["s3fifo", "lru"])]
    read_cache_policy: Option<String>,
    /// Mount the benchmarks' ext4 with its default options (an ordinary file system, as seed
    /// 004 ran PostMark) instead of `-o sync`, which makes every write reach the device.
    #[arg(long, global = true)]
    ext4_default: bool,
    /// Put the loop device under the host's ext4 on direct I/O (`losetup --direct-io=on`). By
    /// default it is buffered, as `mount -o loop` leaves it: a buffered loop device serves its
    /// file one request at a time, which caps a remote LUN a few milliseconds away (the committed
    /// readings ran buffered). qemu-storage-daemon 7.2's FUSE export (`stics bench initiator`'s
    /// peer) does not survive it: e2fsck finds its ext4 corrupt after PostMark.
    #[arg(long, global = true)]
    loop_direct_io: bool,
}

#[derive(Subcommand)]
enum Cmd {
    /// Seed 001 Figs. 1-2: depth-1 latency of one cached block (512 B-64 KiB) and 8-deep throughput, with CPU per GiB, stics against tgt.
    Micro(micro::Args),
    /// Seed 000 Table 1: blocking 8 KiB I/O from one thread, local, on the target and through stics wan at 0-8 ms one way, file and null LUNs and the gateway, beside eq. 1.
    Delay(delay::Args),
    /// Seed 003 eqs. 1-4: one write at depth 1 through stics wan (Reno) against RTT, loss and size (4 KiB-16 MiB) with 64 KiB/256 KiB bursts, beside the model, with model/measured ratios.
    WriteModel(write_model::Args),
    /// The disk model's check: random and sequential 8 KiB reads and writes at depth 1 on disk(mem:…, model=X) for every preset (seed 004 Table 2, seed 000's disks and array), the model's mean for the same requests against the measured one, and one run through stics target.
    Disk(disk::Args),
    /// stics target against tgt on a page-cached file LUN with qemu-img bench: IOPS, latency, loopback share, CPU per GiB.
    Target(target::Args),
    /// TLS 1.3 against plain TCP on loopback: the same stics target over a null LUN, large sequential writes and reads, throughput and CPU per GiB of target and client.
    Tls(tls::Args),
    /// libiscsi's iscsi-test-cu --test=ALL against stics target and tgt, counted strictly; fails if stics fails a test.
    Conformance(conformance::Args),
    /// Seed 004 Figs. 8-9: an EMC-tel-like trace (or --trace FILE) replayed open loop across stics wan at 8 ms one way, plain iSCSI against the gateway in log and immediate mode: every response time.
    Trace(trace::Args),
    /// Seed 004 Figs. 6-7: PostMark small and large pools at block sizes 512 B-8 KiB, plain iSCSI against the gateway (log, immediate) at 100 Mbit/s and 1 Gbit/s.
    Postmark(postmark::Args),
    /// Seed 004 Tables 3-4: packets by size, total packets and bytes on the WAN for a PostMark run, plain iSCSI against the gateway.
    Packets(packets::Args),
    /// Seed 000 Table 2: an OpenSSH build, pgbench and PostMark on ext4 (default mount and -o sync), local, on the target and through stics wan at 0-8 ms one way, plain and through the gateway, normalised to the local row.
    App(app::Args),
    /// Seed 000 Fig. 5: PostMark with a small cache at the host side, at the storage side or none, against one-way delay 0-8 ms.
    CacheLocation(cache_location::Args),
    /// Seed 000 Table 3 / Fig. 6: PostMark at 2 ms one way with background load 0-75 % of 100 Mbit/s, no cache against gateway caches of 0.1-10 % of the working set.
    Congestion(congestion::Args),
    /// The gateway across stics wan at 8 ms: random writes past the log's size in log against write-through mode (destage stalls), the restart on a full log after SIGKILL against an empty one, and sequential reads while destage runs against the same reads after a drain.
    Gateway(gateway::Args),
    /// Gateways that share one SG LUN (seed 004 §3.4) across stics wan at 2 and 8 ms one way: token acquisition against the fast path and a gateway that shares nothing, one segment written alternately by two gateways, three gateways as their spans overlap.
    Coherence(coherence::Args),
    /// Seed 002: NFS v3 (nfs-ganesha, stics nfs-mount) against iSCSI (stics target, ext4) plain and through the gateway across stics wan: 128 MB sequential and random reads and writes, a source tree unpacked, listed and removed, and RPCs per file-system call, counted by the clients and on the wire.
    Nfs(nfs::Args),
    /// stics target (and tgt) with libiscsi's tools, qemu-img convert both ways, and ext4 + PostMark over qemu-storage-daemon's FUSE export, checked with e2fsck.
    Interop(interop::Args),
    /// The stics initiator against libiscsi on one tgt LUN: ext4 + PostMark over stics mount and over qemu-storage-daemon's FUSE export, write + fsync latency at depth 1 (fio), and 4 KiB random reads through the initiator at depths 1 and 32 against tgt, stics target and stics target across stics wan.
    Initiator(initiator::Args),
    /// stics wan against its promises (delay, rate, loss against Mathis' model) and its overhead against a plain veth pair.
    Wan(wan::Args),
    /// stics target serving a Ceph RBD image against tgt's rbd backing store (tgt-rbd) and rbd bench on the same image: 4 KiB random reads and writes at depths 1 and 32, 1 MiB at depth 8; needs a stics built with --features rbd and a Ceph cluster (--conf, or a throwaway one from scripts/ceph-cluster.sh). Not part of `all`.
    Rbd(rbd::Args),
    /// Every experiment above but rbd (which needs a Ceph build) with its defaults, and a Markdown report of them all in --out DIR.
    All,
    /// The load generator the experiments run as a client: closed-loop requests against a device, latency percentiles.
    Load(LoadArgs),
    /// The trace replayer the experiments run as a client: a block trace (MSR CSV, blkparse) or --emc-tel issued open loop, every response time.
    Replay(replay::Args),
}

/// Options of `stics bench load`.
#[derive(clap::Args)]
struct LoadArgs {
    /// The device: an iscsi:// URL or any device spec stics opens (file:PATH, mem:1GiB, cache(…)).
    device: String,
    /// Bytes per request.
    #[arg(long, default_value = "4KiB", value_parser = stics_units::parse_size)]
    size: u64,
    /// Requests in flight.
    #[arg(long, default_value_t = 1)]
    depth: usize,
    #[arg(long, value_enum, default_value_t = Op::Read)]
    op: Op,
    #[arg(long, value_enum, default_value_t = Pattern::Random)]
    pattern: Pattern,
    /// Stop after this many requests.
    #[arg(long)]
    count: Option<u64>,
    /// Stop after this long (default 10s when no --count is given).
    #[arg(long, value_parser = stics_units::parse_duration)]
    seconds: Option<f64>,
    /// Requests fall in SPAN bytes of the device from --from (default: all of the rest).
    #[arg(long, default_value = "0", value_parser = stics_units::parse_size)]
    span: u64,
    /// Where the span starts (a whole number of requests).
    #[arg(long, default_value = "0", value_parser = stics_units::parse_size)]
    from: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Writes only: each of the --depth workers flushes (SYNCHRONIZE CACHE) after every N of
    /// its writes and waits for it (0: never).
    #[arg(long, default_value_t = 0, value_name = "N")]
    flush_every: u64,
    /// Requests sent first on the same connection and not measured (a fresh connection's slow start).
    #[arg(long, default_value_t = 0, conflicts_with = "arrivals")]
    warmup: u64,
    /// Open loop: requests arrive at times drawn from seed003 (lognormal μ = -4.5, σ² = 6.25), lognormal:MU,SIGMA2 or poisson:RATE, whatever the device's speed, and wait in arrival order for one of --depth servers (1: one at a time, seed 003's non-interleaved session); each is timed from its arrival, at random places.
    #[arg(long, value_parser = load::parse_arrivals)]
    arrivals: Option<load::Arrivals>,
    /// Open loop: request sizes drawn from seed003 (the shipped distribution of `stics model`, mean 6 KiB) or a file of "size weight" lines (default: --size every time).
    #[arg(long, value_parser = load::parse_size_dist, requires = "arrivals")]
    size_dist: Option<stics_model::SizeDist>,
}

fn format(c: &Common) -> Format {
    if c.json {
        Format::Json
    } else if c.csv {
        Format::Csv
    } else {
        Format::Text
    }
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let c = &a.common;
    if let Cmd::Load(l) = a.cmd {
        return run_load(&l, format(c));
    }
    if let Cmd::Replay(r) = a.cmd {
        return run_replay(&r, format(c), c.plot.as_deref());
    }
    // What the experiments warn of (an unclean e2fsck, a peer that misbehaved) reaches stderr.
    super::logging::init("warn");
    let stics = std::env::current_exe().context("cannot find the stics binary itself")?;
    stics_bench::env::clean_up_on_interrupt().context("cannot catch SIGINT and SIGTERM")?;
    let bench = Bench::new(Options {
        stics,
        quick: c.quick,
        reps: c.reps,
        keep: c.keep.clone(),
        progress: std::io::stderr().is_terminal(),
        host_memory: c.host_memory,
        remote_disk: c.remote_disk,
        log_disk: c.log_disk,
        read_cache_policy: c.read_cache_policy.clone(),
        ext4_default: c.ext4_default,
        loop_direct_io: c.loop_direct_io,
    })?;
    let b = &bench;
    let mut errors = Vec::new();
    let reports: Vec<Report> = match &a.cmd {
        Cmd::Micro(m) => vec![with_commands(b, || micro::run(b, m))?],
        Cmd::Delay(d) => vec![with_commands(b, || delay::run(b, d))?],
        Cmd::Disk(x) => vec![with_commands(b, || disk::run(b, x))?],
        Cmd::WriteModel(w) => vec![with_commands(b, || write_model::run(b, w))?],
        Cmd::Target(t) => vec![with_commands(b, || target::run(b, t))?],
        Cmd::Tls(t) => vec![with_commands(b, || tls::run(b, t))?],
        Cmd::Conformance(x) => vec![with_commands(b, || conformance::run(b, x))?],
        Cmd::Trace(t) => vec![with_commands(b, || trace::run(b, t))?],
        Cmd::Postmark(p) => vec![with_commands(b, || postmark::run(b, p))?],
        Cmd::Packets(p) => vec![with_commands(b, || packets::run(b, p))?],
        Cmd::CacheLocation(x) => vec![with_commands(b, || cache_location::run(b, x))?],
        Cmd::App(x) => vec![with_commands(b, || app::run(b, x))?],
        Cmd::Congestion(x) => vec![with_commands(b, || congestion::run(b, x))?],
        Cmd::Wan(x) => vec![with_commands(b, || wan::run(b, x))?],
        Cmd::Interop(x) => vec![with_commands(b, || interop::run(b, x))?],
        Cmd::Initiator(x) => vec![with_commands(b, || initiator::run(b, x))?],
        Cmd::Gateway(x) => vec![with_commands(b, || gateway::run(b, x))?],
        Cmd::Coherence(x) => vec![with_commands(b, || coherence::run(b, x))?],
        Cmd::Nfs(x) => vec![with_commands(b, || nfs::run(b, x))?],
        Cmd::Rbd(x) => vec![with_commands(b, || rbd::run(b, x))?],
        Cmd::All => run_all(b, &mut errors),
        Cmd::Load(_) | Cmd::Replay(_) => unreachable!("handled above"),
    };
    let machine = Machine::gather(env!("CARGO_PKG_VERSION"), c.out.is_some());
    for r in &reports {
        print!("{}", r.render(format(c))?);
        if let Some(p) = &c.plot {
            for f in r.plot(p)? {
                eprintln!("figure: {}", f.display());
            }
        }
        if let Some(dir) = &c.out {
            let d = r.write(dir, &r.commands, &machine)?;
            eprintln!("report: {}", d.join("report.md").display());
        }
    }
    if matches!(a.cmd, Cmd::All) {
        if let Some(dir) = &c.out {
            std::fs::write(dir.join("README.md"), index(&reports, &machine, c.quick))?;
            eprintln!("index: {}", dir.join("README.md").display());
        }
    }
    let failed: Vec<&str> = reports.iter().flat_map(Report::failed_checks).collect();
    if !failed.is_empty() {
        errors.push(format!("failed: {}", failed.join("; ")));
    }
    if !errors.is_empty() {
        bail!("{}", errors.join("\n"));
    }
    Ok(())
}

/// Runs one experiment and gives its report the commands it ran, after the command line that
/// asked for it.
fn with_commands(b: &Bench, run: impl FnOnce() -> stics_bench::Result<Report>) -> anyhow::Result<Report> {
    let first = b.commands().len();
    let mut r = run()?;
    let invocation = std::env::args().collect::<Vec<_>>().join(" ");
    r.commands = std::iter::once(format!("# {invocation}")).chain(b.commands().into_iter().skip(first)).collect();
    Ok(r)
}

/// An experiment's options as its subcommand would get them with no arguments.
fn defaults<T: clap::Args + clap::FromArgMatches>() -> stics_bench::Result<T> {
    let cmd = T::augment_args(clap::Command::new("defaults"));
    let bad = |e: clap::Error| stics_bench::Error::Invalid(e.to_string());
    T::from_arg_matches(&cmd.try_get_matches_from(["defaults"]).map_err(bad)?).map_err(bad)
}

/// Every experiment with its defaults; one that fails is reported in `errors` and the others
/// still run.
fn run_all(b: &Bench, errors: &mut Vec<String>) -> Vec<Report> {
    type Step<'a> = Box<dyn Fn() -> anyhow::Result<Report> + 'a>;
    let steps: Vec<(&str, Step<'_>)> = vec![
        ("wan", Box::new(|| with_commands(b, || wan::run(b, &defaults()?)))),
        ("conformance", Box::new(|| with_commands(b, || conformance::run(b, &defaults()?)))),
        ("interop", Box::new(|| with_commands(b, || interop::run(b, &defaults()?)))),
        ("initiator", Box::new(|| with_commands(b, || initiator::run(b, &defaults()?)))),
        ("target", Box::new(|| with_commands(b, || target::run(b, &defaults()?)))),
        ("tls", Box::new(|| with_commands(b, || tls::run(b, &defaults()?)))),
        ("micro", Box::new(|| with_commands(b, || micro::run(b, &defaults()?)))),
        ("delay", Box::new(|| with_commands(b, || delay::run(b, &defaults()?)))),
        ("disk", Box::new(|| with_commands(b, || disk::run(b, &defaults()?)))),
        ("cache-location", Box::new(|| with_commands(b, || cache_location::run(b, &defaults()?)))),
        ("congestion", Box::new(|| with_commands(b, || congestion::run(b, &defaults()?)))),
        ("postmark", Box::new(|| with_commands(b, || postmark::run(b, &defaults()?)))),
        ("packets", Box::new(|| with_commands(b, || packets::run(b, &defaults()?)))),
        ("write-model", Box::new(|| with_commands(b, || write_model::run(b, &defaults()?)))),
        ("trace", Box::new(|| with_commands(b, || trace::run(b, &defaults()?)))),
        ("gateway", Box::new(|| with_commands(b, || gateway::run(b, &defaults()?)))),
        ("app", Box::new(|| with_commands(b, || app::run(b, &defaults()?)))),
        ("coherence", Box::new(|| with_commands(b, || coherence::run(b, &defaults()?)))),
        ("nfs", Box::new(|| with_commands(b, || nfs::run(b, &defaults()?)))),
    ];
    let mut out = Vec::new();
    let all = std::time::Instant::now();
    for (name, step) in steps {
        b.say(&format!("stics bench {name}"));
        let started = std::time::Instant::now();
        match step() {
            Ok(r) => {
                b.say(&format!(
                    "stics bench {name}: done in {:.0} s ({:.0} s so far)",
                    started.elapsed().as_secs_f64(),
                    all.elapsed().as_secs_f64()
                ));
                out.push(r);
            }
            Err(e) => {
                b.say(&format!("stics bench {name} failed after {:.0} s: {e:#}", started.elapsed().as_secs_f64()));
                errors.push(format!("stics bench {name}: {e:#}"));
            }
        }
    }
    out
}

/// The top page of `stics bench all --out DIR`: the machine, then each report.
fn index(reports: &[Report], m: &Machine, quick: bool) -> String {
    let mut s = String::from("# stics bench all: the seeds reproduced on this machine\n\n");
    s.push_str(&format!(
        "Regenerate with `stics bench all{} --out DIR`. Each experiment's folder holds its tables as CSV and JSON, \
         its figures, the exact commands (commands.txt) and the machine's facts.\n\n## Machine\n\n{}\n",
        if quick { " --quick" } else { "" },
        m.markdown()
    ));
    for r in reports {
        s.push_str(&r.markdown(2).replace("](", &format!("]({}/", r.name)));
    }
    s
}

/// Opens the device a client runs against (an iscsi:// URL or any device spec); the context is
/// closed by the caller when the run is over.
async fn open_device(text: &str) -> anyhow::Result<(stics_stack::OpenContext, Arc<dyn stics_block::BlockDev>)> {
    let ctx = stics_stack::OpenContext::default();
    let dev = stics_stack::open(&text.parse().context("device spec")?, &ctx)
        .await
        .with_context(|| format!("cannot open {text}"))?;
    Ok((ctx, dev))
}

fn run_replay(r: &replay::Args, format: Format, plot: Option<&std::path::Path>) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let outcome = rt.block_on(async {
        let (ctx, dev) = open_device(&r.device).await?;
        let res = match replay::requests(r, dev.geometry().bytes()) {
            Ok(requests) => replay::run(Arc::clone(&dev), requests, r.speed).await,
            Err(e) => Err(e),
        };
        ctx.close().await;
        res.map_err(anyhow::Error::from)
    })?;
    if let Some(p) = plot {
        let fig = trace::histogram_figure("Response times of the replay", &[("replay", &outcome)]);
        stics_report::plot::draw(&fig, p)?;
        eprintln!("figure: {}", p.display());
    }
    if format == Format::Json {
        println!("{}", serde_json::to_string(&outcome)?);
        return Ok(());
    }
    print!("{}", replay::table(&outcome)?.render(format)?);
    Ok(())
}

fn run_load(l: &LoadArgs, format: Format) -> anyhow::Result<()> {
    let spec = load::Spec {
        size: l.size,
        depth: l.depth,
        op: l.op,
        pattern: l.pattern,
        count: l.count,
        seconds: l.seconds.or(if l.count.is_none() { Some(10.0) } else { None }),
        span: l.span,
        from: l.from,
        seed: l.seed,
        flush_every: l.flush_every,
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let outcome = rt.block_on(async {
        let (ctx, dev) = open_device(&l.device).await?;
        let warm = load::Spec { count: Some(l.warmup), seconds: None, ..spec.clone() };
        let r = if l.warmup > 0 { load::run(Arc::clone(&dev), &warm).await.map(drop) } else { Ok(()) };
        let r = match (r, l.arrivals) {
            (Err(e), _) => Err(e),
            (Ok(()), None) => load::run(Arc::clone(&dev), &spec).await,
            (Ok(()), Some(arrivals)) => match l.size_dist.clone().map_or_else(|| load::fixed_size(l.size), Ok) {
                Ok(sizes) => {
                    let open = load::OpenSpec {
                        arrivals,
                        sizes,
                        depth: l.depth,
                        op: l.op,
                        count: spec.count,
                        seconds: spec.seconds,
                        span: l.span,
                        seed: l.seed,
                    };
                    load::run_open(Arc::clone(&dev), &open).await
                }
                Err(e) => Err(e),
            },
        };
        let negotiated = ctx.remote_luns().first().and_then(|l| l.sessions().first()).map(|s| {
            let p = s.params();
            load::Negotiated {
                first_burst_length: p.first_burst_length,
                max_burst_length: p.max_burst_length,
                max_outstanding_r2t: p.max_outstanding_r2t,
                immediate_data: p.immediate_data,
                initial_r2t: p.initial_r2t,
            }
        });
        ctx.close().await;
        r.map(|o| load::Outcome { warmup: l.warmup, negotiated, ..o }).map_err(anyhow::Error::from)
    })?;
    if format == Format::Json {
        println!("{}", serde_json::to_string(&outcome)?);
        return Ok(());
    }
    let mut t = Table::new(vec![
        Column::new("requests", "requests", "", 1.0),
        Column::new("iops", "IOPS", "", 1.0),
        Column::new("bandwidth", "bandwidth", "MB/s", 1e-6),
        Column::new("mean", "mean", "ms", 1e3),
        Column::new("p50", "p50", "ms", 1e3),
        Column::new("p99", "p99", "ms", 1e3),
        Column::new("max", "max", "ms", 1e3),
        Column::new("cpu", "CPU", "s", 1.0),
    ])?;
    t.push(vec![
        (outcome.requests as f64).into(),
        outcome.iops.into(),
        outcome.bytes_per_sec.into(),
        outcome.mean.into(),
        outcome.p50.into(),
        outcome.p99.into(),
        outcome.max.into(),
        outcome.cpu_seconds.into(),
    ])?;
    print!("{}", t.render(format)?);
    Ok(())
}

//! `stics bench gateway`: what the gateway promises beyond the papers' tables, across `stics wan`:
//! no destage stalls (random writes well past the log's size, log mode against write-through),
//! recovery (restart on a full log after SIGKILL with the WAN cut, against an empty log) and
//! reads that never wait behind destage (sequential reads while destage runs, against the same
//! reads after a drain).

use std::time::{Duration, Instant};

use stics_report::{Column, Table};

use crate::load::Outcome;
use crate::peers::{Gateway, GatewayOptions, Wan};
use crate::{Bench, Report, Result};

/// Options of `stics bench gateway`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// One-way delay of the WAN.
    #[arg(long, default_value = "8ms")]
    pub delay: String,
    /// The gateway's write log in the stall run (the cache's smallest is 256 MiB).
    #[arg(long, default_value = "256MiB", value_parser = stics_units::parse_size)]
    pub log: u64,
    /// The gateway's RAM buffer in the stall run.
    #[arg(long, default_value = "16MiB")]
    pub ram: String,
    /// Bytes written in the stall run, in multiples of the log (`--quick`: a quarter).
    #[arg(long, default_value_t = 3.0)]
    pub written: f64,
    /// The log filled in the recovery run (`--quick`: 256 MiB).
    #[arg(long, default_value = "1GiB", value_parser = stics_units::parse_size)]
    pub recovery_log: u64,
    /// Seconds of writes with the WAN cut in the recovery run, at most (`--quick`: 10).
    #[arg(long, default_value_t = 90)]
    pub fill_secs: u64,
    /// Sequential 8 KiB reads in each run of the reads section (`--quick`: 300).
    #[arg(long, default_value_t = 1000)]
    pub reads: u64,
    /// Bound on the lag in the link section's third run (`stics gateway --max-lag`), seconds.
    #[arg(long, default_value_t = 2)]
    pub max_lag: u64,
    /// Leave out the link section (the gateway over a stics SG against plain destage).
    #[arg(long, conflicts_with = "link_only")]
    pub no_link: bool,
    /// Run the link section alone.
    #[arg(long)]
    pub link_only: bool,
    /// Bottleneck rate of the WAN (default: none but the emulator's own).
    #[arg(long)]
    pub rate: Option<String>,
}

const LUN_BYTES: u64 = 1 << 30;

pub fn run(b: &Bench, a: &Args) -> Result<Report> {
    b.need(&["curl"])?;
    let mut wan_args = vec!["--delay", a.delay.as_str()];
    if let Some(rate) = &a.rate {
        wan_args.extend(["--rate", rate.as_str()]);
    }
    let wan = Wan::up(b, &format!("sbgw{}", std::process::id()), &wan_args)?;
    let lun = b.work().join("remote.img");
    std::fs::File::create(&lun)?.set_len(LUN_BYTES)?;
    let target = wan.stics_target(b, "remote", "storage", &[&b.remote_medium(&lun)])?;
    let bar = b.bar(5, "gateway");
    let mut r = Report::new("gateway", "The gateway across stics wan: no destage stalls, and recovery of a full log");
    if a.link_only {
        over_the_link(b, a, &wan, &target.url, &mut r)?;
        return Ok(r);
    }

    // 1. Stalls: write-through first, since log mode leaves a destage backlog on the remote.
    let written = if b.quick() { a.written / 4.0 } else { a.written };
    let count = ((a.log as f64 * written) / 4096.0) as u64;
    let mut t = Table::new(vec![
        Column::new("mode", "mode", "", 1.0),
        Column::new("iops", "writes/s", "", 1.0),
        Column::new("mean", "mean", "ms", 1e3),
        Column::new("p99", "p99", "ms", 1e3),
        Column::new("max", "max", "ms", 1e3),
        Column::new("throttled", "throttled writes", "", 1.0),
    ])?;
    let mut iops = Vec::new();
    for mode in ["write-through", "log"] {
        let path = b.work().join("stall-log.img");
        let o = GatewayOptions {
            mode: mode.into(),
            log: format!("{}:{}", path.display(), a.log),
            ram: a.ram.clone(),
            read_cache: "64MiB".into(),
            extra: Vec::new(),
        };
        let g = wan.gateway(b, "gateway", "host", &target.url, &o)?;
        let out = load(b, &wan, &g, &["--count", &count.to_string()])?;
        let status = wan.gateway_status(b, &g)?;
        wan.gateway_stop(b, g, &target.url, &path)?;
        t.push(vec![
            mode.into(),
            out.iops.into(),
            out.mean.into(),
            out.p99.into(),
            out.max.into(),
            (status["throttled_writes"].as_u64().unwrap_or(0) as f64).into(),
        ])?;
        iops.push(out.iops);
        bar.inc(1);
    }
    r.section(
        format!(
            "Random 4 KiB writes at depth 32 from the host namespace, {count} of them ({:.1}× the {} MiB log) over \
             the first GiB, {} one way; the gateway's RAM buffer {}",
            written,
            a.log >> 20,
            a.delay,
            a.ram
        ),
        t,
        None,
    );
    r.note(format!(
        "Log mode sustained {:.2}× write-through's rate over {written:.2}× the log. {}",
        iops[1] / iops[0],
        if written > 1.0 {
            "Past the log's size, writes wait for destage, which runs at the WAN's pace: the worst response shows \
             whether that wait comes as a stall or spread over every write."
        } else {
            "The log never filled in this run (a --quick run), so destage never held a write back."
        }
    ));

    // 2. Recovery: fill a log with the WAN cut, SIGKILL, restore the WAN, restart.
    let log_bytes = if b.quick() { a.recovery_log.min(256 << 20) } else { a.recovery_log };
    let fill_secs = if b.quick() { a.fill_secs.min(10) } else { a.fill_secs };
    let path = b.work().join("recovery-log.img");
    let o = GatewayOptions {
        mode: "log".into(),
        log: format!("{}:{log_bytes}", path.display()),
        // The log must hold the RAM buffer's epochs in flight beside its records.
        ram: if log_bytes < 512 << 20 { "16MiB" } else { "64MiB" }.into(),
        read_cache: "64MiB".into(),
        extra: Vec::new(),
    };
    let mut g = wan.gateway(b, "gateway", "host", &target.url, &o)?;
    wan.set(b, &["--loss", "1"])?;
    // Once the log is full, writes wait for a destage that cannot run: the client is killed.
    let mut client = wan.exec("host", b.stics());
    client.args(["bench", "load", &g.url, "--op", "write", "--depth", "32", "--size", "4KiB"]);
    client.args(["--span", &LUN_BYTES.to_string(), "--seconds", &format!("{fill_secs}s")]);
    let mut fill = b.spawn("fill", &mut client)?;
    let deadline = Instant::now() + Duration::from_secs(fill_secs + 5);
    while Instant::now() < deadline && fill.check().is_ok() {
        std::thread::sleep(Duration::from_millis(200));
    }
    fill.kill();
    let status = wan.gateway_status(b, &g)?;
    let dirty = status["dirty_bytes"].as_u64().unwrap_or(0);
    let log_fill = status["log_fill"].as_f64().unwrap_or(f64::NAN);
    g.proc.kill();
    drop(g);
    wan.set(b, &["--loss", "0"])?;
    bar.inc(1);
    let mut t = Table::new(vec![
        Column::new("log", "log at restart", "", 1.0),
        Column::new("dirty", "dirty", "MiB", 1.0 / f64::from(1u32 << 20)),
        Column::new("restart", "serving again after", "s", 1.0),
        Column::new("drain", "drained in", "s", 1.0),
    ])?;
    let t0 = Instant::now();
    let mut g = wan.gateway(b, "gateway", "host", &target.url, &o)?;
    let restart_full = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    wan.gateway_drain(b, &g)?;
    let drain = t0.elapsed().as_secs_f64();
    g.proc.stop(libc::SIGTERM, Duration::from_secs(60));
    drop(g);
    t.push(vec![
        format!("full ({:.0} % of {} MiB)", log_fill * 100.0, log_bytes >> 20).into(),
        (dirty as f64).into(),
        restart_full.into(),
        drain.into(),
    ])?;
    let t0 = Instant::now();
    let g = wan.gateway(b, "gateway", "host", &target.url, &o)?;
    let restart_empty = t0.elapsed().as_secs_f64();
    let recovered = std::fs::read_to_string(g.proc.log()).unwrap_or_default();
    wan.gateway_stop(b, g, &target.url, &path)?;
    t.push(vec!["empty".into(), 0.0.into(), restart_empty.into(), f64::NAN.into()])?;
    bar.inc(1);
    r.section(
        format!(
            "Random 4 KiB writes at depth 32 into a {} MiB log with the WAN cut (100 % loss) for at most {fill_secs} \
             s; the gateway is killed (SIGKILL), the WAN restored at {} one way, and the restart timed until it \
             serves; then the log is drained, the gateway stopped, and the restart on the empty log timed",
            log_bytes >> 20,
            a.delay
        ),
        t,
        None,
    );
    r.note(format!(
        "A restart reads back the live part of the log before it serves, so its time follows what the log holds: \
         {restart_full:.2} s with {} MiB dirty against {restart_empty:.2} s empty.",
        dirty >> 20
    ));
    if let Some(line) = recovered.lines().rev().find(|l| l.contains("recovered") || l.contains("read back")) {
        r.note(format!("The gateway's own account of the empty-log restart: {}", line.trim()));
    }
    reads_beside_destage(b, a, &wan, &target.url, &mut r)?;
    bar.inc(1);
    if !a.no_link {
        over_the_link(b, a, &wan, &target.url, &mut r)?;
    }
    bar.finish_and_clear();
    drop(target);
    drop(wan);
    Ok(r)
}

/// The third section: sequential 8 KiB reads at depth 1 of blocks the remote holds (not holes) while a writer
/// keeps destage busy in `log` mode (every acknowledged write an epoch of its own, with a flush
/// of its own on the remote), against the same reads of other blocks after a drain. A read that
/// misses never needs ordering against destage, so the two should cost about the same.
fn reads_beside_destage(b: &Bench, a: &Args, wan: &Wan, remote: &str, r: &mut Report) -> Result<()> {
    let reads = if b.quick() { a.reads.min(300) } else { a.reads };
    // Each run reads its own region, so that neither finds the other's blocks in the read cache.
    let region = (reads * 8192).next_multiple_of(1 << 20).max(8 << 20);
    let path = b.work().join("reads-log.img");
    let o = GatewayOptions {
        mode: "log".into(),
        log: format!("{}:{}", path.display(), a.log),
        ram: a.ram.clone(),
        read_cache: "64MiB".into(),
        extra: Vec::new(),
    };
    let g = wan.gateway(b, "gateway", "host", remote, &o)?;
    let stics = b.stics();
    let client = |args: &[&str]| {
        let mut cmd = wan.exec("host", stics);
        cmd.args(["bench", "load", &g.url]).args(args);
        cmd
    };
    let bytes = |n: u64| n.to_string();
    // Both regions written through the gateway and drained: the remote holds their data.
    b.run(&mut client(&[
        "--op",
        "write",
        "--pattern",
        "seq",
        "--size",
        "1MiB",
        "--depth",
        "8",
        "--span",
        &bytes(2 * region),
        "--count",
        &bytes((2 * region) >> 20),
    ]))?;
    wan.gateway_drain(b, &g)?;
    let mut writer = b.spawn(
        "writer",
        &mut client(&[
            "--op",
            "write",
            "--size",
            "4KiB",
            "--depth",
            "4",
            "--from",
            &bytes(2 * region),
            "--span",
            &bytes(region),
            "--seconds",
            "900s",
        ]),
    )?;
    std::thread::sleep(Duration::from_secs(2));
    let before = wan.gateway_status(b, &g)?;
    let read = |from: u64| -> Result<Outcome> {
        let out = b.run(&mut client(&[
            "--op",
            "read",
            "--pattern",
            "seq",
            "--size",
            "8KiB",
            "--from",
            &bytes(from),
            "--span",
            &bytes(region),
            "--count",
            &bytes(reads),
            "--json",
        ]))?;
        Outcome::from_json(&out.stdout)
    };
    let busy = read(0)?;
    let during = wan.gateway_status(b, &g)?;
    writer.kill();
    wan.gateway_drain(b, &g)?;
    let drained = wan.gateway_status(b, &g)?;
    let quiet = read(region)?;
    let after = wan.gateway_status(b, &g)?;
    wan.gateway_stop(b, g, remote, &path)?;
    let n = |s: &serde_json::Value, k: &str| s[k].as_u64().unwrap_or(0) as f64;
    let mut t = Table::new(vec![
        Column::new("when", "reads", "", 1.0),
        Column::new("mean", "mean", "ms", 1e3),
        Column::new("p50", "p50", "ms", 1e3),
        Column::new("p99", "p99", "ms", 1e3),
        Column::new("remote", "blocks from the remote", "", 1.0),
        Column::new("destaged", "epochs destaged meanwhile", "", 1.0),
    ])?;
    t.push(vec![
        "while destage runs".into(),
        busy.mean.into(),
        busy.p50.into(),
        busy.p99.into(),
        (n(&during, "read_blocks_remote") - n(&before, "read_blocks_remote")).into(),
        (n(&during, "destaged_epoch") - n(&before, "destaged_epoch")).into(),
    ])?;
    t.push(vec![
        "after a drain".into(),
        quiet.mean.into(),
        quiet.p50.into(),
        quiet.p99.into(),
        (n(&after, "read_blocks_remote") - n(&drained, "read_blocks_remote")).into(),
        0.0.into(),
    ])?;
    r.section(
        format!(
            "{reads} sequential 8 KiB reads at depth 1 of blocks the remote holds, {} one way: while a writer keeps \
             destage busy (random 4 KiB writes at depth 4 in log mode, each an epoch with a remote flush of its \
             own), then of other blocks after a drain",
            a.delay
        ),
        t,
        None,
    );
    r.note(format!(
        "Reads while destage ran took {:.2}× as long on average as after the drain (the goal: within 2×); {} \
         epochs reached the remote while they ran.",
        busy.mean / quiet.mean,
        n(&during, "destaged_epoch") - n(&before, "destaged_epoch")
    ));
    Ok(())
}

/// `stics bench load` of random 4 KiB writes at depth 32 from the host namespace through `g`.
fn load(b: &Bench, wan: &Wan, g: &Gateway, extra: &[&str]) -> Result<Outcome> {
    let mut cmd = wan.exec("host", b.stics());
    cmd.args(["bench", "load", &g.url, "--op", "write", "--depth", "32", "--size", "4KiB", "--json"]);
    cmd.args(["--span", &LUN_BYTES.to_string()]).args(extra);
    let out = b.run(&mut cmd)?;
    Outcome::from_json(&out.stdout)
}

/// The flush-heavy steady state, plain destage against the link: random 4 KiB writes of fresh
/// random data at depth 32, each worker flushing after every 8 of its writes, `--written` times
/// the log, in `immediate` mode (flushes cut the epochs), through a gateway in front of the plain
/// target and through one in front of a stics SG; then the link again under `--max-lag`. The
/// gateway's lag (the age of the oldest write the remote lacks) is sampled every half second.
fn over_the_link(b: &Bench, a: &Args, wan: &Wan, plain: &str, r: &mut Report) -> Result<()> {
    use super::fs::{sg_lun, Groups, SG_PORT};
    use stics_report::plot::{Figure, Series};
    let sg = wan.stics_target_on(b, "sg", "storage", SG_PORT, &[&sg_lun(b, "sg", LUN_BYTES)?])?;
    let written = if b.quick() { a.written / 4.0 } else { a.written };
    let count = ((a.log as f64 * written) / 4096.0) as u64;
    let max_lag = a.max_lag.to_string();
    let runs: [(&str, &str, Vec<String>); 3] = [
        ("plain destage", plain, Vec::new()),
        ("link", &sg.url, Vec::new()),
        ("link, --max-lag", &sg.url, vec!["--max-lag".into(), max_lag.clone()]),
    ];
    let mut t = Table::new(vec![
        Column::new("path", "path", "", 1.0),
        Column::new("iops", "writes/s", "", 1.0),
        Column::new("mean", "mean", "ms", 1e3),
        Column::new("p99", "p99", "ms", 1e3),
        Column::new("max_lag", "largest lag", "s", 1.0),
        Column::new("groups", "groups", "", 1.0),
        Column::new("epochs", "epochs in them", "", 1.0),
        Column::new("shipped", "shipped/raw", "", 1.0),
    ])?;
    let mut series = Vec::new();
    let mut iops = Vec::new();
    for (label, remote, extra) in &runs {
        let path = b.work().join("link-log.img");
        let o = GatewayOptions {
            mode: "immediate".into(),
            log: format!("{}:{}", path.display(), a.log),
            ram: a.ram.clone(),
            read_cache: "64MiB".into(),
            extra: extra.clone(),
        };
        let g = wan.gateway(b, "gateway", "host", remote, &o)?;
        let started = Instant::now();
        let mut lags = Vec::new();
        let out = std::thread::scope(|s| {
            let writer =
                s.spawn(|| load(b, wan, &g, &["--count", &count.to_string(), "--flush-every", "8", "--seed", "7"]));
            while !writer.is_finished() {
                if let Ok(st) = wan.gateway_status(b, &g) {
                    lags.push((started.elapsed().as_secs_f64(), st["destage_lag_secs"].as_f64().unwrap_or(0.0)));
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            writer
                .join()
                .unwrap_or_else(|_| Err(crate::Error::Output { what: "load".into(), detail: "panicked".into() }))
        })?;
        let status = wan.gateway_status(b, &g)?;
        wan.gateway_drain(b, &g)?;
        wan.gateway_stop(b, g, remote, &path)?;
        let groups = status.get("groups").and_then(Groups::of).unwrap_or_default();
        let largest = lags.iter().map(|&(_, l)| l).fold(0.0, f64::max);
        t.push(vec![
            (*label).into(),
            out.iops.into(),
            out.mean.into(),
            out.p99.into(),
            largest.into(),
            (groups.groups as f64).into(),
            (groups.epochs as f64).into(),
            (groups.shipped as f64 / groups.merged.max(1) as f64).into(),
        ])?;
        series.push(Series::line(*label, lags));
        iops.push(out.iops);
    }
    drop(sg);
    r.section(
        format!(
            "Flush-heavy steady state: random 4 KiB writes of fresh random data at depth 32, a flush after every 8 \
             writes of each worker, {count} writes ({written:.2}× the {} MiB log), immediate mode, {} one way; the \
             gateway in front of the plain target, and in front of a stics SG (the link), then the link with \
             --max-lag {max_lag}{}",
            a.log >> 20,
            a.delay,
            a.rate.as_ref().map(|r| format!(", {r} bottleneck")).unwrap_or_default()
        ),
        t,
        Some(Figure {
            title: "The gateway's lag: age of the oldest write the remote lacks".into(),
            x_label: "time [s]".into(),
            y_label: "lag [s]".into(),
            log_x: false,
            log_y: false,
            categories: Vec::new(),
            series,
        }),
    );
    if let [plain, link, bounded] = iops[..] {
        r.note(format!(
            "Over the link the gateway sustained {:.2}× plain destage's writes/s ({:.2}× under --max-lag \
             {max_lag}); shipped/raw is the groups' bytes on the wire over their merged data (random data: zstd \
             finds nothing, chunks go raw).",
            link / plain,
            bounded / plain
        ));
    }
    Ok(())
}

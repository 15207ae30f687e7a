//! `stics bench`: the seeds' experiments on the real stack (the experiments live in stics-bench;
//! this module parses the command line, prints the reports and writes their folders).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Subcommand;
use stics_bench::exp::{conformance, micro, target};
use stics_bench::load::{self, Op, Pattern};
use stics_bench::machine::Machine;
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
    /// Print the tables as JSON.
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
}

#[derive(Subcommand)]
enum Cmd {
    /// Seed 001 Figs. 1-2: depth-1 latency of one cached block (512 B-64 KiB) and 8-deep throughput, with CPU per GiB, stics against tgt.
    Micro(micro::Args),
    /// stics target against tgt on a page-cached file LUN with qemu-img bench: IOPS, latency, loopback share, CPU per GiB.
    Target(target::Args),
    /// libiscsi's iscsi-test-cu --test=ALL against stics target and tgt, counted strictly; fails if stics fails a test.
    Conformance(conformance::Args),
    /// Every experiment above with its defaults, and a Markdown report of them all in --out DIR.
    All,
    /// The load generator the experiments run as a client: closed-loop requests against a device, latency percentiles.
    Load(LoadArgs),
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
    /// Requests fall in the first SPAN bytes of the device (default: all of it).
    #[arg(long, default_value = "0", value_parser = stics_units::parse_size)]
    span: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
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
    let stics = std::env::current_exe().context("cannot find the stics binary itself")?;
    let bench = Bench::new(Options {
        stics,
        quick: c.quick,
        reps: c.reps,
        keep: c.keep.clone(),
        progress: std::io::stderr().is_terminal(),
    })?;
    let reports: Vec<Report> = match &a.cmd {
        Cmd::Micro(m) => vec![micro::run(&bench, m)?],
        Cmd::Target(t) => vec![target::run(&bench, t)?],
        Cmd::Conformance(x) => vec![conformance::run(&bench, x)?],
        Cmd::All => run_all(&bench)?,
        Cmd::Load(_) => unreachable!("handled above"),
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
            let d = r.write(dir, &bench.commands(), &machine)?;
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
        bail!("failed: {}", failed.join("; "));
    }
    Ok(())
}

fn run_all(b: &Bench) -> anyhow::Result<Vec<Report>> {
    let mut out = Vec::new();
    let steps: [(&str, &dyn Fn() -> stics_bench::Result<Report>); 3] = [
        ("conformance", &|| conformance::run(b, &conformance::Args { lun: "mem:1GiB".into(), stics_only: false })),
        ("target", &|| target::run(b, &target::Args { lun_size: 1 << 30 })),
        ("micro", &|| micro::run(b, &micro::Args { reads: 10_000, threads: 8 })),
    ];
    for (name, step) in steps {
        b.say(&format!("stics bench {name}"));
        out.push(step().with_context(|| format!("stics bench {name}"))?);
    }
    Ok(out)
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

fn run_load(l: &LoadArgs, format: Format) -> anyhow::Result<()> {
    let spec = load::Spec {
        size: l.size,
        depth: l.depth,
        op: l.op,
        pattern: l.pattern,
        count: l.count,
        seconds: l.seconds.or(if l.count.is_none() { Some(10.0) } else { None }),
        span: l.span,
        seed: l.seed,
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let outcome = rt.block_on(async {
        let ctx = stics_stack::OpenContext::default();
        let dev = stics_stack::open(&l.device.parse().context("device spec")?, &ctx)
            .await
            .with_context(|| format!("cannot open {}", l.device))?;
        let r = load::run(Arc::clone(&dev), &spec).await;
        ctx.close().await;
        r.map_err(anyhow::Error::from)
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

//! `stics bench packets`: seed 004 Tables 3–4 — the WAN traffic of a PostMark run counted at the
//! emulator: packets by size, total packets and bytes, the full/partial ratio and bytes per
//! packet, plain iSCSI against the gateway, beside the paper's counts; and seed 002 Tables 2–3,
//! the iSCSI messages each file-system call costs (see [`super::messages`]).

use stics_report::plot::{Figure, Series};
use stics_report::{Column, Table};

use super::fs::{postmark_via, sg_lun, Pool, Via, SG_METRICS, SG_PORT};
use crate::paper;
use crate::peers::Wan;
use crate::{Bench, Report, Result};

/// Options of `stics bench packets`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// PostMark files (`--quick`: 200).
    #[arg(long, default_value_t = 1_000)]
    pub files: u64,
    /// PostMark transactions (`--quick`: 1,000).
    #[arg(long, default_value_t = 50_000)]
    pub transactions: u64,
    /// Bottleneck rate (seed 004: 100 Mbit/s).
    #[arg(long, default_value = "100mbit")]
    pub rate: String,
    /// One-way delay.
    #[arg(long, default_value = "0ms")]
    pub delay: String,
    /// Leave out the count of iSCSI messages per file-system call (seed 002 Tables 2–3).
    #[arg(long)]
    pub no_calls: bool,
    /// The paths to run, comma-separated (default: all five, in this order).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub paths: Vec<Path>,
}

/// A path PostMark's traffic takes to the remote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Path {
    /// Plain iSCSI to the target.
    Plain,
    /// Through a gateway in log mode, then plain iSCSI.
    Log,
    /// Through a gateway in immediate mode, then plain iSCSI.
    Immediate,
    /// Through a gateway in log mode over the link to a stics SG.
    LogLink,
    /// Through a gateway in immediate mode over the link to a stics SG.
    ImmediateLink,
}

impl Path {
    const ALL: [Path; 5] = [Path::Plain, Path::Log, Path::Immediate, Path::LogLink, Path::ImmediateLink];

    fn via(self) -> Via {
        match self {
            Path::Plain => Via::Plain,
            Path::Log => Via::gateway("log"),
            Path::Immediate => Via::gateway("immediate"),
            Path::LogLink => Via::link("log"),
            Path::ImmediateLink => Via::link("immediate"),
        }
    }
}

/// The SG's read counters and apply backlog, from its `/status`.
#[derive(Debug, Clone, Copy, Default)]
struct SgReads {
    journal: u64,
    medium: u64,
    unapplied: u64,
    lag: f64,
}

impl SgReads {
    fn of(b: &Bench, wan: &Wan) -> Result<SgReads> {
        let v = wan.target_status(b, "storage", SG_METRICS)?;
        let j = &v["journals"][0];
        let n = |k: &str| j[k].as_u64().unwrap_or(0);
        Ok(SgReads {
            journal: n("blocks_read_journal"),
            medium: n("blocks_read_medium"),
            unapplied: n("groups_unapplied"),
            lag: j["apply_lag_secs"].as_f64().unwrap_or(0.0),
        })
    }
}

/// Seed 004's bucket names, in the order of `stics_wan`'s.
const BUCKETS: [&str; 6] =
    ["<64 bytes", "65-127 bytes", "128-255 bytes", "256-511 bytes", "512-1023 bytes", ">1024 bytes"];

pub fn run(b: &Bench, a: &Args) -> Result<Report> {
    let pool = if b.quick() {
        Pool { files: a.files.min(200), transactions: a.transactions.min(1_000), block: 4096 }
    } else {
        Pool { files: a.files, transactions: a.transactions, block: 4096 }
    };
    let wan = Wan::up(b, &format!("sbpk{}", std::process::id()), &["--delay", &a.delay, "--rate", &a.rate])?;
    let lun = b.work().join("remote.img");
    std::fs::File::create(&lun)?.set_len(1 << 30)?;
    let target = wan.stics_target(b, "remote", "storage", &[&b.remote_medium(&lun)])?;
    let sg = wan.stics_target_on_with(
        b,
        "sg",
        "storage",
        SG_PORT,
        &[&sg_lun(b, "sg", 1 << 30)?],
        &["--metrics", SG_METRICS],
    )?;
    let paths = if a.paths.is_empty() { Path::ALL.to_vec() } else { a.paths.clone() };
    let vias: Vec<Via> = Path::ALL.into_iter().filter(|p| paths.contains(p)).map(Path::via).collect();
    let bar = b.bar(vias.len() as u64, "packets");
    let mut cols = vec![Column::new("path", "path", "", 1.0)];
    for (i, name) in BUCKETS.iter().enumerate() {
        cols.push(Column::named(format!("b{i}"), *name, "", 1.0));
    }
    cols.extend([
        Column::new("packets", "total packets", "", 1.0),
        Column::new("full_partial", "full/partial", "", 1.0),
        Column::new("bytes", "bytes", "MB", 1e-6),
        Column::new("bytes_per_packet", "bytes/packet", "", 1.0),
        Column::new("host_bytes", "host wrote", "MB", 1e-6),
        Column::new("seconds", "run", "s", 1.0),
    ]);
    let mut t = Table::new(cols)?;
    let mut series = Vec::new();
    // The paper's rows first, as printed.
    for (row, label) in [("iSCSI", "paper: iSCSI"), ("STICS", "paper: STICS")] {
        let counts: Vec<f64> = BUCKETS.iter().map(|c| paper::base("004", "Table 3", row, c)).collect();
        series.push(Series::bars(label, buckets(&counts)));
        let mut cells = vec![label.into()];
        cells.extend(BUCKETS.iter().map(|c| paper::base("004", "Table 3", row, c).into()));
        let total = paper::base("004", "Table 4", row, "total packets");
        let bytes = paper::base("004", "Table 4", row, "bytes transferred");
        cells.extend([
            total.into(),
            paper::base("004", "Table 4", row, "full/partial packet ratio").into(),
            bytes.into(),
            paper::base("004", "Table 4", row, "average bytes/packet").into(),
            f64::NAN.into(),
            f64::NAN.into(),
        ]);
        t.push(cells)?;
    }
    let mut totals = Vec::new();
    let mut shipped = Vec::new();
    let mut sg_reads = Vec::new();
    for via in &vias {
        let remote = if via.is_link() { &sg.url } else { &target.url };
        let before = if via.is_link() { Some(SgReads::of(b, &wan)?) } else { None };
        let r = postmark_via(b, &wan, remote, None, via, super::fs::fs_mib(b), &pool)?;
        if let Some(before) = before {
            sg_reads.push((via.label(), before, SgReads::of(b, &wan)?));
        }
        bar.inc(1);
        let mut cells = vec![via.label().into()];
        cells.extend(r.sizes.iter().map(|&n| (n as f64).into()));
        series.push(Series::bars(via.label(), buckets(&r.sizes.iter().map(|&n| n as f64).collect::<Vec<_>>())));
        let full = r.sizes.last().copied().unwrap_or(0) as f64;
        let partial = r.packets as f64 - full;
        cells.extend([
            (r.packets as f64).into(),
            (full / partial).into(),
            (r.bytes as f64).into(),
            (r.bytes as f64 / r.packets as f64).into(),
            (r.host_bytes as f64).into(),
            r.seconds.into(),
        ]);
        t.push(cells)?;
        totals.push((via.label(), r.packets, r.bytes, r.host_bytes));
        if let Some(g) = r.groups {
            shipped.push((via.label(), g));
        }
    }
    bar.finish_and_clear();
    drop(sg);
    drop(target);
    drop(wan);
    let messages = if a.no_calls { None } else { Some(super::messages::table(b)?) };
    let mut r = Report::new(
        "packets",
        "Seed 004 Tables 3–4: WAN packets and bytes of a PostMark run, plain iSCSI against the gateway",
    );
    r.section(
        format!(
            "PostMark ({} files, {} transactions, {}) at {} and {} one way{}; packets by Ethernet frame length, \
             both directions, counted by stics wan from the run's start to the gateway drained after it",
            pool.files,
            pool.transactions,
            b.ext4_text(),
            a.rate,
            a.delay,
            super::fs::setup(b)
        ),
        t,
        Some(figure(series)),
    );
    if let Some(t) = messages {
        r.section(
            "Seed 002 Tables 2–3: iSCSI commands one call costs on ext4 over stics mount (loopback target), counted by \
             the initiator until the call returns and until a sync after it; cold = fresh mount after dropping every \
             cache, warm = after the same call on other names in the same directory",
            t,
            None,
        );
        r.note(
            "Seed 002 counted messages on ext3 with a 2004 Linux client; ext4 resolves paths and journals in the same \
             way but reads inode tables and directory blocks in larger pieces and commits its journal at sync, which \
             the + sync columns include.",
        );
    }
    // Ratios to plain iSCSI, when it ran (it is then the first path).
    if let (true, [(_, pp, pb, _), rest @ ..]) = (paths.contains(&Path::Plain), totals.as_slice()) {
        for (label, p, bytes, host) in rest {
            r.note(format!(
                "{label}: {:.2}× plain iSCSI's packets (paper: {:.2}×) and {:.2}× its bytes (paper: {:.2}×); {:.2}× the \
                 bytes the host wrote.",
                *p as f64 / *pp as f64,
                paper::base("004", "Table 4", "STICS", "total packets") / paper::base("004", "Table 4", "iSCSI", "total packets"),
                *bytes as f64 / *pb as f64,
                paper::base("004", "Table 4", "STICS", "bytes transferred")
                    / paper::base("004", "Table 4", "iSCSI", "bytes transferred"),
                *bytes as f64 / *host as f64,
            ));
        }
    }
    for (label, g) in &shipped {
        r.note(format!(
            "{label}: {} groups of {} epochs; the host's {:.1} MB merged to {:.1} MB ({:.3}×), shipped as {:.1} MB \
             ({:.3}× after merging: zstd and tables); {} epochs too large for a group went as plain writes.",
            g.groups,
            g.epochs,
            g.before_merge as f64 / 1e6,
            g.merged as f64 / 1e6,
            g.merged as f64 / g.before_merge.max(1) as f64,
            g.shipped as f64 / 1e6,
            g.shipped as f64 / g.merged.max(1) as f64,
            g.plain_epochs
        ));
    }
    for (label, before, after) in &sg_reads {
        let (journal, medium) =
            (after.journal.saturating_sub(before.journal), after.medium.saturating_sub(before.medium));
        let backlog = if after.unapplied == 0 {
            "every group was on the medium once the gateway had drained".to_owned()
        } else {
            format!(
                "{} groups were still to apply once the gateway had drained, the oldest {:.0} s old",
                after.unapplied, after.lag
            )
        };
        r.note(format!(
            "{label}: the SG's reads took {journal} blocks from groups not yet on its medium (held in memory) and \
             {medium} from the medium ({:.0} % from memory); {backlog}.",
            100.0 * journal as f64 / (journal + medium).max(1) as f64,
        ));
    }
    r.note(
        "The paper's STICS buckets add up to 1,039,100, not the 839,100 it prints as the total; its full/partial ratio \
         and bytes per packet agree with 1,039,100 (a 3.2× reduction, not 4×).",
    );
    r.note(
        "Seed 004 merged overwrites across the host's flushes; in front of a plain target the gateway keeps the \
         remote crash-consistent (no write of a later epoch before the earlier ones and a SYNCHRONIZE CACHE), so each \
         ext4 -o sync commit stays its own epoch and only overwrites within an epoch are absorbed. Over the link (+ \
         link: a stics SG, `stics target` over journal(file:…)), the epochs waiting while a group crosses the WAN \
         go as one merged, compressed group that the SG applies whole.",
    );
    Ok(r)
}

/// Bars of packets per frame-length bucket, one colour per path, on a logarithmic scale.
fn figure(series: Vec<Series>) -> Figure {
    Figure {
        title: "WAN packets by Ethernet frame length, PostMark".into(),
        x_label: "Ethernet frame length [B]".into(),
        y_label: "packets".into(),
        log_x: false,
        log_y: true,
        categories: ["≤ 64", "65–127", "128–255", "256–511", "512–1023", "> 1024"].map(String::from).to_vec(),
        series,
    }
}

/// `(bucket number from 1, count)` for a figure; empty buckets are left out of the log scale.
fn buckets(counts: &[f64]) -> Vec<(f64, f64)> {
    counts.iter().enumerate().filter(|(_, &n)| n > 0.0).map(|(i, &n)| (i as f64 + 1.0, n)).collect()
}

//! `stics bench postmark`: seed 004 Figs. 6–7 — PostMark's small and large pools at read/write
//! block sizes 512 B–8 KiB, plain iSCSI against the gateway in `log` and `immediate` modes, at
//! 100 Mbit/s and 1 Gbit/s through `stics wan`, with the paper's speedup ranges beside ours.

use stics_report::plot::{Figure, Series};
use stics_report::{Column, Table};

use super::fs::{postmark_via, Pool, Via};
use crate::paper;
use crate::peers::Wan;
use crate::{Bench, Error, Report, Result, Stat};

/// Options of `stics bench postmark`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Bottleneck rates, comma-separated (seed 004: 100 Mbit/s and 1 Gbit/s).
    #[arg(long, value_delimiter = ',', default_value = "100mbit,1gbit")]
    pub rates: Vec<String>,
    /// PostMark read/write block sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "512,1024,2048,4096,8192", value_parser = stics_units::parse_size)]
    pub blocks: Vec<u64>,
    /// Pools: small (1,000 files, 50,000 transactions), large (20,000 files, 100,000 transactions).
    #[arg(long, value_delimiter = ',', default_value = "small,large")]
    pub pools: Vec<String>,
    /// One-way delay of the link (seed 004 ran a LAN).
    #[arg(long, default_value = "0ms")]
    pub delay: String,
    /// ext4 size in MiB.
    #[arg(long, default_value_t = 1024)]
    pub fs_mib: u64,
}

fn pool(b: &Bench, name: &str, block: u64) -> Result<Pool> {
    let (files, transactions) = match (name, b.quick()) {
        ("small", false) => (1_000, 50_000),
        ("large", false) => (20_000, 100_000),
        ("small", true) => (200, 1_000),
        ("large", true) => (1_000, 2_000),
        _ => return Err(Error::Invalid(format!("unknown pool {name:?}: small or large"))),
    };
    Ok(Pool { files, transactions, block })
}

/// The paper's range for `mode` at `rate`, as speedups over plain iSCSI (low, high).
fn paper_range(rate: &str, mode: &str) -> (f64, f64) {
    let (fig, line) = match rate {
        "100mbit" => ("Fig. 6", "100 Mbit/s"),
        "1gbit" => ("Fig. 7", "1 Gbit/s"),
        _ => return (f64::NAN, f64::NAN),
    };
    if mode == "log" {
        let row = format!("postmark, {line}, report after complete vs iscsi");
        // A gain of 60 % is a speedup of 1.6.
        (1.0 + paper::base("004", fig, &row, "gain low"), 1.0 + paper::base("004", fig, &row, "gain high"))
    } else {
        let row = format!("postmark, {line}, immediate report vs iscsi");
        (paper::base("004", fig, &row, "speedup low"), paper::base("004", fig, &row, "speedup high"))
    }
}

pub fn run(b: &Bench, a: &Args) -> Result<Report> {
    let rates: Vec<String> = if b.quick() { a.rates.iter().take(1).cloned().collect() } else { a.rates.clone() };
    let blocks: Vec<u64> = if b.quick() { vec![4096] } else { a.blocks.clone() };
    let pools: Vec<String> = if b.quick() { vec!["small".into()] } else { a.pools.clone() };
    let vias = [Via::Plain, Via::gateway("log"), Via::gateway("immediate")];
    let fs = if b.quick() { super::fs::fs_mib(b) } else { a.fs_mib };
    let wan = Wan::up(b, &format!("sbpm{}", std::process::id()), &["--delay", &a.delay])?;
    let lun = b.work().join("remote.img");
    std::fs::File::create(&lun)?.set_len((a.fs_mib + 64) << 20)?;
    let target = wan.stics_target(b, "remote", "storage", &[&format!("file:{}", lun.display())])?;
    let bar = b.bar((rates.len() * blocks.len() * pools.len() * vias.len() * b.reps()) as u64, "postmark");
    let mut t = Table::new(vec![
        Column::new("rate", "link", "", 1.0),
        Column::new("pool", "pool", "", 1.0),
        Column::new("block", "block", "B", 1.0),
        Column::new("plain", "plain", "s", 1.0),
        Column::new("log", "log", "s", 1.0),
        Column::new("immediate", "immediate", "s", 1.0),
        Column::ratio("log_speedup", "log speedup", "plain", "log"),
        Column::new("paper_log", "paper", "text", 1.0),
        Column::ratio("immediate_speedup", "immediate speedup", "plain", "immediate"),
        Column::new("paper_immediate", "paper", "text", 1.0),
        Column::new("plain_wan", "plain on WAN", "Mbit/s", 1e-6),
        Column::new("log_bytes", "log WAN bytes", "× plain", 1.0),
        Column::new("fsck", "e2fsck", "", 1.0),
    ])?;
    let mut curves: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for rate in &rates {
        wan.set(b, &["--rate", rate])?;
        for p in &pools {
            let mut log_pts = Vec::new();
            let mut imm_pts = Vec::new();
            for &block in &blocks {
                let pool = pool(b, p, block)?;
                let mut secs = [Vec::new(), Vec::new(), Vec::new()];
                let mut bytes = [Vec::new(), Vec::new(), Vec::new()];
                let mut clean = true;
                for rep in 0..b.reps() {
                    for k in 0..vias.len() {
                        // Rotate the order so no path always runs first.
                        let i = (k + rep) % vias.len();
                        let r = postmark_via(b, &wan, &target.url, &vias[i], fs, &pool)?;
                        clean &= r.fsck_clean;
                        secs[i].push(r.seconds);
                        bytes[i].push(r.bytes as f64);
                        bar.inc(1);
                    }
                }
                let m = secs.map(|s| Stat::of(&s).median);
                let wan_bytes = bytes.map(|s| Stat::of(&s).median);
                let (ll, lh) = paper_range(rate, "log");
                let (il, ih) = paper_range(rate, "immediate");
                let range = |l: f64, h: f64| if l.is_nan() { String::new() } else { format!("{l:.2}–{h:.2}") };
                t.push(vec![
                    rate.as_str().into(),
                    p.as_str().into(),
                    (block as f64).into(),
                    m[0].into(),
                    m[1].into(),
                    m[2].into(),
                    range(ll, lh).into(),
                    range(il, ih).into(),
                    // Plain iSCSI's bytes all cross during its run; a gateway's partly after it.
                    (wan_bytes[0] * 8.0 / m[0]).into(),
                    (wan_bytes[1] / wan_bytes[0]).into(),
                    (if clean { "clean" } else { "ERRORS" }).into(),
                ])?;
                log_pts.push((block as f64, m[0] / m[1]));
                imm_pts.push((block as f64, m[0] / m[2]));
            }
            curves.push((format!("log, {p}, {rate}"), log_pts));
            curves.push((format!("immediate, {p}, {rate}"), imm_pts));
        }
    }
    bar.finish_and_clear();
    drop(target);
    drop(wan);
    let fig = Figure {
        title: "PostMark speedup of the gateway over plain iSCSI".into(),
        x_label: "PostMark block size [B]".into(),
        y_label: "speedup (plain / gateway run time)".into(),
        log_x: true,
        log_y: false,
        categories: Vec::new(),
        series: curves.into_iter().map(|(l, p)| Series::line(l, p)).collect(),
    };
    let mut r = Report::new(
        "postmark",
        "Seed 004 Figs. 6–7: PostMark, plain iSCSI against the gateway in log and immediate modes",
    );
    r.section(
        format!(
            "PostMark run time (medians of {} repetitions, order rotating), ext4 mounted -o sync over stics mount, \
             link at {} one way",
            b.reps(),
            a.delay
        ),
        t,
        Some(fig),
    );
    r.note(
        "Seed 004 ran PostMark on a LAN against a remote disk; its gateway hid the disk and the network behind \
         NVRAM and a log disk. Here the remote is a page-cached file, so plain iSCSI pays only the network and the \
         target's software: the gateway's gain is what it saves of that, and immediate mode adds what a local \
         fdatasync costs in log mode.",
    );
    r.note(
        "plain on WAN: the IP bytes of plain iSCSI's run, both directions, over its run time. Where that is the \
         link's rate the run is bound by the link, and a gateway that sends as many bytes (log WAN bytes, which \
         counts its destage until drained) can only finish ahead by what its log still holds when PostMark ends.",
    );
    r.note(
        "ext4 is mounted -o sync so that PostMark's writes reach the device; without it the runs fit the page cache.",
    );
    Ok(r)
}

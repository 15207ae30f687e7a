//! `stics bench micro`: seed 001's method (Figs. 1–2) on stics target and tgt in one run: the
//! latency at depth 1 of one cached block for 512 B to 64 KiB, the throughput with 8 requests in
//! flight, and the CPU seconds per GiB on the target and on the initiator side (seed 002 Table 9).

use stics_report::plot::{Figure, Series};
use stics_report::{Column, Table};

use super::{alternate, qemu_bench, scaled};
use crate::paper;
use crate::peers::{random_file, stics_target, tgt};
use crate::{Bench, Report, Result, Stat};

/// Options of `stics bench micro`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Reads of the one block per size (seed 001: 10,000).
    #[arg(long, default_value_t = 10_000)]
    pub reads: u64,
    /// Requests in flight for the throughput runs (seed 001: 8 threads).
    #[arg(long, default_value_t = 8)]
    pub threads: u64,
}

const SIZES: &[u64] = &[512, 1024, 2048, 4096, 8192, 16384, 32768, 65536];
const NAMES: [&str; 2] = ["stics", "tgt"];

pub fn run(b: &Bench, a: &Args) -> Result<Report> {
    let lun = if b.quick() { 128 << 20 } else { 512 << 20 };
    let sf = random_file(b, "stics.img", lun)?;
    let tf = random_file(b, "tgt.img", lun)?;
    let spec = format!("file:{}", sf.display());
    let targets = [stics_target(b, "stics-target", &[&spec])?, tgt(b, "tgt", &tf)?];
    let reads = scaled(b, a.reads, a.reads.min(1000));
    let bar = b.bar((SIZES.len() * b.reps() * 4) as u64, "micro");
    let mut lat = Table::new(vec![
        Column::new("size", "request", "B", 1.0),
        Column::new("paper", "paper", "µs", 1e6),
        Column::new("stics", "stics", "µs", 1e6),
        Column::new("tgt", "tgt", "µs", 1e6),
        Column::ratio("ratio", "stics/tgt", "stics", "tgt"),
        Column::new("spread", "spread (worse)", "%", 100.0),
    ])?;
    let mut thr = Table::new(vec![
        Column::new("size", "request", "B", 1.0),
        Column::new("paper", "paper", "MB/s", 1e-6),
        Column::new("stics", "stics", "MB/s", 1e-6),
        Column::new("tgt", "tgt", "MB/s", 1e-6),
        Column::ratio("ratio", "stics/tgt", "stics", "tgt"),
        Column::new("stics_target_cpu", "stics target CPU", "s/GiB", 1.0),
        Column::new("tgt_target_cpu", "tgt CPU", "s/GiB", 1.0),
        Column::new("stics_client_cpu", "initiator CPU (stics)", "s/GiB", 1.0),
        Column::new("tgt_client_cpu", "initiator CPU (tgt)", "s/GiB", 1.0),
    ])?;
    let mut curves: [Vec<(f64, f64)>; 4] = Default::default();
    // The points seed 001 prints in its text: Fig. 1's two ends and Fig. 2's peak.
    let mut paper_pts: [Vec<(f64, f64)>; 2] = Default::default();
    for &size in SIZES {
        let (mut l, mut t, mut tc, mut cc) = ([vec![], vec![]], [vec![], vec![]], [vec![], vec![]], [vec![], vec![]]);
        let count = scaled(b, (256u64 << 20) / size, (32u64 << 20) / size).clamp(2_000, 200_000);
        for rep in 0..b.reps() {
            for i in alternate(rep, [0usize, 1]) {
                let url = &targets[i].url;
                // Step 0: the same block every time, so it stays in every cache on the way.
                let (s, _) =
                    qemu_bench(b, url, &["-c", &reads.to_string(), "-d", "1", "-s", &size.to_string(), "-S", "0"])?;
                l[i].push(s / reads as f64);
                bar.inc(1);
                let c0 = targets[i].cpu_secs();
                let (s, client) = qemu_bench(
                    b,
                    url,
                    &["-c", &count.to_string(), "-d", &a.threads.to_string(), "-s", &size.to_string()],
                )?;
                let gib = (count * size) as f64 / f64::from(1u32 << 30);
                t[i].push((count * size) as f64 / s);
                tc[i].push((targets[i].cpu_secs() - c0) / gib);
                cc[i].push(client / gib);
                bar.inc(1);
            }
        }
        let m = |v: &Vec<f64>| Stat::of(v).median;
        let spread = Stat::of(&l[0]).spread().max(Stat::of(&l[1]).spread());
        // Seed 001 prints the two ends of Fig. 1 and the peak of Fig. 2 in its text.
        let row = match size {
            512 => "512 B block",
            65536 => "64 KB block",
            _ => "",
        };
        let paper_lat = paper::base("001", "Fig. 1", row, "average latency");
        let paper_thr = if size == 65536 {
            paper::base("001", "Fig. 2", "64 KB block, 8 threads", "peak throughput")
        } else {
            f64::NAN
        };
        lat.push(vec![(size as f64).into(), paper_lat.into(), m(&l[0]).into(), m(&l[1]).into(), spread.into()])?;
        thr.push(vec![
            (size as f64).into(),
            paper_thr.into(),
            m(&t[0]).into(),
            m(&t[1]).into(),
            m(&tc[0]).into(),
            m(&tc[1]).into(),
            m(&cc[0]).into(),
            m(&cc[1]).into(),
        ])?;
        let kib = size as f64 / 1024.0;
        if paper_lat.is_finite() {
            paper_pts[0].push((kib, paper_lat * 1e6));
        }
        if paper_thr.is_finite() {
            paper_pts[1].push((kib, paper_thr / 1e6));
        }
        for i in 0..2 {
            curves[i].push((kib, m(&l[i]) * 1e6));
            curves[2 + i].push((kib, m(&t[i]) / 1e6));
        }
    }
    bar.finish_and_clear();
    let fig = |title: &str, y: &str, a: &Vec<(f64, f64)>, c: &Vec<(f64, f64)>, p: &Vec<(f64, f64)>| Figure {
        title: title.into(),
        x_label: "request size [KiB]".into(),
        y_label: y.into(),
        log_x: true,
        log_y: false,
        categories: Vec::new(),
        series: [
            Series::line(NAMES[0], a.clone()),
            Series::line(NAMES[1], c.clone()),
            Series::scatter("paper (seed 001, its text)", p.clone()),
        ]
        .into_iter()
        .filter(|s| !s.points.is_empty())
        .collect(),
    };
    let mut r = Report::new(
        "micro",
        "Seed 001 Figs. 1–2: latency of one cached block and throughput, stics target against tgt",
    );
    r.section(
        format!("Latency at depth 1 of one cached block, {reads} reads per size (seed 001 Fig. 1)"),
        lat,
        Some(fig("Read latency, depth 1, one cached block", "latency [µs]", &curves[0], &curves[1], &paper_pts[0])),
    );
    r.section(
        format!("Sequential reads with {} in flight, CPU per GiB moved (seed 001 Fig. 2, seed 002 Table 9)", a.threads),
        thr,
        Some(fig(&format!("Read throughput, {} in flight", a.threads), "MB/s", &curves[2], &curves[3], &paper_pts[1])),
    );
    r.note(
        "Seed 001 measured a 1 Gbit/s LAN with interrupt-driven NICs, where copy and checksum dominated; here both \
         targets run on loopback on the same two cores as the client, so latency is the software path alone and \
         the ratio stics/tgt is what carries over.",
    );
    r.note("The initiator side is libiscsi inside qemu-img for both targets: its CPU per GiB shows what each target makes the client do.");
    Ok(r)
}

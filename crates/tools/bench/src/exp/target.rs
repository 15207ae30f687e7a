//! `stics bench target`: stics target against tgt, side by side in one run, both serving a file
//! LUN from the page cache to `qemu-img bench` (libiscsi): IOPS, bandwidth, latency, the share of
//! loopback TCP and server CPU per GiB (seed 002 Table 9, seed 001).

use stics_report::{Column, Table};

use super::{alternate, qemu_bench, scaled};
use crate::peers::{random_file, stics_target, tgt};
use crate::{Bench, Report, Result, Stat};

/// Options of `stics bench target`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Size of the LUN each target serves (random data, read once into the page cache).
    #[arg(long, default_value = "1GiB", value_parser = stics_units::parse_size)]
    pub lun_size: u64,
}

/// name, requests (full, quick), depth, bytes per request
const WORKLOADS: &[(&str, u64, u64, u64, u64)] = &[
    ("4k-qd32", 200_000, 50_000, 32, 4096),
    ("8k-qd1", 20_000, 10_000, 1, 8192),
    ("1M-qd8", 6_000, 2_000, 8, 1 << 20),
];

pub fn run(b: &Bench, a: &Args) -> Result<Report> {
    let lun = if b.quick() { a.lun_size.min(256 << 20) } else { a.lun_size };
    let sf = random_file(b, "stics.img", lun)?;
    let tf = random_file(b, "tgt.img", lun)?;
    let spec = format!("file:{}", sf.display());
    let targets = [stics_target(b, "stics-target", &[&spec])?, tgt(b, "tgt", &tf)?];
    let iperf = crate::machine::loopback_iperf3().unwrap_or(f64::NAN);
    let bar = b.bar((WORKLOADS.len() * b.reps() * 2) as u64, "qemu-img bench");
    let mut per = Table::new(vec![
        Column::new("workload", "workload", "", 1.0),
        Column::new("target", "target", "", 1.0),
        Column::new("iops", "IOPS", "", 1.0),
        Column::new("bandwidth", "bandwidth", "MB/s", 1e-6),
        Column::new("latency", "mean latency", "µs", 1e6),
        Column::new("loopback_share", "of loopback TCP", "%", 100.0),
        Column::new("cpu_per_gib", "server CPU", "s/GiB", 1.0),
        Column::new("spread", "spread", "%", 100.0),
    ])?;
    let mut cmp = Table::new(vec![
        Column::new("workload", "workload", "", 1.0),
        Column::new("stics", "stics", "IOPS", 1.0),
        Column::new("tgt", "tgt", "IOPS", 1.0),
        Column::ratio("ratio", "stics/tgt", "stics", "tgt"),
        Column::new("stics_cpu", "stics CPU", "s/GiB", 1.0),
        Column::new("tgt_cpu", "tgt CPU", "s/GiB", 1.0),
        Column::ratio("cpu_ratio", "CPU stics/tgt", "stics_cpu", "tgt_cpu"),
    ])?;
    for &(name, full, quick, depth, size) in WORKLOADS {
        let count = scaled(b, full, quick);
        let mut secs = [Vec::new(), Vec::new()];
        let mut cpu = [Vec::new(), Vec::new()];
        for rep in 0..b.reps() {
            for t in alternate(rep, [0usize, 1]) {
                let c0 = targets[t].cpu_secs();
                let args = ["-c", &count.to_string(), "-d", &depth.to_string(), "-s", &size.to_string()];
                let (s, _) = qemu_bench(b, &targets[t].url, &args)?;
                cpu[t].push(targets[t].cpu_secs() - c0);
                secs[t].push(s);
                bar.inc(1);
            }
        }
        let bytes = (count * size) as f64;
        let mut iops = [0.0; 2];
        let mut cpg = [0.0; 2];
        for (t, label) in ["stics", "tgt"].into_iter().enumerate() {
            let s = Stat::of(&secs[t]);
            iops[t] = count as f64 / s.median;
            cpg[t] = Stat::of(&cpu[t]).median / (bytes / f64::from(1u32 << 30));
            per.push(vec![
                name.into(),
                label.into(),
                iops[t].into(),
                (bytes / s.median).into(),
                (depth as f64 / iops[t]).into(),
                (bytes * 8.0 / s.median / iperf).into(),
                cpg[t].into(),
                s.spread().into(),
            ])?;
        }
        cmp.push(vec![name.into(), iops[0].into(), iops[1].into(), cpg[0].into(), cpg[1].into()])?;
    }
    bar.finish_and_clear();
    let mut r =
        Report::new("target", "stics target against tgt: a file LUN from the page cache, qemu-img bench over loopback");
    r.section(format!("Per target (medians of {} repetitions, order alternating)", b.reps()), per, None);
    r.section("stics / tgt", cmp, None);
    r.note(format!("Loopback TCP, one iperf3 stream, in the same run: {:.1} Gbit/s.", iperf / 1e9));
    r.note("Latency is depth / IOPS (Little's law) as qemu-img bench reports only the run time.");
    Ok(r)
}

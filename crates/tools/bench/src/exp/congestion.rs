//! `stics bench congestion`: seed 000 Table 3 / Fig. 6 — PostMark over seed 000's congestion
//! testbed (an OC-3 backbone, 155 Mbit/s, with a 0.46 ms round trip through its routers)
//! carrying background load 0–75 % of the backbone, with no cache and with host-side gateway
//! caches of 0.1 %, 1 % and 10 % of the working set.

use stics_report::plot::{Figure, Series};
use stics_report::{Column, Table};

use super::fs::{postmark_via, PoolArgs, Via};
use crate::paper;
use crate::peers::Wan;
use crate::{Bench, Report, Result, Stat};

/// Options of `stics bench congestion`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Background load as percent of the link's rate, comma-separated (seed 000: of the OC-3).
    #[arg(long, value_delimiter = ',', default_value = "0,20,40,55,70")]
    pub loads: Vec<u32>,
    /// One-way delay (seed 000: its routers' 0.46 ms round trip with no load; Table 3's delay
    /// column grows with load, which the emulated queue adds here).
    #[arg(long, default_value = "0.23ms")]
    pub delay: String,
    /// Link rate (seed 000: the OC-3 backbone the load shares, 155 Mbit/s; its hosts' Fast
    /// Ethernet edge, 100 Mbit/s, is not emulated apart).
    #[arg(long, default_value = "155mbit")]
    pub rate: String,
    #[command(flatten)]
    pub pool: PoolArgs,
}

pub fn run(b: &Bench, a: &Args) -> Result<Report> {
    let pool = a.pool.pool(b);
    let loads: Vec<u32> = if b.quick() { vec![0, 55] } else { a.loads.clone() };
    let ws = pool.working_set();
    let vias = [
        ("no cache", Via::Plain),
        ("0.1 %", Via::small_cache(ws / 1000, "host")),
        ("1 %", Via::small_cache(ws / 100, "host")),
        ("10 %", Via::small_cache(ws / 10, "host")),
    ];
    let wan = Wan::up(b, &format!("sbcg{}", std::process::id()), &["--delay", &a.delay, "--rate", &a.rate])?;
    let lun = b.work().join("remote.img");
    std::fs::File::create(&lun)?.set_len(1 << 30)?;
    let target = wan.stics_target(b, "remote", "storage", &[&b.remote_medium(&lun)])?;
    let bar = b.bar((loads.len() * vias.len() * b.reps()) as u64, "congestion");
    let mut cols =
        vec![Column::new("load", "background", "%", 1.0), Column::new("paper", "paper (BSD FFS)", "ops/s", 1.0)];
    for (l, _) in &vias {
        cols.push(Column::named(format!("tps_{}", l.replace([' ', '.', '%'], "")), *l, "tx/s", 1.0));
    }
    let mut t = Table::new(cols)?;
    let mut curves: Vec<Vec<(f64, f64)>> = vec![Vec::new(); vias.len()];
    for &load in &loads {
        let bg = format!("{load}%");
        wan.set(b, &["--background", &bg])?;
        let mut tps: Vec<Vec<f64>> = vec![Vec::new(); vias.len()];
        for rep in 0..b.reps() {
            for k in 0..vias.len() {
                let i = (k + rep) % vias.len();
                let r = postmark_via(b, &wan, &target.url, None, &vias[i].1, super::fs::fs_mib(b), &pool)?;
                tps[i].push(pool.transactions as f64 / r.seconds);
                bar.inc(1);
            }
        }
        let paper =
            paper::lookup("000", "Table 3", &format!("load {load}%"), "postmark bsd ffs").map_or(f64::NAN, |v| v.value);
        let mut cells = vec![f64::from(load).into(), paper.into()];
        for (i, s) in tps.iter().enumerate() {
            let m = Stat::of(s).median;
            cells.push(m.into());
            curves[i].push((f64::from(load), m));
        }
        t.push(cells)?;
    }
    bar.finish_and_clear();
    drop(target);
    drop(wan);
    let fig = Figure {
        title: format!("PostMark under background load, {} one way, {}", a.delay, a.rate),
        x_label: "background load [% of the link]".into(),
        y_label: "PostMark transactions/s".into(),
        log_x: false,
        log_y: false,
        categories: Vec::new(),
        series: vias.iter().zip(curves).map(|((l, _), p)| Series::line(*l, p)).chain(paper_curves()).collect(),
    };
    let mut r = Report::new(
        "congestion",
        "Seed 000 Table 3 / Fig. 6: PostMark under background load, with and without a host-side cache",
    );
    r.section(
        format!(
            "PostMark ({} files, {} transactions, {}) transactions/s against background load on a {} link, \
             {} one way; caches are the gateway's RAM buffer and read cache as a share of the {} KiB working set",
            pool.files,
            pool.transactions,
            b.ext4_text(),
            a.rate,
            a.delay,
            ws / 1024
        ),
        t,
        Some(fig),
    );
    r.note(
        "Seed 000 measured PostMark falling from 64 to 26 transactions/s (FreeBSD FFS) as background load rose to \
         70 %, with no cache; its Fig. 6 shows a host-side cache of a small share of the working set holding the \
         rate up. The background here is stics wan's generated traffic with seed 000's packet-size mix.",
    );
    r.note("Every gateway run also has its 256 MiB write log, which absorbs the writes whatever the cache size.");
    Ok(r)
}

/// Seed 000 Table 3's PostMark columns (no cache) at every load it prints.
fn paper_curves() -> Vec<Series> {
    [("postmark bsd ffs", "paper: FreeBSD FFS"), ("postmark bsd softupd", "paper: FreeBSD Soft Updates")]
        .into_iter()
        .map(|(column, label)| {
            let points = paper::values()
                .iter()
                .filter(|v| v.seed == "000" && v.place == "Table 3" && v.column == column)
                .filter_map(|v| {
                    let load = v.row.strip_prefix("load ")?.strip_suffix('%')?.parse::<f64>().ok()?;
                    Some((load, v.value))
                })
                .collect();
            Series::scatter(label, points)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_figure_carries_the_papers_postmark_columns() {
        let c = super::paper_curves();
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].points.len(), 9, "FFS at 0–70 %: {:?}", c[0].points);
        assert!(c[0].points.contains(&(0.0, 64.0)) && c[0].points.contains(&(70.0, 26.0)), "{:?}", c[0].points);
        assert!(c[1].points.contains(&(0.0, 80.0)), "{:?}", c[1].points);
    }
}

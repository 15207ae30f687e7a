//! `stics bench postmark`: seed 004 Figs. 6–7 — PostMark's small and large pools at read/write
//! block sizes 512 B–8 KiB, plain iSCSI against the gateway in `log` and `immediate` modes, at
//! 100 Mbit/s and 1 Gbit/s through `stics wan`, with the paper's speedup ranges beside ours.

use stics_report::plot::{Figure, Series};
use stics_report::{Column, Table};

use super::curve;
use super::fs::{postmark_via, sg_lun, Pool, Via, SG_PORT};
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
    /// One-way delay of the link, or `lan`: half the round trip seed 004 measured on its LAN at
    /// each rate (128.99 µs at 100 Mbit/s, 106.78 µs at 1 Gbit/s; other rates are refused).
    #[arg(long, default_value = "0ms")]
    pub delay: String,
    /// ext4 size in MiB.
    #[arg(long, default_value_t = 1024)]
    pub fs_mib: u64,
    /// Measure nothing: draw one table and figure from earlier runs' report folders (each an
    /// `--out DIR` or its `postmark/` folder), for a sweep too long to run in one go. Rows are
    /// ordered by --rates, --pools and block size; give the setup options the runs had
    /// (--remote-disk, --host-memory, --ext4-default): the caption names them.
    #[arg(long, value_delimiter = ',', value_name = "DIR,...")]
    pub merge: Vec<std::path::PathBuf>,
}

/// One row of the table: a slice's medians, measured here or read back from a report folder.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
struct Slice {
    rate: String,
    pool: String,
    block: f64,
    plain: f64,
    log: f64,
    immediate: f64,
    /// Plain iSCSI's IP bits per second of its run; absent from folders older than the column.
    #[serde(default)]
    plain_wan: Option<f64>,
    /// The gateway's WAN bytes in log mode over plain iSCSI's.
    #[serde(default)]
    log_bytes: Option<f64>,
    /// The gateway in log mode over the link to a stics SG: run time, and WAN bytes over plain
    /// iSCSI's; absent from folders older than the column.
    #[serde(default)]
    link: Option<f64>,
    #[serde(default)]
    link_bytes: Option<f64>,
    fsck: String,
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
    if !a.merge.is_empty() {
        let slices = merged(a)?;
        let caption = format!(
            "PostMark run time, each row the medians of its own run (merged from {} folders: {}), {} over stics \
             mount{}",
            a.merge.len(),
            a.merge.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "),
            b.ext4_text(),
            super::fs::setup(b)
        );
        return report(&slices, caption, b.remote_disk());
    }
    let rates: Vec<String> = if b.quick() { a.rates.iter().take(1).cloned().collect() } else { a.rates.clone() };
    let blocks: Vec<u64> = if b.quick() { vec![4096] } else { a.blocks.clone() };
    let pools: Vec<String> = if b.quick() { vec!["small".into()] } else { a.pools.clone() };
    let vias = [Via::Plain, Via::gateway("log"), Via::gateway("immediate"), Via::link("log")];
    let fs = if b.quick() { super::fs::fs_mib(b) } else { a.fs_mib };
    let delays = rates.iter().map(|r| one_way(&a.delay, r)).collect::<Result<Vec<String>>>()?;
    let wan = Wan::up(b, &format!("sbpm{}", std::process::id()), &["--delay", &delays[0]])?;
    let lun = b.work().join("remote.img");
    std::fs::File::create(&lun)?.set_len((a.fs_mib + 64) << 20)?;
    let target = wan.stics_target(b, "remote", "storage", &[&b.remote_medium(&lun)])?;
    let sg = wan.stics_target_on(b, "sg", "storage", SG_PORT, &[&sg_lun(b, "sg", (a.fs_mib + 64) << 20)?])?;
    let bar = b.bar((rates.len() * blocks.len() * pools.len() * vias.len() * b.reps()) as u64, "postmark");
    let mut slices = Vec::new();
    for (rate, delay) in rates.iter().zip(&delays) {
        wan.set(b, &["--rate", rate, "--delay", delay])?;
        for p in &pools {
            for &block in &blocks {
                let pool = pool(b, p, block)?;
                let mut secs = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
                let mut bytes = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
                let mut clean = true;
                for rep in 0..b.reps() {
                    for k in 0..vias.len() {
                        // Rotate the order so no path always runs first.
                        let i = (k + rep) % vias.len();
                        let remote = if vias[i].is_link() { &sg.url } else { &target.url };
                        let r = postmark_via(b, &wan, remote, &vias[i], fs, &pool)?;
                        clean &= r.fsck_clean;
                        secs[i].push(r.seconds);
                        bytes[i].push(r.bytes as f64);
                        bar.inc(1);
                    }
                }
                let m = secs.map(|s| Stat::of(&s).median);
                let wan_bytes = bytes.map(|s| Stat::of(&s).median);
                slices.push(Slice {
                    rate: rate.clone(),
                    pool: p.clone(),
                    block: block as f64,
                    plain: m[0],
                    log: m[1],
                    immediate: m[2],
                    // Plain iSCSI's bytes all cross during its run; a gateway's partly after it.
                    plain_wan: Some(wan_bytes[0] * 8.0 / m[0]),
                    log_bytes: Some(wan_bytes[1] / wan_bytes[0]),
                    link: Some(m[3]),
                    link_bytes: Some(wan_bytes[3] / wan_bytes[0]),
                    fsck: (if clean { "clean" } else { "ERRORS" }).into(),
                });
            }
        }
    }
    bar.finish_and_clear();
    drop(sg);
    drop(target);
    drop(wan);
    let link = if a.delay == "lan" {
        format!("on seed 004's LAN round trips ({} one way)", delays.join(", "))
    } else {
        format!("at {} one way", a.delay)
    };
    let setup = super::fs::setup(b);
    let caption = format!(
        "PostMark run time (medians of {} repetitions, order rotating), {} over stics mount, link {link}{setup}",
        b.reps(),
        b.ext4_text(),
    );
    report(&slices, caption, b.remote_disk())
}

/// The one-way delay for `rate`: `delay` itself, or for `lan` half of seed 004's measured LAN
/// round trip at that rate.
fn one_way(delay: &str, rate: &str) -> Result<String> {
    if delay != "lan" {
        return Ok(delay.to_owned());
    }
    let bits = stics_units::parse_rate(rate).map_err(|e| crate::Error::Invalid(e.to_string()))?;
    let row = match bits.round() as u64 {
        100_000_000 => "100 Mbit/s switch",
        1_000_000_000 => "1 Gbit/s switch",
        _ => {
            return Err(crate::Error::Invalid(format!(
                "--delay lan: seed 004 measured its LAN at 100mbit and 1gbit only, not at {rate}"
            )))
        }
    };
    let rtt = paper::base("004", "§4.3.1", row, "average network latency");
    Ok(format!("{:.2}us", rtt / 2.0 * 1e6))
}

/// The rows of the report folders in `a.merge`, ordered by `a.rates`, `a.pools` and block size.
fn merged(a: &Args) -> Result<Vec<Slice>> {
    let mut slices: Vec<(Slice, &std::path::Path)> = Vec::new();
    for dir in &a.merge {
        let path = [dir.join("postmark").join("table-1.json"), dir.join("table-1.json")]
            .into_iter()
            .find(|p| p.is_file())
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "{}: no postmark report there (neither postmark/table-1.json nor table-1.json)",
                    dir.display()
                ))
            })?;
        let bad = |detail: String| Error::Output { what: path.display().to_string(), detail };
        let text = std::fs::read_to_string(&path)?;
        let rows = match serde_json::from_str(&text).map_err(|e| bad(e.to_string()))? {
            serde_json::Value::Array(rows) => rows,
            // Folders written before tables of one row became arrays.
            one @ serde_json::Value::Object(_) => vec![one],
            _ => return Err(bad("neither a row nor an array of rows".into())),
        };
        for row in rows {
            let s: Slice = serde_json::from_value(row).map_err(|e| bad(format!("not a postmark row: {e}")))?;
            if let Some((_, other)) =
                slices.iter().find(|(o, _)| (&o.rate, &o.pool, o.block) == (&s.rate, &s.pool, s.block))
            {
                return Err(Error::Invalid(format!(
                    "{} and {} both hold {} {} {} B: merge each slice once",
                    other.display(),
                    dir.display(),
                    s.rate,
                    s.pool,
                    s.block
                )));
            }
            slices.push((s, dir));
        }
    }
    let rank = |order: &[String], x: &str| order.iter().position(|o| o == x).unwrap_or(order.len());
    let mut slices: Vec<Slice> = slices.into_iter().map(|(s, _)| s).collect();
    slices.sort_by(|x, y| {
        (rank(&a.rates, &x.rate), &x.rate, rank(&a.pools, &x.pool), &x.pool)
            .cmp(&(rank(&a.rates, &y.rate), &y.rate, rank(&a.pools, &y.pool), &y.pool))
            .then(x.block.total_cmp(&y.block))
    });
    Ok(slices)
}

/// The table, the figure (speedup against block size, a curve per mode, pool and rate) and the
/// reading of `slices`; `disk` names the disk model the remote's medium sat behind, if any.
fn report(slices: &[Slice], caption: String, disk: Option<stics_disk::Preset>) -> Result<Report> {
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
        Column::new("link", "log + link", "s", 1.0),
        Column::ratio("link_speedup", "link speedup", "plain", "link"),
        Column::new("link_bytes", "link WAN bytes", "× plain", 1.0),
        Column::new("fsck", "e2fsck", "", 1.0),
    ])?;
    // Block sizes are steps of a sweep (powers of two by default): one evenly spaced, named
    // position each, where a log axis would label only 1000 of 512–8192.
    let mut blocks: Vec<f64> = slices.iter().map(|s| s.block).collect();
    blocks.sort_by(f64::total_cmp);
    blocks.dedup();
    let at = |block: f64| blocks.iter().position(|&b| b == block).map_or(f64::NAN, |i| i as f64 + 1.0);
    let mut curves: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    let mut paper: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    let range = |l: f64, h: f64| if l.is_nan() { String::new() } else { format!("{l:.2}–{h:.2}") };
    for s in slices {
        let (ll, lh) = paper_range(&s.rate, "log");
        let (il, ih) = paper_range(&s.rate, "immediate");
        t.push(vec![
            s.rate.as_str().into(),
            s.pool.as_str().into(),
            s.block.into(),
            s.plain.into(),
            s.log.into(),
            s.immediate.into(),
            range(ll, lh).into(),
            range(il, ih).into(),
            s.plain_wan.unwrap_or(f64::NAN).into(),
            s.log_bytes.unwrap_or(f64::NAN).into(),
            s.link.unwrap_or(f64::NAN).into(),
            s.link_bytes.unwrap_or(f64::NAN).into(),
            s.fsck.as_str().into(),
        ])?;
        let x = at(s.block);
        curve(&mut curves, format!("log, {}, {}", s.pool, s.rate)).push((x, s.plain / s.log));
        curve(&mut curves, format!("immediate, {}, {}", s.pool, s.rate)).push((x, s.plain / s.immediate));
        if let Some(link) = s.link {
            curve(&mut curves, format!("log + link, {}, {}", s.pool, s.rate)).push((x, s.plain / link));
        }
        // The paper's range at every block size, so that the axis takes it in: once per rate,
        // whatever the pools.
        for (mode, lo, hi) in [("log", ll, lh), ("immediate", il, ih)] {
            let pts = curve(&mut paper, format!("paper: {mode}, {} (low, high)", s.rate));
            if !lo.is_nan() && !pts.iter().any(|p| p.0 == x) {
                pts.extend([(x, lo), (x, hi)]);
            }
        }
    }
    paper.retain(|(_, pts)| !pts.is_empty());
    let series = curves
        .into_iter()
        .map(|(l, p)| Series::line(l, p))
        .chain(paper.into_iter().map(|(l, p)| Series::scatter(l, p)))
        .collect();
    let fig = Figure {
        title: "PostMark speedup of the gateway over plain iSCSI".into(),
        x_label: "PostMark block size [B]".into(),
        y_label: "speedup (plain / gateway run time)".into(),
        log_x: false,
        log_y: false,
        categories: blocks.iter().map(ToString::to_string).collect(),
        series,
    };
    let mut r = Report::new(
        "postmark",
        "Seed 004 Figs. 6–7: PostMark, plain iSCSI against the gateway in log and immediate modes",
    );
    r.section(caption, t, Some(fig));
    let here = match disk {
        None => "Here the remote is a page-cached file, so plain iSCSI pays only the network and the target's \
                 software: the gateway's gain is what it saves of that, and immediate mode adds what a local \
                 fdatasync costs in log mode."
            .to_owned(),
        Some(m) => format!(
            "Here the remote's medium sits behind the {m} disk model, so plain iSCSI waits for the model's seeks and \
             rotations as well as the network, and the gateway's gain is what its log hides of both."
        ),
    };
    r.note(format!(
        "Seed 004 ran PostMark on a LAN against a remote disk; its gateway hid the disk and the network behind NVRAM \
         and a log disk. {here}"
    ));
    r.note(
        "plain on WAN: the IP bytes of plain iSCSI's run, both directions, over its run time. Where that is the \
         link's rate the run is bound by the link, and a gateway that sends as many bytes (log WAN bytes, which \
         counts its destage until drained) can only finish ahead by what its log still holds when PostMark ends.",
    );
    for s in slices {
        if let Some(note) = link_reading(s) {
            r.note(note);
        }
    }
    r.note(
        "Mounted -o sync (the default here), ext4 sends every PostMark write to the device before the call returns; \
         with its default mount (--ext4-default, the papers' ordinary file systems) writes wait in the host's page \
         cache until ext4 commits (every 5 s) or memory runs short, so a run that fits the page cache barely \
         touches the LUN unless the host's memory is bounded (--host-memory).",
    );
    Ok(r)
}

/// The link's run time against today's gateway (goal: no worse) and its WAN bytes against plain
/// iSCSI's, for a slice that ran it.
fn link_reading(s: &Slice) -> Option<String> {
    let link = s.link?;
    let bytes = s.link_bytes.map(|x| format!("; {x:.2}× plain iSCSI's WAN bytes")).unwrap_or_default();
    Some(format!(
        "{} {} {} B: log + link ran {:.2}× the time of log mode over plain destage (goal: at most 1.00×){bytes}.",
        s.rate,
        s.pool,
        s.block,
        link / s.log
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(merge: Vec<std::path::PathBuf>) -> Args {
        let cmd = <Args as clap::Args>::augment_args(clap::Command::new("postmark"));
        let mut a = <Args as clap::FromArgMatches>::from_arg_matches(&cmd.get_matches_from(["postmark"])).unwrap();
        a.merge = merge;
        a
    }

    fn folder(root: &std::path::Path, name: &str, json: &str) -> std::path::PathBuf {
        let d = root.join(name);
        std::fs::create_dir_all(d.join("postmark")).unwrap();
        std::fs::write(d.join("postmark").join("table-1.json"), json).unwrap();
        d
    }

    const ROW: &str = r#"{"rate": "RATE", "pool": "POOL", "block": BLOCK, "plain": 150.0, "log": 160.0,
        "immediate": 140.0, "log_speedup": 0.9375, "paper_log": "", "immediate_speedup": 1.07,
        "paper_immediate": "", "plain_wan": 2e8, "log_bytes": 1.0, "fsck": "clean"}"#;

    fn row(rate: &str, pool: &str, block: u32) -> String {
        ROW.replace("RATE", rate).replace("POOL", pool).replace("BLOCK", &block.to_string())
    }

    #[test]
    fn merges_slices_in_the_order_of_rates_pools_and_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let a = folder(dir.path(), "a", &format!("[{}, {}]", row("1gbit", "small", 4096), row("1gbit", "small", 512)));
        // A folder from before one-row tables were arrays, and before the WAN columns.
        let old = row("100mbit", "large", 4096).replace(r#""plain_wan": 2e8, "log_bytes": 1.0,"#, "");
        let b = folder(dir.path(), "b", &old);
        let c = dir.path().join("c");
        std::fs::create_dir_all(&c).unwrap();
        let linked = row("100mbit", "small", 8192).replace(r#""fsck""#, r#""link": 120.0, "link_bytes": 0.25, "fsck""#);
        std::fs::write(c.join("table-1.json"), format!("[{linked}]")).unwrap();
        let slices = merged(&args(vec![a, b, c])).unwrap();
        let keys: Vec<(&str, &str, f64)> = slices.iter().map(|s| (s.rate.as_str(), s.pool.as_str(), s.block)).collect();
        assert_eq!(
            keys,
            [
                ("100mbit", "small", 8192.0),
                ("100mbit", "large", 4096.0),
                ("1gbit", "small", 512.0),
                ("1gbit", "small", 4096.0)
            ]
        );
        assert_eq!((slices[1].plain_wan, slices[0].plain_wan), (None, Some(2e8)));
        assert_eq!((slices[0].link, slices[0].link_bytes, slices[1].link), (Some(120.0), Some(0.25), None));
        assert_eq!(
            link_reading(&slices[0]).unwrap(),
            "100mbit small 8192 B: log + link ran 0.75× the time of log mode over plain destage (goal: at most \
             1.00×); 0.25× plain iSCSI's WAN bytes."
        );
        assert_eq!(link_reading(&slices[1]), None);
        let r = report(&slices, "merged".into(), None).unwrap();
        let rows = r.sections[0].table.rows_json();
        assert_eq!(rows.as_array().unwrap().len(), 4);
        assert!(rows[1]["plain_wan"].is_null(), "{rows}");
        assert_eq!(rows[0]["link_speedup"], 150.0 / 120.0);
        assert!(rows[1]["link"].is_null() && rows[1]["link_speedup"].is_null(), "{rows}");
        assert_eq!(rows[2]["paper_log"], "1.51–1.80");
        let fig = r.sections[0].figure.as_ref().unwrap();
        let labels: Vec<&str> = fig.series.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "log, small, 100mbit",
                "immediate, small, 100mbit",
                "log + link, small, 100mbit",
                "log, large, 100mbit",
                "immediate, large, 100mbit",
                "log, small, 1gbit",
                "immediate, small, 1gbit",
                "paper: log, 100mbit (low, high)",
                "paper: immediate, 100mbit (low, high)",
                "paper: log, 1gbit (low, high)",
                "paper: immediate, 1gbit (low, high)"
            ]
        );
        let (lo, hi) = paper_range("1gbit", "log");
        assert_eq!(fig.series[9].points, [(1.0, lo), (1.0, hi), (2.0, lo), (2.0, hi)], "the paper at every block size");
        assert_eq!(fig.categories, ["512", "4096", "8192"]);
        assert_eq!(fig.series[5].points, [(1.0, 150.0 / 160.0), (2.0, 150.0 / 160.0)]);
        assert_eq!(fig.series[0].points, [(3.0, 150.0 / 160.0)]);
    }

    #[test]
    fn lan_is_half_the_papers_round_trip_at_its_two_rates() {
        assert_eq!(one_way("lan", "100mbit").unwrap(), "64.50us");
        assert_eq!(one_way("lan", "1gbit").unwrap(), "53.39us");
        assert_eq!(one_way("2ms", "10mbit").unwrap(), "2ms");
        assert!(one_way("lan", "10mbit").unwrap_err().to_string().contains("100mbit and 1gbit"));
    }

    #[test]
    fn a_merge_names_what_it_cannot_use() {
        let dir = tempfile::tempdir().unwrap();
        let err = |a: Args| merged(&a).unwrap_err().to_string();
        let e = err(args(vec![dir.path().join("none")]));
        assert!(e.contains("no postmark report"), "{e}");
        let a = folder(dir.path(), "a", &format!("[{}]", row("1gbit", "small", 4096)));
        let b = folder(dir.path(), "b", &row("1gbit", "small", 4096));
        let e = err(args(vec![a.clone(), b]));
        assert!(e.contains("both hold 1gbit small 4096") && e.contains("merge each slice once"), "{e}");
        let torn = folder(dir.path(), "torn", "[{\"rate\": ");
        assert!(err(args(vec![torn])).contains("table-1.json"));
        let other = folder(dir.path(), "other", r#"[{"size": 4096, "lat": 1e-5}]"#);
        let e = err(args(vec![a, other]));
        assert!(e.contains("not a postmark row"), "{e}");
    }
}

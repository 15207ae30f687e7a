//! `stics bench postmark`: seed 004 Figs. 6–7 — PostMark's small and large pools at read/write
//! block sizes 512 B–8 KiB, plain iSCSI against the gateway in `log` and `immediate` modes, at
//! 100 Mbit/s and 1 Gbit/s through `stics wan`, with the paper's speedup ranges beside ours.

use stics_report::plot::{Figure, Series};
use stics_report::{Column, Table};

use super::curve;
use super::fs::{postmark_via, sg_lun, Metrics, Pool, Via, SG_METRICS, SG_PORT};
use crate::paper;
use crate::peers::{Waits, Wan};
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
    /// ordered by --rates, --pools and block size; a slice in several folders takes each path
    /// from the last folder that has it (see --paths). Give the setup options the runs had
    /// (--remote-disk, --host-memory, --ext4-default): the caption names them.
    #[arg(long, value_delimiter = ',', value_name = "DIR,...")]
    pub merge: Vec<std::path::PathBuf>,
    /// The paths to run, comma-separated (default: all four, in this order). A path run again
    /// alone (on a quieter machine, say) joins the run that has the others with --merge.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub paths: Vec<Path>,
}

/// A path PostMark's traffic takes to the remote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Path {
    /// Plain iSCSI to the target.
    Plain,
    /// Through a gateway in log mode ("report after complete"), then plain iSCSI.
    Log,
    /// Through a gateway in immediate mode ("immediate report"), then plain iSCSI.
    Immediate,
    /// Through a gateway in log mode over the link to a stics SG.
    LogLink,
}

impl Path {
    const ALL: [Path; 4] = [Path::Plain, Path::Log, Path::Immediate, Path::LogLink];

    fn via(self) -> Via {
        match self {
            Path::Plain => Via::Plain,
            Path::Log => Via::gateway("log"),
            Path::Immediate => Via::gateway("immediate"),
            Path::LogLink => Via::link("log"),
        }
    }
}

/// One row of the table: a slice's medians, measured here or read back from a report folder;
/// a path not run is `None`.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
struct Slice {
    rate: String,
    pool: String,
    block: f64,
    #[serde(default)]
    plain: Option<f64>,
    #[serde(default)]
    log: Option<f64>,
    #[serde(default)]
    immediate: Option<f64>,
    /// Plain iSCSI's IP bits per second of its run; absent from folders older than the column.
    #[serde(default)]
    plain_wan: Option<f64>,
    /// The gateway's WAN bytes in log mode over plain iSCSI's (both run in the same run).
    #[serde(default)]
    log_bytes: Option<f64>,
    /// The gateway in log mode over the link to a stics SG: run time, and WAN bytes over plain
    /// iSCSI's (in the same run); absent from folders older than the column.
    #[serde(default)]
    link: Option<f64>,
    #[serde(default)]
    link_bytes: Option<f64>,
    fsck: String,
}

impl Slice {
    /// Takes the paths `other` (the same slice, from a later run) has: added where this one left
    /// them out, replacing where both have them (returned, so that the report says so). What
    /// relates two paths (WAN bytes over plain iSCSI's) comes along only with the path it was
    /// measured with.
    fn join(&mut self, other: Slice) -> Vec<Path> {
        let mut replaced = Vec::new();
        let mut take = |path: Path, mine: &mut Option<f64>, theirs: Option<f64>| {
            let Some(t) = theirs else { return false };
            if mine.is_some() {
                replaced.push(path);
            }
            *mine = Some(t);
            true
        };
        if take(Path::Plain, &mut self.plain, other.plain) {
            self.plain_wan = other.plain_wan;
        }
        if take(Path::Log, &mut self.log, other.log) {
            self.log_bytes = other.log_bytes;
        }
        take(Path::Immediate, &mut self.immediate, other.immediate);
        if take(Path::LogLink, &mut self.link, other.link) {
            self.link_bytes = other.link_bytes;
        }
        if other.fsck != "clean" {
            self.fsck = other.fsck;
        }
        replaced
    }
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

/// Where the remote target's metrics listen, in the storage namespace.
const REMOTE_METRICS: &str = "127.0.0.1:9121";

/// One row of the second table: the commands one side of a path answered per run, by kind.
#[derive(Debug, Clone, PartialEq)]
struct WaitRow {
    rate: String,
    pool: String,
    block: f64,
    path: Path,
    /// "gateway" (the host's commands) or "remote" (the target's or the SG's).
    at: &'static str,
    kind: String,
    commands: f64,
    secs: f64,
}

impl WaitRow {
    /// The rows of one path's readings over its repetitions, means per run: one per kind the
    /// target counts, zeros for a kind that saw no command, so that every run has the same rows.
    fn of(s: &Slice, path: Path, at: &'static str, runs: &[Waits]) -> Vec<WaitRow> {
        if runs.is_empty() {
            return Vec::new();
        }
        let mean = Waits::mean(runs);
        ["read", "write", "flush", "other"]
            .into_iter()
            .map(|kind| {
                let w = mean.0.get(kind).copied().unwrap_or_default();
                WaitRow {
                    rate: s.rate.clone(),
                    pool: s.pool.clone(),
                    block: s.block,
                    path,
                    at,
                    kind: kind.to_owned(),
                    commands: w.commands,
                    secs: w.secs,
                }
            })
            .collect()
    }
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
        let (slices, mut notes) = merged(a)?;
        notes.push(
            "The commands each side answered (the second table of a measured run) are not merged: each folder \
             holds its own."
                .into(),
        );
        let caption = format!(
            "PostMark run time, each path of a row the medians of its own run (merged from {} folders: {}), {} over \
             stics mount{}",
            a.merge.len(),
            a.merge.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "),
            b.ext4_text(),
            super::fs::setup(b)
        );
        let mut r = report(&slices, &[], caption, b.remote_disk())?;
        for n in notes {
            r.note(n);
        }
        return Ok(r);
    }
    let rates: Vec<String> = if b.quick() { a.rates.iter().take(1).cloned().collect() } else { a.rates.clone() };
    let blocks: Vec<u64> = if b.quick() { vec![4096] } else { a.blocks.clone() };
    let pools: Vec<String> = if b.quick() { vec!["small".into()] } else { a.pools.clone() };
    let paths: Vec<Path> = Path::ALL.into_iter().filter(|p| a.paths.is_empty() || a.paths.contains(p)).collect();
    let vias: Vec<Via> = paths.iter().map(|p| p.via()).collect();
    let fs = if b.quick() { super::fs::fs_mib(b) } else { a.fs_mib };
    let delays = rates.iter().map(|r| one_way(&a.delay, r)).collect::<Result<Vec<String>>>()?;
    let wan = Wan::up(b, &format!("sbpm{}", std::process::id()), &["--delay", &delays[0]])?;
    let lun = b.work().join("remote.img");
    std::fs::File::create(&lun)?.set_len((a.fs_mib + 64) << 20)?;
    let target = wan.stics_target_on_with(
        b,
        "remote",
        "storage",
        3260,
        &[&b.remote_medium(&lun)],
        &["--metrics", REMOTE_METRICS],
    )?;
    let sg = if paths.contains(&Path::LogLink) {
        let luns = [sg_lun(b, "sg", (a.fs_mib + 64) << 20)?];
        Some(wan.stics_target_on_with(b, "sg", "storage", SG_PORT, &[&luns[0]], &["--metrics", SG_METRICS])?)
    } else {
        None
    };
    let bar = b.bar((rates.len() * blocks.len() * pools.len() * vias.len() * b.reps()) as u64, "postmark");
    let mut slices = Vec::new();
    let mut waits = Vec::new();
    for (rate, delay) in rates.iter().zip(&delays) {
        wan.set(b, &["--rate", rate, "--delay", delay])?;
        for p in &pools {
            for &block in &blocks {
                let pool = pool(b, p, block)?;
                let mut secs = vec![Vec::new(); vias.len()];
                let mut bytes = vec![Vec::new(); vias.len()];
                let (mut at_gateway, mut at_remote) = (vec![Vec::new(); vias.len()], vec![Vec::new(); vias.len()]);
                let mut clean = true;
                for rep in 0..b.reps() {
                    for k in 0..vias.len() {
                        // Rotate the order so no path always runs first.
                        let i = (k + rep) % vias.len();
                        let (remote, addr) = match (&sg, vias[i].is_link()) {
                            (Some(sg), true) => (&sg.url, SG_METRICS),
                            _ => (&target.url, REMOTE_METRICS),
                        };
                        let metrics = Metrics { role: "storage", addr };
                        let r = postmark_via(b, &wan, remote, Some(metrics), &vias[i], fs, &pool)?;
                        clean &= r.fsck_clean;
                        secs[i].push(r.seconds);
                        bytes[i].push(r.bytes as f64);
                        at_gateway[i].extend(r.gateway_waits);
                        at_remote[i].extend(r.remote_waits);
                        bar.inc(1);
                    }
                }
                let at = |path: Path| paths.iter().position(|&q| q == path);
                let time = |path: Path| at(path).map(|i| Stat::of(&secs[i]).median);
                let wan_bytes = |path: Path| at(path).map(|i| Stat::of(&bytes[i]).median);
                let plain_bytes = wan_bytes(Path::Plain);
                let over_plain = |path: Path| wan_bytes(path).zip(plain_bytes).map(|(g, p)| g / p);
                let slice = Slice {
                    rate: rate.clone(),
                    pool: p.clone(),
                    block: block as f64,
                    plain: time(Path::Plain),
                    log: time(Path::Log),
                    immediate: time(Path::Immediate),
                    // Plain iSCSI's bytes all cross during its run; a gateway's partly after it.
                    plain_wan: plain_bytes.zip(time(Path::Plain)).map(|(n, t)| n * 8.0 / t),
                    log_bytes: over_plain(Path::Log),
                    link: time(Path::LogLink),
                    link_bytes: over_plain(Path::LogLink),
                    fsck: (if clean { "clean" } else { "ERRORS" }).into(),
                };
                for (i, &path) in paths.iter().enumerate() {
                    waits.extend(WaitRow::of(&slice, path, "gateway", &at_gateway[i]));
                    waits.extend(WaitRow::of(&slice, path, "remote", &at_remote[i]));
                }
                slices.push(slice);
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
    report(&slices, &waits, caption, b.remote_disk())
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

/// The rows of the report folders in `a.merge`, ordered by `a.rates`, `a.pools` and block size;
/// a slice in several folders takes each path from the last folder that has it.
/// With them, a note for each path a later folder ran again and replaced.
fn merged(a: &Args) -> Result<(Vec<Slice>, Vec<String>)> {
    let mut slices: Vec<(Slice, &std::path::Path)> = Vec::new();
    let mut notes = Vec::new();
    for (i, dir) in a.merge.iter().enumerate() {
        if a.merge[..i].contains(dir) {
            return Err(Error::Invalid(format!("{} is given twice: merge each folder once", dir.display())));
        }
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
            match slices.iter_mut().find(|(o, _)| (&o.rate, &o.pool, o.block) == (&s.rate, &s.pool, s.block)) {
                None => slices.push((s, dir)),
                Some((o, last)) => {
                    let key = format!("{} {} {} B", o.rate, o.pool, o.block);
                    if *last == dir.as_path() {
                        return Err(Error::Invalid(format!("{}: {key} is there twice", path.display())));
                    }
                    // The same slice from a later run: it adds the paths the earlier ones left
                    // out and replaces those it ran again.
                    for p in o.join(s) {
                        notes.push(format!(
                            "{key}: {} is the run in {}, which replaced an earlier one.",
                            p.via().label(),
                            dir.display()
                        ));
                    }
                    *last = dir;
                }
            }
        }
    }
    let rank = |order: &[String], x: &str| order.iter().position(|o| o == x).unwrap_or(order.len());
    let mut slices: Vec<Slice> = slices.into_iter().map(|(s, _)| s).collect();
    slices.sort_by(|x, y| {
        (rank(&a.rates, &x.rate), &x.rate, rank(&a.pools, &x.pool), &x.pool)
            .cmp(&(rank(&a.rates, &y.rate), &y.rate, rank(&a.pools, &y.pool), &y.pool))
            .then(x.block.total_cmp(&y.block))
    });
    Ok((slices, notes))
}

/// The table, the figure (speedup against block size, a curve per mode, pool and rate) and the
/// reading of `slices`, and the commands each side answered (`waits`, a second table when there
/// are any); `disk` names the disk model the remote's medium sat behind, if any.
fn report(slices: &[Slice], waits: &[WaitRow], caption: String, disk: Option<stics_disk::Preset>) -> Result<Report> {
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
            s.plain.unwrap_or(f64::NAN).into(),
            s.log.unwrap_or(f64::NAN).into(),
            s.immediate.unwrap_or(f64::NAN).into(),
            range(ll, lh).into(),
            range(il, ih).into(),
            s.plain_wan.unwrap_or(f64::NAN).into(),
            s.log_bytes.unwrap_or(f64::NAN).into(),
            s.link.unwrap_or(f64::NAN).into(),
            s.link_bytes.unwrap_or(f64::NAN).into(),
            s.fsck.as_str().into(),
        ])?;
        let x = at(s.block);
        for (path, time) in [(Path::Log, s.log), (Path::Immediate, s.immediate), (Path::LogLink, s.link)] {
            if let Some((plain, time)) = s.plain.zip(time) {
                curve(&mut curves, format!("{}, {}, {}", path.via().label(), s.pool, s.rate)).push((x, plain / time));
            }
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
    if !waits.is_empty() {
        r.section(
            "The SCSI commands each side answered per run (means over the repetitions), by kind, from mkfs done to \
             the gateway drained after the run: at the gateway, the host's; at the remote, the target's (plain \
             iSCSI's commands, or a gateway's destage and read misses) or the SG's. Latency runs from a command's \
             start (its data in) to its response (0 for a kind with no command); the sum counts commands in flight together once each, so it may \
             pass the run time.",
            wait_table(waits)?,
            None,
        );
    }
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

fn wait_table(rows: &[WaitRow]) -> Result<Table> {
    let mut t = Table::new(vec![
        Column::new("rate", "link", "", 1.0),
        Column::new("pool", "pool", "", 1.0),
        Column::new("block", "block", "B", 1.0),
        Column::new("path", "path", "", 1.0),
        Column::new("at", "at", "", 1.0),
        Column::new("kind", "kind", "", 1.0),
        Column::new("commands", "commands", "", 1.0),
        Column::new("mean", "mean latency", "ms", 1e3),
        Column::new("secs", "latency summed", "s", 1.0),
    ])?;
    for w in rows {
        t.push(vec![
            w.rate.as_str().into(),
            w.pool.as_str().into(),
            w.block.into(),
            w.path.via().label().into(),
            w.at.into(),
            w.kind.as_str().into(),
            w.commands.into(),
            (if w.commands > 0.0 { w.secs / w.commands } else { 0.0 }).into(),
            w.secs.into(),
        ])?;
    }
    Ok(t)
}

/// The link's run time against today's gateway (goal: no worse) and its WAN bytes against plain
/// iSCSI's, for a slice that ran it.
fn link_reading(s: &Slice) -> Option<String> {
    let (link, log) = (s.link?, s.log?);
    let bytes = s.link_bytes.map(|x| format!("; {x:.2}× plain iSCSI's WAN bytes")).unwrap_or_default();
    Some(format!(
        "{} {} {} B: log + link ran {:.2}× the time of log mode over plain destage (goal: at most 1.00×){bytes}.",
        s.rate,
        s.pool,
        s.block,
        link / log
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
        let (slices, notes) = merged(&args(vec![a, b, c])).unwrap();
        assert!(notes.is_empty(), "{notes:?}");
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
        let r = report(&slices, &[], "merged".into(), None).unwrap();
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
    fn a_path_run_again_alone_replaces_it_in_the_run_that_has_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let all = row("100mbit", "large", 4096).replace(r#""fsck""#, r#""link": 120.0, "link_bytes": 0.25, "fsck""#);
        let first = folder(dir.path(), "first", &format!("[{all}]"));
        // Log mode alone on a quieter machine: no plain iSCSI in its run, so no ratio of bytes.
        let again = r#"[{"rate": "100mbit", "pool": "large", "block": 4096, "plain": null, "log": 100.0,
            "immediate": null, "log_speedup": null, "paper_log": "", "immediate_speedup": null,
            "paper_immediate": "", "plain_wan": null, "log_bytes": null, "link": null, "link_speedup": null,
            "link_bytes": null, "fsck": "clean"}]"#;
        let again = folder(dir.path(), "again", again);
        // A slice only the later folder has is added whole.
        let other = folder(dir.path(), "other", &format!("[{}]", row("1gbit", "large", 4096)));
        let (slices, notes) = merged(&args(vec![first, again.clone(), other])).unwrap();
        assert_eq!(slices.len(), 2);
        let s = &slices[0];
        assert_eq!((s.plain, s.log, s.immediate, s.link), (Some(150.0), Some(100.0), Some(140.0), Some(120.0)));
        assert_eq!((s.plain_wan, s.log_bytes, s.link_bytes), (Some(2e8), None, Some(0.25)));
        assert_eq!(
            notes,
            [format!("100mbit large 4096 B: log is the run in {}, which replaced an earlier one.", again.display())]
        );
        assert_eq!(
            link_reading(s).unwrap().split(':').nth(1).unwrap(),
            " log + link ran 1.20× the time of log mode over plain destage (goal"
        );
        let rows = report(&slices, &[], "merged".into(), None).unwrap().sections[0].table.rows_json();
        assert_eq!(rows[0]["log_speedup"], 1.5);
        assert!(rows[0]["log_bytes"].is_null(), "{rows}");
        // A run of one path alone has no speedup to draw, and says so by leaving it blank.
        let (alone, _) = merged(&args(vec![again])).unwrap();
        let r = report(&alone, &[], "alone".into(), None).unwrap();
        assert!(r.sections[0].table.rows_json()[0]["log_speedup"].is_null());
        let fig = r.sections[0].figure.as_ref().unwrap();
        assert!(fig.series.iter().all(|s| s.label.starts_with("paper")), "no curve of ours without plain iSCSI");
    }

    #[test]
    fn a_measured_run_adds_the_commands_each_side_answered_as_a_second_table() {
        let slices = vec![serde_json::from_str::<Slice>(&row("100mbit", "large", 4096)).unwrap()];
        let page = |kind: &str, n: u32, secs: f64| {
            Waits::parse(&format!(
                "stics_target_commands_total{{target=\"t\",lun=\"0\",kind=\"{kind}\"}} {n}\n\
                 stics_target_command_latency_seconds_sum{{target=\"t\",lun=\"0\",kind=\"{kind}\"}} {secs}\n"
            ))
        };
        // Two repetitions of log mode: the table gives one run's mean.
        let runs = [page("read", 100, 2.0), page("read", 300, 6.0)];
        let mut waits = WaitRow::of(&slices[0], Path::Log, "gateway", &runs);
        waits.extend(WaitRow::of(&slices[0], Path::Plain, "remote", &[page("write", 50, 1.0)]));
        waits.extend(WaitRow::of(&slices[0], Path::Immediate, "remote", &[]));
        let r = report(&slices, &waits, "measured".into(), None).unwrap();
        assert_eq!(r.sections.len(), 2);
        let rows = r.sections[1].table.rows_json();
        assert_eq!(rows.as_array().unwrap().len(), 8, "every kind for each side that ran: {rows}");
        assert_eq!(
            (&rows[0]["path"], &rows[0]["at"], &rows[0]["kind"]),
            (&"log".into(), &"gateway".into(), &"read".into())
        );
        assert_eq!((rows[0]["commands"].as_f64(), rows[0]["secs"].as_f64()), (Some(200.0), Some(4.0)));
        assert_eq!(rows[0]["mean"].as_f64(), Some(0.02));
        assert_eq!(
            (rows[1]["kind"].as_str(), rows[1]["commands"].as_f64(), rows[1]["mean"].as_f64()),
            (Some("write"), Some(0.0), Some(0.0))
        );
        assert_eq!(
            (&rows[5]["path"], &rows[5]["at"], &rows[5]["kind"]),
            (&"plain".into(), &"remote".into(), &"write".into())
        );
        assert_eq!(report(&slices, &[], "merged".into(), None).unwrap().sections.len(), 1);
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
        let e = err(args(vec![a.clone(), a.clone()]));
        assert!(e.contains("/a is given twice: merge each folder once"), "{e}");
        let twice =
            folder(dir.path(), "twice", &format!("[{}, {}]", row("1gbit", "small", 4096), row("1gbit", "small", 4096)));
        let e = err(args(vec![a.clone(), twice]));
        assert!(e.contains("twice/postmark/table-1.json: 1gbit small 4096 B is there twice"), "{e}");
        let torn = folder(dir.path(), "torn", "[{\"rate\": ");
        assert!(err(args(vec![torn])).contains("table-1.json"));
        let other = folder(dir.path(), "other", r#"[{"size": 4096, "lat": 1e-5}]"#);
        let e = err(args(vec![a, other]));
        assert!(e.contains("not a postmark row"), "{e}");
    }
}

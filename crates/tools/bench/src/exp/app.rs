//! `stics bench app`: seed 000 Table 2 — applications on ext4 over remote storage: OpenSSH's
//! unpack, configure and build (the paper's SSH), PostgreSQL's pgbench in TPC-C's role, PostMark
//! and Surge (a web server under Surge's users), on a local disk, on the target with no network,
//! through `stics wan` at 0–8 ms one way and through the gateway, each normalised to the local row
//! as the paper prints it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use stics_report::plot::{Figure, Series};
use stics_report::{Column, Table};

use super::curve;
use super::fs::{fsck_clean, mount_ext4, postmark_in, unmount, Export, PoolArgs};
use super::surge;
use crate::paper;
use crate::peers::{stics_target, GatewayOptions, Wan};
use crate::{Bench, Error, Report, Result, Stat};

/// Options of `stics bench app`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Workloads, comma-separated: ssh (unpack, configure and build OpenSSH, seed 000's SSH),
    /// pgbench (PostgreSQL's TPC-B-like load, in TPC-C's role), postmark, surge (Python's
    /// threaded web server, logging every request, under Surge's users and document set).
    #[arg(long, value_delimiter = ',', default_value = "ssh,pgbench,postmark,surge")]
    pub workloads: Vec<Workload>,
    /// One-way delays, comma-separated (seed 000: 0, 1, 2, 4 and 8 ms). --quick runs the local
    /// row and the smallest delay only, plain and through the gateway.
    #[arg(long, value_delimiter = ',', default_value = "0ms,1ms,2ms,4ms,8ms", value_parser = stics_units::parse_duration)]
    pub delays: Vec<f64>,
    /// ext4 mounts, comma-separated: default (metadata written behind, in the role of the
    /// paper's Soft Updates FFS), sync (`-o sync`: every write reaches the device before it
    /// returns, in the role of its traditional FFS) or dirsync (`-o dirsync`: directory changes
    /// only, closer to what traditional FFS made synchronous). This experiment ignores
    /// --ext4-default. Default: default,sync (--quick: default).
    #[arg(long, value_delimiter = ',')]
    pub mounts: Vec<Mount>,
    /// OpenSSH's source archive (openssh_*.orig.tar.gz). Default: the one in
    /// /var/cache/stics-bench, fetched there with `apt-get source --download-only openssh` when
    /// missing (which needs a deb-src entry in apt's sources).
    #[arg(long, value_name = "FILE")]
    pub ssh_source: Option<PathBuf>,
    /// pgbench's scale factor (--quick: 1).
    #[arg(long, default_value_t = 10)]
    pub pg_scale: u32,
    /// pgbench's clients.
    #[arg(long, default_value_t = 4)]
    pub pg_clients: u32,
    /// Seconds each pgbench run lasts (--quick: 10).
    #[arg(long, default_value_t = 60)]
    pub pg_seconds: u32,
    #[command(flatten)]
    pub pool: PoolArgs,
    /// Surge's document set in files, drawn from its size distributions (seed 000: 20,000 files,
    /// about 1 GB; --quick: 2,000).
    #[arg(long, default_value_t = 20_000)]
    pub surge_files: usize,
    /// Surge's user equivalents (seed 000: 4 clients x 2 processes x 50 threads = 400; --quick: 40).
    #[arg(long, default_value_t = 400)]
    pub surge_users: usize,
    /// Seconds of each measured Surge run, after a warm-up of a sixth of it (--quick: 10).
    #[arg(long, default_value_t = 60)]
    pub surge_seconds: u64,
    /// Scales Surge's think times and the gaps within a page: 1 is Surge's own (a user asks
    /// about once a second), 0 has every user ask again as soon as a reply ends.
    #[arg(long, default_value_t = 1.0, value_parser = non_negative)]
    pub surge_think: f64,
    /// The ext4's size in MiB (--quick: 1024).
    #[arg(long, default_value_t = 2048)]
    pub fs_mib: u64,
    /// Leave out the runs through the gateway.
    #[arg(long)]
    pub no_gateway: bool,
    /// Measure nothing: draw the table and figure again from an earlier run's report folder
    /// (its `app/` folder). Give the options that run had: the caption is made from them.
    #[arg(long, value_name = "DIR")]
    pub redraw: Option<PathBuf>,
}

impl Args {
    /// The mounts to run: --mounts, or both of Table 2's file systems (--quick: the default mount
    /// alone, since an OpenSSH build on -o sync is most of the quick run's time).
    fn mounts(&self, b: &Bench) -> Vec<Mount> {
        match (self.mounts.is_empty(), b.quick()) {
            (false, _) => self.mounts.clone(),
            (true, true) => vec![Mount::Default],
            (true, false) => vec![Mount::Default, Mount::Sync],
        }
    }

    /// pgbench's scale factor and seconds, scaled down for `--quick`.
    fn pg_size(&self, b: &Bench) -> (u32, u32) {
        if b.quick() {
            (1, self.pg_seconds.min(10))
        } else {
            (self.pg_scale, self.pg_seconds)
        }
    }

    /// Surge's size, scaled down for `--quick`.
    fn surge_size(&self, b: &Bench) -> surge::Size {
        let full = surge::Size {
            files: self.surge_files,
            users: self.surge_users,
            seconds: self.surge_seconds,
            think: self.surge_think,
        };
        if b.quick() {
            surge::Size {
                files: full.files.min(2000),
                users: full.users.min(40),
                seconds: full.seconds.min(10),
                ..full
            }
        } else {
            full
        }
    }
}

fn non_negative(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v >= 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("{s}: expected a factor of 0 or more")),
    }
}

/// An application of seed 000 Table 2 (or the one standing in for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    Ssh,
    Pgbench,
    Postmark,
    Surge,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Ssh => "ssh",
            Workload::Pgbench => "pgbench",
            Workload::Postmark => "postmark",
            Workload::Surge => "surge",
        }
    }

    /// The unit of its throughput as Table 2 prints it, and that unit's size in operations per
    /// second.
    fn unit(self) -> (&'static str, f64) {
        match self {
            Workload::Ssh => ("iterations/h", 1.0 / 3600.0),
            Workload::Pgbench => ("tx/min", 1.0 / 60.0),
            Workload::Postmark => ("tx/s", 1.0),
            Workload::Surge => ("ops/s", 1.0),
        }
    }

    /// Table 2's column for this workload on `mount`: seed 000's FreeBSD runs (Soft Updates for
    /// the default mount, FFS for -o sync); TPC-C ran on Windows 2000's NTFS only.
    fn paper_column(self, mount: Mount) -> String {
        let fs = match mount {
            Mount::Default => "soft",
            Mount::Sync | Mount::Dirsync => "ffs",
        };
        match self {
            Workload::Ssh => format!("freebsd ssh {fs}"),
            Workload::Postmark => format!("freebsd postmark {fs}"),
            Workload::Surge => format!("freebsd surge {fs}"),
            Workload::Pgbench => "win2000 tpc-c ntfs".into(),
        }
    }
}

/// How the ext4 is mounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mount {
    Default,
    Sync,
    Dirsync,
}

impl Mount {
    fn name(self) -> &'static str {
        match self {
            Mount::Default => "default",
            Mount::Sync => "sync",
            Mount::Dirsync => "dirsync",
        }
    }

    fn options(self) -> &'static str {
        match self {
            Mount::Default => "loop",
            Mount::Sync => "loop,sync",
            Mount::Dirsync => "loop,dirsync",
        }
    }
}

/// Where the storage is: the row of Table 2, and whether the gateway is in front of it.
#[derive(Debug, Clone, PartialEq)]
struct Place {
    /// "local", "target" or "N ms".
    row: String,
    gateway: bool,
}

/// One cell of the table: a workload's throughput (operations per second) on one place and mount.
#[derive(Debug, Clone)]
struct Cell {
    place: Place,
    mount: Mount,
    workload: Workload,
    /// Operations per second: the median over the repetitions, and their spread.
    ops: f64,
    spread: f64,
    fsck: bool,
}

/// What every measurement of one run shares: the options, what the workloads need (found once)
/// and the progress bar.
struct Run<'a> {
    b: &'a Bench,
    a: &'a Args,
    ssh_source: Option<PathBuf>,
    pg_bin: Option<PathBuf>,
    fs_mib: u64,
    bar: indicatif::ProgressBar,
}

pub fn run(b: &Bench, a: &Args) -> Result<Report> {
    let fs_mib = if b.quick() { a.fs_mib.min(1024) } else { a.fs_mib };
    if let Some(dir) = &a.redraw {
        return report(b, a, &read_cells(dir)?, fs_mib);
    }
    b.need(&["mkfs.ext4", "e2fsck", "setpriv", "tar", "make", "cc"])?;
    // CI size: the local row against the smallest delay, plain and through the gateway (at 8 ms
    // one way, unpacking OpenSSH on -o sync alone took over five minutes).
    let delays: Vec<f64> =
        if b.quick() { a.delays.iter().copied().reduce(f64::min).into_iter().collect() } else { a.delays.clone() };
    if a.workloads.contains(&Workload::Surge) {
        b.need(&["python3"])?;
        surge::check(a.surge_size(b), fs_mib)?;
    }
    // postgres runs as its own user and must reach its data folder under the scratch space.
    set_mode(b.work(), 0o711)?;
    let lun = b.work().join("remote.img");
    std::fs::File::create(&lun)?.set_len((fs_mib + 64) << 20)?;
    let spec = b.remote_medium(&lun);
    let mounts = a.mounts(b);
    let places_per_delay = if a.no_gateway { 1 } else { 2 };
    let steps =
        (if b.quick() { 1 } else { 2 } + delays.len() * places_per_delay) * mounts.len() * a.workloads.len() * b.reps();
    let run = Run {
        b,
        a,
        ssh_source: if a.workloads.contains(&Workload::Ssh) { Some(ssh_source(b, a)?) } else { None },
        pg_bin: if a.workloads.contains(&Workload::Pgbench) { Some(pg_bin()?) } else { None },
        fs_mib,
        bar: b.bar(steps as u64, "app"),
    };
    let mut cells = Vec::new();
    let direct = |row: &str| Place { row: row.to_owned(), gateway: false };

    // Local: the host opens the medium itself (through the same FUSE export as every row).
    let local = direct("local");
    for &mount in &mounts {
        let mut cmd = b.stics_cmd();
        cmd.arg("mount").arg(&spec);
        cells.extend(run.on_ext4(cmd, &local, mount)?);
    }
    // Target: stics target on loopback, no WAN.
    if !b.quick() {
        let t = stics_target(b, "target", &[&spec])?;
        let place = direct("target");
        for &mount in &mounts {
            let mut cmd = b.stics_cmd();
            cmd.args(["mount", &t.url]);
            cells.extend(run.on_ext4(cmd, &place, mount)?);
        }
    }
    let wan = Wan::up(b, &format!("sbapp{}", std::process::id()), &["--delay", "0ms"])?;
    let target = wan.stics_target(b, "remote", "storage", &[&spec])?;
    for &d in &delays {
        let ms = d * 1e3;
        wan.set(b, &["--delay", &format!("{ms}ms")])?;
        let row = format!("{ms} ms");
        for gateway in [false, true] {
            if gateway && a.no_gateway {
                continue;
            }
            let place = Place { row: row.clone(), gateway };
            for &mount in &mounts {
                let measure = |url: &str| run.on_ext4(exported_in_host(b, &wan, url), &place, mount);
                if gateway {
                    let log = b.work().join("gateway-log.img");
                    let _ = std::fs::remove_file(&log);
                    let o = GatewayOptions::usual("log", &log, "1GiB");
                    let g = wan.gateway(b, "gateway", "host", &target.url, &o)?;
                    let measured = measure(&g.url.clone());
                    wan.gateway_stop(b, g, &target.url, &log)?;
                    cells.extend(measured?);
                } else {
                    cells.extend(measure(&target.url)?);
                }
            }
        }
    }
    run.bar.finish_and_clear();
    drop(target);
    drop(wan);
    report(b, a, &cells, fs_mib)
}

/// `stics mount URL` in the host namespace of `wan` (its export mounted where this process sees
/// it, ext4 then mounted on it).
fn exported_in_host(b: &Bench, wan: &Wan, url: &str) -> Command {
    let mut cmd = wan.exec("host", b.stics());
    cmd.args(["mount", url]);
    cmd
}

impl Run<'_> {
    /// A fresh ext4 on the export `cmd` (a `stics mount` lacking only the file to export onto),
    /// mounted `mount`, every workload `b.reps()` times on it, then `e2fsck -fn`.
    fn on_ext4(&self, mut cmd: Command, place: &Place, mount: Mount) -> Result<Vec<Cell>> {
        let (b, a) = (self.b, self.a);
        let lun = b.work().join("export");
        cmd.arg(&lun);
        let e = Export::start(b, "export", &mut cmd, lun, b.work().join("fs"))?;
        e.mkfs(b, self.fs_mib)?;
        let docs = e.fs.join("htdocs");
        if a.workloads.contains(&Workload::Surge) {
            // A web server's documents are there before it starts, as the paper's were: written
            // with the default mount whatever the mount under test (under -o sync at 8 ms, each
            // of 20,000 files would wait for its round trips), then unmounted, so that nothing of
            // them is cached.
            mount_ext4(b, &e.lun, &e.fs, Mount::Default.options())?;
            let written = surge::prepare(a.surge_size(b), &docs);
            let unmounted = unmount(b, &e.fs, &e.lun);
            written?;
            unmounted?;
        }
        mount_ext4(b, &e.lun, &e.fs, mount.options())?;
        let mut samples: Vec<Vec<f64>> = vec![Vec::new(); a.workloads.len()];
        let measured = (|| -> Result<()> {
            for rep in 0..b.reps() {
                for (i, w) in a.workloads.iter().enumerate() {
                    let dir = e.fs.join(format!("{}-{rep}", w.name()));
                    std::fs::create_dir_all(&dir)?;
                    let none = Path::new("");
                    let secs_per_op = match w {
                        Workload::Ssh => ssh(b, self.ssh_source.as_deref().unwrap_or(none), &dir)?,
                        Workload::Pgbench => pgbench(b, a, self.pg_bin.as_deref().unwrap_or(none), &dir)?,
                        Workload::Postmark => postmark(b, a, &dir)?,
                        Workload::Surge => 1.0 / surge::run(b, a.surge_size(b), &docs, &dir)?,
                    };
                    samples[i].push(1.0 / secs_per_op);
                    self.bar.inc(1);
                }
            }
            Ok(())
        })();
        let unmounted = unmount(b, &e.fs, &e.lun);
        measured?;
        unmounted?;
        let fsck = fsck_clean(&e.lun);
        drop(e);
        Ok(a.workloads
            .iter()
            .zip(samples)
            .map(|(&workload, s)| {
                let st = Stat::of(&s);
                Cell { place: place.clone(), mount, workload, ops: st.median, spread: st.spread(), fsck }
            })
            .collect())
    }
}

/// Seed 000's SSH benchmark in `dir`: unpack the source, configure it and build it (make -j2),
/// as the host runs them; seconds per iteration.
fn ssh(b: &Bench, source: &Path, dir: &Path) -> Result<f64> {
    let mut unpack = Command::new("tar");
    unpack.arg("xzf").arg(source).arg("-C").arg(dir);
    let mut secs = b.run(&mut b.host(unpack))?.secs;
    let tree = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.join("configure").exists())
        .ok_or_else(|| Error::Output { what: "the OpenSSH archive".into(), detail: "no configure script".into() })?;
    let mut configure = Command::new("./configure");
    configure.current_dir(&tree);
    secs += b.run(&mut b.host(configure))?.secs;
    let mut make = Command::new("make");
    make.args(["-j2"]).current_dir(&tree);
    secs += b.run(&mut b.host(make))?.secs;
    Ok(secs)
}

/// PostgreSQL in `dir` (initdb, a server on a socket in `dir` only, `pgbench -i`), then one
/// timed pgbench run; seconds per transaction.
fn pgbench(b: &Bench, a: &Args, bin: &Path, dir: &Path) -> Result<f64> {
    let (scale, seconds) = a.pg_size(b);
    b.run(Command::new("chown").arg("postgres:postgres").arg(dir))?;
    let data = dir.join("data");
    let as_pg = |program: &str| {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=postgres", "--regid=postgres", "--init-groups", "--"]).arg(bin.join(program));
        c.env("LC_ALL", "C");
        b.host(c)
    };
    let mut init = as_pg("initdb");
    init.args(["-D"]).arg(&data).args(["--no-sync", "-A", "trust", "-U", "postgres"]);
    b.run(&mut init)?;
    let mut server = as_pg("postgres");
    server.arg("-D").arg(&data).args(["-c", "listen_addresses="]).arg("-k").arg(dir);
    let mut pg = b.spawn("postgres", &mut server)?;
    let run = (|| -> Result<f64> {
        // The socket appears before recovery ends; pg_isready asks the server itself.
        let ready = || {
            let mut c = Command::new(bin.join("pg_isready"));
            c.arg("-q").arg("-h").arg(dir);
            c.status().is_ok_and(|s| s.success())
        };
        pg.wait_until(Duration::from_secs(120), ready)?;
        let mut load = as_pg("pgbench");
        load.arg("-h").arg(dir).args(["-U", "postgres", "-q", "-i", "-s", &scale.to_string(), "postgres"]);
        b.run(&mut load)?;
        // The load leaves its tables dirty in the server's buffers and the page cache. Written
        // back during the timed run (the kernel writes dirty pages back 30 s after they were
        // dirtied), they put every commit's flush behind them on a slow medium: on the raid5
        // model a row fell on one of two throughputs, 2.5x apart, by when its load ended. A
        // checkpoint and a sync of the file system put them on the medium first.
        let mut checkpoint = as_pg("psql");
        checkpoint.arg("-h").arg(dir).args(["-U", "postgres", "-q", "-c", "CHECKPOINT", "postgres"]);
        b.run(&mut checkpoint)?;
        let mut sync = Command::new("sync");
        sync.arg("-f").arg(dir);
        b.run(&mut b.host(sync))?;
        let mut bench = as_pg("pgbench");
        bench.arg("-h").arg(dir).args(["-U", "postgres", "-c", &a.pg_clients.to_string(), "-j", "2"]);
        bench.args(["-T", &seconds.to_string(), "postgres"]);
        let out = b.run(&mut bench)?;
        let tps = out
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("tps = "))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|t| *t > 0.0)
            .ok_or_else(|| Error::Output { what: "pgbench".into(), detail: crate::env::tail(&out.stdout) })?;
        Ok(1.0 / tps)
    })();
    // A fast shutdown: the server ends its sessions and writes a checkpoint.
    pg.stop(libc::SIGINT, Duration::from_secs(120));
    run
}

/// PostMark in `dir` as the host runs it; seconds per transaction.
fn postmark(b: &Bench, a: &Args, dir: &Path) -> Result<f64> {
    b.need(&["postmark"])?;
    let pool = a.pool.pool(b);
    let secs = postmark_in(b, &dir.join("pm.cfg"), dir, pool.files, pool.transactions)?.secs;
    Ok(secs / pool.transactions as f64)
}

/// One row of an earlier run's table (`table-1.json`).
#[derive(serde::Deserialize)]
struct SavedRow {
    at: String,
    path: String,
    workload: String,
    mount: String,
    throughput: f64,
    spread: f64,
    fsck: String,
}

/// The cells of an earlier run, from its report folder.
fn read_cells(dir: &Path) -> Result<Vec<Cell>> {
    let file = dir.join("table-1.json");
    let bad = |detail: String| Error::Output { what: file.display().to_string(), detail };
    let text = std::fs::read_to_string(&file).map_err(|e| bad(e.to_string()))?;
    let rows: Vec<SavedRow> = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    rows.into_iter()
        .map(|r| {
            let workload = <Workload as clap::ValueEnum>::from_str(&r.workload, false).map_err(&bad)?;
            let mount = <Mount as clap::ValueEnum>::from_str(&r.mount, false).map_err(&bad)?;
            Ok(Cell {
                place: Place { row: r.at, gateway: r.path != "iSCSI" },
                mount,
                workload,
                ops: r.throughput * workload.unit().1,
                spread: r.spread,
                fsck: r.fsck == "clean",
            })
        })
        .collect()
}

/// Where the OpenSSH archive is kept between runs.
const SOURCE_CACHE: &str = "/var/cache/stics-bench";

/// The OpenSSH source archive: --ssh-source, or the cached one, or one apt fetches into the cache.
fn ssh_source(b: &Bench, a: &Args) -> Result<PathBuf> {
    if let Some(p) = &a.ssh_source {
        return if p.is_file() {
            Ok(p.clone())
        } else {
            Err(Error::Invalid(format!("--ssh-source {}: no such file", p.display())))
        };
    }
    let cache = Path::new(SOURCE_CACHE);
    let find = || -> Option<PathBuf> {
        let mut found: Vec<PathBuf> = std::fs::read_dir(cache)
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("openssh_") && n.ends_with(".orig.tar.gz"))
            })
            .collect();
        found.sort();
        found.pop()
    };
    if let Some(p) = find() {
        return Ok(p);
    }
    b.need(&["apt-get"])?;
    std::fs::create_dir_all(cache)?;
    let mut fetch = Command::new("apt-get");
    fetch.args(["source", "--download-only", "openssh"]).current_dir(cache);
    b.run(&mut fetch).map_err(|e| {
        Error::Invalid(format!(
            "the SSH benchmark needs OpenSSH's source: pass --ssh-source FILE, or let apt fetch it into \
             {SOURCE_CACHE} (add a `Types: deb-src` entry with the URIs and suites of \
             /etc/apt/sources.list.d/debian.sources, then `apt-get update`; scripts/deps.sh does both): {e}"
        ))
    })?;
    find().ok_or_else(|| Error::Invalid(format!("apt-get source put no openssh_*.orig.tar.gz in {SOURCE_CACHE}")))
}

/// The folder of PostgreSQL's server programs (initdb, postgres, pgbench), newest version first.
fn pg_bin() -> Result<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path().join("bin"))).collect())
        .unwrap_or_default();
    found.retain(|p| ["postgres", "pgbench", "initdb", "pg_isready", "psql"].iter().all(|t| p.join(t).exists()));
    // Numeric order: 9.6 before 15.
    found.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.split('.').next())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    found.pop().ok_or(Error::Missing { tool: "postgres".into(), package: "postgresql".into() })
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn report(b: &Bench, a: &Args, cells: &[Cell], fs_mib: u64) -> Result<Report> {
    let mut t = Table::new(vec![
        Column::new("at", "storage", "", 1.0),
        Column::new("path", "path", "", 1.0),
        Column::new("workload", "workload", "", 1.0),
        Column::new("mount", "ext4 mount", "", 1.0),
        Column::new("throughput", "throughput", "", 1.0),
        Column::new("unit", "unit", "", 1.0),
        Column::new("normalized", "of local", "", 1.0),
        Column::new("paper", "paper", "", 1.0),
        Column::new("paper_column", "paper's column", "", 1.0),
        Column::new("spread", "spread", "%", 100.0),
        Column::new("fsck", "e2fsck -fn", "", 1.0),
    ])?;
    let mut rows: Vec<String> = Vec::new();
    for c in cells {
        if !rows.contains(&c.place.row) {
            rows.push(c.place.row.clone());
        }
    }
    let mut curves: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    let mut paper_pts: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for mount in a.mounts(b) {
        for &w in &a.workloads {
            let of = |c: &&Cell| c.mount == mount && c.workload == w;
            let local = cells.iter().filter(of).find(|c| c.place.row == "local").map_or(f64::NAN, |c| c.ops);
            let (unit, size) = w.unit();
            let column = w.paper_column(mount);
            for c in cells.iter().filter(of) {
                let normalized = c.ops / local;
                let paper = if c.place.gateway {
                    f64::NAN
                } else if c.place.row == "local" {
                    paper::lookup("000", "Table 2", "local", &column).map_or(f64::NAN, |_| 1.0)
                } else {
                    paper::lookup("000", "Table 2", &c.place.row, &column).map_or(f64::NAN, |v| v.value)
                };
                t.push(vec![
                    c.place.row.clone().into(),
                    (if c.place.gateway { "gateway (log)" } else { "iSCSI" }).into(),
                    w.name().into(),
                    mount.name().into(),
                    (c.ops / size).into(),
                    unit.into(),
                    normalized.into(),
                    paper.into(),
                    column.clone().into(),
                    c.spread.into(),
                    (if c.fsck { "clean" } else { "ERRORS" }).into(),
                ])?;
                // Table 2's rows are the x positions: local, target, then each delay.
                let x = (rows.iter().position(|r| *r == c.place.row).unwrap_or(0) + 1) as f64;
                let via = if c.place.gateway { ", gateway" } else { "" };
                curve(&mut curves, format!("{} ({}){via}", w.name(), mount.name())).push((x, normalized));
                let pts = curve(&mut paper_pts, format!("paper: {column}"));
                if !paper.is_nan() && !pts.iter().any(|p| p.0 == x) {
                    pts.push((x, paper));
                }
            }
        }
    }
    let mut series: Vec<Series> = curves.into_iter().map(|(l, p)| Series::line(l, p)).collect();
    series.extend(paper_pts.into_iter().filter(|c| !c.1.is_empty()).map(|(l, p)| Series::scatter(l, p)));
    let fig = Figure {
        title: "Applications on ext4 over iSCSI, throughput as a fraction of the local disk's".into(),
        x_label: "storage (N ms: one-way delay through stics wan)".into(),
        y_label: "throughput / local".into(),
        log_x: false,
        // A gateway that acknowledges flushes from its log can be many times the local row.
        log_y: true,
        categories: rows,
        series,
    };
    let pool = a.pool.pool(b);
    let (scale, seconds) = a.pg_size(b);
    let surge = a.surge_size(b);
    let mut r = Report::new(
        "app",
        "Seed 000 Table 2: applications (an OpenSSH build, pgbench, PostMark, Surge) on local storage, on the target and \
         through stics wan at 0-8 ms one way, normalised to the local row",
    );
    r.section(
        format!(
            "Throughput, medians of {} repetition(s), on a fresh {fs_mib} MiB ext4 per storage and mount; local = \
             the medium opened by the host itself, target = stics target on loopback, N ms = through stics wan, \
             gateway = a log-mode gateway in the host namespace in front of the same target. SSH: unpack, configure \
             and make -j2 of {}; pgbench: scale {scale}, {} clients, {seconds} s; PostMark: {} files, {} \
             transactions; Surge: {} files, {} users, think times x{}, {} s measured{}",
            b.reps(),
            a.ssh_source.as_deref().map_or_else(|| "Debian's openssh orig archive".into(), |p| p.display().to_string()),
            a.pg_clients,
            pool.files,
            pool.transactions,
            surge.files,
            surge.users,
            surge.think,
            surge.seconds,
            super::fs::setup(b)
        ),
        t,
        Some(fig),
    );
    r.note(
        "The paper's local row is a host-attached disk array and its rows are normalised to it; ours is the same \
         medium opened by the host through the same FUSE export, so the rows below it measure what iSCSI, then the \
         network, then the gateway add. Run with --remote-disk raid5 (or another preset) to put the paper's disks \
         back: on a page-cached file nothing waits for a disk.",
    );
    r.note(
        "Stand-ins: ext4's default mount plays the paper's Soft Updates FFS (metadata written behind) and -o sync its \
         traditional FFS (which wrote metadata synchronously and data behind, so -o sync is the harsher of the \
         two; -o dirsync is the closer); pgbench (PostgreSQL 15, its TPC-B-like default script, every commit flushed to the WAL) \
         plays TPC-C on Oracle 8i, whose writes the paper found mostly delayed; its column is Windows 2000 NTFS's. \
         Surge: its document set drawn from its distributions (sizes lognormal below 133 kB and Pareto above, \
         bounded at 4 MiB; Zipf popularity drawn apart from size), served by Python's threaded http.server in the \
         role of the paper's web server, appending a log line per request on the same ext4; its users fetch pages \
         of a base file and a Pareto number of embedded files with Weibull gaps and Pareto think times, and check \
         every byte. Left out of Surge's model: its temporal locality (stack distances) and its request-size \
         distribution, so popularity alone decides which files are hot. SDET (SPEC) is not run: its scripts are \
         not available, and no faithful stand-in was found.",
    );
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_paper_cell_the_table_reads_is_in_paper_toml() {
        for w in [Workload::Ssh, Workload::Pgbench, Workload::Postmark, Workload::Surge] {
            for m in [Mount::Default, Mount::Sync, Mount::Dirsync] {
                let column = w.paper_column(m);
                for row in ["local", "target", "0 ms", "1 ms", "2 ms", "4 ms", "8 ms"] {
                    assert!(paper::lookup("000", "Table 2", row, &column).is_some(), "{row} / {column}");
                }
            }
        }
    }

    #[test]
    fn the_local_rows_units_are_table_2s() {
        // The paper prints SSH in iterations per hour and TPC-C in transactions per minute.
        let ssh = paper::lookup("000", "Table 2", "local", &Workload::Ssh.paper_column(Mount::Sync)).unwrap();
        assert_eq!(ssh.unit, "ops/h");
        assert_eq!(Workload::Ssh.unit().1, 1.0 / 3600.0);
        let tpcc = paper::lookup("000", "Table 2", "local", &Workload::Pgbench.paper_column(Mount::Sync)).unwrap();
        assert_eq!(tpcc.unit, "ops/min");
        assert_eq!(Workload::Pgbench.unit().1, 1.0 / 60.0);
    }

    #[test]
    fn mounts_map_to_ext4_options() {
        assert_eq!(Mount::Default.options(), "loop");
        assert_eq!(Mount::Sync.options(), "loop,sync");
        assert_eq!(Mount::Dirsync.options(), "loop,dirsync");
    }

    #[test]
    fn a_missing_ssh_source_is_a_clear_error() {
        let b = Bench::new(crate::Options { reps: 1, ..Default::default() }).unwrap();
        let cmd = clap::Command::new("app");
        let cmd = <Args as clap::Args>::augment_args(cmd);
        let m = cmd.try_get_matches_from(["app", "--ssh-source", "/nonexistent/openssh.tar.gz"]).unwrap();
        let a = <Args as clap::FromArgMatches>::from_arg_matches(&m).unwrap();
        let e = ssh_source(&b, &a).unwrap_err().to_string();
        assert!(e.contains("--ssh-source /nonexistent/openssh.tar.gz"), "{e}");
    }
}

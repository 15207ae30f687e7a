//! `stics bench initiator`: the stics initiator against libiscsi (inside qemu-storage-daemon) on
//! one tgt LUN: ext4 + PostMark over `stics mount` and over qemu-storage-daemon's FUSE export,
//! alternating, each checked with e2fsck; a 4 KiB write + fsync at depth 1 on each exported file
//! (fio); and 4 KiB random reads through the initiator at depths 1 and 32 against tgt, stics
//! target and stics target across `stics wan`.

use std::process::Command;

use stics_report::{Column, Table};

use super::alternate;
use super::fs::{fsck_clean, Export};
use crate::load::Outcome;
use crate::peers::{fill_random, random_file, stics_target, tgt, Target, Wan, TGT_IQN};
use crate::{Bench, Error, Report, Result, Stat};

/// Options of `stics bench initiator`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// PostMark files (`--quick`: 100).
    #[arg(long, default_value_t = 300)]
    pub files: u64,
    /// PostMark transactions (`--quick`: 500).
    #[arg(long, default_value_t = 3_000)]
    pub transactions: u64,
    /// Seconds of each fio run and of each read measurement (`--quick`: at most 2).
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// One-way delay of the WAN for the reads across it.
    #[arg(long, default_value = "1ms")]
    pub delay: String,
    /// Where tgt's backing file lives (default: the run's scratch folder). /dev/shm takes the
    /// disk's fdatasync out of every SYNCHRONIZE CACHE and leaves the two initiators to compare.
    #[arg(long)]
    pub image_dir: Option<std::path::PathBuf>,
    /// Busy-looping processes kept running during PostMark and fio, to compare the initiators
    /// under CPU contention.
    #[arg(long, default_value_t = 0)]
    pub hogs: usize,
}

/// tgt's backing file outside the scratch folder, removed when dropped and by an interrupted run.
struct Image(std::path::PathBuf);

impl Drop for Image {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        crate::env::forget(&rm(&self.0));
    }
}

fn rm(path: &std::path::Path) -> crate::env::Undo {
    crate::env::Undo::Command { program: "rm".into(), args: vec!["-f".into(), path.display().to_string()] }
}

const LUN_BYTES: u64 = 256 << 20;

/// The exports compared: a label and how it is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `stics mount` with its defaults.
    Stics,
    /// `stics mount --io-threads 2`.
    SticsIo2,
    /// qemu-storage-daemon's FUSE export over its libiscsi driver.
    Qsd,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Stics => "stics mount",
            Kind::SticsIo2 => "stics mount --io-threads 2",
            Kind::Qsd => "qemu-storage-daemon (libiscsi)",
        }
    }
}

pub fn run(b: &Bench, a: &Args) -> Result<Report> {
    b.need(&["qemu-storage-daemon", "postmark", "fio", "mkfs.ext4", "e2fsck", "mount", "umount"])?;
    let (files, transactions) =
        if b.quick() { (a.files.min(100), a.transactions.min(500)) } else { (a.files, a.transactions) };
    let secs = if b.quick() { a.seconds.min(2.0) } else { a.seconds };
    // Written out in full, so that the export measured first does not pay for allocating it.
    let (image, _outside) = match &a.image_dir {
        None => (random_file(b, "lun.img", LUN_BYTES)?, None),
        Some(dir) => {
            let path = dir.join(format!("stics-bench-initiator-{}.img", std::process::id()));
            crate::env::remember(rm(&path));
            let guard = Image(path.clone());
            fill_random(&path, LUN_BYTES)?;
            (path, Some(guard))
        }
    };
    let bar = b.bar((b.reps() * 2 + 3 + 6) as u64, "initiator");

    let t = tgt(b, "tgt", &image)?;
    let hogs = (0..a.hogs)
        .map(|i| b.spawn(&format!("hog-{i}"), Command::new("sh").args(["-c", "while :; do :; done"])))
        .collect::<Result<Vec<_>>>()?;
    let mut pm = Table::new(vec![
        Column::new("export", "export", "", 1.0),
        Column::new("seconds", "PostMark", "s", 1.0),
        Column::new("spread", "spread", "%", 100.0),
        Column::new("fsck", "e2fsck -fn clean", "", 1.0),
    ])?;
    let pair = [Kind::Stics, Kind::Qsd];
    let mut seconds = [Vec::new(), Vec::new()];
    let mut clean = [0usize; 2];
    for rep in 0..b.reps() {
        for k in alternate(rep, [0usize, 1]) {
            let (s, ok) = postmark(b, &t, pair[k], files, transactions)?;
            seconds[k].push(s);
            clean[k] += usize::from(ok);
            bar.inc(1);
        }
    }
    let mut medians = [0.0; 2];
    for (k, kind) in pair.iter().enumerate() {
        let s = Stat::of(&seconds[k]);
        medians[k] = s.median;
        pm.push(vec![
            kind.label().into(),
            s.median.into(),
            s.spread().into(),
            format!("{}/{}", clean[k], b.reps()).into(),
        ])?;
    }

    let mut fio =
        Table::new(vec![Column::new("export", "export", "", 1.0), Column::new("latency", "write + fsync", "µs", 1e6)])?;
    for kind in [Kind::Stics, Kind::SticsIo2, Kind::Qsd] {
        let l = fio_sync_write(b, &t, kind, secs)?;
        fio.push(vec![kind.label().into(), l.into()])?;
        bar.inc(1);
    }
    drop(hogs);

    let mut reads = Table::new(vec![
        Column::new("target", "target", "", 1.0),
        Column::new("depth", "depth", "", 1.0),
        Column::new("iops", "IOPS", "", 1.0),
        Column::new("mean", "mean", "µs", 1e6),
        Column::new("p99", "p99", "µs", 1e6),
    ])?;
    let mut read_row = |what: &str, depth: usize, o: &Outcome| -> Result<()> {
        reads.push(vec![what.into(), (depth as f64).into(), o.iops.into(), o.mean.into(), o.p99.into()])?;
        bar.inc(1);
        Ok(())
    };
    for depth in [1, 32] {
        read_row("tgt", depth, &load(b, b.stics_cmd(), &t.url, depth, secs)?)?;
    }
    drop(t);
    let spec = format!("file:{}", image.display());
    {
        let s = stics_target(b, "stics-target", &[&spec])?;
        for depth in [1, 32] {
            read_row("stics target", depth, &load(b, b.stics_cmd(), &s.url, depth, secs)?)?;
        }
    }
    let wan = Wan::up(b, &format!("sbinit{}", std::process::id()), &["--delay", &a.delay])?;
    let far = wan.stics_target(b, "stics-target-wan", "storage", &[&spec])?;
    for depth in [1, 32] {
        let what = format!("stics target across stics wan, {} one way", a.delay);
        read_row(&what, depth, &load(b, wan.exec("host", b.stics()), &far.url, depth, secs)?)?;
    }
    drop(far);
    drop(wan);
    bar.finish_and_clear();

    let mut r = Report::new(
        "initiator",
        "The stics initiator against libiscsi on one tgt LUN, and its reads at depth 1 and 32",
    );
    r.section(
        format!(
            "PostMark ({files} files, {transactions} transactions) on ext4 mounted -o sync through a loop device over \
             each export of one tgt LUN of {} MiB, a fresh mkfs each time, medians of {} runs, order alternating",
            LUN_BYTES >> 20,
            b.reps()
        ),
        pm,
        None,
    );
    r.section(
        format!("fio on the exported file: 4 KiB random writes, each followed by fsync, depth 1, {secs} s"),
        fio,
        None,
    );
    r.section(
        format!(
            "4 KiB random reads through stics-initiator (stics bench load), {secs} s each: tgt, stics target serving \
             the same image, and stics target across stics wan"
        ),
        reads,
        None,
    );
    r.note(format!(
        "PostMark time qemu-storage-daemon / stics mount: {:.2} (above 1: stics faster).",
        medians[1] / medians[0]
    ));
    r.note(format!(
        "tgt's image in {}; {} busy loops beside PostMark and fio.",
        a.image_dir.as_ref().map_or_else(|| "the scratch folder".to_owned(), |d| d.display().to_string()),
        a.hogs
    ));
    Ok(r)
}

/// Starts `kind`'s export of tgt's LUN 1 onto a file in the scratch folder.
fn export(b: &Bench, t: &Target, kind: Kind) -> Result<Export> {
    let lun = b.work().join("export");
    let fs = b.work().join("fs");
    if kind == Kind::Qsd {
        return Export::qsd(b, "qsd", t.portal(), TGT_IQN, 1, lun, fs);
    }
    let mut cmd = b.stics_cmd();
    cmd.arg("mount");
    if kind == Kind::SticsIo2 {
        cmd.args(["--io-threads", "2"]);
    }
    cmd.arg(&t.url).arg(&lun);
    let name = if kind == Kind::SticsIo2 { "stics-mount-io2" } else { "stics-mount" };
    Export::start(b, name, &mut cmd, lun, fs)
}

/// PostMark on a fresh ext4 over `kind`'s export: its seconds, and whether e2fsck found it clean.
fn postmark(b: &Bench, t: &Target, kind: Kind, files: u64, transactions: u64) -> Result<(f64, bool)> {
    let e = export(b, t, kind)?;
    let secs = e.postmark(b, LUN_BYTES >> 20, files, transactions)?;
    Ok((secs, fsck_clean(&e.lun)))
}

/// Mean seconds of a 4 KiB random write and the fsync after it, depth 1, on `kind`'s export.
fn fio_sync_write(b: &Bench, t: &Target, kind: Kind, secs: f64) -> Result<f64> {
    let e = export(b, t, kind)?;
    let out = b.run(
        Command::new("fio")
            .args(["--name=wsync", "--direct=1", "--bs=4k", "--ioengine=psync", "--rw=randwrite", "--fsync=1"])
            .args(["--size=64M", "--time_based", "--output-format=json"])
            .arg(format!("--runtime={secs}"))
            .arg(format!("--filename={}", e.lun.display())),
    )?;
    drop(e);
    let bad = |detail: &str| Error::Output { what: "fio".into(), detail: detail.to_owned() };
    let v: serde_json::Value = serde_json::from_str(&out.stdout).map_err(|err| bad(&err.to_string()))?;
    let job = &v["jobs"][0];
    let f = |x: &serde_json::Value| x.as_f64().ok_or_else(|| bad(&format!("no number in {job}")));
    let (writes, syncs) = (f(&job["write"]["total_ios"])?, f(&job["sync"]["total_ios"])?);
    let (w, s) = (f(&job["write"]["lat_ns"]["mean"])?, f(&job["sync"]["lat_ns"]["mean"])?);
    if writes == 0.0 {
        return Err(bad("no write completed"));
    }
    Ok((w * writes + s * syncs) / writes / 1e9)
}

/// `stics bench load` (run by `cmd`, the `stics` binary perhaps inside a namespace): 4 KiB random
/// reads at `depth` for `secs` seconds.
fn load(b: &Bench, mut cmd: Command, url: &str, depth: usize, secs: f64) -> Result<Outcome> {
    cmd.args(["bench", "load", url, "--json", "--op", "read", "--pattern", "random", "--size", "4KiB"]).args([
        "--depth",
        &depth.to_string(),
        "--seconds",
        &format!("{secs}s"),
    ]);
    Outcome::from_json(&b.run(&mut cmd)?.stdout)
}

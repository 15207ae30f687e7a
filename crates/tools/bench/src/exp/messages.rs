//! Seed 002 Tables 2–3: the iSCSI messages one file-system call costs on ext4 over a remote LUN,
//! with a cold cache and a warm one, at directory depth 0 and 3, counted by the initiator of
//! `stics mount --counters` (commands until the call returns, and with the `sync` that makes it
//! durable).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use stics_report::{Column, Table};

use super::fs::{mount_ext4, unmount, Export};
use crate::paper;
use crate::peers::stics_target;
use crate::{Bench, Error, Result};

/// The calls of seed 002 Table 2, in its order.
pub const OPS: [&str; 17] = [
    "mkdir", "chdir", "readdir", "symlink", "readlink", "unlink", "rmdir", "creat", "open", "link", "rename", "trunc",
    "chmod", "chown", "access", "stat", "utime",
];

/// The call `op` on names under `dir`, as a Python statement; `v` tells runs apart (each run
/// works on names of its own, made beforehand when the call needs them to exist).
pub(crate) fn call(op: &str, dir: &str, v: &str) -> String {
    let p = |name: &str| format!("'{dir}/{name}_{v}'");
    match op {
        "mkdir" => format!("os.mkdir({})", p("new")),
        "chdir" => format!("os.chdir({})", p("d")),
        "readdir" => format!("os.listdir({})", p("d")),
        "symlink" => format!("os.symlink('target', {})", p("newlink")),
        "readlink" => format!("os.readlink({})", p("l")),
        "unlink" => format!("os.unlink({})", p("f")),
        "rmdir" => format!("os.rmdir({})", p("d")),
        "creat" => format!("os.close(os.open({}, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644))", p("new")),
        "open" => format!("os.close(os.open({}, os.O_RDONLY))", p("f")),
        "link" => format!("os.link({}, {})", p("f"), p("newlink")),
        "rename" => format!("os.rename({}, {})", p("f"), p("renamed")),
        "trunc" => format!("os.truncate({}, 0)", p("f")),
        "chmod" => format!("os.chmod({}, 0o600)", p("f")),
        "chown" => format!("os.chown({}, 1, 1)", p("f")),
        "access" => format!("os.access({}, os.R_OK)", p("f")),
        "stat" => format!("os.stat({})", p("f")),
        _ => format!("os.utime({})", p("f")),
    }
}

/// What each run of each call needs in place: a 4 KiB file `f`, a directory `d` and a symlink `l`.
pub(crate) fn fixture(dir: &Path, v: &str) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join(format!("f_{v}")), vec![7u8; 4096])?;
    std::fs::create_dir_all(dir.join(format!("d_{v}")))?;
    let l = dir.join(format!("l_{v}"));
    if !l.exists() {
        std::os::unix::fs::symlink("target", l)?;
    }
    Ok(())
}

/// The export, with the initiator's counters readable.
struct Counted {
    export: Export,
    counters: PathBuf,
}

impl Counted {
    /// The initiator's command count now.
    fn commands(&mut self) -> Result<u64> {
        commands(&mut self.export.proc, &self.counters)
    }

    fn mount(&self, b: &Bench) -> Result<()> {
        mount_ext4(b, &self.export.lun, &self.export.fs, "loop")
    }

    /// Unmounts ext4 (writing back everything) and drops every cache, so the next mount starts cold.
    fn unmount_cold(&self, b: &Bench) -> Result<()> {
        // Gone for good before the next mount, which would otherwise be a second ext4 on the file.
        unmount(b, &self.export.fs, &self.export.lun)?;
        std::fs::write("/proc/sys/vm/drop_caches", "3\n")?;
        Ok(())
    }
}

/// The command count of the initiator of `stics mount --counters FILE` running as `proc`, now:
/// SIGUSR1 makes it write FILE.
pub(crate) fn commands(proc: &mut crate::env::Proc, counters: &Path) -> Result<u64> {
    let _ = std::fs::remove_file(counters);
    proc.signal(libc::SIGUSR1);
    let path = counters.to_owned();
    proc.wait_until(Duration::from_secs(10), || path.exists())?;
    let text = std::fs::read_to_string(counters)?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::Output { what: "stics mount --counters".into(), detail: e.to_string() })?;
    v["commands"].as_u64().ok_or_else(|| Error::Output { what: "stics mount --counters".into(), detail: text })
}

/// Runs one call and returns the commands it cost until it returned and until `sync` after it.
fn measure(b: &Bench, e: &mut Counted, op: &str, dir: &str, v: &str) -> Result<(u64, u64)> {
    let code = format!("import os\n{}\n", call(op, dir, v));
    let c0 = e.commands()?;
    b.run(Command::new("python3").arg("-c").arg(&code))?;
    let c1 = e.commands()?;
    b.run(Command::new("sync").arg("-f").arg(&e.export.fs))?;
    let c2 = e.commands()?;
    Ok((c1 - c0, c2 - c0))
}

/// The messages table: one row per call, cold and warm at depth 0 and 3, the paper's iSCSI
/// columns beside ours.
pub fn table(b: &Bench) -> Result<Table> {
    b.need(&["python3", "mkfs.ext4", "findmnt"])?;
    let lun_file = b.work().join("messages-lun.img");
    std::fs::File::create(&lun_file)?.set_len(512 << 20)?;
    let target = stics_target(b, "messages-target", &[&format!("file:{}", lun_file.display())])?;
    let lun = b.work().join("messages-export");
    let counters = b.work().join("counters.json");
    let mut cmd = b.stics_cmd();
    cmd.args(["mount", &target.url]).arg(&lun).arg("--counters").arg(&counters);
    let export = Export::start(b, "messages-export", &mut cmd, lun, b.work().join("messages-fs"))?;
    export.mkfs(b, 256)?;
    let mut e = Counted { export, counters };
    e.mount(b)?;
    let depths = [(0u32, e.export.fs.clone()), (3, e.export.fs.join("a/b/c"))];
    for (_, d) in &depths {
        for op in OPS {
            for v in ["cold", "warmup", "warm"] {
                fixture(d, &format!("{op}_{v}"))?;
            }
        }
    }
    e.unmount_cold(b)?;
    let mut t = Table::new(vec![
        Column::new("op", "call", "", 1.0),
        Column::new("paper_cold_0", "paper cold, depth 0", "", 1.0),
        Column::new("cold_0", "cold, depth 0", "", 1.0),
        Column::new("cold_0_sync", "+ sync", "", 1.0),
        Column::new("paper_cold_3", "paper cold, depth 3", "", 1.0),
        Column::new("cold_3", "cold, depth 3", "", 1.0),
        Column::new("cold_3_sync", "+ sync", "", 1.0),
        Column::new("paper_warm_0", "paper warm, depth 0", "", 1.0),
        Column::new("warm_0", "warm, depth 0", "", 1.0),
        Column::new("warm_0_sync", "+ sync", "", 1.0),
        Column::new("paper_warm_3", "paper warm, depth 3", "", 1.0),
        Column::new("warm_3", "warm, depth 3", "", 1.0),
        Column::new("warm_3_sync", "+ sync", "", 1.0),
    ])?;
    let bar = b.bar(OPS.len() as u64, "messages per call");
    for op in OPS {
        let mut cells = vec![op.into()];
        let mut warm_cells = Vec::new();
        for (depth, d) in &depths {
            let dir = d.display().to_string();
            // Cold: a fresh mount after every cache was dropped.
            e.mount(b)?;
            let (cold, cold_sync) = measure(b, &mut e, op, &dir, &format!("{op}_cold"))?;
            // Warm: the same call once on other names, then measured (seed 002: the path's
            // entries are in the client's cache).
            let _ = measure(b, &mut e, op, &dir, &format!("{op}_warmup"))?;
            let (warm, warm_sync) = measure(b, &mut e, op, &dir, &format!("{op}_warm"))?;
            e.unmount_cold(b)?;
            let col = format!("iscsi, depth {depth}");
            cells.extend([
                paper::lookup("002", "Table 2", op, &col).map_or(f64::NAN, |v| v.value).into(),
                (cold as f64).into(),
                (cold_sync as f64).into(),
            ]);
            warm_cells.extend([
                paper::lookup("002", "Table 3", op, &col).map_or(f64::NAN, |v| v.value).into(),
                (warm as f64).into(),
                (warm_sync as f64).into(),
            ]);
        }
        cells.extend(warm_cells);
        t.push(cells)?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    drop(e);
    drop(target);
    Ok(t)
}

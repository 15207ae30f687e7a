//! `stics bench rbd` run for real in its CI size (needs the `rbd` feature, Ceph's daemons and
//! tools, tgt-rbd and qemu-img): the built binary starts a throwaway Ceph cluster, serves one image
//! with stics target and with tgt in turn, runs rbd bench on it, and leaves nothing behind.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// The command lines of the processes that are running now (zombies left out), by PID.
fn processes() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        if stat.rfind(')').is_some_and(|i| stat[i + 1..].trim_start().starts_with('Z')) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let line = String::from_utf8_lossy(&cmdline).replace('\0', " ").trim().to_owned();
        if !line.is_empty() {
            out.push((pid, line));
        }
    }
    out
}

fn positive(row: &Value, key: &str) -> f64 {
    let x = row[key].as_f64().unwrap_or(f64::NAN);
    assert!(x > 0.0, "{key} of {row}");
    x
}

#[test]
fn rbd_experiment_quick_run_compares_stics_tgt_and_rbd_bench() {
    let _serial = stics_testkit::proc::one_at_a_time();
    // The run's scratch space (and so the cluster's folder) is made under this TMPDIR.
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ceph-cluster.sh");
    let out = Command::new(env!("CARGO_BIN_EXE_stics"))
        .args(["bench", "rbd", "--quick", "--reps", "1", "--json", "--cluster-script"])
        .arg(&script)
        .arg("--out")
        .arg(out_dir.path())
        .env("TMPDIR", tmp.path())
        .output()
        .expect("run stics bench rbd");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stics bench rbd failed: {stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(v["experiment"], "rbd");

    // Every workload, with numbers from all three peers.
    let workloads =
        ["4k-randread-qd1", "4k-randread-qd32", "4k-randwrite-qd1", "4k-randwrite-qd32", "1M-read-qd8", "1M-write-qd8"];
    let per = v["sections"][0]["rows"].as_array().cloned().unwrap_or_default();
    assert_eq!(per.len(), workloads.len() * 3, "{per:?}");
    for w in workloads {
        for peer in ["stics", "tgt", "rbd bench"] {
            let row = per.iter().find(|r| r["workload"] == w && r["peer"] == peer);
            let row = row.unwrap_or_else(|| panic!("no row for {w} / {peer}: {per:?}"));
            positive(row, "iops");
            positive(row, "bandwidth");
        }
    }
    let cmp = v["sections"][1]["rows"].as_array().cloned().unwrap_or_default();
    let names: Vec<&str> = cmp.iter().filter_map(|r| r["workload"].as_str()).collect();
    assert_eq!(names, workloads);
    for r in &cmp {
        let (s, t, rb) = (positive(r, "stics"), positive(r, "tgt"), positive(r, "rbd_bench"));
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs();
        assert!(close(positive(r, "vs_tgt"), s / t), "{r}");
        assert!(close(positive(r, "vs_rbd_bench"), s / rb), "{r}");
    }
    // The goal's readings at depth 32: two per depth-32 workload, reported, never a failed run.
    let goal = v["sections"][2]["rows"].as_array().cloned().unwrap_or_default();
    assert_eq!(goal.len(), 4, "{goal:?}");
    for r in &goal {
        assert!(r["met"] == "yes" || r["met"] == "no", "{r}");
    }
    assert_eq!(v["checks"].as_array().map(Vec::len), Some(0));

    // The report folder holds what --out promises, and the commands name the three peers.
    let dir = out_dir.path().join("rbd");
    for f in ["report.md", "table-1.csv", "table-1.json", "commands.txt", "machine.json"] {
        assert!(dir.join(f).is_file(), "{f} missing in {}", dir.display());
    }
    let commands = std::fs::read_to_string(dir.join("commands.txt")).unwrap();
    for needle in ["ceph-cluster.sh start", "ceph-cluster.sh stop", " target ", "--bstype rbd", " bench --io-type"] {
        assert!(commands.contains(needle), "{needle:?} not in commands.txt:\n{commands}");
    }

    // Nothing is left running: no Ceph daemon or stics target naming the run's scratch space, no
    // tgtd the run started (each is named by its control port and portal in commands.txt).
    let scratch = tmp.path().to_string_lossy().into_owned();
    let tgtds: Vec<&str> = commands.lines().filter_map(|l| l.find("tgtd -f ").map(|i| &l[i..])).collect();
    assert!(!tgtds.is_empty(), "no tgtd in commands.txt:\n{commands}");
    let left: Vec<(String, String)> = processes()
        .into_iter()
        .filter(|(_, line)| line.contains(&scratch) || tgtds.iter().any(|t| line == t))
        .collect();
    assert!(left.is_empty(), "left running after the run: {left:?}\n{stderr}");
    // And the scratch space (the cluster's folder with it) is gone.
    let files: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(files.is_empty(), "scratch left behind: {files:?}");
}

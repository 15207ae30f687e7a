//! `stics bench` experiments run for real in their CI size: the built binary drives stics target,
//! tgt, qemu-img and `stics wan`, and the reports carry every row with measured numbers.

use std::process::Command;

use serde_json::Value;

fn bench(args: &[&str]) -> Value {
    let out_dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_stics"))
        .arg("bench")
        .args(args)
        .args(["--quick", "--reps", "1", "--json", "--out"])
        .arg(out_dir.path())
        .output()
        .expect("run stics bench");
    assert!(out.status.success(), "stics bench {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    // The report folder holds what --out promises.
    let dir = out_dir.path().join(args[0]);
    for f in ["report.md", "table-1.csv", "table-1.json", "commands.txt", "machine.json"] {
        assert!(dir.join(f).is_file(), "{f} missing in {}", dir.display());
    }
    let commands = std::fs::read_to_string(dir.join("commands.txt")).unwrap();
    assert!(!commands.trim().is_empty());
    v
}

fn rows(v: &Value, section: usize) -> Vec<Value> {
    v["sections"][section]["rows"].as_array().cloned().unwrap_or_default()
}

fn positive(row: &Value, key: &str) -> f64 {
    let x = row[key].as_f64().unwrap_or(f64::NAN);
    assert!(x > 0.0, "{key} of {row}");
    x
}

#[test]
fn micro_measures_every_request_size_on_both_targets() {
    let _serial = stics_testkit::proc::one_at_a_time();
    let v = bench(&["micro"]);
    let lat = rows(&v, 0);
    let sizes: Vec<f64> = lat.iter().map(|r| r["size"].as_f64().unwrap()).collect();
    assert_eq!(sizes, [512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0, 65536.0]);
    for r in &lat {
        positive(r, "stics");
        positive(r, "tgt");
    }
    // The paper's two printed latencies stand beside ours, in seconds.
    assert_eq!(lat[0]["paper"].as_f64(), Some(283e-6));
    assert_eq!(lat[7]["paper"].as_f64(), Some(2469e-6));
    for r in &rows(&v, 1) {
        positive(r, "stics");
        positive(r, "tgt");
    }
}

#[test]
fn delay_adds_two_one_way_delays_to_each_blocking_request() {
    let _serial = stics_testkit::proc::one_at_a_time();
    let v = bench(&["delay", "--no-gateway", "--delays", "0ms,8ms"]);
    let rs = rows(&v, 0);
    // local, target, and per delay a file and a null LUN, for each of the four benchmarks.
    assert_eq!(rs.len(), 4 * (2 + 2 * 2), "{rs:?}");
    for r in &rs {
        let resp = positive(r, "response");
        if r["at"] == "8 ms" {
            // Blocking I/O cannot finish faster than the 16 ms round trip.
            assert!(resp > 0.016, "{r}");
        }
    }
}

#[test]
fn packets_counts_the_wan_traffic_of_postmark_and_the_messages_of_each_call() {
    let _serial = stics_testkit::proc::one_at_a_time();
    let v = bench(&["packets"]);
    let traffic = rows(&v, 0);
    let paths: Vec<&str> = traffic.iter().filter_map(|r| r["path"].as_str()).collect();
    assert_eq!(paths, ["paper: iSCSI", "paper: STICS", "plain", "log", "immediate"]);
    for r in &traffic[2..] {
        let total = positive(r, "packets");
        // The buckets partition the packets.
        let sum: f64 = (0..6).map(|i| r[format!("b{i}")].as_f64().unwrap()).sum();
        assert!((sum - total).abs() < 0.5, "{r}");
        positive(r, "host_bytes");
    }
    let calls = rows(&v, 1);
    assert_eq!(calls.len(), 17);
    for r in &calls {
        // A cold cache must read the path before any call three directories down can act.
        positive(r, "cold_3");
        assert!(r["cold_3_sync"].as_f64() >= r["cold_3"].as_f64(), "{r}");
    }
}

/// PIDs whose parent is `parent`, with their start times (so that a PID that came round again is
/// not taken for the same process).
fn children_of(parent: u32) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{name}/stat")) else { continue };
        let f: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split_whitespace().collect();
        if f[1] == parent.to_string() {
            out.push((name, f[19].to_owned()));
        }
    }
    out
}

fn still_running(pid: &str, start: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let f: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split_whitespace().collect();
        f[19] == start && f[0] != "Z"
    })
}

#[test]
fn an_interrupted_run_stops_its_processes_and_leaves_no_mount_namespace_or_scratch() {
    let _serial = stics_testkit::proc::one_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let err_file = logs.path().join("stderr");
    let mut child = stics_testkit::proc::spawn(
        Command::new(env!("CARGO_BIN_EXE_stics"))
            .args(["bench", "packets", "--quick", "--reps", "1", "--no-calls"])
            .env("TMPDIR", tmp.path()),
        Some(&err_file),
    );
    let pid = child.pid();
    let under_tmp = || {
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
        mounts.lines().filter(|l| l.contains(&*tmp.path().to_string_lossy())).map(str::to_owned).collect::<Vec<_>>()
    };
    // Interrupt it with PostMark running on ext4 over the export, through the WAN.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    while !under_tmp().iter().any(|l| l.contains(" ext4 ")) {
        assert!(child.alive(), "stics bench ended before PostMark started");
        assert!(std::time::Instant::now() < deadline, "no ext4 mounted after 180 s");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let kids = children_of(pid);
    assert!(kids.len() >= 2, "target, gateway or export, and PostMark: {kids:?}");
    assert!(child.signal("INT"));
    let status = child.wait_exit(std::time::Duration::from_secs(60));
    let stderr = std::fs::read_to_string(&err_file).unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(130), "(none: still running 60 s after SIGINT) {stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    for (p, start) in &kids {
        assert!(!still_running(p, start), "child {p} survived: {stderr}");
    }
    assert_eq!(under_tmp(), Vec::<String>::new());
    let netns = String::from_utf8(Command::new("ip").args(["netns", "list"]).output().unwrap().stdout).unwrap();
    assert!(!netns.contains(&format!("sbpk{pid}-")), "{netns}");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "scratch left behind: {left:?}");
}

#[test]
fn wan_measures_each_promise_of_the_emulator() {
    let _serial = stics_testkit::proc::one_at_a_time();
    let v = bench(&["wan"]);
    let rs = rows(&v, 0);
    let names: Vec<&str> = rs.iter().filter_map(|r| r["measurement"].as_str()).collect();
    for want in ["plain veth: ping", "emulator, no delay: iperf3", "--delay 5ms: ping", "--rate 100mbit", "reno: loss"]
    {
        assert!(names.iter().any(|n| n.contains(want)), "{want} missing from {names:?}");
    }
    for r in &rs {
        positive(r, "value");
    }
    // Every bound the emulator promises was checked, and bench exits non-zero when one fails.
    assert_eq!(rs.iter().filter(|r| r["verdict"] == "pass").count(), 6, "{rs:?}");
}

#[test]
fn interop_runs_every_check_on_both_targets() {
    let _serial = stics_testkit::proc::one_at_a_time();
    let v = bench(&["interop"]);
    let rs = rows(&v, 0);
    assert_eq!(rs.len(), 10, "{rs:?}");
    for r in &rs {
        assert_eq!(r["verdict"], "ok", "{r}");
    }
}

#[test]
fn initiator_compares_both_exports_and_reads_at_both_depths_on_three_paths() {
    let _serial = stics_testkit::proc::one_at_a_time();
    let v = bench(&["initiator"]);
    let pm = rows(&v, 0);
    assert_eq!(pm.len(), 2, "{pm:?}");
    for r in &pm {
        positive(r, "seconds");
        assert_eq!(r["fsck"], "1/1", "ext4 stayed consistent: {r}");
    }
    let fio = rows(&v, 1);
    assert_eq!(fio.len(), 3, "{fio:?}");
    for r in &fio {
        positive(r, "latency");
    }
    let reads = rows(&v, 2);
    assert_eq!(reads.len(), 6, "{reads:?}");
    for r in &reads {
        positive(r, "iops");
        positive(r, "mean");
    }
    // Across the WAN a read at depth 1 takes a round trip of 2 ms at least.
    assert!(reads[4]["mean"].as_f64().unwrap() > 0.002, "{}", reads[4]);
}

#[test]
fn gateway_measures_both_modes_and_both_restarts() {
    let _serial = stics_testkit::proc::one_at_a_time();
    let v = bench(&["gateway"]);
    let modes: Vec<Value> = rows(&v, 0);
    assert_eq!(modes.iter().map(|r| r["mode"].as_str().unwrap()).collect::<Vec<_>>(), ["write-through", "log"]);
    for r in &modes {
        positive(r, "iops");
        // A write-through write waits for the remote: one round trip of 16 ms at least.
        if r["mode"] == "write-through" {
            assert!(positive(r, "mean") > 0.016, "{r}");
        }
    }
    let restarts = rows(&v, 1);
    assert_eq!(restarts.len(), 2, "{restarts:?}");
    // The WAN was cut while writes went on: the log held dirty data when the gateway was killed.
    positive(&restarts[0], "dirty");
    positive(&restarts[0], "restart");
    positive(&restarts[1], "restart");
}

#[test]
fn postmark_merges_the_committed_full_size_slices_into_one_table_and_figure() {
    let full = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/reproduction/full");
    let mut slices: Vec<String> = std::fs::read_dir(&full)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("postmark-"))
        .map(|p| p.display().to_string())
        .collect();
    slices.sort();
    assert!(slices.len() >= 2, "{slices:?}");
    let out = tempfile::tempdir().unwrap();
    let png = out.path().join("merged.png");
    let run = Command::new(env!("CARGO_BIN_EXE_stics"))
        .args(["bench", "postmark", "--json", "--merge", &slices.join(","), "--plot"])
        .arg(&png)
        .output()
        .expect("run stics bench");
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let v: Value = serde_json::from_slice(&run.stdout).expect("a JSON report");
    let rows = rows(&v, 0);
    assert_eq!(rows.len(), slices.len(), "one row per slice");
    for r in &rows {
        assert_eq!(r["fsck"], "clean", "{r}");
        positive(r, "plain");
    }
    // Ordered by rate (100mbit before 1gbit, the default --rates), then pool, then block.
    let rates: Vec<&str> = rows.iter().map(|r| r["rate"].as_str().unwrap()).collect();
    assert!(rates.windows(2).all(|w| !(w[0] == "1gbit" && w[1] == "100mbit")), "{rates:?}");
    assert!(std::fs::metadata(&png).unwrap().len() > 10_000, "a drawn figure");
    // A slice given twice is refused, by name.
    let twice = format!("{},{}", slices[0], slices[0]);
    let run =
        Command::new(env!("CARGO_BIN_EXE_stics")).args(["bench", "postmark", "--merge", &twice]).output().unwrap();
    assert!(!run.status.success());
    assert!(String::from_utf8_lossy(&run.stderr).contains("merge each slice once"));
}

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

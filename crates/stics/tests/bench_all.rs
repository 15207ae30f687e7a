//! `stics bench all --quick --reps 1`, the command that regenerates `docs/reproduction/`, run whole
//! against the real peers: it completes, every experiment writes its folder, and each table has
//! the rows, columns and figures of the committed report, with measured numbers in them.
//!
//! It takes about half an hour (five minutes of it `app`'s build and databases), so the default test
//! run leaves it out and CI runs it after that: `cargo test -p stics --test bench_all -- --ignored`.
//! The committed report is the expected shape: an experiment whose rows change needs the report
//! regenerated.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

/// What `stics bench all` runs, in its order.
const EXPERIMENTS: [&str; 19] = [
    "wan",
    "conformance",
    "interop",
    "initiator",
    "target",
    "tls",
    "micro",
    "delay",
    "disk",
    "cache-location",
    "congestion",
    "postmark",
    "packets",
    "write-model",
    "trace",
    "gateway",
    "app",
    "coherence",
    "nfs",
];

/// The columns that name a row (the rest are measured), per experiment and table (1-based);
/// tables not listed are matched by their row count alone.
const KEYS: &[(&str, usize, &[&str])] = &[
    ("conformance", 1, &["target", "block_size"]),
    ("interop", 1, &["check", "target"]),
    ("initiator", 1, &["export"]),
    ("initiator", 2, &["export"]),
    ("initiator", 3, &["target", "depth"]),
    ("target", 1, &["target", "workload"]),
    ("target", 2, &["workload"]),
    ("tls", 1, &["op", "transport"]),
    ("tls", 2, &["op"]),
    ("micro", 1, &["size"]),
    ("micro", 2, &["size"]),
    ("delay", 1, &["op", "device", "at"]),
    ("disk", 1, &["model", "access", "via"]),
    ("cache-location", 1, &["delay"]),
    ("congestion", 1, &["load"]),
    ("postmark", 1, &["pool", "rate", "block"]),
    ("postmark", 2, &["path", "at", "kind"]),
    ("packets", 1, &["path"]),
    ("packets", 2, &["op"]),
    ("write-model", 2, &["rtt", "loss", "size"]),
    ("write-model", 3, &["rtt", "loss", "size"]),
    ("write-model", 4, &["operation"]),
    ("trace", 1, &["path"]),
    ("trace", 2, &["bucket"]),
    ("gateway", 1, &["mode"]),
    ("gateway", 4, &["path"]),
    ("app", 1, &["at", "path", "workload", "mount"]),
    ("coherence", 1, &["delay", "path"]),
    ("coherence", 2, &["delay"]),
    ("coherence", 3, &["delay", "reader"]),
    ("coherence", 4, &["delay", "share"]),
    ("nfs", 1, &["workload", "client"]),
    ("nfs", 2, &["workload", "client"]),
    ("nfs", 3, &["workload", "client"]),
    ("nfs", 4, &["workload", "client", "rtt"]),
    ("nfs", 5, &["op"]),
];

/// The columns that name the rows of table `table` of `exp` (none: matched by position only).
fn keys(exp: &str, table: usize) -> &'static [&'static str] {
    KEYS.iter().find(|(e, t, _)| *e == exp && *t == table).map_or(&[], |k| k.2)
}

fn committed() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/reproduction")
}

fn tables(dir: &Path) -> Vec<(String, Vec<Value>)> {
    let mut numbered: Vec<(usize, String)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|n| Some((n.strip_prefix("table-")?.strip_suffix(".json")?.parse().ok()?, n)))
        .collect();
    numbered.sort();
    numbered
        .into_iter()
        .map(|(_, n)| {
            let text = std::fs::read_to_string(dir.join(&n)).unwrap();
            let rows: Vec<Value> = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}/{n}: {e}", dir.display()));
            (n, rows)
        })
        .collect()
}

fn files_ending(dir: &Path, ext: &str) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(ext))
        .collect()
}

fn positive(row: &Value, key: &str) -> f64 {
    let x = row[key].as_f64().unwrap_or(f64::NAN);
    assert!(x > 0.0, "{key} of {row}");
    x
}

/// Each table of `exp` against the committed one: the same tables and figures, the same rows
/// named the same way, every column, a number wherever the committed report has one, and every
/// number finite.
fn same_shape(exp: &str, ours: &Path, theirs: &Path) {
    let (mine, want) = (tables(ours), tables(theirs));
    let names = |t: &[(String, Vec<Value>)]| t.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&mine), names(&want), "{exp}: tables");
    assert_eq!(files_ending(ours, ".csv"), files_ending(theirs, ".csv"), "{exp}: tables as CSV");
    assert_eq!(files_ending(ours, ".png"), files_ending(theirs, ".png"), "{exp}: figures");
    for (i, ((name, rows), (_, want))) in mine.iter().zip(&want).enumerate() {
        assert_eq!(rows.len(), want.len(), "{exp}/{name}: rows {rows:#?}");
        let keys = keys(exp, i + 1);
        for (r, w) in rows.iter().zip(want) {
            let (r, w) = (r.as_object().unwrap(), w.as_object().unwrap());
            assert_eq!(r.keys().collect::<Vec<_>>(), w.keys().collect::<Vec<_>>(), "{exp}/{name}: columns");
            for k in keys {
                assert_eq!(r[*k], w[*k], "{exp}/{name}: the row named by {keys:?} in {w:?}");
            }
            for (k, v) in r {
                assert!(!v.is_null() || w[k].is_null(), "{exp}/{name}: {k} missing in {r:?}");
                if let Some(x) = v.as_f64() {
                    assert!(x.is_finite(), "{exp}/{name}: {k} of {r:?}");
                }
            }
        }
    }
}

/// What each experiment promises beyond its shape, in the report folders under `dir`.
fn promises(dir: &Path) {
    let rows = |exp: &str, table: usize| tables(&dir.join(exp)).swap_remove(table - 1).1;

    // Every bound the emulator promises held (bench exits non-zero when one does not).
    let wan = rows("wan", 1);
    assert_eq!(wan.iter().filter(|r| r["verdict"] == "pass").count(), 6, "{wan:#?}");
    for r in &wan {
        positive(r, "value");
    }

    let conformance = rows("conformance", 1);
    assert_eq!(conformance[0]["target"], "stics");
    assert_eq!(conformance[0]["failed"].as_f64(), Some(0.0), "{conformance:?}");

    for r in &rows("interop", 1) {
        assert_eq!(r["verdict"], "ok", "{r}");
    }

    for r in &rows("initiator", 1) {
        positive(r, "seconds");
        assert_eq!(r["fsck"], "1/1", "ext4 stayed consistent: {r}");
    }
    // Across the WAN a read at depth 1 takes a round trip of 2 ms at least.
    let reads = rows("initiator", 3);
    assert!(positive(&reads[4], "mean") > 0.002, "{}", reads[4]);

    for t in [1, 2] {
        for r in &rows("micro", t) {
            positive(r, "stics");
            positive(r, "tgt");
        }
    }
    // The paper's two printed latencies stand beside ours, in seconds.
    let micro = rows("micro", 1);
    assert_eq!(micro[0]["paper"].as_f64(), Some(283e-6));
    assert_eq!(micro[7]["paper"].as_f64(), Some(2469e-6));

    for r in &rows("delay", 1) {
        let response = positive(r, "response");
        if r["at"] == "8 ms" && r["device"] != "gateway" {
            // Blocking I/O cannot finish faster than the 16 ms round trip.
            assert!(response > 0.016, "{r}");
        }
    }

    // A reader that asks for the blocks with its grants gets some of them so; one told not to, none.
    for r in &rows("coherence", 3) {
        positive(r, "iops");
        let with = r["with_data"].as_f64().unwrap_or(f64::NAN);
        if r["reader"].as_str().is_some_and(|s| s.contains("--no-grant-data")) {
            assert_eq!(with, 0.0, "{r}");
        } else {
            assert!(with > 0.0, "{r}");
        }
    }

    for r in &rows("app", 1) {
        assert_eq!(r["fsck"], "clean", "ext4 stayed consistent: {r}");
    }

    for r in &rows("postmark", 1) {
        assert_eq!(r["fsck"], "clean", "{r}");
        positive(r, "plain");
        positive(r, "log");
        positive(r, "immediate");
    }
    // Every path's writes were counted where the host sent them: at the remote for plain
    // iSCSI, at the gateway otherwise.
    let waits = rows("postmark", 2);
    for path in ["plain", "log", "immediate", "log + link"] {
        let at = if path == "plain" { "remote" } else { "gateway" };
        let w = waits.iter().find(|r| r["path"] == path && r["at"] == at && r["kind"] == "write");
        positive(w.unwrap_or_else(|| panic!("no {path} writes at the {at}: {waits:#?}")), "commands");
    }

    let traffic = rows("packets", 1);
    for r in &traffic[2..] {
        // The buckets partition the packets.
        let total = positive(r, "packets");
        let sum: f64 = (0..6).map(|i| r[format!("b{i}")].as_f64().unwrap()).sum();
        assert!((sum - total).abs() < 0.5, "{r}");
        positive(r, "host_bytes");
    }
    for r in &rows("packets", 2) {
        // A cold cache must read the path before any call three directories down can act.
        positive(r, "cold_3");
        assert!(r["cold_3_sync"].as_f64() >= r["cold_3"].as_f64(), "{r}");
    }

    for r in &rows("trace", 1) {
        assert!(positive(r, "max") >= positive(r, "p99") && positive(r, "p99") >= positive(r, "p50"), "{r}");
        positive(r, "mean");
    }

    for r in &rows("gateway", 1) {
        positive(r, "iops");
        // A write-through write waits for the remote: one round trip of 16 ms at least.
        if r["mode"] == "write-through" {
            assert!(positive(r, "mean") > 0.016, "{r}");
        }
    }
    // The WAN was cut while writes went on: the log held dirty data when the gateway was killed.
    let restarts = rows("gateway", 2);
    positive(&restarts[0], "dirty");
    positive(&restarts[0], "restart");
    positive(&restarts[1], "restart");
    for r in &rows("gateway", 4) {
        positive(r, "iops");
        if r["path"] != "plain destage" {
            // Over the link every epoch went in a group; the writes' random data does not
            // compress, so a group's chunks go raw and only its tables add to the bytes.
            positive(r, "groups");
            assert!(positive(r, "shipped") < 1.01, "{r}");
        }
    }
    // Every workload sent messages, and crossed the wire unless the gateway's cache held it; what
    // changes the file system costs NFS at least one RPC each time, its caches warm or not.
    for t in [1, 2, 3] {
        for r in &rows("nfs", t) {
            positive(r, "messages");
            if r["client"] != "iSCSI + gateway (log)" {
                positive(r, "bytes");
            }
        }
    }
    for r in &rows("nfs", 4) {
        positive(r, "secs");
    }
    for r in &rows("nfs", 5) {
        if ["mkdir", "symlink", "unlink", "rmdir", "creat", "link", "rename", "trunc", "chmod", "chown", "utime"]
            .contains(&r["op"].as_str().unwrap_or_default())
        {
            for k in ["nfs_cold_0", "nfs_cold_3", "nfs_warm_0", "nfs_warm_3"] {
                positive(r, k);
            }
        }
    }
}

#[test]
#[ignore = "about half an hour; CI runs it: cargo test -p stics --test bench_all -- --ignored"]
fn all_quick_completes_and_every_table_has_every_row() {
    let out = tempfile::tempdir().unwrap();
    // Progress goes to the test's stderr as it happens; the JSON reports to stdout.
    let run = Command::new(env!("CARGO_BIN_EXE_stics"))
        .args(["bench", "all", "--quick", "--reps", "1", "--json", "--out"])
        .arg(out.path())
        .stderr(Stdio::inherit())
        .output()
        .expect("run stics bench all");
    assert!(run.status.success(), "stics bench all --quick failed ({}); its output is above", run.status);
    let printed: Vec<Value> = serde_json::Deserializer::from_slice(&run.stdout)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .expect("one JSON report per experiment");
    let names: Vec<&str> = printed.iter().filter_map(|v| v["experiment"].as_str()).collect();
    assert_eq!(names, EXPERIMENTS, "the reports printed");
    for v in &printed {
        for c in v["checks"].as_array().unwrap() {
            assert_eq!(c["ok"], true, "{}: {}", v["experiment"], c["check"]);
        }
    }

    let index = std::fs::read_to_string(out.path().join("README.md")).expect("the report's index");
    for (exp, report) in EXPERIMENTS.into_iter().zip(&printed) {
        let dir = out.path().join(exp);
        for f in ["report.md", "commands.txt", "machine.json"] {
            assert!(dir.join(f).is_file(), "{f} missing in {}", dir.display());
        }
        assert!(std::fs::read_to_string(dir.join("commands.txt")).unwrap().lines().count() > 1, "{exp} ran nothing");
        let title = report["title"].as_str().unwrap();
        assert!(index.contains(title), "the index lacks {title}");
        same_shape(exp, &dir, &committed().join(exp));
    }

    promises(out.path());
}

/// The default run's share: the committed report has every experiment, keeps each promise, and the
/// columns this test names rows by exist and name each row once.
#[test]
fn the_committed_report_has_every_experiment_keeps_each_promise_and_names_each_row_once() {
    let index = std::fs::read_to_string(committed().join("README.md")).expect("docs/reproduction/README.md");
    for exp in EXPERIMENTS {
        let dir = committed().join(exp);
        assert!(dir.join("report.md").is_file(), "docs/reproduction/{exp}/report.md");
        same_shape(exp, &dir, &dir);
        let title = std::fs::read_to_string(dir.join("report.md")).unwrap().lines().next().unwrap().to_owned();
        assert!(index.contains(title.trim_start_matches("# ")), "the index lacks {title}");
        for (i, (name, rows)) in tables(&dir).iter().enumerate() {
            let keys = keys(exp, i + 1);
            if keys.is_empty() {
                continue;
            }
            let named: BTreeSet<String> =
                rows.iter().map(|r| keys.iter().map(|k| r[*k].to_string()).collect::<Vec<_>>().join(" / ")).collect();
            assert_eq!(named.len(), rows.len(), "{exp}/{name}: {keys:?} name two rows alike");
        }
    }
    promises(&committed());
    for (exp, t, _) in KEYS {
        assert!(EXPERIMENTS.contains(exp) && tables(&committed().join(exp)).len() >= *t, "{exp} table {t}");
    }
}

//! libiscsi's conformance suite (`iscsi-test-cu --test=ALL`) against `stics target` with a
//! mem:1GiB LUN of 512-byte blocks and one of 4096-byte blocks: no test may fail.
//! `stics bench conformance` is the one place that runs and counts the suite (it also runs tgt
//! for the side-by-side table); here it runs the stics half.

use std::process::Command;

/// Runs the suite against a `stics target` serving `lun` and checks that it reported `block_size`,
/// that every test of the suite ran and that none failed.
fn suite_has_no_failures(lun: &str, block_size: u32) {
    let keep = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_stics"))
        .args(["bench", "conformance", "--stics-only", "--json", "--lun", lun, "--keep"])
        .arg(keep.path())
        .output()
        .expect("run stics bench conformance");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        // Keep the raw iscsi-test-cu log for whoever reads the failure.
        let kept = keep.keep();
        panic!("conformance failures on {lun} (raw logs kept in {}):\n{stdout}\n{stderr}", kept.display());
    }
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("a JSON report");
    let row = &report["sections"][0]["rows"][0];
    assert_eq!(row["target"], "stics", "{report}");
    assert_eq!(row["block_size"], f64::from(block_size), "the suite ran against {lun} with {block_size}-byte blocks");
    assert_eq!(row["tests"], 230.0, "every test of the suite ran: {row}");
    assert_eq!(row["failed"], 0.0, "no failed test: {report}");
    assert!(report["checks"].as_array().unwrap().iter().all(|c| c["ok"] == true), "{report}");
}

#[test]
fn iscsi_test_cu_all_has_no_failures_against_a_memory_lun() {
    suite_has_no_failures("mem:1GiB", 512);
}

#[test]
fn iscsi_test_cu_all_has_no_failures_against_a_memory_lun_of_4096_byte_blocks() {
    suite_has_no_failures("mem:1GiB:4096", 4096);
}

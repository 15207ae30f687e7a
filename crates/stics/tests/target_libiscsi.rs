//! libiscsi's conformance suite (`iscsi-test-cu --test=ALL`) against `stics target` with a
//! mem:1GiB LUN of 512-byte blocks and one of 4096-byte blocks: no test may fail.
//! `scripts/conformance.sh` is the one place that counts the log (it also runs tgt for the
//! side-by-side table); here it runs the stics half.

use std::process::Command;

/// Runs the suite against a `stics target` serving `lun` and checks that it reported `block_size`,
/// that every test of the suite ran and that none failed.
fn suite_has_no_failures(lun: &str, block_size: u32) {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let logs = tempfile::tempdir().unwrap();
    let out = Command::new("bash")
        .arg(format!("{root}/scripts/conformance.sh"))
        .arg("--stics-only")
        .args(["--lun", lun])
        .arg("--logs")
        .arg(logs.path())
        .env("STICS", env!("CARGO_BIN_EXE_stics"))
        .output()
        .expect("run scripts/conformance.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    if !out.status.success() {
        // Keep the raw iscsi-test-cu log for whoever reads the failure.
        let kept = logs.keep();
        panic!("conformance failures on {lun} (raw logs kept in {}):\n{stdout}\n{stderr}", kept.display());
    }
    let served = format!("LUN under test: {lun}, block size {block_size}");
    assert!(stdout.lines().any(|l| l == served), "the suite ran against {lun} with {block_size}-byte blocks");
    let stics_row = stdout.lines().find(|l| l.starts_with("stics ")).expect("a stics row in the table");
    let cols: Vec<&str> = stics_row.split_whitespace().collect();
    assert_eq!(cols.get(1), Some(&"230"), "every test of the suite ran: {stics_row}");
    assert_eq!(cols.get(4), Some(&"0"), "no failed test: {stics_row}");
}

#[test]
fn iscsi_test_cu_all_has_no_failures_against_a_memory_lun() {
    suite_has_no_failures("mem:1GiB", 512);
}

#[test]
fn iscsi_test_cu_all_has_no_failures_against_a_memory_lun_of_4096_byte_blocks() {
    suite_has_no_failures("mem:1GiB:4096", 4096);
}

//! `stics bench replay`: the built binary replays the EMC-tel-like trace open loop on a RAM device
//! and reports every response.

use std::process::Command;

use serde_json::Value;

#[test]
fn replay_of_the_emc_tel_trace_reports_every_response() {
    let out = Command::new(env!("CARGO_BIN_EXE_stics"))
        .args(["bench", "replay", "mem:64MiB", "--emc-tel", "--requests", "500", "--json"])
        .output()
        .expect("run stics");
    assert!(out.status.success(), "stics bench replay failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    let responses = v["responses"].as_array().expect("responses");
    assert_eq!(responses.len(), 500);
    assert_eq!(v["requests"], 500);
    let mut last = 0.0;
    for r in responses {
        let (at, rt) = (r["at"].as_f64().unwrap(), r["rt"].as_f64().unwrap());
        assert!(rt > 0.0 && at >= last, "{r}");
        last = at;
    }
    let writes = responses.iter().filter(|r| r["write"] == true).count();
    assert_eq!(v["writes"], writes);
    // 89 % writes in seed 004's trace; 500 draws lie within a few points of it.
    assert!((420..=470).contains(&writes), "{writes} writes of 500");
    // About 1.5 s of arrivals at 333/s: the replay keeps the trace's clock.
    let secs = v["seconds"].as_f64().unwrap();
    assert!(secs > 1.0 && secs < 30.0, "{secs}");
    assert_eq!(v["folded"], 0);
}

#[test]
fn replay_names_the_line_of_a_corrupt_trace() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.csv");
    std::fs::write(&path, "1,h,0,Write,0,512,1\n2,h,0,Erase,0,512,1\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_stics"))
        .args(["bench", "replay", "mem:1MiB", "--trace"])
        .arg(&path)
        .output()
        .expect("run stics");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2") && err.contains("Erase"), "{err}");
}

/// Runs `stics ARGS` with `PATH` set to `path`, expecting a failure within 60 s; returns stderr.
fn fails(args: &[&str], path: Option<&std::path::Path>) -> String {
    let dir = tempfile::tempdir().unwrap();
    let err_file = dir.path().join("stderr");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stics"));
    cmd.args(args);
    if let Some(p) = path {
        cmd.env("PATH", p);
    }
    let mut child = stics_testkit::proc::spawn(&mut cmd, Some(&err_file));
    let status = child.wait_exit(std::time::Duration::from_secs(60));
    let err = std::fs::read_to_string(&err_file).unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(1), "stics {args:?} (none: still running after 60 s): {err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

#[test]
fn bad_input_gets_a_message_naming_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("t.txt");
    std::fs::write(&garbage, "this is not a block trace\nnor is this\n").unwrap();
    let t = garbage.to_str().unwrap();
    let err = fails(&["bench", "replay", "mem:1MiB", "--trace", t], None);
    assert!(err.contains("format"), "{err}");

    // Nothing listens on port 1 of loopback.
    let err = fails(&["bench", "load", "iscsi://127.0.0.1:1/iqn.2024-01.org.example:none/0"], None);
    assert!(err.contains("127.0.0.1:1"), "{err}");

    // A PATH without tgt: the experiment says which package to install before starting anything.
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    for tool in ["qemu-img", "ip", "iptables", "nsenter"] {
        if let Some(p) =
            std::env::split_paths(&std::env::var_os("PATH").unwrap()).map(|d| d.join(tool)).find(|p| p.is_file())
        {
            std::os::unix::fs::symlink(p, bin.join(tool)).unwrap();
        }
    }
    let err = fails(&["bench", "micro", "--quick"], Some(&bin));
    assert!(err.contains("tgtd is missing") && err.contains("apt-get install tgt"), "{err}");
}

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

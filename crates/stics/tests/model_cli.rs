//! `stics model`: runs the built binary for every subcommand and checks its tables, JSON, CSV, plots and errors.

use std::process::{Command, Output};

use serde_json::Value;

fn stics(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stics")).arg("model").args(args).output().expect("run stics")
}

fn ok(args: &[&str]) -> String {
    let out = stics(args);
    assert!(out.status.success(), "stics model {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn json(args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    serde_json::from_str(&ok(&a)).unwrap()
}

fn num(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} missing in {v}"))
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs()
}

#[test]
fn tcp_json_gives_throughput_limit_and_critical_loss() {
    let v = json(&["tcp", "--rtt", "10ms", "--loss", "1e-3"]);
    assert!(close(num(&v, "throughput_bps"), 0.93 * 1460.0 * 8.0 / (0.01 * 1e-3_f64.sqrt()), 1e-9), "{v}");
    assert_eq!(v["limit"], "congestion_window");
    assert!(close(num(&v, "critical_loss"), 4.29e-4, 1e-3));
    assert!(close(num(&v, "knee_rtt_rwnd_s"), 65536.0 / 125e6, 1e-9));
    let v = json(&["tcp", "--rtt", "2ms", "--loss", "1e-6"]);
    assert_eq!(v["limit"], "receive_window");
    let v = json(&["tcp", "--rtt", "50us", "--link", "100mbit"]);
    assert_eq!(v["limit"], "link");
    assert!(close(num(&v, "throughput_bps"), 100e6, 1e-12));
}

#[test]
fn tcp_table_prints_units() {
    let out = ok(&["tcp", "--rtt", "0.2ms,2ms,10ms", "--loss", "1e-2,1e-3,1e-6"]);
    assert!(out.contains("RTT [ms]") && out.contains("B [Mbit/s]"), "{out}");
    assert_eq!(out.lines().count(), 1 + 9);
}

#[test]
fn write_json_follows_eq1_and_eq2() {
    let v = json(&["write", "--size", "264KiB", "--rtt", "2ms", "--loss", "1e-6", "--proc", "1ms"]);
    assert_eq!(num(&v, "rounds"), 2.0);
    let b = 65536.0 / 2e-3;
    assert!(close(num(&v, "write_time_s"), 270336.0 / b + 2.0 * 3e-3, 1e-12), "{v}");
    let rows = json(&["write", "--size", "6KiB,inf", "--rtt", "10ms", "--loss", "1e-3"]);
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(num(&rows[0], "rounds"), 1.0);
    assert!(rows[1]["write_time_s"].is_null(), "an infinite request has no finite write time");
    assert!(close(num(&rows[1], "throughput_bps"), num(&rows[1], "eq3_bound_bps"), 1e-12));
}

#[test]
fn write_reads_a_size_distribution_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sizes.txt");
    std::fs::write(&path, "# two sizes\n4KiB 3\n128KiB 1\n").unwrap();
    let v = json(&["write", "--size-dist", path.to_str().unwrap(), "--rtt", "2ms"]);
    assert!(close(num(&v, "mean_size_bytes"), (3.0 * 4096.0 + 131072.0) / 4.0, 1e-12));
    assert!(close(num(&v, "mean_rounds"), 1.25, 1e-12));
    std::fs::write(&path, "4KiB 3\n128KiB lots\n").unwrap();
    let out = stics(&["write", "--size-dist", path.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 2"));
}

#[test]
fn capacity_json_gives_the_paper_asymptotes() {
    let v = json(&["capacity", "--rtt", "2ms", "--loss", "1e-6", "--proc", "0ms"]);
    assert!(close(num(&v, "interleaved_erlang"), 0.26, 0.01), "{v}");
    assert!(close(num(&v, "non_interleaved_erlang"), 0.022, 0.02), "{v}");
    assert_eq!(v["interleaved_bottleneck"], "transmission");
    let v = json(&["capacity", "--rtt", "2ms", "--proc", "5ms", "--size", "4KiB"]);
    assert_eq!(v["interleaved_bottleneck"], "processing");
    assert!(close(num(&v, "interleaved_rate_per_s"), 200.0, 1e-9));
}

#[test]
fn simulate_is_repeatable_and_near_eq5_at_light_load() {
    let args = [
        "simulate",
        "--mode",
        "interleaved",
        "--arrivals",
        "poisson",
        "--load",
        "1e-6",
        "--rtt",
        "10ms",
        "--loss",
        "1e-3",
        "--requests",
        "20000",
        "--seed",
        "42",
        "--json",
    ];
    let a = ok(&args);
    assert_eq!(a, ok(&args), "same seed, same output");
    let v: Value = serde_json::from_str(&a).unwrap();
    assert!(close(num(&v, "mean_write_time_s"), num(&v, "eq5_write_time_s"), 0.01), "{v}");
    assert_eq!(num(&v, "requests"), 20000.0);
    assert!(close(num(&v, "offered_erlang"), 1e-6, 1e-9));
}

#[test]
fn simulate_sweeps_both_modes_as_csv() {
    let out = ok(&["simulate", "--sweep", "load=0.005..0.015", "--points", "3", "--requests", "5000", "--csv"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1 + 2 * 3, "{out}");
    assert!(lines[0].starts_with("mode,arrivals,rtt_s"));
    assert!(lines[1].starts_with("non-interleaved,lognormal,0.002,"));
    assert!(lines[6].starts_with("interleaved,lognormal,0.002,"));
}

#[test]
fn latency_reproduces_seed000_eq1_and_masking() {
    let rows = json(&["latency"]);
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 5, "Table 1's delays 0, 1, 2, 4, 8 ms");
    assert!(close(num(&rows[1], "latency_s"), 0.24e-3 + 2e-3 + 0.408e-3, 1e-12));
    let v = json(&["latency", "--delay", "1ms", "--disk", "5ms"]);
    assert_eq!(v["network_masked"], "yes");
    assert!(close(num(&v, "random_write_s"), 5.408e-3, 1e-12));
}

#[test]
fn sweep_draws_a_png() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("fig3.png");
    ok(&[
        "write",
        "--size",
        "6KiB,264KiB",
        "--loss",
        "1e-2,1e-6",
        "--sweep",
        "rtt=0.1ms..100ms",
        "--log",
        "--points",
        "10",
        "--plot",
        png.to_str().unwrap(),
    ]);
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn bad_input_gets_a_clear_error() {
    for (args, needle) in [
        (vec!["tcp", "--rtt", "10"], "10ms"),
        (vec!["tcp", "--loss", "2"], "between 0 and 1"),
        (vec!["tcp", "--link", "fast"], "1gbit"),
        (vec!["write", "--size", "3 apples"], "KiB"),
        (vec!["tcp", "--sweep", "size=1..2"], "rtt, loss"),
        (vec!["tcp", "--sweep", "rtt=0ms..1ms", "--log"], "above zero"),
        (vec!["capacity", "--size", "inf"], "finite"),
    ] {
        let out = stics(&args);
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn help_explains_the_model_and_defaults() {
    let help = ok(&["simulate", "--help"]);
    for needle in ["-4.5", "6.25", "Poisson", "[default: 200000]", "interleaved"] {
        assert!(help.contains(needle), "missing {needle:?} in:\n{help}");
    }
    let help = ok(&["tcp", "--help"]);
    assert!(help.contains("p_c") && help.contains("[default: 1gbit]") && help.contains("[default: 64KiB]"));
}

//! `stics gateway --config FILE` as a process: the target's guards in front of cached LUNs (a
//! wrong CHAP secret and an initiator not listed are refused at login, the listed initiator gets
//! in, with libiscsi's `iscsi-inq`), two cached LUNs behind one gateway each crash-tested with
//! SIGKILLs against a ledger of stamped blocks, and `/metrics` of the gateway and of
//! `stics target --metrics` read by `promtool check metrics`, histograms included.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use stics_block::BlockDev;
use stics_testkit::ledger::{Durable, Ledger, Pace};
use stics_testkit::net::free_port;
use stics_testkit::peers::{SticsOptions, SticsTarget};
use stics_testkit::proc::wait_port;

mod common;

use common::*;

const FRIEND: &str = "iqn.2024-01.org.stics.test:friend";
const STRANGER: &str = "iqn.2024-01.org.stics.test:stranger";
const SECRET: &str = "gateway-chap-secret-1";

/// A cached LUN's table: `remote`, its own `log` in `dir`, and `mode`.
fn cached_lun(remote: &str, dir: &Path, name: &str, mode: &str) -> String {
    format!(
        "[[target.luns]]\nremote = \"{remote}\"\nlog = \"{}\"\nlog_size = \"256MiB\"\nmode = \"{mode}\"\nram = \"8MiB\"\n",
        dir.join(name).display()
    )
}

fn write_config(dir: &Path, toml: &str) -> PathBuf {
    let path = dir.join("gateway.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

/// Logs in to LUN 0 of the gateway as `initiator` with `iscsi-inq` and CHAP `secret`; Err holds
/// its stderr.
fn inq(port: u16, initiator: &str, secret: &str) -> Result<String, String> {
    let out = Command::new("iscsi-inq")
        .args(["-i", initiator])
        .arg(format!("iscsi://alice%{secret}@127.0.0.1:{port}/{GATEWAY_IQN}/0"))
        .output()
        .expect("run iscsi-inq (libiscsi-bin)");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn a_wrong_secret_and_a_stranger_are_refused_at_login_and_the_listed_initiator_gets_in() {
    let remote = SticsTarget::with_file_lun(Path::new(BIN), 16, &[]);
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "[discovery]\nchap = {{ user = \"finder\", secret = \"discovery-secret-22\" }}\n\
         [[target]]\niqn = \"{GATEWAY_IQN}\"\nchap = {{ user = \"alice\", secret = \"{SECRET}\" }}\n\
         mutual_chap = {{ user = \"gateway\", secret = \"gateway-mutual-secret\" }}\ninitiators = [\"{FRIEND}\"]\n{}",
        cached_lun(&remote.url(0), dir.path(), "log", "log")
    );
    let config = write_config(dir.path(), &toml);
    let (_gw, port) = gateway_config(&config, &dir.path().join("gw.log"), &[]);
    let wrong = inq(port, FRIEND, "not-the-secret-at-all").expect_err("a wrong secret is refused");
    assert!(wrong.to_lowercase().contains("login"), "{wrong}");
    let stranger = inq(port, STRANGER, SECRET).expect_err("an initiator not listed is refused");
    assert!(stranger.to_lowercase().contains("login"), "{stranger}");
    let friend = inq(port, FRIEND, SECRET).unwrap_or_else(|e| panic!("the listed initiator is let in: {e}"));
    assert!(friend.contains("Peripheral"), "an INQUIRY answer: {friend}");
}

#[test]
fn two_cached_luns_behind_one_gateway_each_survive_sigkills_with_every_durable_write() {
    const BLOCKS: u64 = 512;
    const ROUNDS: u32 = 25;
    let remotes =
        [SticsTarget::with_file_lun(Path::new(BIN), 16, &[]), SticsTarget::with_file_lun(Path::new(BIN), 16, &[])];
    let dir = tempfile::tempdir().unwrap();
    let modes = ["log", "immediate"];
    let toml = format!(
        "[[target]]\niqn = \"{GATEWAY_IQN}\"\n{}{}",
        cached_lun(&remotes[0].url(0), dir.path(), "log0", modes[0]),
        cached_lun(&remotes[1].url(0), dir.path(), "log1", modes[1])
    );
    let config = write_config(dir.path(), &toml);
    let mut rng = StdRng::seed_from_u64(31);
    let mut ledgers = modes.map(|m| Ledger::new(BLOCKS, 512, Durable::of_mode(m, false)));
    let mut rngs = [StdRng::seed_from_u64(32), StdRng::seed_from_u64(33)];
    let started = Instant::now();
    let verify = |ledgers: &mut [Ledger; 2], port: u16, round: &str| {
        for (i, ledger) in ledgers.iter_mut().enumerate() {
            let (rt, lun) = open_url(&format!("iscsi://127.0.0.1:{port}/{GATEWAY_IQN}/{i}"));
            rt.block_on(ledger.verify(&lun, &format!("LUN {i} ({}) {round}", modes[i])));
        }
    };
    for round in 0..ROUNDS {
        let (mut gw, port) = gateway_config(&config, &dir.path().join("gw.log"), &[]);
        verify(&mut ledgers, port, &format!("round {round}"));
        let (rt, lun0) = open_url(&format!("iscsi://127.0.0.1:{port}/{GATEWAY_IQN}/0"));
        let (_rt1, lun1) = open_url(&format!("iscsi://127.0.0.1:{port}/{GATEWAY_IQN}/1"));
        let kill_after = Duration::from_millis(rng.gen_range(20..300));
        let t = Instant::now();
        let [a, b] = &mut ledgers;
        let [ra, rb] = &mut rngs;
        let stop = || t.elapsed() >= kill_after;
        rt.block_on(async {
            tokio::join!(a.run(&lun0, ra, Pace::FAST, stop), b.run(&lun1 as &dyn BlockDev, rb, Pace::FAST, stop))
        });
        gw.kill();
    }
    let (_gw, port) = gateway_config(&config, &dir.path().join("last.log"), &[]);
    verify(&mut ledgers, port, "after the last round");
    for (i, l) in ledgers.iter().enumerate() {
        let acked = l.acked().load(Ordering::Relaxed);
        assert!(acked > 0, "LUN {i} took writes");
        eprintln!("LUN {i} ({}): {ROUNDS} SIGKILLs, {acked} writes acknowledged, {} flushes", modes[i], l.flushes());
    }
    eprintln!("{:?} in all", started.elapsed());
}

/// Metric names (before any label) in a scrape.
fn families(text: &str) -> Vec<&str> {
    text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).collect()
}

#[test]
fn metrics_of_the_gateway_and_of_the_target_pass_promtool_with_latency_histograms() {
    let remotes =
        [SticsTarget::with_file_lun(Path::new(BIN), 16, &[]), SticsTarget::with_file_lun(Path::new(BIN), 16, &[])];
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "[[target]]\niqn = \"{GATEWAY_IQN}\"\n{}{}",
        cached_lun(&remotes[0].url(0), dir.path(), "log0", "log"),
        cached_lun(&remotes[1].url(0), dir.path(), "log1", "immediate")
    );
    let config = write_config(dir.path(), &toml);
    let metrics = free_port();
    let (_gw, port) =
        gateway_config(&config, &dir.path().join("gw.log"), &["--metrics", &format!("127.0.0.1:{metrics}")]);
    assert!(wait_port(metrics, Duration::from_secs(20)));
    for lun in 0..2 {
        let (rt, dev) = open_url(&format!("iscsi://127.0.0.1:{port}/{GATEWAY_IQN}/{lun}"));
        rt.block_on(async {
            dev.write(8, stics_testkit::pattern::noise(lun, 4096), false).await.unwrap();
            dev.flush().await.unwrap();
            dev.read(8, 8).await.unwrap();
        });
    }
    let text = scrape_checked(metrics);
    let types = families(&text);
    for want in [
        "stics_target_command_latency_seconds histogram",
        "stics_target_sessions gauge",
        "stics_target_commands_total counter",
        "stics_cache_dirty_bytes gauge",
    ] {
        assert!(types.contains(&want), "{want} in the gateway's scrape:\n{text}");
    }
    // Every LUN's host-visible read and write latency, and each cache's series, by LUN; flush
    // latency where the host flushes (a LUN in log mode has no volatile cache to flush).
    for (lun, kinds) in [("0", &["read", "write"][..]), ("1", &["read", "write", "flush"][..])] {
        for kind in kinds {
            let bucket = format!("lun=\"{lun}\",kind=\"{kind}\"");
            assert!(
                text.lines()
                    .any(|l| l.starts_with("stics_target_command_latency_seconds_bucket") && l.contains(&bucket)),
                "{bucket} in:\n{text}"
            );
        }
        let labelled = format!("stics_cache_host_write_bytes_total{{target=\"{GATEWAY_IQN}\",lun=\"{lun}\"");
        assert!(text.contains(&labelled), "{labelled} in:\n{text}");
    }

    // stics target --metrics: sessions, commands, bytes and command latency.
    let metrics = free_port();
    let target = SticsTarget::start(
        Path::new(BIN),
        SticsOptions::args(&["--lun", "mem:16MiB", "--metrics", &format!("127.0.0.1:{metrics}")]),
    );
    assert!(wait_port(metrics, Duration::from_secs(20)));
    let (rt, dev) = open_url(&target.url(0));
    rt.block_on(async {
        dev.write(0, stics_testkit::pattern::noise(7, 8192), false).await.unwrap();
        dev.read(0, 16).await.unwrap();
    });
    let text = scrape_checked(metrics);
    let types = families(&text);
    for want in [
        "stics_target_command_latency_seconds histogram",
        "stics_target_sessions gauge",
        "stics_target_received_bytes_total counter",
        "stics_target_sent_bytes_total counter",
    ] {
        assert!(types.contains(&want), "{want} in the target's scrape:\n{text}");
    }
    assert!(!text.contains("stics_cache_"), "a target without caches has no cache series:\n{text}");
    drop((rt, dev));
}

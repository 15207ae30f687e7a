//! Self-healing: a verified random-write workload keeps going, with every block verified at the
//! end, while tgt is killed with SIGKILL and restarted, while connections are cut at the socket,
//! and while the link goes silent.

use std::time::{Duration, Instant};

use bytes::Bytes;
use stics_block::BlockDev;
use stics_initiator::{IscsiUrl, Lun};
use stics_testkit::net::Proxy;
use stics_testkit::peers::Tgt;
use stics_testkit::workload::{fault_options as options, run_with_fault};

#[test]
fn target_killed_and_restarted_mid_workload_loses_no_write() {
    let mut tgt = Tgt::start(16);
    let url = tgt.url();
    let c = run_with_fault(&url, 4, || {
        std::thread::sleep(Duration::from_millis(1000));
        tgt.kill();
        std::thread::sleep(Duration::from_millis(700));
        tgt.restart();
    });
    assert!(c.reconnects >= 1, "the session was reinstated: {c:?}");
}

#[test]
fn connections_cut_at_the_socket_mid_workload_lose_no_write() {
    let tgt = Tgt::start(16);
    let proxy = Proxy::start(tgt.port);
    let c = run_with_fault(&tgt.url_via(proxy.port), 4, || {
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(800));
            proxy.cut();
        }
    });
    assert!(c.reconnects >= 3, "each cut led to a reconnection: {c:?}");
}

#[test]
fn silent_link_is_detected_by_nop_out_and_healed() {
    let tgt = Tgt::start(16);
    let proxy = Proxy::start(tgt.port);
    let c = run_with_fault(&tgt.url_via(proxy.port), 5, || {
        std::thread::sleep(Duration::from_millis(800));
        proxy.freeze(true);
        std::thread::sleep(Duration::from_millis(2500));
        proxy.freeze(false);
    });
    assert!(c.reconnects >= 1, "the silent connection was replaced: {c:?}");
}

#[test]
fn io_fails_cleanly_when_the_target_stays_away_past_the_recovery_window() {
    let mut tgt = Tgt::start(16);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let url = IscsiUrl::parse(&tgt.url()).unwrap();
    let mut o = options();
    o.config.timers.recovery.timeout = Duration::from_millis(1500);
    let lun = rt.block_on(Lun::open(&url, &o)).unwrap();
    tgt.kill();
    let started = Instant::now();
    let e = rt.block_on(lun.write(0, Bytes::from(vec![1u8; 512]), false)).unwrap_err();
    assert!(matches!(e, stics_block::BlockError::Unreachable(_)), "{e}");
    assert!(started.elapsed() >= Duration::from_millis(1000));
    // The target comes back: the next command reconnects by itself.
    tgt.restart();
    rt.block_on(lun.write(0, Bytes::from(vec![2u8; 512]), false)).unwrap();
    assert_eq!(rt.block_on(lun.read(0, 1)).unwrap(), Bytes::from(vec![2u8; 512]));
}

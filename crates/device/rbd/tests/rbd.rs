//! `RbdDev` against a real throwaway Ceph cluster with one OSD, shared by the tests of this
//! binary. `STICS_RBD_TEST_CONF=PATH` runs them against an existing cluster instead (a pool
//! `rbd`; images are created here).
#![cfg(feature = "rbd")]

mod common;

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use stics_block::{BlockDev, BlockError, Provisioning};
use stics_rbd::{RbdDev, RbdError, RbdOptions};

use common::cluster;
use stics_testkit::pattern::stamp_run;

async fn round_trip(bs: u32) {
    let c = cluster();
    let name = c.image(&format!("rt{bs}"), "64M", &[]);
    let dev = Arc::new(c.open(&name, bs).await);
    let g = dev.geometry();
    assert_eq!(g.block_size, bs);
    assert_eq!(g.bytes(), 64 << 20);
    assert!(!dev.volatile_cache(), "rbd_cache is off: completed writes are durable");
    assert!(!dev.read_only());
    assert!(dev.supports_discard());
    let id = dev.device_id().unwrap();
    assert!(id.starts_with("rbd:") && id.matches('/').count() == 2, "{id}");

    // 64 concurrent writes of 1..=16 blocks spread over the image, some across object borders.
    let per = u64::from((4 << 20) / bs);
    let spots: Vec<(u64, u64)> =
        (0..64u64).map(|i| ((i * g.num_blocks / 64 + per - 3) % (g.num_blocks - 16), 1 + i % 16)).collect();
    let mut set = tokio::task::JoinSet::new();
    for &(lba, n) in &spots {
        let dev = Arc::clone(&dev);
        set.spawn(async move { dev.write(lba, stamp_run(lba, n, 1, bs as usize), lba % 2 == 0).await });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap().unwrap();
    }
    dev.flush().await.unwrap();
    let mut set = tokio::task::JoinSet::new();
    for &(lba, n) in &spots {
        let dev = Arc::clone(&dev);
        set.spawn(async move { (lba, n, dev.read(lba, n as u32).await) });
    }
    while let Some(r) = set.join_next().await {
        let (lba, n, got) = r.unwrap();
        assert_eq!(got.unwrap(), stamp_run(lba, n, 1, bs as usize), "{n} blocks at {lba}");
    }
    // Never-written blocks read as zeros; out-of-range and misaligned requests are refused.
    let far = dev.read(g.num_blocks - 1, 1).await.unwrap();
    assert!(far.iter().all(|&b| b == 0));
    assert!(matches!(dev.read(g.num_blocks, 1).await, Err(BlockError::OutOfRange { .. })));
    assert!(matches!(dev.write(0, Bytes::from(vec![1u8; 100]), false).await, Err(BlockError::Misaligned { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_512() {
    round_trip(512).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_4096() {
    round_trip(4096).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discard_zeros_and_provisioning() {
    let c = cluster();
    let name = c.image("prov", "64M", &[]);
    let dev = c.open(&name, 512).await;
    let per_obj = 8192u64; // 4 MiB objects in 512-byte blocks
                           // A fresh image has nothing allocated up to the window's end.
    assert_eq!(dev.provisioning(0).await.unwrap(), (Provisioning::Deallocated, dev.geometry().num_blocks));
    // A written block is mapped; the space before it is not.
    dev.write(100, stamp_run(100, 4, 2, 512), true).await.unwrap();
    let (state, run) = dev.provisioning(100).await.unwrap();
    assert_eq!(state, Provisioning::Mapped);
    assert!(run >= 4, "{run}");
    let (state, run) = dev.provisioning(per_obj).await.unwrap();
    assert_eq!(state, Provisioning::Deallocated);
    assert_eq!(run, dev.geometry().num_blocks - per_obj);

    // A whole object written, then discarded: zeros, and deallocated again.
    let obj = 2 * per_obj;
    for i in 0..8 {
        let lba = obj + i * 1024;
        dev.write(lba, stamp_run(lba, 1024, 3, 512), false).await.unwrap();
    }
    assert_eq!(dev.provisioning(obj).await.unwrap().0, Provisioning::Mapped);
    dev.discard(obj, per_obj).await.unwrap();
    assert!(dev.read(obj, 1024).await.unwrap().iter().all(|&b| b == 0));
    let (state, run) = dev.provisioning(obj).await.unwrap();
    assert_eq!(state, Provisioning::Deallocated, "after discarding a whole object");
    assert!(run >= per_obj, "{run}");

    // A discard inside written data reads back as zeros (LBPRZ), its neighbours intact.
    dev.write(20000, stamp_run(20000, 16, 4, 512), false).await.unwrap();
    dev.discard(20004, 3).await.unwrap();
    let got = dev.read(20000, 16).await.unwrap();
    assert_eq!(&got[..4 * 512], &stamp_run(20000, 4, 4, 512)[..]);
    assert!(got[4 * 512..7 * 512].iter().all(|&b| b == 0), "a partial discard must zero");
    assert_eq!(&got[7 * 512..], &stamp_run(20007, 9, 4, 512)[..]);

    // write_zeros over written data.
    dev.write(30000, stamp_run(30000, 32, 5, 512), false).await.unwrap();
    dev.write_zeros(30008, 16).await.unwrap();
    let got = dev.read(30000, 32).await.unwrap();
    assert_eq!(&got[..8 * 512], &stamp_run(30000, 8, 5, 512)[..]);
    assert!(got[8 * 512..24 * 512].iter().all(|&b| b == 0));
    assert_eq!(&got[24 * 512..], &stamp_run(30024, 8, 5, 512)[..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_and_write() {
    let c = cluster();
    for bs in [512u32, 4096] {
        let name = c.image(&format!("caw{bs}"), "16M", &[]);
        let dev = c.open(&name, bs).await;
        // In the first object and in a later one, at an offset inside it.
        for lba in [3u64, (5 << 20) / u64::from(bs) + 3] {
            let old = stamp_run(lba, 1, 6, bs as usize);
            let new = stamp_run(lba, 1, 7, bs as usize);
            dev.write(lba, old.clone(), false).await.unwrap();
            // Match: written.
            assert_eq!(dev.compare_and_write(lba, old.clone(), new.clone()).await.unwrap(), None);
            assert_eq!(dev.read(lba, 1).await.unwrap(), new);
            // Miscompare: the offset of the first differing byte, nothing written.
            for at in [0usize, 100, bs as usize - 1] {
                let mut cmp = new.to_vec();
                cmp[at] ^= 0xff;
                let got = dev.compare_and_write(lba, Bytes::from(cmp), old.clone()).await.unwrap();
                assert_eq!(got, Some(at as u64), "bs {bs} lba {lba}");
                assert_eq!(dev.read(lba, 1).await.unwrap(), new);
            }
        }
        // Two blocks (beyond librbd's one-sector atomic compare-and-write).
        let two_old = stamp_run(8, 2, 8, bs as usize);
        let two_new = stamp_run(8, 2, 9, bs as usize);
        dev.write(8, two_old.clone(), false).await.unwrap();
        let mut cmp = two_old.to_vec();
        cmp[bs as usize + 7] ^= 1;
        let at = dev.compare_and_write(8, Bytes::from(cmp), two_new.clone()).await.unwrap();
        assert_eq!(at, Some(u64::from(bs) + 7));
        assert_eq!(dev.compare_and_write(8, two_old, two_new.clone()).await.unwrap(), None);
        assert_eq!(dev.read(8, 2).await.unwrap(), two_new);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_is_read_only_and_keeps_its_data() {
    let c = cluster();
    let name = c.image("snap", "16M", &[]);
    let dev = c.open(&name, 512).await;
    dev.write(0, stamp_run(0, 64, 10, 512), true).await.unwrap();
    // Taken while the writer holds the exclusive lock: librbd asks the holder to do it.
    c.rbd(&["snap", "create", &format!("rbd/{name}@s1")]);
    dev.write(0, stamp_run(0, 64, 11, 512), true).await.unwrap();

    let snap = RbdDev::open("rbd", &name, Some("s1"), &c.opts(512)).await.unwrap();
    assert!(snap.read_only());
    assert!(BlockDev::read_only(&snap));
    assert!(!snap.supports_discard());
    assert_ne!(snap.device_id(), dev.device_id());
    assert_eq!(snap.read(0, 64).await.unwrap(), stamp_run(0, 64, 10, 512));
    assert_eq!(dev.read(0, 64).await.unwrap(), stamp_run(0, 64, 11, 512));
    let refused = |r: Result<(), BlockError>| matches!(r, Err(BlockError::Unsupported(_)));
    assert!(refused(snap.write(0, stamp_run(0, 1, 12, 512), false).await));
    assert!(refused(snap.discard(0, 1).await));
    assert!(refused(snap.write_zeros(0, 1).await));
    snap.flush().await.expect("a snapshot has nothing to flush");
    assert!(matches!(
        snap.compare_and_write(0, stamp_run(0, 1, 10, 512), stamp_run(0, 1, 12, 512)).await,
        Err(BlockError::Unsupported(_))
    ));
    assert_eq!(snap.read(0, 64).await.unwrap(), stamp_run(0, 64, 10, 512));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_writer_is_refused_until_the_first_closes() {
    let c = cluster();
    let name = c.image("lock", "16M", &[]);
    let first = c.open(&name, 512).await;
    first.write(0, stamp_run(0, 1, 20, 512), false).await.unwrap();
    let t = Instant::now();
    let err = RbdDev::open("rbd", &name, None, &c.opts(512)).await.unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(5), "the refusal took {:?}", t.elapsed());
    let RbdError::Locked { ref holder, .. } = err else { panic!("expected Locked, got {err}") };
    assert!(holder.contains("127.0.0.1:"), "{holder}");
    let msg = err.to_string();
    assert!(msg.starts_with(&format!("rbd:rbd/{name} is in use by another writer (client at 127.0.0.1:")), "{msg}");
    // Readers of a snapshot are never refused.
    c.rbd(&["snap", "create", &format!("rbd/{name}@r")]);
    RbdDev::open("rbd", &name, Some("r"), &c.opts(512)).await.unwrap();

    first.close().await;
    let second = c.open(&name, 512).await;
    assert_eq!(second.read(0, 1).await.unwrap(), stamp_run(0, 1, 20, 512));
    second.write(1, stamp_run(1, 1, 21, 512), false).await.unwrap();
}

/// Run only as the child of `a_killed_writer_loses_its_lock`: holds the image until killed.
#[tokio::test]
async fn lock_holder_child() {
    let (Ok(conf), Ok(image)) = (std::env::var("STICS_RBD_HOLDER_CONF"), std::env::var("STICS_RBD_HOLDER_IMAGE"))
    else {
        return;
    };
    let opts = RbdOptions { conf: Some(conf.into()), ..RbdOptions::default() };
    let dev = RbdDev::open("rbd", &image, None, &opts).await.unwrap();
    dev.write(0, stamp_run(0, 1, 30, 512), false).await.unwrap();
    println!("holding");
    tokio::time::sleep(Duration::from_secs(600)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_writer_loses_its_lock() {
    let c = cluster();
    let name = c.image("killed", "16M", &[]);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["lock_holder_child", "--exact", "--nocapture", "--test-threads=1"])
        .env("STICS_RBD_HOLDER_CONF", c.conf())
        .env("STICS_RBD_HOLDER_IMAGE", &name)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // libtest prints "test NAME ... " before the child's own line.
    assert!(lines.any(|l| l.is_ok_and(|l| l.trim_end().ends_with("holding"))), "the child never held the image");

    // While it lives, it is named as the holder.
    let err = RbdDev::open("rbd", &name, None, &c.opts(512)).await.unwrap_err();
    assert!(matches!(err, RbdError::Locked { .. }), "{err}");

    child.kill().unwrap(); // SIGKILL: no goodbye to the cluster
    child.wait().unwrap();
    let t = Instant::now();
    // A short limit runs out while the dead owner's watch is still registered...
    let err = RbdDev::open("rbd", &name, None, &RbdOptions { connect_timeout: Duration::from_secs(2), ..c.opts(512) })
        .await
        .unwrap_err();
    assert!(matches!(err, RbdError::LockTimeout { .. }), "{err}");
    assert!(err.to_string().contains("osd_client_watch_timeout"), "{err}");
    // ...a long one waits it out and takes the lock over.
    let opts = RbdOptions { connect_timeout: Duration::from_secs(90), ..c.opts(512) };
    let dev = RbdDev::open("rbd", &name, None, &opts).await.unwrap();
    let took = t.elapsed();
    eprintln!("a new writer took the lock {:.1} s after the holder was SIGKILLed", took.as_secs_f64());
    assert!(took < Duration::from_secs(80), "{took:?}");
    assert_eq!(dev.read(0, 1).await.unwrap(), stamp_run(0, 1, 30, 512));
    dev.write(0, stamp_run(0, 1, 31, 512), true).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_without_exclusive_lock_is_refused_for_writing() {
    let c = cluster();
    let name = c.image("nolock", "16M", &["--image-feature", "layering"]);
    let err = RbdDev::open("rbd", &name, None, &c.opts(512)).await.unwrap_err();
    assert!(matches!(err, RbdError::NoExclusiveLock { .. }), "{err}");
    assert!(err.to_string().contains(&format!("rbd feature enable rbd/{name} exclusive-lock")), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sizes_and_names_that_do_not_fit_are_refused() {
    let c = cluster();
    let name = c.image("odd", "1025K", &[]);
    let err = RbdDev::open("rbd", &name, None, &c.opts(4096)).await.unwrap_err();
    assert!(matches!(err, RbdError::Size { size: 1_049_600, block_size: 4096, .. }), "{err}");
    assert_eq!(c.open(&name, 512).await.geometry().num_blocks, 2050);
    let err = RbdDev::open("rbd", &name, None, &c.opts(1000)).await.unwrap_err();
    assert!(matches!(err, RbdError::BlockSize(1000)), "{err}");
    let err = RbdDev::open("rbd", "no-such-image", None, &c.opts(512)).await.unwrap_err();
    assert!(matches!(err, RbdError::Open { .. }), "{err}");
    let err = RbdDev::open("no-such-pool", &name, None, &c.opts(512)).await.unwrap_err();
    assert!(matches!(err, RbdError::Pool { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_cluster_fails_within_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port(); // closed again
    let conf = dir.path().join("ceph.conf");
    std::fs::write(
        &conf,
        format!(
            "[global]\nmon host = v1:127.0.0.1:{port}\nauth client required = none\nauth cluster required = none\n\
             auth service required = none\nlog file = {}/client.log\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let opts =
        RbdOptions { conf: Some(conf.clone()), connect_timeout: Duration::from_secs(2), ..RbdOptions::default() };
    let t = Instant::now();
    let err = RbdDev::open("rbd", "img", None, &opts).await.unwrap_err();
    let took = t.elapsed();
    eprintln!("after {:.1} s: {err}", took.as_secs_f64());
    assert!(took < Duration::from_secs(4), "took {took:?}");
    assert!(matches!(err, RbdError::Unreachable { .. }), "{err}");
    let msg = err.to_string();
    let want = format!("cannot reach the Ceph cluster (conf {}, client.admin) within 2 s: ", conf.display());
    assert!(msg.starts_with(&want), "{msg}");
}

/// Polls a future once and drops it: a request that was submitted and then abandoned.
fn poll_once_and_drop<F: Future>(f: F) {
    let mut f = Box::pin(f);
    let _ = f.as_mut().poll(&mut Context::from_waker(Waker::noop()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_requests_do_not_crash() {
    let c = cluster();
    let name = c.image("cancel", "16M", &[]);
    let dev = c.open(&name, 512).await;
    dev.write(0, stamp_run(0, 256, 40, 512), true).await.unwrap();
    for i in 0..64 {
        poll_once_and_drop(dev.read(i * 4, 4));
    }
    assert_eq!(dev.read(0, 256).await.unwrap(), stamp_run(0, 256, 40, 512));
    for i in 0..64 {
        poll_once_and_drop(dev.write(i * 4, stamp_run(i * 4, 4, 41, 512), false));
        poll_once_and_drop(dev.read(i * 4, 4));
    }
    // close() waits for the abandoned requests, then closes: the lock is free at once.
    dev.close().await;
    let dev = c.open(&name, 512).await;
    assert_eq!(dev.read(0, 256).await.unwrap(), stamp_run(0, 256, 41, 512));
    for i in 0..64 {
        poll_once_and_drop(dev.write(i * 4, stamp_run(i * 4, 4, 42, 512), false));
    }
    // Dropped with requests in flight: the last one to complete closes the image (off
    // librbd's thread), which releases the lock for the next writer soon after.
    drop(dev);
    let t = Instant::now();
    let dev = loop {
        match RbdDev::open("rbd", &name, None, &c.opts(512)).await {
            Ok(d) => break d,
            Err(RbdError::Locked { .. }) if t.elapsed() < Duration::from_secs(20) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(dev.read(0, 256).await.unwrap(), stamp_run(0, 256, 42, 512));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_override_of_the_cache_is_followed() {
    let c = cluster();
    let name = c.image("cached", "16M", &[]);
    c.rbd(&["config", "image", "set", &format!("rbd/{name}"), "rbd_cache", "true"]);
    let dev = c.open(&name, 512).await;
    assert!(dev.volatile_cache(), "the image's own rbd_cache = true is in force");
    dev.write(0, stamp_run(0, 8, 50, 512), true).await.unwrap();
    dev.write(8, stamp_run(8, 8, 51, 512), false).await.unwrap();
    dev.flush().await.unwrap();
    assert_eq!(dev.read(0, 8).await.unwrap(), stamp_run(0, 8, 50, 512));
    assert_eq!(dev.read(8, 8).await.unwrap(), stamp_run(8, 8, 51, 512));
}

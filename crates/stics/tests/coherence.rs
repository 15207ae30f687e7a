//! Coherence tokens over the link, as processes: a stics SG (`stics target` over `journal(...)`)
//! is the lock server of the gateways that share its LUN; two initiators, each speaking for a
//! gateway, trade a segment through LINK TOKENS and LINK POLL, a poll that waits is answered when
//! a message comes for it, an answer lost with a connection is read again, a poll that waits holds
//! up nothing else on its session, and bad bytes are refused while the lock server serves on;
//! three gateways' token drivers, each over its own initiator session, share four segments
//! through the SG (`stics_testkit::coherence`); an operator breaks a silent writer's token over
//! HTTP and its late group is refused.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use stics_block::{BlockDev, BlockError};
use stics_coherence::{Kind, Msg};
use stics_initiator::{IscsiUrl, Lun, LunOptions};
use stics_link::token;
use stics_testkit::peers::{SticsOptions, SticsTarget};

use common::*;

/// A stics SG with its metrics endpoint on `metrics`.
fn sg(dir: &Path, lun: String, metrics: u16) -> SticsTarget {
    SticsTarget::start(
        Path::new(BIN),
        SticsOptions {
            iqn: Some("iqn.2024-01.org.stics.test:sg".into()),
            args: vec!["--lun".into(), lun, "--metrics".into(), format!("127.0.0.1:{metrics}")],
            env: vec![("RUST_LOG".into(), "info".into())],
            stderr: Some(dir.join("sg.log")),
        },
    )
}

fn journal_lun(dir: &Path) -> String {
    let disk = dir.join("disk.img");
    std::fs::File::create(&disk).unwrap().set_len(64 << 20).unwrap();
    format!("journal(file:{}, journal={}:16MiB)", disk.display(), dir.join("journal").display())
}

/// [`journal_lun`] with leases of `lease` seconds, and a silent holder's token broken
/// `break_after` seconds past its lease.
fn breaking_journal_lun(dir: &Path, lease: u32, break_after: u32) -> String {
    journal_lun(dir).replace(":16MiB)", &format!(":16MiB, lease={lease}, break-after={break_after})"))
}

/// One gateway's end of the token traffic, over its own session to the SG.
struct Gateway {
    lun: Lun,
    source: [u8; 16],
    /// The number of the next message it wants: what it has read so far (unknown until the
    /// first message, since the SG numbers each gateway's from a point of its own).
    from: std::sync::Mutex<Option<u32>>,
}

impl Gateway {
    async fn open(t: &SticsTarget, n: u8) -> Gateway {
        let url = IscsiUrl::parse(&t.url(0)).unwrap();
        let lun = Lun::open(&url, &LunOptions { link: true, ..LunOptions::default() }).await.unwrap();
        let mut source = [0u8; 16];
        source[0] = n;
        source[15] = 0x5a;
        Gateway { lun, source, from: std::sync::Mutex::new(None) }
    }

    async fn send(&self, msgs: &[Msg], new_connection: bool) -> Result<(), BlockError> {
        let sink = self.lun.group_sink().expect("the SG's LUN takes groups");
        sink.tokens(Bytes::from(token::encode_exchange(&self.source, msgs)), new_connection).await
    }

    /// Reads the messages after those read before, acknowledging those.
    async fn poll(&self, wait: Duration) -> Vec<Msg> {
        let from = *self.from.lock().unwrap();
        let (first, msgs) = self.poll_from(from.unwrap_or(0), wait).await;
        if let Some(from) = from {
            assert_eq!(first, from, "no message lost");
        }
        if from.is_some() || !msgs.is_empty() {
            *self.from.lock().unwrap() = Some(first.wrapping_add(msgs.len() as u32));
        }
        msgs
    }

    /// The number it reads on from.
    fn next(&self) -> u32 {
        self.from.lock().unwrap().expect("it has read messages")
    }

    async fn poll_from(&self, from: u32, wait: Duration) -> (u32, Vec<Msg>) {
        let sink = self.lun.group_sink().expect("the SG's LUN takes groups");
        let b = sink.token_poll(stics_link::fence_of(&self.source), from, wait, 64 << 10).await.unwrap();
        token::decode_answer(&b, 4096).unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_trade_a_segment_through_the_sg_s_lock_server() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = stics_testkit::net::free_port();
    let t = sg(dir.path(), journal_lun(dir.path()), metrics);
    assert!(stics_testkit::proc::wait_port(metrics, Duration::from_secs(20)), "no metrics endpoint on the SG");
    let (a, b) = (Gateway::open(&t, 1).await, Gateway::open(&t, 2).await);

    a.send(&[Msg::Request { op: 1, seg: 9, kind: Kind::Exclusive }], true).await.unwrap();
    let got = a.poll(Duration::from_secs(2)).await;
    let [Msg::Grant { seg: 9, kind: Kind::Exclusive, gen, .. }] = got[..] else { panic!("{got:?}") };

    b.send(&[Msg::Request { op: 1, seg: 9, kind: Kind::Shared }], true).await.unwrap();
    assert!(matches!(b.poll(Duration::from_secs(2)).await[..], [Msg::Queued { op: 1, .. }]));
    let got = a.poll(Duration::from_secs(2)).await;
    assert!(matches!(got[..], [Msg::Revoke { seg: 9, keep: Some(Kind::Shared), .. }]), "{got:?}");

    // The SG's status names whom the waiting gateway waits for.
    let st = tokio::task::spawn_blocking(move || status(metrics)).await.unwrap();
    let tokens = &st["journals"][0]["tokens"];
    assert_eq!(tokens["blocked"][0]["segment"], 9, "{st}");
    assert_eq!(tokens["blocked"][0]["holders"][0][0], "0100000000000000000000000000005a", "{st}");
    assert_eq!(tokens["blocked"][0]["waiters"][0][1], "shared", "{st}");
    assert_eq!((tokens["held_exclusive"].as_u64(), tokens["gateways"].as_u64()), (Some(1), Some(2)), "{st}");

    // B polls with nothing for it yet; the answer comes as soon as A gives the token up.
    let started = Instant::now();
    let waiting = tokio::spawn(async move { (b.poll(Duration::from_secs(4)).await, b) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.send(&[Msg::Release { seg: 9, gen, keep: Some(Kind::Shared) }], false).await.unwrap();
    let (got, b) = waiting.await.unwrap();
    assert!(matches!(got[..], [Msg::Grant { seg: 9, kind: Kind::Shared, .. }]), "{got:?}");
    assert!(started.elapsed() < Duration::from_secs(4), "the poll was answered when the grant came");

    // A poll that waits holds up nothing else on its session: reads and status reads go on.
    let from = a.next();
    let lun = std::sync::Arc::new(a.lun);
    let poller = {
        let (lun, fold) = (std::sync::Arc::clone(&lun), stics_link::fence_of(&a.source));
        tokio::spawn(
            async move { lun.group_sink().unwrap().token_poll(fold, from, Duration::from_secs(3), 4096).await },
        )
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    for lba in 0..20 {
        lun.read(lba * 8, 8).await.unwrap();
    }
    lun.group_sink().unwrap().link_status(0).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(2), "reads waited {:?} behind a poll", started.elapsed());
    assert!(!poller.is_finished(), "the poll still waits");
    assert_eq!(token::decode_answer(&poller.await.unwrap().unwrap(), 16).unwrap(), (from, vec![]));
    let a = Gateway { lun: std::sync::Arc::into_inner(lun).unwrap(), source: a.source, from: a.from };

    // A's answer with the next revoke is lost with its connection: it asks from the same number
    // and reads it again.
    b.send(&[Msg::Request { op: 2, seg: 9, kind: Kind::Exclusive }], false).await.unwrap();
    let from = a.next();
    assert!(matches!(a.poll_from(from, Duration::from_secs(2)).await.1[..], [Msg::Revoke { seg: 9, keep: None, .. }]));
    assert!(matches!(a.poll(Duration::from_secs(2)).await[..], [Msg::Revoke { seg: 9, keep: None, .. }]));

    // Bad bytes are refused with an error, and the lock server serves on.
    let sink = a.lun.group_sink().unwrap();
    let e = sink.tokens(Bytes::from_static(b"not an exchange"), false).await.unwrap_err();
    assert!(matches!(e, BlockError::Rejected(_)), "{e}");
    a.send(&[Msg::Release { seg: 9, gen, keep: None }], false).await.unwrap();
    let got = b.poll(Duration::from_secs(2)).await;
    assert!(
        matches!(got[..], [Msg::Queued { op: 2, .. }, Msg::Grant { op: 2, seg: 9, kind: Kind::Exclusive, .. }]),
        "{got:?}"
    );
    // Three grants, and two revokes (one read twice).
    let text = tokio::task::spawn_blocking(move || http(metrics, "GET /metrics")).await.unwrap();
    for line in ["stics_sg_token_grants_total{journal=\"0\"} 3", "stics_sg_token_revokes_total{journal=\"0\"} 2"] {
        assert!(text.contains(line), "{line} in {text}");
    }
    assert!(text.contains("stics_sg_tokens_held{journal=\"0\",kind=\"exclusive\"} 1.0"), "{text}");
    a.lun.close().await;
    b.lun.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_share_four_segments_through_a_stics_sg() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = stics_testkit::net::free_port();
    let t = sg(dir.path(), journal_lun(dir.path()), metrics);
    let url = IscsiUrl::parse(&t.url(0)).unwrap();
    let mut luns = Vec::new();
    for _ in 0..3 {
        let lun = Lun::open(&url, &LunOptions { link: true, ..LunOptions::default() }).await.unwrap();
        luns.push(std::sync::Arc::new(lun));
    }
    let devs = luns.iter().map(|l| std::sync::Arc::clone(l) as std::sync::Arc<dyn BlockDev>).collect();
    let cfg = stics_coherence::driver::DriverConfig {
        poll_wait: Duration::from_millis(200),
        ..stics_coherence::driver::DriverConfig::default()
    };
    let run = stics_testkit::coherence::share(devs, 4, 100, cfg).await;
    assert!(run.groups > 0, "segments changed hands: {run:?}");
    assert!(run.filled > 0, "shared grants came with their blocks: {run:?}");
    let st = tokio::task::spawn_blocking(move || status(metrics)).await.unwrap();
    assert_eq!(st["journals"][0]["tokens"]["breaks"], 0, "{st}");
    for l in luns {
        l.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_breaks_a_silent_writer_s_token_and_its_late_group_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = stics_testkit::net::free_port();
    let t = sg(dir.path(), journal_lun(dir.path()), metrics);
    assert!(stics_testkit::proc::wait_port(metrics, Duration::from_secs(20)), "no metrics endpoint on the SG");
    let (a, b) = (Gateway::open(&t, 1).await, Gateway::open(&t, 2).await);
    a.send(&[Msg::Request { op: 1, seg: 3, kind: Kind::Exclusive }], true).await.unwrap();
    let got = a.poll(Duration::from_secs(2)).await;
    let [Msg::Grant { gen, .. }] = got[..] else { panic!("{got:?}") };
    b.send(&[Msg::Request { op: 1, seg: 3, kind: Kind::Exclusive }], true).await.unwrap();
    assert!(matches!(b.poll(Duration::from_secs(2)).await[..], [Msg::Queued { .. }]));

    // A says nothing more; by default B waits. The operator breaks the segment.
    let bad = tokio::task::spawn_blocking(move || http_answer(metrics, "POST /break?segment=x")).await.unwrap();
    assert!(bad.starts_with("HTTP/1.0 400"), "{bad}");
    let said = tokio::task::spawn_blocking(move || http(metrics, "POST /break?segment=3")).await.unwrap();
    assert!(said.contains("\"broken\"") && said.contains("0100000000000000000000000000005a"), "{said}");
    let got = b.poll(Duration::from_secs(2)).await;
    assert!(matches!(got[..], [Msg::Grant { seg: 3, kind: Kind::Exclusive, .. }]), "{got:?}");

    // A's group under its old token is refused; it is told its token was broken.
    let head =
        stics_link::group::GroupHead { source: a.source, seq: 1, first_epoch: 1, last_epoch: 1, block_size: 512 };
    let extents = [stics_link::group::Extent { lba: 3 * 128, blocks: 1, kind: stics_link::group::ExtentKind::Data }];
    let fences = stics_link::group::Fences { segment_bytes: 64 << 10, gens: vec![(3, gen)] };
    let group = stics_link::group::encode_fenced(&head, &extents, &[7; 512], 1, Some(&fences)).unwrap();
    let e = a.lun.group_sink().unwrap().commit(Bytes::from(group)).await.unwrap_err();
    assert!(matches!(e, BlockError::Rejected(_)), "{e}");
    // It is told at once, and again with every answer until it acknowledges it.
    let got = a.poll(Duration::from_secs(2)).await;
    assert!(matches!(got[..], [Msg::Revoke { seg: 3, .. }, Msg::Broken { seg: 3, gen: g }] if g == gen), "{got:?}");
    a.send(&[], false).await.unwrap();
    let got = a.poll(Duration::from_secs(2)).await;
    assert!(matches!(got[..], [Msg::Broken { seg: 3, gen: g }] if g == gen), "{got:?}");
    assert_eq!(a.lun.read(3 * 128, 1).await.unwrap()[..], [0u8; 512][..], "nothing of it landed");
    let st = tokio::task::spawn_blocking(move || status(metrics)).await.unwrap();
    assert_eq!(st["journals"][0]["tokens"]["breaks"], 1, "{st}");
    a.lun.close().await;
    b.lun.close().await;
}

/// A `stics gateway --shared` in front of the SG's LUN, its log and stderr in `dir` under `name`:
/// (process, iSCSI port, metrics port).
fn shared_gateway(sg: &SticsTarget, dir: &Path, name: &str, mode: &str) -> (stics_testkit::proc::Guard, u16, u16) {
    gateway_with_metrics_and(
        &sg.url(0),
        &dir.join(format!("{name}.log")),
        mode,
        &dir.join(format!("{name}.err")),
        &["--shared"],
    )
}

/// File `i` of the volume: where it lives and what it holds.
fn volume_file(fs: &Path, i: u64) -> (std::path::PathBuf, Bytes) {
    (fs.join(format!("d{}/f{i}", i % 10)), file_data(i))
}

#[track_caller]
fn files_there(fs: &Path, files: std::ops::Range<u64>, what: &str) {
    for i in files {
        let (path, want) = volume_file(fs, i);
        let got = std::fs::read(&path).unwrap_or_else(|e| panic!("{what}: {}: {e}", path.display()));
        assert!(got == want, "{what}: {} differs", path.display());
    }
}

#[test]
fn a_volume_changes_hands_between_gateways_with_no_manual_drain() {
    // FUSE exports, loop devices and ext4 beside the WAN tests' three gateways overload two
    // cores: an export once took more than 20 s to unmount.
    let _serial = stics_testkit::proc::one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let metrics = stics_testkit::net::free_port();
    let sg = sg(dir.path(), journal_lun(dir.path()), metrics);
    let (_a, port_a, metrics_a) = shared_gateway(&sg, dir.path(), "a", "log");
    let (_b, port_b, metrics_b) = shared_gateway(&sg, dir.path(), "b", "immediate");
    // Host A: ext4 through its gateway, files written, unmounted. Nothing is drained by hand.
    let mut on_a = Export::start(&url(port_a), dir.path(), "on-a");
    on_a.mkfs();
    on_a.mount_fs("");
    write_files(&on_a.fs, 0..60);
    on_a.umount_fs();
    on_a.stop();
    // Host B mounts it through its own gateway: every file is there and the file system is
    // clean.
    let mut on_b = Export::start(&url(port_b), dir.path(), "on-b");
    on_b.fsck_clean("B's view of what A wrote");
    on_b.mount_fs("");
    files_there(&on_b.fs, 0..60, "B reads A's files");
    for i in 60..90 {
        let (path, data) = volume_file(&on_b.fs, i);
        std::fs::write(path, data).unwrap();
    }
    on_b.umount_fs();
    on_b.stop();
    // And back to A, whose cache held the volume before: it sees B's files, not its old blocks.
    let mut again = Export::start(&url(port_a), dir.path(), "on-a-again");
    again.fsck_clean("A's view after B");
    again.mount_fs("");
    files_there(&again.fs, 0..90, "A reads B's files");
    again.umount_fs();
    again.stop();
    let a = status(metrics_a);
    assert!(a["tokens"]["surrenders"].as_u64().unwrap() > 0, "A gave tokens up to B: {}", a["tokens"]);
    let text = http(metrics_b, "GET /metrics");
    assert!(text.contains("stics_cache_tokens_held{"), "{text}");
    let s = status(metrics);
    assert!(s["journals"][0]["tokens"]["revokes"].as_u64().unwrap() > 0, "{}", s["journals"][0]["tokens"]);
}

/// A block of `size` bytes that says `stamp` in every word.
fn stamped(stamp: u64, size: usize) -> Bytes {
    Bytes::from(stamp.to_le_bytes().repeat(size / 8))
}

#[track_caller]
fn stamp_in(b: &[u8]) -> u64 {
    let first = u64::from_le_bytes(b[..8].try_into().unwrap());
    assert!(b.chunks(8).all(|w| w == first.to_le_bytes()), "a block mixes two writes");
    first
}

#[test]
fn three_gateways_see_each_other_s_writes_through_kills_of_a_gateway_and_of_the_sg() {
    use rand::{Rng, SeedableRng};
    // One at a time with the other process tests: its kills and restarts load both cores.
    let _serial = stics_testkit::proc::one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let metrics = stics_testkit::net::free_port();
    let mut sg = sg(dir.path(), journal_lun(dir.path()), metrics);
    let modes = ["log", "immediate", "log"];
    let mut gws: Vec<_> = (0..3).map(|i| shared_gateway(&sg, dir.path(), &format!("g{i}"), modes[i])).collect();
    let mut luns: Vec<_> = gws.iter().map(|(_, port, _)| common::open(*port)).collect();
    let bs = luns[0].1.geometry().block_size as usize;
    // Sixteen 64 KiB segments, written and read by all three.
    let blocks = (16 * (64 << 10) / bs) as u64;
    let mut model = std::collections::BTreeMap::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(29);
    for i in 1..=300u64 {
        if i == 100 {
            // A gateway is SIGKILLed and starts again on its log: its writes, dirty or not, stay.
            gws[1].0.kill();
            gws[1] = shared_gateway(&sg, dir.path(), "g1", modes[1]);
            luns[1] = common::open(gws[1].1);
        }
        if i == 200 {
            // The SG is SIGKILLed and starts again on its journal, tokens and all.
            sg.kill();
            sg.restart();
        }
        let g = rng.gen_range(0..3);
        let block = rng.gen_range(0..blocks);
        let (rt, lun) = &luns[g];
        if rng.gen_bool(0.5) {
            let stamp = (g as u64 + 1) << 32 | i;
            rt.block_on(lun.write(block, stamped(stamp, bs), false)).unwrap_or_else(|e| panic!("write {i}: {e}"));
            model.insert(block, stamp);
        } else {
            let got = stamp_in(&rt.block_on(lun.read(block, 1)).unwrap_or_else(|e| panic!("read {i}: {e}")));
            assert_eq!(got, model.get(&block).copied().unwrap_or(0), "op {i}: gateway {g} reads block {block}");
        }
    }
    // Every block written, read through every gateway: the newest write.
    for (g, (rt, lun)) in luns.iter().enumerate() {
        for (&block, &stamp) in &model {
            let got = stamp_in(&rt.block_on(lun.read(block, 1)).unwrap());
            assert_eq!(got, stamp, "at the end, gateway {g} reads block {block}");
        }
    }
}

#[test]
fn readers_on_three_hosts_see_an_update_of_a_shared_image_once_it_completes_and_never_half_a_block() {
    let _serial = stics_testkit::proc::one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    // Three hosts behind `stics wan`, each reading through its own gateway; host 1 also updates.
    let s = WanSetup::start(dir.path(), journal_lun(dir.path()), &[]);
    let bs = block_size_in(&s.session(0));
    // The region: 128 KiB across two segments, written whole by each update.
    let region = (128 << 10) / bs;
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<Session> = (0..3).map(|g| s.session(g)).collect();
    let writer = s.session(0);
    let counts = std::thread::scope(|scope| {
        let runs: Vec<_> = readers
            .iter()
            .map(|r| {
                let (done, stop) = (Arc::clone(&done), Arc::clone(&stop));
                scope.spawn(move || {
                    let mut reads = 0u32;
                    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                        let floor = done.load(std::sync::atomic::Ordering::SeqCst);
                        let data = read_in(r, 0, region as u32).unwrap();
                        for (b, block) in data.chunks(bs).enumerate() {
                            let v = stamp_in(block);
                            assert!(
                                v >= floor,
                                "block {b}: version {v}, but version {floor} had completed before the read"
                            );
                        }
                        reads += 1;
                    }
                    reads
                })
            })
            .collect();
        for v in 1..=20u64 {
            let data = Bytes::from((0..region).flat_map(|_| v.to_le_bytes().repeat(bs / 8)).collect::<Vec<u8>>());
            write_in(&writer, 0, data).unwrap();
            done.store(v, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        runs.into_iter().map(|r| r.join().expect("reader")).collect::<Vec<u32>>()
    });
    assert!(counts.iter().all(|&n| n > 0), "every reader read: {counts:?}");
    for r in &readers {
        let data = read_in(r, 0, region as u32).unwrap();
        assert!(data.chunks(bs).all(|b| stamp_in(b) == 20), "every gateway reads the last update whole");
    }
    // The readers' grants after each update brought the blocks they read (the SG sends them):
    // no READ after the grant for those.
    for g in 1..3 {
        let tokens = &s.gateway_status(g)["tokens"];
        assert!(tokens["grants_with_data"].as_u64().unwrap_or(0) > 0, "gateway {g}: {tokens}");
    }
    let sg = &s.sg_status()["journals"][0]["tokens"];
    assert!(sg["grant_data_blocks"].as_u64().unwrap_or(0) > 0, "{sg}");
}

#[test]
fn a_gateway_cut_off_holds_its_segment_until_the_sg_breaks_it_and_its_voided_write_goes_to_quarantine() {
    // C's second write must find its lease good when the link freezes: a lease of 2 s, with the
    // other tests beside it on two cores, once let it lapse first, and that write then waited
    // for a lease no frozen link could renew. Five seconds and no neighbours leave room.
    let _serial = stics_testkit::proc::one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let metrics = stics_testkit::net::free_port();
    let sg = sg(dir.path(), breaking_journal_lun(dir.path(), 5, 8), metrics);
    let proxy = stics_testkit::net::Proxy::start(sg.port);
    let via = format!("iscsi://127.0.0.1:{}/{}/0", proxy.port, "iqn.2024-01.org.stics.test:sg");
    let (mut c, c_port, c_metrics) = gateway_with_metrics_and(
        &via,
        &dir.path().join("c.log"),
        "log",
        &dir.path().join("c.err"),
        &["--shared", "--lease", "5"],
    );
    let (mut a, a_port) = gateway_with(
        &sg.url(0),
        &dir.path().join("a.log"),
        "log",
        &dir.path().join("a.err"),
        &["--shared", "--lease", "5"],
    );
    let (c_rt, c_lun) = common::open(c_port);
    let (a_rt, a_lun) = common::open(a_port);
    let bs = c_lun.geometry().block_size as usize;
    let x = 5 * (64 << 10) as u64 / bs as u64 + 1;
    // C writes a block, then loses its link and writes it again (under the token it holds).
    c_rt.block_on(c_lun.write(x, stamped(1, bs), true)).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    proxy.freeze(true);
    proxy.cut();
    c_rt.block_on(c_lun.write(x, stamped(2, bs), true)).unwrap();
    // A reads it: it waits for C's token until the SG breaks it, then reads what landed.
    let started = Instant::now();
    let got = stamp_in(&a_rt.block_on(a_lun.read(x, 1)).unwrap());
    assert!(started.elapsed() >= Duration::from_secs(5), "A waited for C's token: {:?}", started.elapsed());
    assert_eq!(got, 1, "C's first write landed; its second, under the broken token, never does");
    a_rt.block_on(a_lun.write(x, stamped(3, bs), true)).unwrap();
    let s = status(metrics);
    assert!(s["journals"][0]["tokens"]["breaks"].as_u64().unwrap() >= 1, "{}", s["journals"][0]["tokens"]);
    // C's link comes back: it hears of the break and keeps its voided write in quarantine.
    proxy.freeze(false);
    let deadline = Instant::now() + Duration::from_secs(30);
    let q = loop {
        let q = status(c_metrics)["quarantine"].as_array().cloned().unwrap_or_default();
        if !q.is_empty() {
            break q;
        }
        assert!(Instant::now() < deadline, "C put nothing in quarantine: {}", status(c_metrics));
        std::thread::sleep(Duration::from_millis(100));
    };
    let file = q[0]["file"].as_str().unwrap();
    let kept = stics_shared::quarantine::Quarantine::decode(&std::fs::read(file).unwrap()).unwrap();
    assert_eq!(kept.runs, vec![(x, Some(stamped(2, bs).to_vec()), 1)]);
    assert_eq!(stamp_in(&c_rt.block_on(c_lun.read(x, 1)).unwrap()), 3, "C reads A's write");
    let (rt, lun) = open_url(&sg.url(0));
    let settled = Instant::now() + Duration::from_secs(20);
    while stamp_in(&rt.block_on(lun.read(x, 1)).unwrap()) != 3 {
        assert!(Instant::now() < settled, "A's write reaches the SG");
        std::thread::sleep(Duration::from_millis(100));
    }
    // An operator who decides it should land after all applies it through a gateway.
    let shown = stics_testkit::proc::run_ok(std::process::Command::new(BIN).args(["quarantine", "show", file]));
    assert!(shown.contains(&format!("blocks {x}+1: data")), "{shown}");
    let to = url(a_port);
    stics_testkit::proc::run_ok(std::process::Command::new(BIN).args(["quarantine", "apply", file, "--to", &to]));
    assert_eq!(stamp_in(&c_rt.block_on(c_lun.read(x, 1)).unwrap()), 2, "the applied write is the newest now");
    c.kill();
    a.kill();
}

/// One operation of a checker's history: who read or wrote which block, the stamp written or
/// read, and when it began and ended.
#[derive(Debug, Clone)]
struct Op {
    gw: usize,
    block: u64,
    write: bool,
    stamp: u64,
    start: Instant,
    end: Instant,
}

/// Per-block linearizability of a history whose writes all carry distinct stamps: a read
/// returns a write that began before the read ended and that no other write had superseded
/// (begun after it ended and ended before the read began), or the LUN's zeroes if no write
/// ended before it began.
#[track_caller]
fn check_linearizable(ops: &[Op]) {
    let mut writes: std::collections::HashMap<u64, Vec<&Op>> = std::collections::HashMap::new();
    for w in ops.iter().filter(|o| o.write) {
        writes.entry(w.block).or_default().push(w);
    }
    let none = Vec::new();
    for r in ops.iter().filter(|o| !o.write) {
        let ws = writes.get(&r.block).unwrap_or(&none);
        let superseded =
            |w_end: Option<Instant>| ws.iter().any(|w2| w_end.is_none_or(|end| end < w2.start) && w2.end < r.start);
        if r.stamp == 0 {
            assert!(
                !superseded(None),
                "gateway {} read zeroes at block {} after a write to it ended: {r:?}",
                r.gw,
                r.block
            );
            continue;
        }
        let w = ws.iter().find(|w| w.stamp == r.stamp).unwrap_or_else(|| {
            panic!("gateway {} read stamp {:#x} at block {}, never written there", r.gw, r.stamp, r.block)
        });
        assert!(w.start < r.end, "gateway {} read a write that began after the read ended: {r:?} {w:?}", r.gw);
        assert!(
            !superseded(Some(w.end)),
            "gateway {} read a stale write at block {}: {r:?} returned {w:?}",
            r.gw,
            r.block
        );
    }
}

/// A checker's session to one gateway, made and used inside the gateway's host namespace.
type Session = stics_testkit::netns::Resident<Option<(tokio::runtime::Runtime, stics_initiator::Lun)>>;

/// `blocks` blocks at `lba`, read through `s`.
fn read_in(s: &Session, lba: u64, blocks: u32) -> Result<Bytes, BlockError> {
    s.call(move |l| {
        let (rt, lun) = l.as_ref().expect("a session");
        rt.block_on(lun.read(lba, blocks))
    })
}

/// `data` written at `lba` through `s`.
fn write_in(s: &Session, lba: u64, data: Bytes) -> Result<(), BlockError> {
    s.call(move |l| {
        let (rt, lun) = l.as_ref().expect("a session");
        rt.block_on(lun.write(lba, data, false))
    })
}

/// The block size of the LUN `s` reads.
fn block_size_in(s: &Session) -> usize {
    s.call(|l| l.as_ref().expect("a session").1.geometry().block_size) as usize
}

/// What a failed command's session went through: how long the command took, and the session's
/// reconnections, retries and reset attentions so far.
fn failed_after(s: &Session, start: Instant) -> String {
    let took = start.elapsed();
    let c = s.call(|l| l.as_ref().expect("a session").1.counters());
    format!(
        " (after {took:?}; the session reconnected {} times, retried {} commands, saw {} reset attentions)",
        c.reconnects, c.retries, c.reset_attentions
    )
}

fn session_write(s: &Session, gw: usize, block: u64, stamp: u64, bs: usize) -> Op {
    let start = Instant::now();
    write_in(s, block, stamped(stamp, bs))
        .unwrap_or_else(|e| panic!("gateway {gw} writes block {block}: {e}{}", failed_after(s, start)));
    Op { gw, block, write: true, stamp, start, end: Instant::now() }
}

fn session_read(s: &Session, gw: usize, block: u64) -> Op {
    let start = Instant::now();
    let data = read_in(s, block, 1)
        .unwrap_or_else(|e| panic!("gateway {gw} reads block {block}: {e}{}", failed_after(s, start)));
    Op { gw, block, write: false, stamp: stamp_in(&data), start, end: Instant::now() }
}

/// The SG and three gateways, each gateway on a host of its own behind `stics wan`.
struct WanSetup {
    wan: stics_testkit::netns::Wan,
    dir: std::path::PathBuf,
    sg_addr: String,
    lun: String,
    sg: stics_testkit::proc::Guard,
    gws: Vec<stics_testkit::proc::Guard>,
    starts: usize,
    /// More arguments for every gateway.
    extra: Vec<String>,
}

const SG_IQN: &str = "iqn.2024-01.org.stics.test:sg";
const WAN_MODES: [&str; 3] = ["log", "immediate", "log"];

impl WanSetup {
    fn host(g: usize) -> String {
        format!("host{}", g + 1)
    }

    /// A new stderr file for each process started, so that a restart keeps the earlier one.
    fn stderr(&mut self, name: &str) -> std::path::PathBuf {
        self.starts += 1;
        self.dir.join(format!("{name}-{}.err", self.starts))
    }

    fn start_sg(&mut self) {
        let err = self.stderr("sg");
        let mut cmd = self.wan.exec("storage", Path::new(BIN));
        cmd.args(["target", "--listen", &self.sg_addr, "--iqn", SG_IQN, "--lun", &self.lun])
            .args(["--metrics", "127.0.0.1:9100"])
            .env("RUST_LOG", "info");
        self.sg = stics_testkit::proc::spawn(&mut cmd, Some(&err));
        let addr = self.sg_addr.parse().unwrap();
        assert!(
            stics_testkit::netns::wait_port(&self.wan.ns("storage"), addr, Duration::from_secs(20)),
            "the SG did not listen: {}",
            std::fs::read_to_string(&err).unwrap_or_default()
        );
    }

    fn gateway_addr(&self, g: usize) -> String {
        format!("{}:3260", self.wan.addr(&Self::host(g)))
    }

    fn start_gateway(&mut self, g: usize) {
        let err = self.stderr(&format!("g{g}"));
        let log = self.dir.join(format!("g{g}.log"));
        let remote = format!("iscsi://{}/{SG_IQN}/0", self.sg_addr);
        let listen = self.gateway_addr(g);
        let mut cmd = self.wan.exec(&Self::host(g), Path::new(BIN));
        cmd.args(["gateway", "--listen", &listen, "--iqn", GATEWAY_IQN, "--remote", &remote])
            .args(["--log", &format!("{}:256MiB", log.display()), "--mode", WAN_MODES[g], "--ram", "8MiB"])
            .args(["--shared", "--metrics", "127.0.0.1:9101"])
            .args(&self.extra);
        self.gws[g] = stics_testkit::proc::spawn(&mut cmd, Some(&err));
        assert!(
            stics_testkit::netns::wait_port(
                &self.wan.ns(&Self::host(g)),
                listen.parse().unwrap(),
                Duration::from_secs(30)
            ),
            "gateway {g} did not listen: {}",
            std::fs::read_to_string(&err).unwrap_or_default()
        );
    }

    fn session(&self, g: usize) -> Session {
        let u = format!("iscsi://{}/{GATEWAY_IQN}/0", self.gateway_addr(g));
        stics_testkit::netns::Resident::start(&self.wan.ns(&Self::host(g)), move || Some(common::open_url(&u)))
    }

    /// The SG's `/status`, read inside the storage namespace.
    fn sg_status(&self) -> serde_json::Value {
        stics_testkit::netns::run_in(&self.wan.ns("storage"), || status(9100))
    }

    /// Gateway `g`'s `/status`, read inside its host's namespace.
    fn gateway_status(&self, g: usize) -> serde_json::Value {
        stics_testkit::netns::run_in(&self.wan.ns(&Self::host(g)), || status(9101))
    }

    /// A link with three hosts at 1 ms each way, the SG on `lun` and a shared gateway on each
    /// host, with `extra` arguments.
    fn start(dir: &Path, lun: String, extra: &[&str]) -> WanSetup {
        let wan = stics_testkit::netns::Wan::up(Path::new(BIN), "coh", &["--hosts", "3", "--delay", "1ms"]);
        let mut s = WanSetup {
            sg_addr: format!("{}:3260", wan.addr("storage")),
            lun,
            wan,
            dir: dir.to_owned(),
            sg: stics_testkit::proc::Guard::default(),
            gws: (0..3).map(|_| stics_testkit::proc::Guard::default()).collect(),
            starts: 0,
            extra: extra.iter().map(|a| (*a).to_owned()).collect(),
        };
        s.start_sg();
        for g in 0..3 {
            s.start_gateway(g);
        }
        s
    }
}

/// A write whose outcome a checker never learnt (its gateway was killed under it) may land at
/// any time after it began, or never: it ends in the far future, so it supersedes nothing.
fn uncertain(gw: usize, block: u64, stamp: u64, start: Instant) -> Op {
    Op { gw, block, write: true, stamp, start, end: start + Duration::from_secs(3600) }
}

/// Three checkers at once, one per gateway, each `ops` random reads and writes of the blocks
/// `0..blocks`; their histories. The checker of gateway `fragile` stops at its first error
/// (its gateway is killed under it), keeping a write it was making as [`uncertain`]; every
/// other error fails the test.
fn concurrent_round(
    sessions: &[Session],
    bs: usize,
    blocks: u64,
    ops: u32,
    seed: u64,
    next: &std::sync::atomic::AtomicU64,
    fragile: Option<usize>,
) -> Vec<Op> {
    use rand::{Rng, SeedableRng};
    std::thread::scope(|scope| {
        let runs: Vec<_> = sessions
            .iter()
            .enumerate()
            .map(|(g, s)| {
                scope.spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 10 + g as u64);
                    let mut history = Vec::new();
                    for _ in 0..ops {
                        let block = rng.gen_range(0..blocks);
                        let write = rng.gen_bool(0.5);
                        let stamp = (g as u64 + 1) << 32 | next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        if fragile == Some(g) {
                            let start = Instant::now();
                            let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                if write {
                                    session_write(s, g, block, stamp, bs)
                                } else {
                                    session_read(s, g, block)
                                }
                            }));
                            match done {
                                Ok(op) => history.push(op),
                                Err(_) if write => {
                                    history.push(uncertain(g, block, stamp, start));
                                    break;
                                }
                                Err(_) => break,
                            }
                        } else if write {
                            history.push(session_write(s, g, block, stamp, bs));
                        } else {
                            history.push(session_read(s, g, block));
                        }
                    }
                    history
                })
            })
            .collect();
        runs.into_iter().flat_map(|r| r.join().expect("a checker")).collect()
    })
}

#[test]
fn three_gateways_each_behind_its_own_wan_host_stay_linearizable_through_kills_and_a_cut_off_owner() {
    let _serial = stics_testkit::proc::one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let mut s = WanSetup::start(dir.path(), journal_lun(dir.path()), &[]);
    let mut sessions: Vec<Session> = (0..3).map(|g| s.session(g)).collect();
    let bs = block_size_in(&sessions[0]);
    // Twelve 64 KiB segments, read and written by all three at once.
    let seg = (64 << 10) / bs as u64;
    let blocks = 12 * seg;
    let next = std::sync::atomic::AtomicU64::new(1);
    let mut history = concurrent_round(&sessions, bs, blocks, 60, 1, &next, None);
    // Gateway 0 (log mode: what it acknowledged is dirty in its log, under its exclusive
    // tokens) is SIGKILLed while the checkers run. The others wait for the segments it holds
    // until it starts again on its log, a second later, and ships them.
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(2029);
    history.extend(std::thread::scope(|scope| {
        let round = scope.spawn(|| concurrent_round(&sessions, bs, blocks, 150, 2, &next, Some(0)));
        std::thread::sleep(Duration::from_millis(rand::Rng::gen_range(&mut rng, 300..900)));
        s.gws[0].kill();
        std::thread::sleep(Duration::from_secs(1));
        s.start_gateway(0);
        round.join().expect("the round")
    }));
    sessions[0] = s.session(0);
    // Gateway 1 is SIGKILLed between operations and starts again on its log.
    s.gws[1].kill();
    s.start_gateway(1);
    sessions[1] = s.session(1);
    history.extend(concurrent_round(&sessions, bs, blocks, 60, 3, &next, None));
    // The SG is SIGKILLed while the checkers run and starts again on its journal a second later;
    // the gateways reconnect by themselves and every command completes.
    history.extend(std::thread::scope(|scope| {
        let round = scope.spawn(|| concurrent_round(&sessions, bs, blocks, 100, 4, &next, None));
        std::thread::sleep(Duration::from_millis(rand::Rng::gen_range(&mut rng, 200..600)));
        s.sg.kill();
        std::thread::sleep(Duration::from_secs(1));
        s.start_sg();
        round.join().expect("the round")
    }));

    // Gateway 2 writes two blocks of segment 14 (log mode: they stay dirty in its log, under its
    // exclusive token), then its host is cut off. Gateway 0 writes one of them: it waits for the
    // owner, and only that segment waits: gateway 1 goes on with segment 15.
    let (a, b) = (14 * seg + 1, 14 * seg + 2);
    let stamp = |g: usize| (g as u64 + 1) << 32 | next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    history.push(session_write(&sessions[2], 2, a, stamp(2), bs));
    history.push(session_write(&sessions[2], 2, b, stamp(2), bs));
    s.wan.cut("host3");
    let over_it = stamp(0);
    let cut_at = Instant::now();
    let (waiting, others) = std::thread::scope(|scope| {
        let waiting = scope.spawn(|| session_write(&sessions[0], 0, a, over_it, bs));
        let mut others = Vec::new();
        for i in 0..10 {
            let block = 15 * seg + i % 4;
            others.push(session_write(&sessions[1], 1, block, stamp(1), bs));
            others.push(session_read(&sessions[1], 1, block));
        }
        std::thread::sleep(Duration::from_secs(3).saturating_sub(cut_at.elapsed()));
        assert!(!waiting.is_finished(), "gateway 0 wrote over the cut-off owner's segment without its data");
        let blocked = s.sg_status()["journals"][0]["tokens"]["blocked"].clone();
        assert!(
            blocked
                .as_array()
                .is_some_and(|b| b.iter().any(|x| x["segment"] == 14 && !x["holders"].as_array().unwrap().is_empty())),
            "the SG names the owner segment 14 waits for: {blocked}"
        );
        s.wan.mend("host3");
        (waiting.join().expect("gateway 0's write"), others)
    });
    assert!(waiting.end.duration_since(cut_at) >= Duration::from_secs(3), "gateway 0 waited for the owner");
    history.push(waiting);
    history.extend(others);
    // Gateway 2 sees the newer write, and its other block reached everyone.
    for g in [2, 0, 1] {
        let r = session_read(&sessions[g], g, a);
        assert_eq!(r.stamp, over_it, "gateway {g} reads block {a}");
        history.push(r);
        history.push(session_read(&sessions[g], g, b));
    }

    // Every block written, read through every gateway, one after another.
    let written: std::collections::BTreeSet<u64> = history.iter().filter(|o| o.write).map(|o| o.block).collect();
    for &block in &written {
        let reads: Vec<Op> = (0..3).map(|g| session_read(&sessions[g], g, block)).collect();
        assert!(reads.iter().all(|r| r.stamp == reads[0].stamp), "the gateways disagree on block {block}: {reads:?}");
        history.extend(reads);
    }
    check_linearizable(&history);
    let tokens = s.sg_status()["journals"][0]["tokens"].clone();
    assert!(tokens["early_releases"].as_u64().unwrap() > 0, "releases went beside their groups: {tokens}");
    let reads = history.iter().filter(|o| !o.write).count();
    assert!(reads > 500 && history.len() - reads > 400, "{} reads, {} writes", reads, history.len() - reads);
    drop(sessions);
}

#[test]
fn the_history_checker_refuses_a_stale_read_a_lost_write_and_a_read_from_the_future() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let op = |write, stamp, start, end| Op { gw: 0, block: 7, write, stamp, start: at(start), end: at(end) };
    // Sequential: 1 then 2 written; a read after both returns 2; a read during 2 may return 1.
    let good = [op(true, 1, 0, 10), op(true, 2, 20, 30), op(false, 1, 25, 27), op(false, 2, 40, 41)];
    check_linearizable(&good);
    // An uncertain write may be seen or not.
    let unsure = [op(true, 1, 0, 10), uncertain(0, 7, 2, at(20)), op(false, 1, 40, 41), op(false, 2, 50, 51)];
    check_linearizable(&unsure);
    for (what, bad) in [
        ("stale", vec![op(true, 1, 0, 10), op(true, 2, 20, 30), op(false, 1, 40, 41)]),
        ("lost", vec![op(true, 1, 0, 10), op(false, 0, 40, 41)]),
        ("future", vec![op(false, 1, 0, 5), op(true, 1, 10, 20)]),
        ("never written", vec![op(true, 1, 0, 10), op(false, 3, 40, 41)]),
    ] {
        let caught = std::panic::catch_unwind(|| check_linearizable(&bad));
        assert!(caught.is_err(), "a {what} read passed");
    }
}

#[test]
fn a_gateway_started_with_max_tokens_keeps_no_more_and_ships_what_it_gives_up() {
    let dir = tempfile::tempdir().unwrap();
    let sg = sg(dir.path(), journal_lun(dir.path()), stics_testkit::net::free_port());
    let (_a, a_port, metrics) = gateway_with_metrics_and(
        &sg.url(0),
        &dir.path().join("a.log"),
        "log",
        &dir.path().join("a.err"),
        &["--shared", "--max-tokens", "3"],
    );
    let (_b, b_port, _) = shared_gateway(&sg, dir.path(), "b", "log");
    let (rt, lun) = common::open(a_port);
    let bs = lun.geometry().block_size as usize;
    let seg = (64 << 10) / bs as u64;
    for s in 0..12 {
        rt.block_on(lun.write(s * seg + 3, stamped(100 + s, bs), false)).unwrap();
        // A token past the bound is given up once its writes reach the SG, after the command.
        common::wait_status(
            metrics,
            Duration::from_secs(20),
            &format!("A back within its bound after segment {s}"),
            |v| v["tokens"]["held_shared"].as_u64().unwrap() + v["tokens"]["held_exclusive"].as_u64().unwrap() <= 3,
        );
    }
    assert!(status(metrics)["tokens"]["surrenders"].as_u64().unwrap() >= 9);
    let (rt, lun) = common::open(b_port);
    for s in 0..12 {
        assert_eq!(stamp_in(&rt.block_on(lun.read(s * seg + 3, 1)).unwrap()), 100 + s, "segment {s} through B");
    }
    // The bound is for a shared LUN only, and a number.
    let said =
        refused_gateway_with(&sg.url(0), &dir.path().join("c.log"), &dir.path().join("c.err"), &["--max-tokens", "3"]);
    assert!(said.contains("--shared"), "{said}");
}

#[test]
fn a_gateway_cut_off_behind_stics_wan_loses_its_token_after_break_after_and_quarantines_its_voided_write() {
    let _serial = stics_testkit::proc::one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    // The gateways are configured with the default lease (30 s) and learn the SG's 2 s.
    let s = WanSetup::start(dir.path(), breaking_journal_lun(dir.path(), 2, 3), &[]);
    let sessions: Vec<Session> = (0..3).map(|g| s.session(g)).collect();
    for g in 0..3 {
        assert_eq!(s.gateway_status(g)["tokens"]["lease_secs"], 2.0, "gateway {g} takes the SG's shorter lease");
    }
    let bs = block_size_in(&sessions[0]);
    let x = 5 * (64 << 10) / bs as u64 + 1;
    // Gateway 2 writes a block and lets it reach the SG, loses its line, and writes the block
    // again: dirty in its log, under the exclusive token it still holds.
    session_write(&sessions[2], 2, x, 1, bs);
    common::wait_clean_in(&s.wan.ns("host3"), 9101, Duration::from_secs(20));
    s.wan.cut("host3");
    session_write(&sessions[2], 2, x, 2, bs);
    // Gateway 0 reads it: it waits for the token until the SG breaks it, then reads what landed.
    let cut_at = Instant::now();
    let r = session_read(&sessions[0], 0, x);
    assert!(cut_at.elapsed() >= Duration::from_secs(2), "gateway 0 waited for the token: {:?}", cut_at.elapsed());
    assert_eq!(r.stamp, 1, "the first write landed; the second, under the broken token, never does");
    session_write(&sessions[1], 1, x, 3, bs);
    assert!(s.sg_status()["journals"][0]["tokens"]["breaks"].as_u64().unwrap() >= 1);
    // Its line back, gateway 2 hears of the break, keeps its voided write in quarantine and reads
    // the newer one.
    s.wan.mend("host3");
    let deadline = Instant::now() + Duration::from_secs(60);
    let q = loop {
        let q = s.gateway_status(2)["quarantine"].as_array().cloned().unwrap_or_default();
        if !q.is_empty() {
            break q;
        }
        assert!(Instant::now() < deadline, "gateway 2 put nothing in quarantine: {}", s.gateway_status(2));
        std::thread::sleep(Duration::from_millis(200));
    };
    let kept =
        stics_shared::quarantine::Quarantine::decode(&std::fs::read(q[0]["file"].as_str().unwrap()).unwrap()).unwrap();
    assert_eq!(kept.runs, vec![(x, Some(stamped(2, bs).to_vec()), 1)]);
    for g in [2, 0, 1] {
        assert_eq!(session_read(&sessions[g], g, x).stamp, 3, "gateway {g} reads the newest write");
    }
}

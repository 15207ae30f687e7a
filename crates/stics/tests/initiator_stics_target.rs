//! The initiator against `stics target`: listing, data integrity with digests and R2T bursts,
//! CHAP, a SIGKILL of the target in the middle of a verified workload; against the target in
//! process: reads on a session of their own, the ordered queue after a lost connection, and the
//! count of resets.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use stics_block::{BlockDev, BlockError};
use stics_initiator::{IscsiUrl, Lun, LunOptions};
use stics_testkit::peers::{InProcess, SticsTarget};
use stics_testkit::workload::{fault_options, run_with_fault, zeroing_reads_back_zeros};
use stics_testkit::IQN;

/// `stics target` with LUN 0 on a sparse file of `size_mib` MiB.
fn start(size_mib: u64, extra: &[&str]) -> SticsTarget {
    SticsTarget::with_file_lun(Path::new(env!("CARGO_BIN_EXE_stics")), size_mib, extra)
}

#[test]
fn ls_lists_the_stics_target_and_its_file_lun() {
    let t = start(32, &[]);
    let out = Command::new(env!("CARGO_BIN_EXE_stics"))
        .args(["ls", &format!("iscsi://127.0.0.1:{}", t.port)])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("Target:{IQN}")), "{stdout}");
    assert!(stdout.contains("Lun:0    Type:DIRECT_ACCESS (Size:32M Blocks:65536 BlockSize:512)"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_with_digests_and_r2t_bursts_reads_back_from_stics_target() {
    let t = start(32, &[]);
    let mut opts = LunOptions::default();
    opts.config.offer.header_digest = true;
    opts.config.offer.data_digest = true;
    opts.config.offer.initial_r2t = true;
    opts.config.offer.first_burst_length = 16384;
    opts.config.offer.max_burst_length = 65536;
    opts.max_transfer = 2 << 20;
    let lun = Lun::open(&IscsiUrl::parse(&t.url(0)).unwrap(), &opts).await.unwrap();
    let p = lun.sessions()[0].params();
    assert!(p.header_digest && p.data_digest, "{p:?}");
    let data: Bytes =
        (0..(2u32 << 20)).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect::<Vec<u8>>().into();
    lun.write(100, data.clone(), true).await.unwrap();
    lun.flush().await.unwrap();
    assert!(lun.read(100, 4096).await.unwrap() == data);
    let c = lun.counters();
    assert!(c.round_trips > c.commands, "R2T round trips: {c:?}");
    lun.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_chap_with_stics_target_and_wrong_secret_refused() {
    let t = start(
        8,
        &[
            "--chap-user",
            "alice",
            "--chap-secret",
            "alicesecret12",
            "--mutual-user",
            "tgt",
            "--mutual-secret",
            "targetsecret1",
        ],
    );
    let base = format!("iscsi://alice%alicesecret12@127.0.0.1:{}/{IQN}/0", t.port);
    let url = format!("{base}?target_user=tgt&target_password=targetsecret1");
    let lun = Lun::open(&IscsiUrl::parse(&url).unwrap(), &LunOptions::default()).await.unwrap();
    lun.write(0, Bytes::from(vec![5u8; 512]), false).await.unwrap();
    lun.close().await;
    let bad = format!("iscsi://alice%nottheright1@127.0.0.1:{}/{IQN}/0", t.port);
    let e = Lun::open(&IscsiUrl::parse(&bad).unwrap(), &LunOptions::default()).await.unwrap_err();
    assert!(e.to_string().contains("authentication failed"), "{e}");
}

#[test]
fn stics_target_killed_and_restarted_mid_workload_loses_no_write() {
    let mut t = start(16, &[]);
    let url = t.url(0);
    let c = run_with_fault(&url, 4, || {
        std::thread::sleep(Duration::from_millis(1000));
        t.kill();
        std::thread::sleep(Duration::from_millis(500));
        t.restart();
    });
    assert!(c.reconnects >= 1, "{c:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zeroing_a_range_is_one_write_same_on_stics_target() {
    let t = start(32, &[]);
    let used = zeroing_reads_back_zeros(&t.url(0)).await;
    assert_eq!(used, 1, "9000 blocks zeroed by one WRITE SAME");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discard_unmaps_blocks_of_a_stics_file_lun_and_they_read_zero() {
    use std::os::unix::fs::MetadataExt;
    let t = start(32, &[]);
    let lun = Lun::open(&IscsiUrl::parse(&t.url(0)).unwrap(), &LunOptions::default()).await.unwrap();
    assert!(lun.supports_discard(), "a file LUN is thin-provisioned and unmapped blocks read zero");
    lun.write(0, Bytes::from(vec![0x77u8; 8 << 20]), false).await.unwrap();
    lun.flush().await.unwrap();
    let allocated = std::fs::metadata(t.file()).unwrap().blocks();
    // 4 MiB from block 2048: whole file-system blocks, so the hole is real.
    lun.discard(2048, 8192).await.unwrap();
    lun.flush().await.unwrap();
    let b = lun.read(0, 16384).await.unwrap();
    assert!(b[..2048 * 512].iter().all(|&x| x == 0x77));
    assert!(b[2048 * 512..10_240 * 512].iter().all(|&x| x == 0));
    assert!(b[10_240 * 512..].iter().all(|&x| x == 0x77));
    let after = std::fs::metadata(t.file()).unwrap().blocks();
    assert!(after + 8000 <= allocated, "space freed: {allocated} → {after} sectors");
    lun.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_writer_claims_the_lun_with_a_persistent_reservation() {
    let mut t = start(16, &[]);
    let url = t.url(0);
    stics_testkit::workload::one_writer_claim(&url, || t.restart()).await;
}

/// The stics target in this process with LUN 0 over `mem:16MiB`.
async fn in_process() -> InProcess {
    InProcess::mem(IQN, 16 << 20).await
}

fn url_via(port: u16) -> IscsiUrl {
    IscsiUrl::parse(&format!("iscsi://127.0.0.1:{port}/{IQN}/0")).unwrap()
}

/// A loopback TCP proxy whose connections, numbered in the order they were opened, can each be
/// held (what the initiator sends waits in the proxy; nothing is lost while it is held) or cut
/// (what it held is dropped).
struct Links {
    port: u16,
    conns: Arc<Mutex<Vec<Link>>>,
}

struct Link {
    hold: Arc<AtomicBool>,
    dead: Arc<AtomicBool>,
    down: TcpStream,
    up: TcpStream,
}

impl Links {
    fn start(upstream: SocketAddr) -> Links {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let conns: Arc<Mutex<Vec<Link>>> = Arc::default();
        let list = Arc::clone(&conns);
        std::thread::spawn(move || {
            for down in listener.incoming() {
                let Ok(down) = down else { return };
                let Ok(up) = TcpStream::connect(upstream) else { continue };
                let _ = (down.set_nodelay(true), up.set_nodelay(true));
                let (hold, dead) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
                let clones = (down.try_clone(), up.try_clone(), down.try_clone(), up.try_clone());
                let (Ok(d1), Ok(u1), Ok(d2), Ok(u2)) = clones else { continue };
                list.lock().unwrap().push(Link { hold: Arc::clone(&hold), dead: Arc::clone(&dead), down: d1, up: u1 });
                std::thread::spawn(move || pump(u2, d2, None));
                std::thread::spawn(move || pump(down, up, Some((hold, dead))));
            }
        });
        Links { port, conns }
    }

    fn opened(&self) -> usize {
        self.conns.lock().unwrap().len()
    }

    fn hold(&self, i: usize, on: bool) {
        self.conns.lock().unwrap()[i].hold.store(on, Ordering::SeqCst);
    }

    fn cut(&self, i: usize) {
        let conns = self.conns.lock().unwrap();
        conns[i].dead.store(true, Ordering::SeqCst);
        let _ = conns[i].down.shutdown(std::net::Shutdown::Both);
        let _ = conns[i].up.shutdown(std::net::Shutdown::Both);
    }
}

/// Copies `from` to `to`; with `hold`, waits while it is set and drops everything once `dead`.
fn pump(mut from: TcpStream, mut to: TcpStream, hold: Option<(Arc<AtomicBool>, Arc<AtomicBool>)>) {
    use std::io::{Read, Write};
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some((hold, dead)) = &hold {
            while hold.load(Ordering::SeqCst) && !dead.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            if dead.load(Ordering::SeqCst) {
                break;
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

fn block(v: u8) -> Bytes {
    Bytes::from(vec![v; 4096])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_go_on_a_session_of_their_own_and_the_ordered_queue_stays() {
    let t = in_process().await;
    let url = url_via(t.addr.port());
    let lun = Lun::open(&url, &LunOptions { read_session: true, ..LunOptions::default() }).await.unwrap();
    assert_eq!((lun.sessions().len(), lun.write_sessions().len()), (2, 1));
    assert!(lun.ordered_queue().is_some(), "one write session on a target with ORDSUP");
    let (w, r) = (&lun.write_sessions()[0], lun.read_session().unwrap());
    let (w0, r0) = (w.counters().commands, r.counters().commands);
    for i in 0..10u64 {
        lun.write(i * 8, block(i as u8), false).await.unwrap();
    }
    lun.flush().await.unwrap();
    let q = lun.ordered_queue().unwrap();
    q.queue_write(80, block(0xee)).await.unwrap();
    q.queue_barrier().await.unwrap();
    let (w1, r1) = (w.counters().commands, r.counters().commands);
    assert!(w1 - w0 >= 12, "writes, the queue and its barrier on the write session: {}", w1 - w0);
    assert_eq!(r1, r0, "nothing but reads on the read session");
    for i in 0..10u64 {
        assert_eq!(lun.read(i * 8, 8).await.unwrap(), block(i as u8));
    }
    assert_eq!(lun.read(80, 8).await.unwrap(), block(0xee));
    assert_eq!(w.counters().commands, w1, "no read on the write session");
    assert!(r.counters().commands - r1 >= 11, "every read on the read session");
    assert_eq!(lun.counters().commands, w.counters().commands + r.counters().commands, "counters sum both");
    lun.close().await;
    // Without it, one session carries both.
    let lun = Lun::open(&url, &LunOptions::default()).await.unwrap();
    assert!(lun.read_session().is_none() && lun.sessions().len() == 1);
    lun.close().await;
}

/// The write session's link holds a write and an ORDERED SYNCHRONIZE CACHE behind it (the
/// target has not received them); a read completes meanwhile on the read session, where with one
/// session it would wait behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_completes_while_the_write_session_holds_a_write_and_an_ordered_barrier() {
    let t = in_process().await;
    for read_session in [true, false] {
        let links = Links::start(t.addr);
        let opts = LunOptions { read_session, ..LunOptions::default() };
        let lun = Arc::new(Lun::open(&url_via(links.port), &opts).await.unwrap());
        assert_eq!(links.opened(), 1 + usize::from(read_session));
        lun.write(0, block(1), false).await.unwrap();
        links.hold(0, true);
        let q = lun.ordered_queue().expect("an ordered queue");
        let write = tokio::spawn(q.queue_write(800, Bytes::from(vec![2u8; 1 << 20])));
        let barrier = tokio::spawn(q.queue_barrier());
        let read = tokio::time::timeout(Duration::from_secs(2), lun.read(0, 8)).await;
        if read_session {
            assert_eq!(read.expect("the read completes while the write session is held").unwrap(), block(1));
            assert!(!write.is_finished() && !barrier.is_finished(), "the write and the barrier are still held");
        } else {
            assert!(read.is_err(), "with one session the read waits behind the held write");
        }
        links.hold(0, false);
        write.await.unwrap().unwrap();
        barrier.await.unwrap().unwrap();
        assert_eq!(lun.read(800, 8).await.unwrap(), block(2));
        lun.close().await;
    }
}

/// A write and an ORDERED SYNCHRONIZE CACHE of the ordered queue are on a connection that is cut
/// before the target sees them: both fail, they are not reissued after the session is
/// reinstated, and the queue takes nothing more until `prepare`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_queue_commands_are_not_reissued_after_a_lost_connection() {
    let t = in_process().await;
    let links = Links::start(t.addr);
    let lun = Lun::open(&url_via(links.port), &fault_options()).await.unwrap();
    let q = lun.ordered_queue().expect("an ordered queue");
    q.queue_write(0, block(1)).await.unwrap();
    assert_eq!(lun.resets(), 0);
    links.hold(0, true);
    let write = q.queue_write(8, block(2));
    let barrier = q.queue_barrier();
    tokio::time::sleep(Duration::from_millis(100)).await;
    links.cut(0);
    for (what, r) in [("write", write.await), ("barrier", barrier.await)] {
        let e = r.expect_err(what);
        assert!(matches!(&e, BlockError::Unreachable(m) if m.contains("not reissued")), "{what}: {e}");
        assert!(e.is_transient(), "{what}: {e}");
    }
    let e = q.queue_write(16, block(3)).await.unwrap_err();
    assert!(matches!(&e, BlockError::Unreachable(m) if m.contains("not reissued")), "before prepare: {e}");
    q.prepare().await.unwrap();
    q.queue_write(24, block(4)).await.unwrap();
    q.queue_barrier().await.unwrap();
    assert_eq!(links.opened(), 2, "the session was reinstated");
    let resets = lun.resets();
    assert!(resets >= 1, "the reinstatement counts as a reset");
    let back = lun.read(0, 32).await.unwrap();
    assert_eq!(back.slice(..4096), block(1));
    assert_eq!(back.slice(4096..8192), block(0), "the cut write was not reissued");
    assert_eq!(back.slice(8192..12288), block(0), "nor the one queued before prepare");
    assert_eq!(back.slice(12288..), block(4));
    // Plain writes are still reissued after a cut.
    links.hold(1, true);
    let l = Arc::new(lun);
    let w = tokio::spawn({
        let l = Arc::clone(&l);
        async move { l.write(40, block(5), false).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    links.cut(1);
    w.await.unwrap().unwrap();
    assert_eq!(l.read(40, 8).await.unwrap(), block(5));
    assert!(l.resets() > resets, "counted by the time the reissued write completed");
}

/// `resets` counts power-on and reset unit attentions (a LOGICAL UNIT RESET from another
/// initiator here) and reinstatements of the write session, by the time the command that saw
/// one completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resets_count_reset_unit_attentions_and_reinstatements() {
    let t = in_process().await;
    let links = Links::start(t.addr);
    let opts = LunOptions { read_session: true, ..fault_options() };
    let lun = Lun::open(&url_via(links.port), &opts).await.unwrap();
    lun.write(0, block(1), false).await.unwrap();
    lun.read(0, 8).await.unwrap();
    assert_eq!(lun.resets(), 0, "the power-on attentions of new sessions are taken at open");
    let mut other = stics_testkit::client::Client::session(t.addr, &[]).await;
    let r = other.task_mgmt(stics_wire::tmf::LOGICAL_UNIT_RESET, 0, stics_wire::RESERVED_TAG, 0).await;
    assert_eq!(r.response, 0, "LOGICAL UNIT RESET done");
    lun.write(8, block(2), false).await.unwrap();
    assert_eq!(lun.resets(), 1, "the write that saw the attention has completed");
    lun.read(8, 8).await.unwrap();
    assert_eq!(lun.resets(), 1, "the read session's own attention of the same reset adds nothing");
    links.cut(1);
    lun.read(0, 8).await.unwrap();
    assert_eq!(lun.resets(), 1, "the read session's reinstatement loses no write");
    links.cut(0);
    lun.write(16, block(3), false).await.unwrap();
    assert!(lun.resets() > 1, "the write session's reinstatement counts");
    assert_eq!(lun.read(0, 24).await.unwrap(), [block(1), block(2), block(3)].concat());
    lun.close().await;
}

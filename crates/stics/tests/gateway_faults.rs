//! The fault campaign: `stics gateway` in front of a remote that fails on demand (the test kit's
//! `FaultRemote`, served by `stics target` or by tgt) in each acknowledgement mode, under each
//! fault: the link cut, the storage host's power lost, writes refused until repaired, the
//! gateway SIGKILLed or SIGTERMed and started again on its log. A stamped-block ledger writes
//! through the gateway while the fault strikes at a seeded random moment; afterwards every
//! write that must survive is there through the gateway, POST /drain empties the log, and the
//! remote alone holds exactly what the host saw.
//!
//! The gateway's health report (`/status` `health` and `errors_by_kind`) is checked in one
//! place, [`expect_health`]. Each of the 30 tests takes 5 to 20 s, so `.ci/run` runs them after
//! the default test run; `STICS_FAULTS_SEED` replaces every seed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use stics_block::{BlockDev, BlockError};
use stics_initiator::{IscsiUrl, Lun, LunOptions};
use stics_sam::sense::{asc, key};
use stics_sam::status;
use stics_testkit::faults::ErrorKind;
use stics_testkit::ledger::{Durable, Failure, Ledger, Pace};
use stics_testkit::net::free_port;
use stics_testkit::proc::{spawn, wait_port, Guard};
use stics_testkit::remote::{FaultRemote, Server};
use stics_testkit::workload::fault_options;

const BIN: &str = env!("CARGO_BIN_EXE_stics");
const GATEWAY_IQN: &str = "iqn.2024-01.org.stics.test:gateway";
/// Blocks the ledger writes (2 MiB), on a remote of `REMOTE_MIB`.
const BLOCKS: u64 = 4096;
const REMOTE_MIB: u64 = 16;
/// `--full-timeout`: how long the remote may fail before a full log refuses writes.
const FULL_TIMEOUT: Duration = Duration::from_secs(20);
/// A host write unanswered this long counts as hung.
const WRITE_BOUND: Duration = Duration::from_secs(45);
/// POST /drain must answer within this.
const DRAIN_BOUND: Duration = Duration::from_secs(120);
/// How long the gateway may take to report itself healthy again once a fault ends.
const HEAL_BOUND: Duration = Duration::from_secs(60);
const PACE: Pace = Pace { pause: Some(Duration::from_millis(1)), flush_one_in: 10, timeout: Some(WRITE_BOUND) };

/// What happens to the gateway or its remote while the ledger writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Connections to the remote reset, then 8 to 12 s in which new ones reach nothing (longer
    /// than the gateway's 5 s answer timeout, after which it counts the remote unreachable).
    NetworkCut,
    /// The storage host loses power (its volatile cache with it) for up to 3 s.
    RemotePowerLoss,
    /// The remote refuses every write with one error for 6 to 9 s, then is repaired.
    PersistentError,
    GatewaySigkill,
    GatewaySigterm,
}

macro_rules! campaign {
    ($($name:ident: $server:ident, $mode:literal, $fault:ident;)*) => {$(
        #[test]
        #[ignore = "fault campaign: .ci/run runs it after the default test run"]
        fn $name() {
            run(stringify!($name), Server::$server, $mode, Fault::$fault);
        }
    )*};
}

campaign! {
    stics_log_network_cut: Stics, "log", NetworkCut;
    stics_log_remote_power_loss: Stics, "log", RemotePowerLoss;
    stics_log_persistent_error: Stics, "log", PersistentError;
    stics_log_gateway_sigkill: Stics, "log", GatewaySigkill;
    stics_log_gateway_sigterm: Stics, "log", GatewaySigterm;
    stics_immediate_network_cut: Stics, "immediate", NetworkCut;
    stics_immediate_remote_power_loss: Stics, "immediate", RemotePowerLoss;
    stics_immediate_persistent_error: Stics, "immediate", PersistentError;
    stics_immediate_gateway_sigkill: Stics, "immediate", GatewaySigkill;
    stics_immediate_gateway_sigterm: Stics, "immediate", GatewaySigterm;
    stics_write_through_network_cut: Stics, "write-through", NetworkCut;
    stics_write_through_remote_power_loss: Stics, "write-through", RemotePowerLoss;
    stics_write_through_persistent_error: Stics, "write-through", PersistentError;
    stics_write_through_gateway_sigkill: Stics, "write-through", GatewaySigkill;
    stics_write_through_gateway_sigterm: Stics, "write-through", GatewaySigterm;
    tgt_log_network_cut: Tgt, "log", NetworkCut;
    tgt_log_remote_power_loss: Tgt, "log", RemotePowerLoss;
    tgt_log_persistent_error: Tgt, "log", PersistentError;
    tgt_log_gateway_sigkill: Tgt, "log", GatewaySigkill;
    tgt_log_gateway_sigterm: Tgt, "log", GatewaySigterm;
    tgt_immediate_network_cut: Tgt, "immediate", NetworkCut;
    tgt_immediate_remote_power_loss: Tgt, "immediate", RemotePowerLoss;
    tgt_immediate_persistent_error: Tgt, "immediate", PersistentError;
    tgt_immediate_gateway_sigkill: Tgt, "immediate", GatewaySigkill;
    tgt_immediate_gateway_sigterm: Tgt, "immediate", GatewaySigterm;
    tgt_write_through_network_cut: Tgt, "write-through", NetworkCut;
    tgt_write_through_remote_power_loss: Tgt, "write-through", RemotePowerLoss;
    tgt_write_through_persistent_error: Tgt, "write-through", PersistentError;
    tgt_write_through_gateway_sigkill: Tgt, "write-through", GatewaySigkill;
    tgt_write_through_gateway_sigterm: Tgt, "write-through", GatewaySigterm;
}

/// The error the remote refuses writes with in the persistent-error case, one per mode so that
/// the campaign covers each, and whether flushes are refused too (a full pool takes them).
fn refusal_of(mode: &str) -> (ErrorKind, bool) {
    match mode {
        "log" => (ErrorKind::NoSpace, false),
        "immediate" => (ErrorKind::Io, true),
        _ => (ErrorKind::Reserved, true),
    }
}

/// The `kind` the gateway's health report gives a remote's refusal of that status and sense.
fn health_kind(status: u8, sense: Option<(u8, (u8, u8))>) -> &'static str {
    match (status, sense) {
        (status::RESERVATION_CONFLICT, _) => "reserved",
        (status::BUSY, _) => "busy",
        (_, Some((key::DATA_PROTECT, asc::SPACE_ALLOCATION_FAILED))) => "no_space",
        (_, Some((key::DATA_PROTECT, _))) => "write_protected",
        _ => "medium",
    }
}

/// A seed per test, stable across runs, unless `STICS_FAULTS_SEED` gives one.
fn seed_of(name: &str) -> u64 {
    if let Some(s) = std::env::var("STICS_FAULTS_SEED").ok().and_then(|s| s.parse().ok()) {
        return s;
    }
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

fn sleep(d: Duration) {
    std::thread::sleep(d);
}

fn ms(rng: &mut StdRng, range: std::ops::Range<u64>) -> Duration {
    Duration::from_millis(rng.gen_range(range))
}

/// One test of the campaign.
fn run(name: &str, server: Server, mode: &'static str, fault: Fault) {
    let seed = seed_of(name);
    let ctx = format!("{name} (seed {seed})");
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut remote = FaultRemote::start(server, REMOTE_MIB, seed);
    let dir = tempfile::tempdir().unwrap();
    let mut gw = Gateway::start(&remote.url(), dir.path(), mode);
    let ledger = Ledger::new(BLOCKS, 512, Durable::of_mode(mode, true));
    let acked = ledger.acked();
    let mut w = Writer::start(gw.url(), ledger, seed);
    sleep(ms(&mut rng, 500..2500));
    let hit = Instant::now();
    let acked_before = acked.load(Ordering::Relaxed);
    // Failures the host may see, and from when.
    let mut tolerated: Option<Tolerated> = None;
    match fault {
        Fault::NetworkCut => {
            remote.cut();
            sleep(ms(&mut rng, 100..500));
            remote.outage();
            let length = ms(&mut rng, 8000..12_000);
            expect_health(&gw, &["degraded", "stalled"], None, length, &format!("{ctx}: while the link is down"));
            sleep(length.saturating_sub(hit.elapsed()));
            remote.restore();
        }
        Fault::RemotePowerLoss => remote.power_loss(ms(&mut rng, 500..3000)),
        Fault::PersistentError => {
            let (kind, flushes) = refusal_of(mode);
            let refusal = remote.refusal(kind);
            let want = health_kind(refusal.status, refusal.sense);
            remote.fail_writes(kind, flushes);
            let length = ms(&mut rng, 6000..9000);
            tolerated = Some(Tolerated { since: hit, mode });
            expect_health(&gw, &["stalled"], Some(want), length, &format!("{ctx}: while the remote refuses writes"));
            sleep(length.saturating_sub(hit.elapsed()));
            remote.repair();
            expect_errors_counted(&gw, want, &ctx);
        }
        Fault::GatewaySigkill | Fault::GatewaySigterm => {
            // The host's write in flight dies with the gateway; the host then opens the
            // restarted gateway afresh, and what it reads there must hold every durable write.
            if fault == Fault::GatewaySigkill {
                gw.sigkill();
            } else {
                gw.sigterm(&ctx);
            }
            let (mut l, failures) = w.join();
            eprintln!("{ctx}: the writer stopped with the gateway: {}", describe(&failures));
            gw.restart();
            let (rt, lun) = open(&gw.url());
            rt.block_on(l.verify(&lun, &format!("{ctx}: the gateway restarted on its log")));
            w = Writer::start(gw.url(), l, seed ^ 1);
        }
    }
    let fault_took = hit.elapsed();
    let acked_during = acked.load(Ordering::Relaxed) - acked_before;
    if mode != "write-through" && matches!(fault, Fault::NetworkCut | Fault::PersistentError) {
        assert!(acked_during > 0, "{ctx}: the log took no write while the remote could not");
    }
    expect_health(&gw, &["healthy"], None, HEAL_BOUND, &format!("{ctx}: after the fault"));
    sleep(Duration::from_secs(2));
    let (mut l, failures) = w.join();
    judge(&failures, tolerated, &ctx);

    // Every write that must survive is there through the gateway.
    let (rt, lun) = open(&gw.url());
    let seen = rt.block_on(l.verify(&lun, &format!("{ctx}: through the gateway")));
    drop(lun);
    if mode == "write-through" {
        let on_remote = l.check(&remote.read_volatile(0, BLOCKS), &format!("{ctx}: the remote before drain"));
        assert!(on_remote == seen, "{ctx}: in write-through mode the remote holds every acknowledged write at once");
    }
    let (drained, drain_took) = gw.drain(&ctx);
    assert_eq!(drained["dirty_bytes"], 0, "{ctx}: after POST /drain: {drained}");
    expect_health(&gw, &["healthy"], None, Duration::ZERO, &format!("{ctx}: after POST /drain"));
    gw.sigterm(&ctx);

    // The remote alone holds exactly the host's view, and holds it durably.
    let (rt, lun) = open(&remote.direct_url());
    let image = rt.block_on(lun.read(0, BLOCKS as u32)).unwrap_or_else(|e| panic!("{ctx}: reading the remote: {e}"));
    let on_remote = l.check(&image, &format!("{ctx}: the remote alone after drain"));
    assert!(on_remote == seen, "{ctx}: the remote alone differs from what the host saw through the gateway");
    let durable = remote.read_durable(0, BLOCKS);
    assert!(durable == image, "{ctx}: what the host saw is not durable on the remote after POST /drain");
    rt.block_on(lun.close());
    eprintln!(
        "{ctx}: {} writes and {} flushes acknowledged, {acked_during} of the writes during the fault; \
         {}; fault {fault_took:?}, drain {drain_took:?}, {:?} in all",
        l.acked().load(Ordering::Relaxed),
        l.flushes(),
        describe(&failures),
        started.elapsed()
    );
}

/// When a persistent remote error lets the host see a CHECK CONDITION: in write-through mode at
/// once, in the other modes from `--full-timeout` after it began (the log absorbs writes until
/// then).
#[derive(Clone, Copy)]
struct Tolerated {
    since: Instant,
    mode: &'static str,
}

/// Fails the test on a failure the host must not see: none at all, outside a persistent remote
/// error; during one, only a CHECK CONDITION, and with a log (`log`, `immediate`) only once it is
/// older than `--full-timeout`. A write left unanswered (hung) is never allowed.
fn judge(failures: &[(Instant, Failure)], tolerated: Option<Tolerated>, ctx: &str) {
    for (at, f) in failures {
        let ok = match (tolerated, f.error()) {
            (Some(t), Some(e)) if check_condition(e) => {
                t.mode == "write-through" || at.duration_since(t.since) + Duration::from_secs(1) >= FULL_TIMEOUT
            }
            _ => false,
        };
        assert!(ok, "{ctx}: the host saw {f}");
    }
}

/// True for an error the initiator made of a CHECK CONDITION: one of the kinds it maps sense
/// to, or an I/O error carrying that status.
fn check_condition(e: &BlockError) -> bool {
    match e {
        BlockError::NoSpace(_) | BlockError::WriteProtected(_) | BlockError::Stalled(_) => true,
        BlockError::Io { source, .. } => source.to_string().contains("status 0x02"),
        _ => false,
    }
}

fn describe(failures: &[(Instant, Failure)]) -> String {
    match failures {
        [] => "no host-visible failure".into(),
        [.., (_, last)] => format!("{} host-visible failures, the last: {last}", failures.len()),
    }
}

/// Waits up to `within` for /status to report `"health": {"state": S, "kind": K}` with S one of
/// `states` and K `kind` (any, when None); fails naming `what` and the last report.
fn expect_health(gw: &Gateway, states: &[&str], kind: Option<&str>, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    loop {
        let s = gw.status();
        let health = &s["health"];
        assert!(!health.is_null(), "{what}: /status has no health report: {s}");
        let state_ok = health["state"].as_str().is_some_and(|st| states.contains(&st));
        let kind_ok = kind.is_none_or(|k| health["kind"].as_str() == Some(k));
        if state_ok && kind_ok {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: health {states:?} kind {kind:?} expected within {within:?}: {s}");
        sleep(Duration::from_millis(200));
    }
}

/// `errors_by_kind` in /status counts at least one error of `kind`.
fn expect_errors_counted(gw: &Gateway, kind: &str, ctx: &str) {
    let s = gw.status();
    let n = s["errors_by_kind"][kind].as_u64().unwrap_or(0);
    assert!(n > 0, "{ctx}: errors_by_kind counts no {kind:?} error: {s}");
}

/// A `stics gateway` process with its status endpoint, started again on the same ports and
/// log after it is stopped; killed when dropped.
struct Gateway {
    proc: Guard,
    port: u16,
    metrics: u16,
    remote: String,
    log: PathBuf,
    dir: PathBuf,
    mode: &'static str,
    starts: u32,
}

impl Gateway {
    fn start(remote: &str, dir: &Path, mode: &'static str) -> Gateway {
        let mut g = Gateway {
            proc: Guard::default(),
            port: free_port(),
            metrics: free_port(),
            remote: remote.to_owned(),
            log: dir.join("log"),
            dir: dir.to_owned(),
            mode,
            starts: 0,
        };
        g.restart();
        g
    }

    fn stderr(&self) -> PathBuf {
        self.dir.join(format!("gw{}.log", self.starts))
    }

    /// Starts the gateway (again) and waits until both its ports listen.
    fn restart(&mut self) {
        self.starts += 1;
        let mut cmd = Command::new(BIN);
        cmd.args(["gateway", "--listen", &format!("127.0.0.1:{}", self.port), "--iqn", GATEWAY_IQN])
            .args(["--remote", &self.remote, "--log", &format!("{}:256MiB", self.log.display())])
            .args(["--mode", self.mode, "--ram", "8MiB", "--metrics", &format!("127.0.0.1:{}", self.metrics)])
            .args(["--full-timeout", &FULL_TIMEOUT.as_secs().to_string()]);
        self.proc = spawn(&mut cmd, Some(&self.stderr()));
        for port in [self.port, self.metrics] {
            let up = wait_port(port, Duration::from_secs(30));
            assert!(
                up,
                "the gateway did not listen on {port}: {}",
                std::fs::read_to_string(self.stderr()).unwrap_or_default()
            );
        }
    }

    fn url(&self) -> String {
        format!("iscsi://127.0.0.1:{}/{GATEWAY_IQN}/0", self.port)
    }

    fn sigkill(&mut self) {
        self.proc.kill();
    }

    /// SIGTERM: the gateway must stop on its own, successfully, within 30 s.
    fn sigterm(&mut self, ctx: &str) {
        assert!(self.proc.signal(libc::SIGTERM), "{ctx}: the gateway is not running");
        let st = self.proc.wait_exit(Duration::from_secs(30));
        let said = || std::fs::read_to_string(self.stderr()).unwrap_or_default();
        assert!(st.is_some(), "{ctx}: the gateway still runs 30 s after SIGTERM: {}", said());
        assert!(st.is_some_and(|s| s.success()), "{ctx}: the gateway exits {st:?} on SIGTERM: {}", said());
    }

    fn status(&self) -> Value {
        let body = http(self.metrics, "GET /status", Duration::from_secs(10)).unwrap_or_else(|e| self.fail(&e));
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("/status is not JSON ({e}): {body}"))
    }

    /// POST /drain, within [`DRAIN_BOUND`]: the status it answers with and how long it took.
    fn drain(&self, ctx: &str) -> (Value, Duration) {
        let t = Instant::now();
        let body = http(self.metrics, "POST /drain", DRAIN_BOUND).unwrap_or_else(|e| {
            let now = http(self.metrics, "GET /status", Duration::from_secs(10)).unwrap_or_else(|e| e);
            self.fail(&format!("{ctx}: {e}; /status now: {now}"))
        });
        let s = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{ctx}: POST /drain is not JSON ({e}): {body}"));
        (s, t.elapsed())
    }

    /// Fails the test with `what` and the end of what the gateway said on stderr.
    fn fail(&self, what: &str) -> ! {
        let said = std::fs::read_to_string(self.stderr()).unwrap_or_default();
        let tail: Vec<&str> = said.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        panic!("{what}\nthe gateway said (last lines of {}):\n{}", self.stderr().display(), tail.join("\n"));
    }
}

/// One HTTP/1.0 request (`"GET /status"`) to 127.0.0.1:`port`, answered within `limit`; the body
/// of its 200 answer, or what went wrong.
fn http(port: u16, request: &str, limit: Duration) -> Result<String, String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("{request}: {e}"))?;
    s.set_read_timeout(Some(limit)).map_err(|e| e.to_string())?;
    s.write_all(format!("{request} HTTP/1.0\r\n\r\n").as_bytes()).map_err(|e| format!("{request}: {e}"))?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).map_err(|e| format!("{request}: no answer within {limit:?}: {e}"))?;
    if !answer.starts_with("HTTP/1.0 200") {
        return Err(format!("{request}: {answer}"));
    }
    Ok(answer.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default())
}

/// How the host reaches the gateway: the kit's short timers, and a short recovery so that a
/// write in flight when the gateway dies fails within seconds.
fn host_options() -> LunOptions {
    let mut o = fault_options();
    o.config.timers.recovery.timeout = Duration::from_secs(3);
    o
}

/// A LUN through the initiator, with the runtime its sessions run on.
fn open(url: &str) -> (tokio::runtime::Runtime, Lun) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let u = IscsiUrl::parse(url).unwrap();
    let lun = rt.block_on(Lun::open(&u, &host_options())).unwrap_or_else(|e| panic!("open {url}: {e}"));
    (rt, lun)
}

/// What the host saw fail, and when.
type Failures = Vec<(Instant, Failure)>;

/// The host: the ledger writing through the gateway on a thread of its own until stopped,
/// going on after each failure (noted with its time) unless a write hung or it was stopped.
struct Writer {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<(Ledger, Failures)>>,
}

impl Writer {
    fn start(url: String, mut ledger: Ledger, seed: u64) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            let lun = match rt.block_on(Lun::open(&IscsiUrl::parse(&url).unwrap(), &host_options())) {
                Ok(lun) => lun,
                // The test ended (it failed) and took the gateway with it while this started.
                Err(_) if s.load(Ordering::Relaxed) => return (ledger, Vec::new()),
                Err(e) => panic!("open {url}: {e}"),
            };
            let mut rng = StdRng::seed_from_u64(seed);
            let mut failures = Vec::new();
            while let Some(f) = rt.block_on(ledger.run(&lun, &mut rng, PACE, || s.load(Ordering::Relaxed))) {
                let hung = matches!(f, Failure::Hung { .. });
                failures.push((Instant::now(), f));
                if hung || s.load(Ordering::Relaxed) {
                    break;
                }
                sleep(Duration::from_millis(100));
            }
            (ledger, failures)
        });
        Writer { stop, thread: Some(thread) }
    }

    /// Stops the writer and hands back its ledger and failures.
    fn join(mut self) -> (Ledger, Failures) {
        self.stop.store(true, Ordering::Relaxed);
        let t = self.thread.take().expect("joined once");
        t.join().expect("the writer thread panicked")
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[test]
fn refusals_map_to_the_health_kinds_the_gateway_reports() {
    let check = |k, c| (status::CHECK_CONDITION, Some((k, c)));
    let (s, sense) = check(key::DATA_PROTECT, asc::SPACE_ALLOCATION_FAILED);
    assert_eq!(health_kind(s, sense), "no_space");
    let (s, sense) = check(key::DATA_PROTECT, asc::WRITE_PROTECTED);
    assert_eq!(health_kind(s, sense), "write_protected");
    let (s, sense) = check(key::MEDIUM_ERROR, asc::UNRECOVERED_READ_ERROR);
    assert_eq!(health_kind(s, sense), "medium");
    assert_eq!(health_kind(status::RESERVATION_CONFLICT, None), "reserved");
    assert_eq!(health_kind(status::BUSY, None), "busy");
    let io = BlockError::Io { lba: 0, source: std::io::Error::other("SCSI command 0x8a failed: status 0x02") };
    assert!(check_condition(&io));
    assert!(!check_condition(&BlockError::Unreachable("gone".into())));
    assert!(!check_condition(&BlockError::Reserved { holder: None }));
}

//! A configuration served in process: a LUN that is a LUN of another target (a proxy), cached
//! LUNs with their status and metrics per LUN, devices closed after the service stops, and
//! devices that cannot be opened named in the error.

use std::path::Path;

use bytes::Bytes;
use stics_block::BlockDev;
use stics_initiator::{IscsiUrl, Lun, LunOptions};
use stics_service::{CachedLunConfig, Config, LunConfig, Service, TargetConfig};
use stics_stack::OpenContext;
use stics_testkit::peers::InProcess;
use tokio::sync::oneshot;

const BACKING: &str = "iqn.2024-01.org.stics.test:backing";
const PROXY: &str = "iqn.2024-01.org.stics.test:proxy";
const GATEWAY: &str = "iqn.2024-01.org.stics.test:gateway";

fn config(iqn: &str, luns: Vec<LunConfig>) -> Config {
    Config { listen: vec!["127.0.0.1:0".into()], targets: vec![TargetConfig::new(iqn, luns)], ..Config::default() }
}

fn spec(text: impl Into<String>) -> LunConfig {
    LunConfig::Spec(text.into())
}

fn cached(remote: &str, log: &Path) -> LunConfig {
    let mut c = CachedLunConfig::new(remote, log);
    c.log_size = Some(stics_service::config::SizeText("256MiB".into()));
    c.ram = Some(stics_service::config::SizeText("4MiB".into()));
    LunConfig::Cached(c)
}

/// A service running in a task, stopped by sending on the channel.
struct Running {
    addr: std::net::SocketAddr,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

fn run(service: Service) -> Running {
    let addr = service.local_addrs()[0];
    let (stop, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        service.run(async { drop(rx.await) }, std::future::pending()).await.unwrap();
    });
    Running { addr, stop, task }
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap();
    }
}

async fn login(addr: std::net::SocketAddr, iqn: &str, lun: u32) -> Lun {
    Lun::open(&IscsiUrl::parse(&format!("iscsi://{addr}/{iqn}/{lun}")).unwrap(), &LunOptions::default()).await.unwrap()
}

#[tokio::test]
async fn a_target_serves_a_lun_of_another_target() {
    let backing = InProcess::over(BACKING, vec![stics_testkit::peers::mem(4 << 20, 4096)]).await;
    let proxy = Service::open(
        &config(PROXY, vec![spec(format!("iscsi://{}/{BACKING}/0", backing.addr))]),
        OpenContext::default(),
    )
    .await
    .unwrap();
    let proxy = run(proxy);
    let via_proxy = login(proxy.addr, PROXY, 0).await;
    let g = via_proxy.geometry();
    assert_eq!((g.block_size, g.num_blocks), (4096, 1024));
    via_proxy.write(7, Bytes::from(vec![0x5a; 8192]), true).await.unwrap();
    let direct = login(backing.addr, BACKING, 0).await;
    assert_eq!(&direct.read(7, 2).await.unwrap()[..], &[0x5a; 8192][..]);
    assert_eq!(&direct.read(9, 1).await.unwrap()[..], &[0; 4096][..]);
    via_proxy.close().await;
    direct.close().await;
    proxy.stop().await;
    backing.stop().await;
}

#[tokio::test]
async fn an_unreachable_backing_target_fails_with_the_lun_named() {
    let c = config(PROXY, vec![spec("mem:1MiB"), spec("iscsi://127.0.0.1:1/iqn.2024-01.org.x:y/0")]);
    let e = Service::open(&c, OpenContext::default()).await.err().unwrap().to_string();
    assert!(e.contains(PROXY) && e.contains("LUN 1") && e.contains("127.0.0.1:1"), "{e}");
}

#[tokio::test]
async fn a_cached_lun_that_cannot_open_is_named_and_the_caches_opened_before_it_are_closed() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.log"), dir.path().join("b.log"));
    let c = config(GATEWAY, vec![cached("mem:4MiB", &a), cached("iscsi://127.0.0.1:1/iqn.2024-01.org.x:y/0", &b)]);
    let e = Service::open(&c, OpenContext::default()).await.err().unwrap().to_string();
    assert!(e.contains(GATEWAY) && e.contains("LUN 1") && e.contains("127.0.0.1:1"), "{e}");
    assert!(!b.exists(), "the log made for the LUN that failed is gone");
    // The first LUN's log was let go: a cache opens on it again at once.
    let again = config(GATEWAY, vec![cached("mem:4MiB", &a)]);
    let s = Service::open(&again, OpenContext::default()).await.unwrap();
    run(s).stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_luns_report_status_and_metrics_per_lun() {
    let dir = tempfile::tempdir().unwrap();
    let one = config(GATEWAY, vec![cached("mem:8MiB", &dir.path().join("one.log"))]);
    let service = Service::open(&one, OpenContext::default()).await.unwrap();
    let endpoint = service.endpoint();
    let running = run(service);
    let lun = login(running.addr, GATEWAY, 0).await;
    lun.write(0, Bytes::from(vec![1; 8192]), false).await.unwrap();
    lun.flush().await.unwrap();
    assert_eq!(&lun.read(0, 16).await.unwrap()[..], &[1; 8192][..]);
    // One cached LUN: its fields at the top, as a single-LUN gateway always had them, and in `luns`.
    let s = endpoint.status_json();
    assert_eq!(s["host_write_bytes"], 8192, "{s}");
    assert_eq!((s["target"].as_str(), s["lun"].as_u64()), (Some(GATEWAY), Some(0)), "{s}");
    assert_eq!(s["luns"].as_array().map(Vec::len), Some(1), "{s}");
    assert_eq!(s["luns"][0]["host_write_bytes"], 8192, "{s}");
    let m = endpoint.metrics_text();
    let labels = format!("target=\"{GATEWAY}\",lun=\"0\"");
    for want in [
        format!("stics_cache_host_write_bytes_total{{{labels},mode=\"log\"}} 8192"),
        format!("stics_target_received_bytes_total{{{labels}}} 8192"),
        format!("stics_target_commands_total{{{labels},kind=\"write\"}} 1"),
        format!("stics_target_command_latency_seconds_bucket{{le=\"+Inf\",{labels},kind=\"read\"}} 1"),
        format!("stics_target_command_latency_seconds_count{{{labels},kind=\"write\"}} 1"),
        format!("stics_target_sessions{{target=\"{GATEWAY}\"}} 1"),
    ] {
        assert!(m.contains(&want), "{want} missing from:\n{m}");
    }
    // Read data and what the login's INQUIRY and VPD pages sent.
    let sent = m.lines().find_map(|l| l.strip_prefix(&format!("stics_target_sent_bytes_total{{{labels}}} "))).unwrap();
    assert!(sent.parse::<u64>().unwrap() >= 8192, "{sent}");
    lun.close().await;
    running.stop().await;

    // Two cached LUNs: only the list, each entry naming its LUN.
    let two = config(
        GATEWAY,
        vec![cached("mem:8MiB", &dir.path().join("a.log")), cached("mem:4MiB", &dir.path().join("b.log"))],
    );
    let service = Service::open(&two, OpenContext::default()).await.unwrap();
    let s = service.endpoint().status_json();
    assert!(s.get("host_write_bytes").is_none(), "{s}");
    let luns: Vec<u64> = s["luns"].as_array().unwrap().iter().map(|l| l["lun"].as_u64().unwrap()).collect();
    assert_eq!(luns, [0, 1], "{s}");
    run(service).stop().await;
}

#[tokio::test]
async fn devices_a_service_opened_are_closed_once_it_stops() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("spec.log");
    // A cache given as a spec is the device stack's to open, and the service's to close.
    let c = config(PROXY, vec![spec(format!("cache(mem:4MiB, log={}:256MiB, ram=4MiB)", log.display()))]);
    let service = Service::open(&c, OpenContext::default()).await.unwrap();
    let e = Service::open(&c, OpenContext::default()).await.err().unwrap().to_string();
    assert!(e.contains("in use by this process"), "{e}");
    run(service).stop().await;
    let again = Service::open(&c, OpenContext::default()).await.unwrap();
    run(again).stop().await;
}

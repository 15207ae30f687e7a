//! TLS 1.3 as the transport of `stics target` and of the initiator, as processes: reads and
//! writes over TLS; a client that does not trust the CA, a plain client on the TLS port and a
//! TLS client on a plain port are refused with a clear message while the target keeps serving;
//! mutual TLS refuses a client without a certificate; a gateway ships groups to an SG over TLS,
//! and one whose configuration file has a [tls] table serves its cached LUN over TLS only.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use stics_stack::{DeviceSpec, OpenContext};
use stics_testkit::ledger::{Durable, Ledger, Pace};
use stics_testkit::peers::{SticsOptions, SticsTarget};

use common::*;

const IQN: &str = "iqn.2024-01.org.stics.test:tls";

/// A throwaway PKI in `dir`: `ca.pem` signs `server.pem` (for 127.0.0.1) and `client.pem`;
/// `other-ca.pem` signs nothing the target holds.
fn pki(dir: &Path) {
    let ca = |name: &str| {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        rcgen::Issuer::new(params, key)
    };
    let issuer = ca("ca");
    ca("other-ca");
    for (name, san) in [("server", "127.0.0.1"), ("client", "client.stics.test")] {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![san.to_owned()]).unwrap().signed_by(&key, &issuer).unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }
}

fn p(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

/// `stics target` with one LUN, serving TLS with the PKI's server certificate (and asking for
/// client certificates when `mutual`), its log in `dir/target.log`.
fn tls_target(dir: &Path, lun: &str, mutual: bool) -> SticsTarget {
    let mut args = vec!["--lun".into(), lun.into(), "--tls-cert".into(), p(dir, "server.pem")];
    args.extend(["--tls-key".into(), p(dir, "server.key")]);
    if mutual {
        args.extend(["--tls-client-ca".into(), p(dir, "ca.pem")]);
    }
    SticsTarget::start(
        Path::new(BIN),
        SticsOptions {
            iqn: Some(IQN.into()),
            args,
            env: vec![("RUST_LOG".into(), "info".into())],
            stderr: Some(dir.join("target.log")),
        },
    )
}

/// `stics ls URL ARGS...`, with what it printed.
fn ls(url: &str, args: &[String]) -> Output {
    Command::new(BIN).args(["ls", url, "--timeout", "5"]).args(args).output().unwrap()
}

fn said(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn trusting(dir: &Path, ca: &str) -> Vec<String> {
    vec!["--tls-ca".into(), p(dir, ca)]
}

/// A device spec for the target's LUN 0 over TLS, trusting `ca`.
fn tls_spec(t: &SticsTarget, dir: &Path, ca: &str) -> DeviceSpec {
    format!("{}?tls=on&tls_ca={}", t.url(0), p(dir, ca)).parse().unwrap()
}

#[test]
fn a_tls_target_serves_reads_and_writes_and_refuses_a_client_that_does_not_trust_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    pki(dir.path());
    let t = tls_target(dir.path(), "mem:16MiB", false);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let spec = tls_spec(&t, dir.path(), "ca.pem");
    rt.block_on(async {
        let dev = stics_stack::open(&spec, &OpenContext::default()).await.unwrap();
        // 4 MiB in 256 KiB writes, each block stamped with its LBA, then read back in one go.
        for i in 0..16u64 {
            let data: Vec<u8> = (0..512u64).flat_map(|b| [(i * 512 + b) as u8; 512]).collect();
            dev.write(i * 512, Bytes::from(data), false).await.unwrap();
        }
        dev.flush().await.unwrap();
        let back = dev.read(0, 8192).await.unwrap();
        for (lba, block) in back.chunks(512).enumerate() {
            assert!(block.iter().all(|&b| b == lba as u8), "block {lba} came back wrong");
        }
    });
    let ok = ls(&t.url(0), &trusting(dir.path(), "ca.pem"));
    assert!(ok.status.success() && said(&ok).contains("Lun:0"), "{}", said(&ok));
    let untrusted = ls(&t.url(0), &trusting(dir.path(), "other-ca.pem"));
    assert!(!untrusted.status.success());
    assert!(said(&untrusted).contains("certificate"), "the refusal names the certificate: {}", said(&untrusted));
    let wrong_name =
        ls(&t.url(0), &[trusting(dir.path(), "ca.pem"), vec!["--tls-name".into(), "sg.example".into()]].concat());
    assert!(!wrong_name.status.success(), "{}", said(&wrong_name));
    let spec = tls_spec(&t, dir.path(), "other-ca.pem");
    let e =
        rt.block_on(stics_stack::open(&spec, &OpenContext::default())).err().expect("an untrusted target is refused");
    assert!(e.to_string().contains("certificate"), "{e}");
}

#[test]
fn a_plain_client_on_the_tls_port_is_refused_and_the_target_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    pki(dir.path());
    let t = tls_target(dir.path(), "mem:16MiB", false);
    let plain = ls(&t.url(0), &[]);
    assert!(!plain.status.success(), "{}", said(&plain));
    // libiscsi, a plain peer of another make, is refused the same way.
    let portal = t.url(0).split('/').nth(2).unwrap().to_owned();
    let other = Command::new("iscsi-ls").arg(format!("iscsi://{portal}/")).output().expect("iscsi-ls (libiscsi-bin)");
    assert!(!other.status.success() && !said(&other).contains(IQN), "{}", said(&other));
    let log = std::fs::read_to_string(dir.path().join("target.log")).unwrap();
    assert!(log.contains("plain iSCSI initiator on a TLS port"), "the target says why: {log}");
    let ok = ls(&t.url(0), &trusting(dir.path(), "ca.pem"));
    assert!(ok.status.success() && said(&ok).contains("Lun:0"), "{}", said(&ok));
}

#[test]
fn a_tls_client_on_a_plain_port_is_told_the_port_may_be_plain() {
    let dir = tempfile::tempdir().unwrap();
    pki(dir.path());
    let t = SticsTarget::start(Path::new(BIN), SticsOptions::args(&["--lun", "mem:16MiB"]));
    let o = ls(&t.url(0), &trusting(dir.path(), "ca.pem"));
    assert!(!o.status.success());
    assert!(said(&o).contains("without TLS"), "{}", said(&o));
    let plain = ls(&t.url(0), &[]);
    assert!(plain.status.success(), "{}", said(&plain));
}

#[test]
fn mutual_tls_refuses_a_client_without_a_certificate_and_admits_one_with() {
    let dir = tempfile::tempdir().unwrap();
    pki(dir.path());
    let t = tls_target(dir.path(), "mem:16MiB", true);
    let without = ls(&t.url(0), &trusting(dir.path(), "ca.pem"));
    assert!(!without.status.success(), "{}", said(&without));
    let cert = vec!["--tls-cert".into(), p(dir.path(), "client.pem"), "--tls-key".into(), p(dir.path(), "client.key")];
    let with = ls(&t.url(0), &[trusting(dir.path(), "ca.pem"), cert].concat());
    assert!(with.status.success() && said(&with).contains("Lun:0"), "{}", said(&with));
    let log = std::fs::read_to_string(dir.path().join("target.log")).unwrap();
    assert!(log.contains("TLS handshake"), "the target logs the refusal: {log}");
}

#[test]
fn bad_pem_files_stop_the_target_with_the_file_named() {
    let dir = tempfile::tempdir().unwrap();
    pki(dir.path());
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let run = |cert: &PathBuf, key: &PathBuf| {
        Command::new(BIN)
            .args(["target", "--listen", "127.0.0.1:0", "--lun", "mem:1MiB", "--tls-cert"])
            .arg(cert)
            .arg("--tls-key")
            .arg(key)
            .output()
            .unwrap()
    };
    let o = run(&dir.path().join("missing.pem"), &dir.path().join("server.key"));
    assert!(!o.status.success() && said(&o).contains("missing.pem"), "{}", said(&o));
    let o = run(&junk, &dir.path().join("server.key"));
    assert!(!o.status.success() && said(&o).contains("junk.pem"), "{}", said(&o));
    let o = run(&dir.path().join("server.pem"), &dir.path().join("server.pem"));
    assert!(!o.status.success() && said(&o).contains("private key"), "{}", said(&o));
}

#[test]
fn the_gateway_ships_groups_to_an_sg_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    pki(dir.path());
    let disk = dir.path().join("disk.img");
    std::fs::File::create(&disk).unwrap().set_len(64 << 20).unwrap();
    let lun = format!("journal(file:{}, journal={}:64MiB)", disk.display(), dir.path().join("journal").display());
    let sg = tls_target(dir.path(), &lun, true);
    let remote = format!(
        "{}?tls=on&tls_ca={}&tls_cert={}&tls_key={}",
        sg.url(0),
        p(dir.path(), "ca.pem"),
        p(dir.path(), "client.pem"),
        p(dir.path(), "client.key")
    );
    let (mut gw, port, metrics) =
        gateway_with_metrics(&remote, &dir.path().join("log"), "log", &dir.path().join("gw.log"));
    let stop = Arc::new(AtomicBool::new(false));
    let ledger = Ledger::new(4096, 512, Durable::of_mode("log", false));
    let pace = Pace { pause: Some(Duration::from_micros(300)), flush_one_in: 8, timeout: None };
    let w = writer(port, ledger, 28, pace, Arc::clone(&stop));
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    let (mut ledger, err) = w.join().unwrap();
    assert!(err.is_none(), "a write through the gateway failed: {err:?}");
    let drained: serde_json::Value = serde_json::from_str(&http(metrics, "POST /drain")).unwrap();
    assert_eq!(drained["dirty_bytes"], 0, "{drained}");
    let g = status(metrics)["groups"].clone();
    assert!(g["groups"].as_u64().unwrap() > 0, "groups went to the SG over TLS: {g}");
    gw.kill();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let spec: DeviceSpec = remote.parse().unwrap();
    let dev = rt.block_on(stics_stack::open(&spec, &OpenContext::default())).unwrap();
    rt.block_on(ledger.verify(dev.as_ref(), "the SG alone, read over TLS, after the drain"));
}

#[test]
fn a_gateway_config_with_a_tls_table_serves_its_cached_lun_over_tls_only() {
    let dir = tempfile::tempdir().unwrap();
    pki(dir.path());
    let remote = SticsTarget::with_file_lun(Path::new(BIN), 16, &[]);
    let toml = format!(
        "[tls]\ncert = \"{}\"\nkey = \"{}\"\n[[target]]\niqn = \"{GATEWAY_IQN}\"\n[[target.luns]]\nremote = \"{}\"\n\
         log = \"{}\"\nlog_size = \"256MiB\"\nmode = \"log\"\nram = \"8MiB\"\n",
        p(dir.path(), "server.pem"),
        p(dir.path(), "server.key"),
        remote.url(0),
        dir.path().join("log").display()
    );
    let config = dir.path().join("gateway.toml");
    std::fs::write(&config, toml).unwrap();
    let (_gw, port) = gateway_config(&config, &dir.path().join("gw.log"), &[]);
    let url = format!("iscsi://127.0.0.1:{port}/{GATEWAY_IQN}/0");
    let plain = ls(&url, &[]);
    assert!(!plain.status.success(), "a plain client is refused: {}", said(&plain));
    let spec: DeviceSpec = format!("{url}?tls=on&tls_ca={}", p(dir.path(), "ca.pem")).parse().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let dev = stics_stack::open(&spec, &OpenContext::default()).await.unwrap();
        dev.write(64, Bytes::from(vec![0x5a; 8 * 512]), true).await.unwrap();
        dev.flush().await.unwrap();
        assert!(dev.read(64, 8).await.unwrap().iter().all(|&b| b == 0x5a), "read back through the gateway over TLS");
    });
}

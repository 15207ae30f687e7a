//! A target over devices its caller opened: it serves them as its LUNs, each with its own
//! geometry, writes reach the caller's device, and a configuration that breaks a rule is
//! refused before anything listens.

use std::sync::Arc;

use bytes::Bytes;
use stics_block::{BlockDev, MemDev};
use stics_initiator::{IscsiUrl, Lun, LunOptions};
use stics_target::{Credentials, Server, ServerConfig, Target};
use stics_testkit::peers::{loopback, InProcess};

const IQN: &str = "iqn.2024-01.org.stics.test:devices";

#[tokio::test]
async fn devices_opened_by_the_caller_are_served_as_its_luns() {
    let a: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 2048));
    let b: Arc<dyn BlockDev> = Arc::new(MemDev::new(4096, 256));
    let target = InProcess::over(IQN, vec![a.clone(), b]).await;
    let url = |lun: u32| IscsiUrl::parse(&format!("iscsi://{}/{IQN}/{lun}", target.addr)).unwrap();
    let lun0 = Lun::open(&url(0), &LunOptions::default()).await.unwrap();
    let lun1 = Lun::open(&url(1), &LunOptions::default()).await.unwrap();
    assert_eq!((lun0.geometry().block_size, lun0.geometry().num_blocks), (512, 2048));
    assert_eq!(lun1.geometry().block_size, 4096);
    lun0.write(3, Bytes::from(vec![0x3c; 1024]), true).await.unwrap();
    assert_eq!(&a.read(3, 2).await.unwrap()[..], &[0x3c; 1024][..], "the caller's device took the write");
    lun0.close().await;
    lun1.close().await;
    target.stop().await;
}

#[tokio::test]
async fn a_configuration_that_breaks_a_rule_is_refused_naming_it() {
    let dev = || -> Arc<dyn BlockDev> { Arc::new(MemDev::new(512, 64)) };
    let refused = |c: ServerConfig, want: &'static str| async move {
        let e = Server::bind(c).await.err().expect("refused").to_string();
        assert!(e.contains(want), "{want}: {e}");
    };
    refused(ServerConfig::new(vec![loopback()], vec![Target::new(IQN, vec![])]), "has no LUNs").await;
    refused(ServerConfig::new(vec![loopback()], vec![Target::new("disk0", vec![dev()])]), "not an iqn").await;
    refused(ServerConfig::new(vec![], vec![Target::new(IQN, vec![dev()])]), "no listen address").await;
    refused(ServerConfig::new(vec![loopback()], vec![]), "no target").await;
    let twice = vec![Target::new(IQN, vec![dev()]), Target::new(IQN.replace("devices", "DEVICES"), vec![dev()])];
    refused(ServerConfig::new(vec![loopback()], twice), "configured twice").await;
    let same = Credentials { user: "u".into(), secret: "same-secret-1".into() };
    let t = Target { chap: Some(same.clone()), mutual_chap: Some(same), ..Target::new(IQN, vec![dev()]) };
    refused(ServerConfig::new(vec![loopback()], vec![t]), "must differ").await;
}

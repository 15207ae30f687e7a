//! A target over devices its caller opened (`Server::bind_devices`): it serves them as the LUNs
//! its configuration names, and refuses a count of devices that differs from those names.

use std::sync::Arc;

use bytes::Bytes;
use stics_block::{BlockDev, MemDev};
use stics_target::{Config, Server, TargetConfig};
use stics_testkit::peers::InProcess;

const IQN: &str = "iqn.2024-01.org.stics.test:devices";

fn config(luns: &[&str]) -> Config {
    Config {
        listen: vec!["127.0.0.1:0".into()],
        targets: vec![TargetConfig {
            iqn: IQN.into(),
            alias: None,
            luns: luns.iter().map(ToString::to_string).collect(),
            chap: None,
            mutual_chap: None,
            initiators: vec![],
        }],
        ..Config::default()
    }
}

#[tokio::test]
async fn devices_opened_by_the_caller_are_served_as_the_named_luns() {
    let a: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 2048));
    let b: Arc<dyn BlockDev> = Arc::new(MemDev::new(4096, 256));
    let server = Server::bind_devices(&config(&["the first", "the second"]), vec![vec![a.clone(), b]]).await.unwrap();
    let target = InProcess::serve(server);
    let ctx = stics_stack::OpenContext::default();
    let url = |lun: u32| format!("iscsi://{}/{IQN}/{lun}", target.addr).parse().unwrap();
    let lun0 = stics_stack::open(&url(0), &ctx).await.unwrap();
    let lun1 = stics_stack::open(&url(1), &ctx).await.unwrap();
    assert_eq!((lun0.geometry().block_size, lun0.geometry().num_blocks), (512, 2048));
    assert_eq!(lun1.geometry().block_size, 4096);
    lun0.write(3, Bytes::from(vec![0x3c; 1024]), true).await.unwrap();
    assert_eq!(&a.read(3, 2).await.unwrap()[..], &[0x3c; 1024][..], "the caller's device took the write");
    ctx.close().await;
    target.stop().await;
}

#[tokio::test]
async fn a_count_of_devices_unlike_the_named_luns_is_refused() {
    let a: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 64));
    let e = Server::bind_devices(&config(&["one", "two"]), vec![vec![a]]).await.err().unwrap().to_string();
    assert!(e.contains("[1]") && e.contains("[2]"), "{e}");
}

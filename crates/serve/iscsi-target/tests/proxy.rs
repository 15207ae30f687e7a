//! A target whose LUN is an `iscsi://` LUN of another target (a proxy): what is written through
//! the proxy lands on the backing target, and the proxy reports the backing LUN's geometry.

use bytes::Bytes;
use stics_target::{Config, Limits, Server, TargetConfig};
use stics_testkit::peers::InProcess;

const BACKING: &str = "iqn.2024-01.org.stics.test:backing";
const PROXY: &str = "iqn.2024-01.org.stics.test:proxy";

fn config(iqn: &str, lun: String) -> Config {
    Config {
        listen: vec!["127.0.0.1:0".into()],
        limits: Limits::default(),
        targets: vec![TargetConfig {
            iqn: iqn.into(),
            alias: None,
            luns: vec![lun],
            chap: None,
            mutual_chap: None,
            initiators: vec![],
        }],
        ..Config::default()
    }
}

#[tokio::test]
async fn a_target_serves_a_lun_of_another_target() {
    let backing_target = InProcess::start(&config(BACKING, "mem:4MiB:4096".into())).await;
    let backing = backing_target.addr;
    let proxy_target = InProcess::start(&config(PROXY, format!("iscsi://{backing}/{BACKING}/0"))).await;
    let proxy = proxy_target.addr;

    let ctx = stics_stack::OpenContext::default();
    let via_proxy = stics_stack::open(&format!("iscsi://{proxy}/{PROXY}/0").parse().unwrap(), &ctx).await.unwrap();
    let g = via_proxy.geometry();
    assert_eq!((g.block_size, g.num_blocks), (4096, 1024));
    via_proxy.write(7, Bytes::from(vec![0x5a; 8192]), true).await.unwrap();

    let direct = stics_stack::open(&format!("iscsi://{backing}/{BACKING}/0").parse().unwrap(), &ctx).await.unwrap();
    assert_eq!(&direct.read(7, 2).await.unwrap()[..], &[0x5a; 8192][..]);
    assert_eq!(&direct.read(9, 1).await.unwrap()[..], &[0; 4096][..]);
    assert_eq!(ctx.remote_luns().len(), 2);
    ctx.close().await;

    proxy_target.stop().await;
    backing_target.stop().await;
}

#[tokio::test]
async fn an_unreachable_backing_target_fails_bind_with_the_lun_named() {
    let c = config(PROXY, "iscsi://127.0.0.1:1/iqn.2024-01.org.x:y/0".into());
    let e = Server::bind(&c).await.err().unwrap().to_string();
    assert!(e.contains(PROXY) && e.contains("LUN 0") && e.contains("127.0.0.1:1"), "{e}");
}

//! A target whose LUN is an `iscsi://` LUN of another target (a proxy): what is written through
//! the proxy lands on the backing target, and the proxy reports the backing LUN's geometry.

use std::time::Duration;

use bytes::Bytes;
use stics_target::{Config, Limits, Server, TargetConfig};
use tokio::sync::oneshot;

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
    }
}

/// Serves `c` until the returned sender is dropped or sent to.
async fn serve(c: Config) -> (std::net::SocketAddr, oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let server = Server::bind(&c).await.unwrap();
    let addr = server.local_addrs()[0];
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        server
            .run(async {
                let _ = rx.await;
            })
            .await
            .unwrap();
    });
    (addr, tx, task)
}

#[tokio::test]
async fn a_target_serves_a_lun_of_another_target() {
    let (backing, stop_backing, backing_task) = serve(config(BACKING, "mem:4MiB:4096".into())).await;
    let (proxy, stop_proxy, proxy_task) = serve(config(PROXY, format!("iscsi://{backing}/{BACKING}/0"))).await;

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

    let _ = stop_proxy.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), proxy_task).await;
    let _ = stop_backing.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), backing_task).await;
}

#[tokio::test]
async fn an_unreachable_backing_target_fails_bind_with_the_lun_named() {
    let c = config(PROXY, "iscsi://127.0.0.1:1/iqn.2024-01.org.x:y/0".into());
    let e = Server::bind(&c).await.err().unwrap().to_string();
    assert!(e.contains(PROXY) && e.contains("LUN 0") && e.contains("127.0.0.1:1"), "{e}");
}

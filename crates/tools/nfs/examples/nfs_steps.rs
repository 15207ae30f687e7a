//! Mounts an export and runs shell steps on it, printing the RPCs each step sent.
//!
//! `nfs_steps SERVER:PORT EXPORT MOUNTPOINT STEP...` where a step is a shell command, `@drop`
//! (drop caches) or `@sleep SECONDS`. Runs in the caller's mount namespace, so the steps see the
//! mount.

use std::process::Command;
use std::time::{Duration, Instant};

use stics_nfs::{Mount, Options};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        return Err("usage: nfs_steps SERVER:PORT EXPORT MOUNTPOINT STEP...".into());
    }
    let size = |k: &str| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let opts = Options {
        server: args[0].parse()?,
        export: args[1].clone(),
        rsize: size("NFS_RSIZE"),
        wsize: size("NFS_WSIZE"),
        ..Options::default()
    };
    let mount = Mount::mount(opts, std::path::Path::new(&args[2]))?;
    for step in &args[3..] {
        mount.reset_counts();
        let t = Instant::now();
        let status = if step == "@drop" {
            mount.drop_caches();
            "ok".to_string()
        } else if let Some(s) = step.strip_prefix("@sleep ") {
            std::thread::sleep(Duration::from_secs_f64(s.parse()?));
            "ok".to_string()
        } else {
            let st = Command::new("sh").arg("-c").arg(step).status()?;
            st.to_string()
        };
        let c = mount.counts();
        let calls: Vec<String> =
            c.by_name().into_iter().filter(|(_, n)| *n > 0).map(|(k, n)| format!("{k}={n}")).collect();
        println!(
            "STEP {step:?} -> {status} in {:.2}s: total={} {} read_bytes={} written_bytes={}",
            t.elapsed().as_secs_f64(),
            c.total(),
            calls.join(" "),
            c.bytes_read,
            c.bytes_written
        );
    }
    mount.unmount()?;
    Ok(())
}

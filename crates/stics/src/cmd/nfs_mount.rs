//! `stics nfs-mount nfs://HOST[:PORT]/EXPORT DIR`: mounts an NFSv3 export on DIR through FUSE
//! with a client that caches as Linux's does by default, and counts its RPCs by procedure (how
//! `stics bench nfs` measures file access beside block access).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};

#[derive(clap::Args)]
pub struct Args {
    /// The export: nfs://HOST[:PORT]/PATH (PORT: the NFS port, 2049 unless given).
    pub url: String,
    /// Directory to mount it on.
    pub dir: PathBuf,
    /// The server's MOUNT protocol port (nfs-ganesha's default).
    #[arg(long, default_value_t = 20048)]
    pub mount_port: u16,
    /// Largest READ in bytes; 0 takes the server's preferred size (at most 1 MiB).
    #[arg(long, default_value_t = 0)]
    pub rsize: u32,
    /// Largest WRITE in bytes; 0 takes the server's preferred size (at most 1 MiB).
    #[arg(long, default_value_t = 0)]
    pub wsize: u32,
    /// Seconds a regular file's attributes are trusted at least (Linux: acregmin=3).
    #[arg(long, default_value_t = 3)]
    pub acregmin: u64,
    /// Seconds a regular file's attributes are trusted at most (Linux: acregmax=60).
    #[arg(long, default_value_t = 60)]
    pub acregmax: u64,
    /// Seconds a directory's attributes are trusted at least (Linux: acdirmin=30).
    #[arg(long, default_value_t = 30)]
    pub acdirmin: u64,
    /// Seconds a directory's attributes are trusted at most (Linux: acdirmax=60).
    #[arg(long, default_value_t = 60)]
    pub acdirmax: u64,
    /// Trust cached attributes at open (Linux: nocto); by default every open asks the server.
    #[arg(long)]
    pub nocto: bool,
    /// Bytes read ahead of a sequential reader.
    #[arg(long, default_value_t = 128 * 1024)]
    pub readahead: u32,
    /// Write the RPC counts by procedure as JSON to FILE whenever the process gets SIGUSR1, and
    /// once more when it stops. SIGUSR2 drops the client's caches (a cold start without a remount),
    /// then writes the counts too.
    #[arg(long, value_name = "FILE")]
    pub counters: Option<PathBuf>,
}

/// `nfs://HOST[:PORT]/PATH` into the server's address and the export's path.
fn parse_url(url: &str) -> anyhow::Result<(std::net::SocketAddr, String)> {
    let Some(rest) = url.strip_prefix("nfs://") else { bail!("{url}: not an nfs:// URL (nfs://HOST[:PORT]/PATH)") };
    let Some(slash) = rest.find('/') else { bail!("{url}: no export path (nfs://HOST[:PORT]/PATH)") };
    let (host, path) = rest.split_at(slash);
    let addr = if host.contains(':') { host.to_owned() } else { format!("{host}:2049") };
    let addr = std::net::ToSocketAddrs::to_socket_addrs(&addr)
        .with_context(|| format!("{url}: cannot resolve {host}"))?
        .next()
        .with_context(|| format!("{url}: {host} has no address"))?;
    Ok((addr, path.to_owned()))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    super::logging::init("info");
    let (server, export) = parse_url(&args.url)?;
    if args.acregmin > args.acregmax || args.acdirmin > args.acdirmax {
        bail!("an attribute cache's minimum is above its maximum");
    }
    let opts = stics_nfs::Options {
        server,
        mount_port: args.mount_port,
        export,
        rsize: args.rsize,
        wsize: args.wsize,
        acregmin: Duration::from_secs(args.acregmin),
        acregmax: Duration::from_secs(args.acregmax),
        acdirmin: Duration::from_secs(args.acdirmin),
        acdirmax: Duration::from_secs(args.acdirmax),
        cto: !args.nocto,
        readahead: args.readahead,
        ..stics_nfs::Options::default()
    };
    let mount = std::sync::Arc::new(
        stics_nfs::Mount::mount(opts, &args.dir)
            .with_context(|| format!("mounting {} on {}", args.url, args.dir.display()))?,
    );
    tracing::info!(url = %args.url, dir = %args.dir.display(), "mounted");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let mut usr1 = signal(SignalKind::user_defined1())?;
        let mut usr2 = signal(SignalKind::user_defined2())?;
        loop {
            tokio::select! {
                _ = term.recv() => return Ok::<(), std::io::Error>(()),
                _ = int.recv() => return Ok(()),
                _ = usr1.recv() => if let Some(path) = &args.counters {
                    if let Err(e) = write_counts(path, &mount.counts()) {
                        tracing::warn!(file = %path.display(), "cannot write the counts: {e}");
                    }
                },
                _ = usr2.recv() => {
                    // The client waits on a runtime of its own, which this one may not block in.
                    let m = std::sync::Arc::clone(&mount);
                    let _ = tokio::task::spawn_blocking(move || m.drop_caches()).await;
                    // Written after the caches are gone: a caller waiting for the file knows.
                    if let Some(path) = &args.counters {
                        if let Err(e) = write_counts(path, &mount.counts()) {
                            tracing::warn!(file = %path.display(), "cannot write the counts: {e}");
                        }
                    }
                }
            }
        }
    })?;
    tracing::info!("signal received: unmounting");
    drop(rt);
    let counts = mount.counts();
    let mount = std::sync::Arc::into_inner(mount).context("the client is still in use")?;
    mount.unmount().with_context(|| format!("unmounting {}", args.dir.display()))?;
    if let Some(path) = &args.counters {
        write_counts(path, &counts)?;
    }
    Ok(())
}

/// The counts as one JSON object (procedure → calls, plus bytes and the total); through a
/// temporary file and a rename, so that a reader never sees half of it.
fn write_counts(path: &std::path::Path, c: &stics_nfs::Counts) -> std::io::Result<()> {
    let mut m = serde_json::Map::new();
    for (name, n) in c.by_name() {
        m.insert(name.to_owned(), n.into());
    }
    m.insert("total".into(), c.total().into());
    m.insert("bytes_read".into(), c.bytes_read.into());
    m.insert("bytes_written".into(), c.bytes_written.into());
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::Value::Object(m).to_string() + "\n")?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_server_and_an_export() {
        let (a, p) = parse_url("nfs://127.0.0.1/export").unwrap();
        assert_eq!((a.to_string().as_str(), p.as_str()), ("127.0.0.1:2049", "/export"));
        let (a, p) = parse_url("nfs://10.1.2.3:2050/a/b").unwrap();
        assert_eq!((a.to_string().as_str(), p.as_str()), ("10.1.2.3:2050", "/a/b"));
        for bad in ["iscsi://127.0.0.1/x", "nfs://127.0.0.1", "nfs://no.such.host.invalid/x"] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }
}

//! A user-space NFSv3 client mounted through FUSE. It caches as the Linux kernel client does
//! with default mount options and counts every RPC it sends by procedure, so that benchmarks
//! can compare the messages a workload costs over NFS with those over iSCSI.
//!
//! The kernel's FUSE layer is told to cache nothing (zero attribute and entry timeouts, direct
//! I/O): every system call reaches this crate, which answers from its own caches or with RPCs.
//! Where it differs from the Linux client: `docs/nfs-client.md`.

#![forbid(unsafe_code)]

mod fs;
mod fuse;
pub mod policy;
mod rpc;

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fuser::MountOption;
use nfs3_client::nfs3_types::nfs3::{fattr3, nfs_fh3, FSINFO3resok, Nfs3Result};
use nfs3_client::nfs3_types::rpc::{auth_unix, opaque_auth};
use nfs3_client::nfs3_types::xdr_codec::Opaque;
use nfs3_client::{Nfs3Connection, Nfs3ConnectionBuilder};

use crate::policy::Bounds;
use crate::rpc::{call, Pool};

/// How to mount. The defaults are the Linux client's defaults for NFSv3 over TCP.
#[derive(Debug, Clone)]
pub struct Options {
    /// The NFS port, e.g. `127.0.0.1:2049`.
    pub server: SocketAddr,
    /// The MOUNT v3 port (nfs-ganesha: 20048).
    pub mount_port: u16,
    /// The exported path, e.g. `/export`.
    pub export: String,
    /// READ size; 0 takes the server's preference (FSINFO rtpref), at most 1 MiB.
    pub rsize: u32,
    /// WRITE size; 0 takes the server's preference (FSINFO wtpref), at most 1 MiB.
    pub wsize: u32,
    pub acregmin: Duration,
    pub acregmax: Duration,
    pub acdirmin: Duration,
    pub acdirmax: Duration,
    /// Close-to-open consistency: GETATTR on every open, write-back and COMMIT on every close.
    pub cto: bool,
    /// Read-ahead window in bytes.
    pub readahead: u32,
    /// AUTH_SYS credentials every RPC carries.
    pub uid: u32,
    pub gid: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            server: SocketAddr::from(([127, 0, 0, 1], 2049)),
            mount_port: 20048,
            export: "/export".into(),
            rsize: 0,
            wsize: 0,
            acregmin: Duration::from_secs(3),
            acregmax: Duration::from_secs(60),
            acdirmin: Duration::from_secs(30),
            acdirmax: Duration::from_secs(60),
            cto: true,
            readahead: 128 << 10,
            uid: 0,
            gid: 0,
        }
    }
}

/// RPCs sent, by NFSv3 procedure, and the payload bytes of READ and WRITE.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    pub null: u64,
    pub getattr: u64,
    pub setattr: u64,
    pub lookup: u64,
    pub access: u64,
    pub readlink: u64,
    pub read: u64,
    pub write: u64,
    pub create: u64,
    pub mkdir: u64,
    pub symlink: u64,
    pub mknod: u64,
    pub remove: u64,
    pub rmdir: u64,
    pub rename: u64,
    pub link: u64,
    pub readdir: u64,
    pub readdirplus: u64,
    pub fsstat: u64,
    pub fsinfo: u64,
    pub pathconf: u64,
    pub commit: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

impl Counts {
    /// All RPCs (the byte counts are not RPCs and are left out).
    pub fn total(&self) -> u64 {
        self.by_name().iter().map(|(_, n)| n).sum()
    }

    /// Every procedure with its count, in procedure-number order, lowercase names.
    pub fn by_name(&self) -> Vec<(&'static str, u64)> {
        let v = [
            self.null,
            self.getattr,
            self.setattr,
            self.lookup,
            self.access,
            self.readlink,
            self.read,
            self.write,
            self.create,
            self.mkdir,
            self.symlink,
            self.mknod,
            self.remove,
            self.rmdir,
            self.rename,
            self.link,
            self.readdir,
            self.readdirplus,
            self.fsstat,
            self.fsinfo,
            self.pathconf,
            self.commit,
        ];
        rpc::PROC_NAMES.iter().copied().zip(v).collect()
    }
}

/// Errors of mounting and unmounting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("cannot start the I/O runtime: {0}")]
    Runtime(#[source] io::Error),
    #[error("cannot mount {export} from {server}: {source}")]
    Connect {
        server: SocketAddr,
        export: String,
        #[source]
        source: nfs3_client::ConnectError,
    },
    /// The server refused or failed a call made while mounting (errno of the failure).
    #[error("{procedure} on the export root failed: {}", io::Error::from_raw_os_error(*.errno))]
    Probe { procedure: &'static str, errno: i32 },
    #[error("cannot mount FUSE at {path}: {source}")]
    Fuse {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Dirty data could not be written or committed before unmounting.
    #[error("write-back before unmount failed: {}", io::Error::from_raw_os_error(*.0))]
    WriteBack(i32),
    #[error("cannot unmount {path}: {source}")]
    Unmount {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

type MountConn = Nfs3Connection<rpc::Io>;

/// How long unmounting waits for the server's answer to UMNT, which only tidies its list of
/// clients: a server that went away meanwhile must not hold the unmount up.
const UMNT_TIMEOUT: Duration = Duration::from_secs(5);

/// A mounted file system; unmounts (writing back dirty data first) when dropped.
pub struct Mount {
    fs: Arc<fs::Shared>,
    rt: Option<tokio::runtime::Runtime>,
    unmounter: fuser::SessionUnmounter,
    thread: Option<std::thread::JoinHandle<io::Result<()>>>,
    conn: Option<MountConn>,
    path: PathBuf,
}

impl std::fmt::Debug for Mount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mount").field("path", &self.path).finish_non_exhaustive()
    }
}

/// What mounting learns from the server before FUSE is mounted.
struct Probe {
    fsinfo: FSINFO3resok,
    namelen: u32,
    root: fattr3,
}

/// The calls the kernel client makes at mount time: FSINFO, PATHCONF, then the root's GETATTR.
async fn probe(pool: &Pool, root: &nfs_fh3) -> Result<Probe, (&'static str, fuser::Errno)> {
    let fsinfo = match call!(pool, Fsinfo, c => c.fsinfo(&root.clone().into())).map_err(|e| ("FSINFO", e))? {
        Nfs3Result::Ok(ok) => ok,
        Nfs3Result::Err((s, _)) => return Err(("FSINFO", rpc::errno(s))),
    };
    let namelen = match call!(pool, Pathconf, c => c.pathconf(&root.clone().into())).map_err(|e| ("PATHCONF", e))? {
        Nfs3Result::Ok(ok) => ok.name_max,
        Nfs3Result::Err(_) => 255,
    };
    let root = match call!(pool, Getattr, c => c.getattr(&root.clone().into())).map_err(|e| ("GETATTR", e))? {
        Nfs3Result::Ok(ok) => ok.obj_attributes,
        Nfs3Result::Err((s, _)) => return Err(("GETATTR", rpc::errno(s))),
    };
    Ok(Probe { fsinfo, namelen, root })
}

/// A transfer size: the one asked for, else the server's preference, never above the server's
/// maximum or 1 MiB, and a whole number of pages.
fn transfer_size(asked: u32, pref: u32, max: u32) -> u32 {
    let want = if asked == 0 { pref } else { asked };
    let cap = if max == 0 { 1 << 20 } else { max.min(1 << 20) };
    let v = want.clamp(1, cap);
    (v / 4096).max(1) * 4096
}

impl Mount {
    /// Mounts `opts.export` on `mountpoint` (an existing directory); returns once the mount
    /// answers system calls.
    #[allow(clippy::self_named_constructors, reason = "mounting is what makes a Mount")]
    pub fn mount(opts: Options, mountpoint: &Path) -> Result<Mount, Error> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("stics-nfs")
            .enable_all()
            .build()
            .map_err(Error::Runtime)?;
        let cred = opaque_auth::auth_unix(&auth_unix {
            stamp: 0,
            machinename: Opaque::owned(b"stics".to_vec()),
            uid: opts.uid,
            gid: opts.gid,
            gids: vec![opts.gid],
        });
        let conn = rt
            .block_on(
                Nfs3ConnectionBuilder::new(rpc::Connector, opts.server.ip().to_string(), &opts.export)
                    .mount_port(opts.mount_port)
                    .nfs3_port(opts.server.port())
                    .connect_from_privileged_port(false)
                    .credential(cred.clone())
                    .mount(),
            )
            .map_err(|source| Error::Connect { server: opts.server, export: opts.export.clone(), source })?;
        let root_fh = conn.root_nfs_fh3();
        let pool = Pool::new(opts.server, cred, 4);
        let p = rt
            .block_on(probe(&pool, &root_fh))
            .map_err(|(procedure, e)| Error::Probe { procedure, errno: e.code() })?;
        let t = fs::Tunables {
            rsize: transfer_size(opts.rsize, p.fsinfo.rtpref, p.fsinfo.rtmax),
            wsize: transfer_size(opts.wsize, p.fsinfo.wtpref, p.fsinfo.wtmax),
            reg: Bounds { min: opts.acregmin, max: opts.acregmax.max(opts.acregmin) },
            dir: Bounds { min: opts.acdirmin, max: opts.acdirmax.max(opts.acdirmin) },
            cto: opts.cto,
            readahead: opts.readahead,
        };
        tracing::debug!(rsize = t.rsize, wsize = t.wsize, "mounted {}", opts.export);
        let shared = Arc::new(fs::Shared::new(pool, root_fh, &p.root, t));
        let nfs = fuse::NfsFs { fs: shared.clone(), rt: rt.handle().clone(), namelen: p.namelen };
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            MountOption::FSName(format!("{}:{}", opts.server.ip(), opts.export)),
            MountOption::Subtype("stics-nfs".into()),
            // No `default_permissions`: with it the kernel sends a GETATTR before every
            // permission check, which the kernel NFS client answers from its ACCESS cache. The
            // server enforces permissions on each call, as it does for the kernel client.
        ];
        config.n_threads = Some(4);
        config.clone_fd = true;
        let fuse_err = |source| Error::Fuse { path: mountpoint.to_owned(), source };
        let mut session = fuser::Session::new(nfs, mountpoint, &config).map_err(fuse_err)?;
        let unmounter = session.unmount_callable();
        let thread =
            std::thread::Builder::new().name("stics-nfs-fuse".into()).spawn(move || session.run()).map_err(fuse_err)?;
        Ok(Mount {
            fs: shared,
            rt: Some(rt),
            unmounter,
            thread: Some(thread),
            conn: Some(conn),
            path: mountpoint.to_owned(),
        })
    }

    /// RPCs sent since mounting (or the last reset), background read-ahead and write-behind
    /// included; MOUNT protocol calls are not NFS calls and are not counted.
    pub fn counts(&self) -> Counts {
        self.fs.pool.counters.snapshot()
    }

    pub fn reset_counts(&self) {
        self.fs.pool.counters.reset();
    }

    /// Writes back dirty data, then forgets cached attributes, lookups, listings and data, so
    /// the next operation starts cold.
    pub fn drop_caches(&self) {
        if let Some(rt) = &self.rt {
            rt.block_on(self.fs.drop_caches());
        }
    }

    /// Writes back and commits dirty data, then unmounts.
    pub fn unmount(mut self) -> Result<(), Error> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), Error> {
        let Some(rt) = self.rt.take() else { return Ok(()) };
        let wb = rt.block_on(self.fs.sync_all());
        if let Err(source) = self.unmounter.unmount() {
            // Still mounted (busy): the session keeps serving, and the runtime must outlive
            // it, so both are handed to a thread that waits for an unmount from outside.
            let (thread, conn) = (self.thread.take(), self.conn.take());
            let reaper = move || {
                if let Some(t) = thread {
                    let _ = t.join();
                }
                if let Some(conn) = conn {
                    let _ = rt.block_on(async { tokio::time::timeout(UMNT_TIMEOUT, conn.unmount()).await });
                }
            };
            if std::thread::Builder::new().name("stics-nfs-reaper".into()).spawn(reaper).is_err() {
                tracing::warn!("cannot start a thread to wait for the busy mount");
            }
            return Err(Error::Unmount { path: self.path.clone(), source });
        }
        if let Some(t) = self.thread.take() {
            if let Ok(Err(e)) = t.join() {
                tracing::debug!(error = %e, "FUSE session ended with an error");
            }
        }
        if let Some(conn) = self.conn.take() {
            if let Ok(Err(e)) = rt.block_on(async { tokio::time::timeout(UMNT_TIMEOUT, conn.unmount()).await }) {
                tracing::debug!(error = %e, "UMNT failed");
            }
        }
        rt.shutdown_timeout(Duration::from_secs(5));
        wb.map_err(|e| Error::WriteBack(e.code()))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!(path = %self.path.display(), error = %e, "unmount failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfer_sizes_take_the_servers_preference_within_one_mebibyte() {
        assert_eq!(transfer_size(0, 1 << 20, 1 << 20), 1 << 20);
        assert_eq!(transfer_size(0, 4 << 20, 4 << 20), 1 << 20);
        assert_eq!(transfer_size(65536, 1 << 20, 1 << 20), 65536);
        assert_eq!(transfer_size(10_000, 1 << 20, 1 << 20), 8192);
        assert_eq!(transfer_size(0, 32768, 0), 32768);
    }

    #[test]
    fn defaults_are_the_linux_clients() {
        let o = Options::default();
        assert_eq!((o.acregmin.as_secs(), o.acregmax.as_secs()), (3, 60));
        assert_eq!((o.acdirmin.as_secs(), o.acdirmax.as_secs()), (30, 60));
        assert!(o.cto);
        assert_eq!(o.readahead, 128 * 1024);
    }
}

//! NFSv3 transport: a small pool of TCP connections (the client library does one call at a
//! time per connection), per-procedure RPC counters and the nfsstat3-to-errno map.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

use fuser::Errno;
use nfs3_client::io::{AsyncRead, AsyncWrite};
use nfs3_client::nfs3_types::nfs3::nfsstat3;
use nfs3_client::nfs3_types::rpc::opaque_auth;
use nfs3_client::Nfs3Client;
use tokio::net::TcpStream;
use tokio::sync::{Mutex, MutexGuard};

use crate::Counts;

pub type Client = Nfs3Client<Io>;

/// How long a call may wait for its reply before the connection is given up (the kernel
/// client's default `timeo=600`, 60 s, after which it retransmits on a new connection).
pub const RPC_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// The pause after a failed connect before the call fails.
const RECONNECT_PAUSE: std::time::Duration = std::time::Duration::from_millis(200);

/// A TCP stream for the RPC client. The client's read loop treats a zero-byte read as
/// progress, so a connection the server closed would spin forever; here it is an error.
pub struct Io(TcpStream);

impl AsyncRead for Io {
    async fn async_read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = tokio::io::AsyncReadExt::read(&mut self.0, buf).await?;
        if n == 0 && !buf.is_empty() {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(n)
    }
}

/// Connects as the MOUNT protocol's client does, through [`Io`], so that its connection too
/// fails rather than spins once the server has gone.
pub struct Connector;

impl nfs3_client::net::Connector for Connector {
    type Connection = Io;

    async fn connect(&self, addr: std::net::SocketAddr) -> std::io::Result<Io> {
        Ok(Io(TcpStream::connect(addr).await?))
    }

    async fn connect_with_port(&self, addr: std::net::SocketAddr, local_port: u16) -> std::io::Result<Io> {
        let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
        let local = if addr.is_ipv4() {
            std::net::SocketAddr::from(([0, 0, 0, 0], local_port))
        } else {
            std::net::SocketAddr::from(([0u16; 8], local_port))
        };
        socket.bind(local)?;
        Ok(Io(socket.connect(addr).await?))
    }
}

impl AsyncWrite for Io {
    async fn async_write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = tokio::io::AsyncWriteExt::write(&mut self.0, buf).await?;
        if n == 0 && !buf.is_empty() {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        Ok(n)
    }
}

/// NFSv3 procedure numbers, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
#[allow(dead_code, reason = "numbered by the protocol; not every procedure is sent")]
pub enum Proc {
    Null = 0,
    Getattr,
    Setattr,
    Lookup,
    Access,
    Readlink,
    Read,
    Write,
    Create,
    Mkdir,
    Symlink,
    Mknod,
    Remove,
    Rmdir,
    Rename,
    Link,
    Readdir,
    Readdirplus,
    Fsstat,
    Fsinfo,
    Pathconf,
    Commit,
}

pub const PROC_NAMES: [&str; 22] = [
    "null",
    "getattr",
    "setattr",
    "lookup",
    "access",
    "readlink",
    "read",
    "write",
    "create",
    "mkdir",
    "symlink",
    "mknod",
    "remove",
    "rmdir",
    "rename",
    "link",
    "readdir",
    "readdirplus",
    "fsstat",
    "fsinfo",
    "pathconf",
    "commit",
];

/// Counters shared by every task that sends RPCs.
#[derive(Debug, Default)]
pub struct Counters {
    calls: [AtomicU64; 22],
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
}

impl Counters {
    pub fn count(&self, p: Proc) {
        self.calls[p as usize].fetch_add(1, Relaxed);
    }

    pub fn snapshot(&self) -> Counts {
        let c: Vec<u64> = self.calls.iter().map(|a| a.load(Relaxed)).collect();
        Counts {
            null: c[0],
            getattr: c[1],
            setattr: c[2],
            lookup: c[3],
            access: c[4],
            readlink: c[5],
            read: c[6],
            write: c[7],
            create: c[8],
            mkdir: c[9],
            symlink: c[10],
            mknod: c[11],
            remove: c[12],
            rmdir: c[13],
            rename: c[14],
            link: c[15],
            readdir: c[16],
            readdirplus: c[17],
            fsstat: c[18],
            fsinfo: c[19],
            pathconf: c[20],
            commit: c[21],
            bytes_read: self.bytes_read.load(Relaxed),
            bytes_written: self.bytes_written.load(Relaxed),
        }
    }

    pub fn reset(&self) {
        for a in &self.calls {
            a.store(0, Relaxed);
        }
        self.bytes_read.store(0, Relaxed);
        self.bytes_written.store(0, Relaxed);
    }
}

/// The errno the kernel client returns for an NFS status (`nfs_stat_to_errno`). The kernel's
/// private codes (EBADHANDLE and up, 521..528) cannot pass through FUSE, which refuses errnos of
/// 512 and above, so those become the nearest public errno.
pub fn errno(stat: nfsstat3) -> Errno {
    use nfsstat3 as S;
    Errno::from_i32(match stat {
        S::NFS3_OK => 0,
        S::NFS3ERR_PERM => libc::EPERM,
        S::NFS3ERR_NOENT => libc::ENOENT,
        S::NFS3ERR_IO => libc::EIO,
        S::NFS3ERR_NXIO => libc::ENXIO,
        S::NFS3ERR_ACCES => libc::EACCES,
        S::NFS3ERR_EXIST => libc::EEXIST,
        S::NFS3ERR_XDEV => libc::EXDEV,
        S::NFS3ERR_NODEV => libc::ENODEV,
        S::NFS3ERR_NOTDIR => libc::ENOTDIR,
        S::NFS3ERR_ISDIR => libc::EISDIR,
        S::NFS3ERR_INVAL => libc::EINVAL,
        S::NFS3ERR_FBIG => libc::EFBIG,
        S::NFS3ERR_NOSPC => libc::ENOSPC,
        S::NFS3ERR_ROFS => libc::EROFS,
        S::NFS3ERR_MLINK => libc::EMLINK,
        S::NFS3ERR_NAMETOOLONG => libc::ENAMETOOLONG,
        S::NFS3ERR_NOTEMPTY => libc::ENOTEMPTY,
        S::NFS3ERR_DQUOT => libc::EDQUOT,
        S::NFS3ERR_STALE => libc::ESTALE,
        S::NFS3ERR_REMOTE => libc::EREMOTE,
        S::NFS3ERR_BADHANDLE => libc::ESTALE,
        S::NFS3ERR_NOT_SYNC | S::NFS3ERR_BAD_COOKIE | S::NFS3ERR_TOOSMALL | S::NFS3ERR_JUKEBOX => libc::EIO,
        S::NFS3ERR_NOTSUPP | S::NFS3ERR_BADTYPE => libc::EOPNOTSUPP,
        S::NFS3ERR_SERVERFAULT => libc::EREMOTEIO,
    })
}

/// Connections to the NFS port. Each carries one call at a time, so a foreground read and the
/// read-ahead or write-behind it started can be on the wire together.
pub struct Pool {
    addr: SocketAddr,
    cred: opaque_auth<'static>,
    slots: Vec<Mutex<Option<Client>>>,
    next: AtomicUsize,
    pub counters: Counters,
}

/// A connection taken from the pool; dropped, it goes back.
pub struct Conn<'a> {
    slot: MutexGuard<'a, Option<Client>>,
}

impl Conn<'_> {
    pub fn client(&mut self) -> &mut Client {
        self.slot.as_mut().expect("a taken connection is always connected")
    }

    /// The transport failed mid-call: the next user of this slot reconnects.
    pub fn poison(&mut self) {
        *self.slot = None;
    }
}

impl Pool {
    pub fn new(addr: SocketAddr, cred: opaque_auth<'static>, size: usize) -> Pool {
        Pool {
            addr,
            cred,
            slots: (0..size.max(1)).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
            counters: Counters::default(),
        }
    }

    /// Takes an idle connection if there is one, else waits for the next in turn; connects it
    /// if it is not connected (first use, or after a transport failure).
    pub async fn take(&self) -> Result<Conn<'_>, Errno> {
        let mut slot = None;
        for s in &self.slots {
            if let Ok(g) = s.try_lock() {
                slot = Some(g);
                break;
            }
        }
        let mut slot = match slot {
            Some(g) => g,
            None => self.slots[self.next.fetch_add(1, Relaxed) % self.slots.len()].lock().await,
        };
        if slot.is_none() {
            let stream = match TcpStream::connect(self.addr).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(addr = %self.addr, error = %e, "cannot connect to the NFS server");
                    // Whoever retries (write-back does, until its data is on the server) does so
                    // at this pace, not in a busy loop while the server is away.
                    tokio::time::sleep(RECONNECT_PAUSE).await;
                    return Err(Errno::EIO);
                }
            };
            let _ = stream.set_nodelay(true);
            *slot = Some(Nfs3Client::new_with_auth(Io(stream), self.cred.clone(), opaque_auth::default()));
        }
        Ok(Conn { slot })
    }
}

/// Sends one RPC on a pooled connection, counting it; transport failures become EIO and drop
/// the connection so that the next call reconnects.
macro_rules! call {
    ($pool:expr, $proc:ident, $c:ident => $call:expr) => {{
        let pool: &$crate::rpc::Pool = &$pool;
        match pool.take().await {
            Err(e) => Err(e),
            Ok(mut conn) => {
                // Counted once it goes out: a call that found no connection sent nothing.
                pool.counters.count($crate::rpc::Proc::$proc);
                let $c = conn.client();
                match tokio::time::timeout($crate::rpc::RPC_TIMEOUT, $call).await {
                    Ok(Ok(r)) => Ok::<_, fuser::Errno>(r),
                    Ok(Err(e)) => {
                        tracing::warn!(proc = stringify!($proc), error = %e, "RPC failed");
                        if !e.is_connection_reusable() {
                            conn.poison();
                        }
                        Err(fuser::Errno::EIO)
                    }
                    Err(_) => {
                        tracing::warn!(proc = stringify!($proc), "RPC timed out");
                        conn.poison();
                        Err(fuser::Errno::EIO)
                    }
                }
            }
        }
    }};
}
pub(crate) use call;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_the_kernel_clients_errnos() {
        assert_eq!(errno(nfsstat3::NFS3ERR_NOENT), Errno::ENOENT);
        assert_eq!(errno(nfsstat3::NFS3ERR_EXIST), Errno::EEXIST);
        assert_eq!(errno(nfsstat3::NFS3ERR_NOTEMPTY), Errno::ENOTEMPTY);
        assert_eq!(errno(nfsstat3::NFS3ERR_STALE), Errno::ESTALE);
        assert_eq!(errno(nfsstat3::NFS3ERR_ACCES), Errno::EACCES);
        assert_eq!(errno(nfsstat3::NFS3ERR_NAMETOOLONG), Errno::ENAMETOOLONG);
    }

    #[test]
    fn counters_name_every_procedure_once() {
        let c = Counters::default();
        c.count(Proc::Commit);
        c.count(Proc::Null);
        let s = c.snapshot();
        assert_eq!((s.commit, s.null, s.total()), (1, 1, 2));
        assert_eq!(s.by_name().len(), 22);
        c.reset();
        assert_eq!(c.snapshot().total(), 0);
    }
}

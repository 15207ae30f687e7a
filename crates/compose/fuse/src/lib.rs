//! Exports any [`BlockDev`] as one regular file through FUSE, so that `mkfs` and
//! `mount -o loop` work on it without a kernel initiator (the gateway reuses this too).
//!
//! The file is opened in direct-I/O mode: every read and write reaches the device, `fsync`
//! becomes [`BlockDev::flush`] (SYNCHRONIZE CACHE on a remote LUN), `fallocate` hole punching
//! and zeroing become [`BlockDev::discard`] and [`BlockDev::write_zeros`], and requests are
//! handled as tokio tasks, so that the kernel's concurrent requests are in flight together.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, INodeNo, InitFlags, KernelConfig, LockOwner, MountOption,
    OpenFlags, ReplyAttr, ReplyData, ReplyEmpty, ReplyOpen, ReplyWrite, Request, WriteFlags,
};
use stics_block::range::{read_at, write_at, zero_at};
use stics_block::{BlockDev, BlockError};
use tokio::runtime::Handle;
use tokio::sync::RwLock;

/// Errors of the export.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// The mount point must be an existing regular file.
    #[error("{0}: mount point must be an existing regular file")]
    NotAFile(PathBuf),
    /// Mounting failed (no /dev/fuse, no permission, fusermount3 missing).
    #[error("cannot mount FUSE file at {path}: {source}")]
    Mount {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// How to export.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// Threads reading requests from /dev/fuse (handling itself is asynchronous).
    pub threads: usize,
    /// Refuse writes.
    pub read_only: bool,
    /// Name shown as the mount source in /proc/mounts.
    pub fsname: String,
}

impl Default for ExportOptions {
    fn default() -> Self {
        ExportOptions { threads: 2, read_only: false, fsname: "stics".into() }
    }
}

/// Request counts of an export.
#[derive(Debug, Default)]
pub struct ExportStats {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    /// Writes that did not cover whole blocks and needed a read first.
    pub read_modify_writes: AtomicU64,
    pub flushes: AtomicU64,
    /// fallocate calls that zeroed or punched a range.
    pub zeroings: AtomicU64,
    pub errors: AtomicU64,
}

struct BlockFile {
    dev: Arc<dyn BlockDev>,
    rt: Handle,
    size: u64,
    block_size: u64,
    read_only: bool,
    started: SystemTime,
    uid: u32,
    gid: u32,
    /// Whole-block writes share this lock; read-modify-writes of partial blocks take it alone,
    /// so that a concurrent write can never be undone by a stale read-modify-write.
    rmw: Arc<RwLock<()>>,
    stats: Arc<ExportStats>,
}

const TTL: Duration = Duration::from_secs(1);

/// The errno a file says for a device's error: a full or write-protected device as a full or
/// read-only file system (the reverse of what a file LUN reads them as), anything else as EIO.
fn errno(e: &BlockError) -> Errno {
    match e {
        BlockError::OutOfRange { .. } => Errno::EINVAL,
        BlockError::Unsupported(_) => Errno::EOPNOTSUPP,
        BlockError::NoSpace(_) => Errno::ENOSPC,
        BlockError::WriteProtected(_) => Errno::EROFS,
        _ => Errno::EIO,
    }
}

impl BlockFile {
    fn attr(&self) -> FileAttr {
        FileAttr {
            ino: INodeNo::ROOT,
            size: self.size,
            blocks: self.size.div_ceil(512),
            atime: self.started,
            mtime: self.started,
            ctime: self.started,
            crtime: self.started,
            kind: FileType::RegularFile,
            perm: if self.read_only { 0o444 } else { 0o644 },
            nlink: 1,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: self.block_size as u32,
            flags: 0,
        }
    }
}

/// What an fallocate(2) call asks of a file that is a whole device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fallocate {
    /// Every byte of the device already has backing: allocating is a no-op.
    Nothing,
    /// The range must read as zeros afterwards; `punch` allows deallocating it.
    Zero { off: u64, len: u64, punch: bool },
}

/// Checks an fallocate request against a file of `size` bytes that cannot grow.
fn fallocate_op(mode: i32, off: u64, len: u64, size: u64) -> Result<Fallocate, Errno> {
    let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
    let end = off.checked_add(len).ok_or(Errno::EFBIG)?;
    if len == 0 {
        return Err(Errno::EINVAL);
    }
    // A range past the end would grow the file, which a device cannot; with KEEP_SIZE the part
    // past the end has nothing to do.
    if end > size && !keep {
        return Err(Errno::EFBIG);
    }
    let clipped = |punch| {
        if off >= size {
            Fallocate::Nothing
        } else {
            Fallocate::Zero { off, len: end.min(size) - off, punch }
        }
    };
    match mode & !libc::FALLOC_FL_KEEP_SIZE {
        0 => Ok(Fallocate::Nothing),
        libc::FALLOC_FL_PUNCH_HOLE if keep => Ok(clipped(true)),
        libc::FALLOC_FL_ZERO_RANGE => Ok(clipped(false)),
        libc::FALLOC_FL_PUNCH_HOLE => Err(Errno::EINVAL),
        _ => Err(Errno::EOPNOTSUPP),
    }
}

impl fuser::Filesystem for BlockFile {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        let _ = config.set_max_background(128);
        let _ = config.set_congestion_threshold(96);
        // Lets asynchronous direct I/O (loop devices with direct-io, io_uring, aio) overlap.
        let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO);
        Ok(())
    }

    fn lookup(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: fuser::ReplyEntry) {
        reply.error(Errno::ENOTDIR);
    }

    fn getattr(&self, _req: &Request, _ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        reply.attr(&TTL, &self.attr());
    }

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // The file is the device: its size cannot change. Times and modes are not kept.
        match size {
            Some(s) if s != self.size => reply.error(Errno::EINVAL),
            _ => reply.attr(&TTL, &self.attr()),
        }
    }

    fn open(&self, _req: &Request, _ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let acc = flags.0 & libc::O_ACCMODE;
        if self.read_only && acc != libc::O_RDONLY {
            reply.error(Errno::EROFS);
            return;
        }
        let sync = flags.0 & (libc::O_SYNC | libc::O_DSYNC) != 0;
        reply.opened(
            FileHandle(u64::from(sync)),
            FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES,
        );
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if offset >= self.size {
            reply.data(&[]);
            return;
        }
        let len = (u64::from(size)).min(self.size - offset) as usize;
        let dev = self.dev.clone();
        let stats = self.stats.clone();
        self.rt.spawn(async move {
            stats.reads.fetch_add(1, Relaxed);
            match read_at(&*dev, offset, len).await {
                Ok(b) => reply.data(&b),
                Err(e) => {
                    stats.errors.fetch_add(1, Relaxed);
                    tracing::warn!(offset, len, error = %e, "read failed");
                    reply.error(errno(&e));
                }
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if self.read_only {
            reply.error(Errno::EROFS);
            return;
        }
        if offset >= self.size {
            reply.error(Errno::ENOSPC);
            return;
        }
        let len = (data.len() as u64).min(self.size - offset) as usize;
        let buf = Bytes::copy_from_slice(&data[..len]);
        let (dev, lock, stats) = (self.dev.clone(), self.rmw.clone(), self.stats.clone());
        let fua = fh.0 == 1;
        self.rt.spawn(async move {
            stats.writes.fetch_add(1, Relaxed);
            match write_at(&*dev, &lock, offset, buf, fua).await {
                Ok(rmw) => {
                    if rmw {
                        stats.read_modify_writes.fetch_add(1, Relaxed);
                    }
                    reply.written(len as u32);
                }
                Err(e) => {
                    stats.errors.fetch_add(1, Relaxed);
                    tracing::warn!(offset, len, error = %e, "write failed");
                    reply.error(errno(&e));
                }
            }
        });
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        // close(): direct I/O leaves nothing buffered here; durability is fsync's job.
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let (dev, stats) = (self.dev.clone(), self.stats.clone());
        self.rt.spawn(async move {
            stats.flushes.fetch_add(1, Relaxed);
            match dev.flush().await {
                Ok(()) => reply.ok(),
                Err(e) => {
                    stats.errors.fetch_add(1, Relaxed);
                    tracing::warn!(error = %e, "flush failed");
                    reply.error(errno(&e));
                }
            }
        });
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let op = match fallocate_op(mode, offset, length, self.size) {
            Ok(op) => op,
            Err(e) => {
                reply.error(e);
                return;
            }
        };
        if self.read_only && !matches!(op, Fallocate::Nothing) {
            reply.error(Errno::EROFS);
            return;
        }
        let (dev, lock, stats) = (self.dev.clone(), self.rmw.clone(), self.stats.clone());
        self.rt.spawn(async move {
            let r = match op {
                Fallocate::Nothing => Ok(()),
                Fallocate::Zero { off, len, punch } => {
                    stats.zeroings.fetch_add(1, Relaxed);
                    zero_at(&*dev, &lock, off, len, punch).await
                }
            };
            match r {
                Ok(()) => reply.ok(),
                Err(e) => {
                    stats.errors.fetch_add(1, Relaxed);
                    tracing::warn!(offset, length, mode, error = %e, "fallocate failed");
                    reply.error(errno(&e));
                }
            }
        });
    }

    fn getxattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, _size: u32, reply: fuser::ReplyXattr) {
        reply.error(Errno::ENOTSUP);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        if size == 0 {
            reply.size(0);
        } else {
            reply.data(&[]);
        }
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    #[allow(clippy::too_many_arguments)]
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        // Block-device ioctls (BLKGETSIZE64 and friends) do not apply to a regular file.
        reply.error(Errno::ENOTTY);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: fuser::ReplyStatfs) {
        reply.statfs(0, 0, 0, 1, 0, self.block_size as u32, 255, self.block_size as u32);
    }
}

/// A mounted export.
pub struct Mounted {
    path: PathBuf,
    unmounter: fuser::SessionUnmounter,
    thread: Option<std::thread::JoinHandle<io::Result<()>>>,
    stats: Arc<ExportStats>,
}

impl std::fmt::Debug for Mounted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mounted").field("path", &self.path).finish_non_exhaustive()
    }
}

/// Mounts `dev` over the regular file `file`. Requests run on `rt`.
pub fn mount(dev: Arc<dyn BlockDev>, rt: Handle, file: &Path, opts: &ExportOptions) -> Result<Mounted, ExportError> {
    let meta = std::fs::metadata(file).map_err(|source| ExportError::Mount { path: file.to_owned(), source })?;
    if !meta.is_file() {
        return Err(ExportError::NotAFile(file.to_owned()));
    }
    let g = dev.geometry();
    let stats = Arc::new(ExportStats::default());
    // SAFETY: geteuid and getegid have no preconditions and cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let fs = BlockFile {
        dev,
        rt,
        size: g.bytes(),
        block_size: u64::from(g.block_size),
        read_only: opts.read_only,
        started: SystemTime::now(),
        uid,
        gid,
        rmw: Arc::new(RwLock::new(())),
        stats: stats.clone(),
    };
    let mut config = fuser::Config::default();
    config.mount_options = vec![MountOption::FSName(opts.fsname.clone()), MountOption::Subtype("stics".into())];
    if opts.read_only {
        config.mount_options.push(MountOption::RO);
    }
    config.n_threads = Some(opts.threads.max(1));
    config.clone_fd = opts.threads > 1;
    let mut session = fuser::Session::new(fs, file, &config)
        .map_err(|source| ExportError::Mount { path: file.to_owned(), source })?;
    let unmounter = session.unmount_callable();
    let thread = std::thread::Builder::new()
        .name("stics-fuse".into())
        .spawn(move || session.run())
        .map_err(|source| ExportError::Mount { path: file.to_owned(), source })?;
    Ok(Mounted { path: file.to_owned(), unmounter, thread: Some(thread), stats })
}

impl Mounted {
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn stats(&self) -> &ExportStats {
        &self.stats
    }

    /// True once the export stopped (unmounted from outside, or after [`Mounted::unmount`]).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(std::thread::JoinHandle::is_finished)
    }

    /// Unmounts; when the file is busy (a loop device still holds it), detaches it lazily so
    /// that it goes away as soon as the last user lets go.
    pub fn unmount(&mut self) -> io::Result<()> {
        match self.unmounter.unmount() {
            Ok(()) => Ok(()),
            Err(e) => {
                let c = std::ffi::CString::new(self.path.as_os_str().as_bytes()).map_err(io::Error::other)?;
                // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
                let r = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
                if r == 0 {
                    tracing::warn!(path = %self.path.display(), error = %e, "export busy: detached lazily");
                    Ok(())
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Waits for the request loop to end.
    pub fn join(mut self) -> io::Result<()> {
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| io::Error::other("FUSE request loop panicked"))?,
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_or_write_protected_device_reads_as_a_full_or_read_only_file_system() {
        assert_eq!(errno(&BlockError::NoSpace("pool full".into())), Errno::ENOSPC);
        assert_eq!(errno(&BlockError::WriteProtected("snapshot".into())), Errno::EROFS);
        let io = BlockError::Io { lba: 1, source: io::Error::other("medium") };
        assert_eq!(errno(&io), Errno::EIO);
        assert_eq!(errno(&BlockError::Busy("resetting".into())), Errno::EIO);
    }

    #[test]
    fn fallocate_modes_map_to_device_operations() {
        use libc::{FALLOC_FL_COLLAPSE_RANGE as COLLAPSE, FALLOC_FL_KEEP_SIZE as KEEP};
        use libc::{FALLOC_FL_PUNCH_HOLE as PUNCH, FALLOC_FL_ZERO_RANGE as ZERO};
        let size = 1 << 20;
        assert_eq!(fallocate_op(0, 0, size, size), Ok(Fallocate::Nothing));
        assert_eq!(fallocate_op(0, 0, size + 1, size), Err(Errno::EFBIG));
        assert_eq!(fallocate_op(KEEP, 0, size + 1, size), Ok(Fallocate::Nothing));
        assert_eq!(fallocate_op(PUNCH | KEEP, 10, 20, size), Ok(Fallocate::Zero { off: 10, len: 20, punch: true }));
        assert_eq!(fallocate_op(PUNCH, 10, 20, size), Err(Errno::EINVAL));
        assert_eq!(fallocate_op(ZERO, 10, 20, size), Ok(Fallocate::Zero { off: 10, len: 20, punch: false }));
        assert_eq!(fallocate_op(ZERO, size - 4, 8, size), Err(Errno::EFBIG));
        assert_eq!(
            fallocate_op(ZERO | KEEP, size - 4, 8, size),
            Ok(Fallocate::Zero { off: size - 4, len: 4, punch: false })
        );
        assert_eq!(fallocate_op(PUNCH | KEEP, size, 8, size), Ok(Fallocate::Nothing));
        assert_eq!(fallocate_op(COLLAPSE, 0, 4096, size), Err(Errno::EOPNOTSUPP));
        assert_eq!(fallocate_op(ZERO, 0, 0, size), Err(Errno::EINVAL));
        assert_eq!(fallocate_op(ZERO, u64::MAX, 2, size), Err(Errno::EFBIG));
    }
}

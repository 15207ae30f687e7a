//! A device backed by a regular file or a block-device node.
//!
//! Reads and buffered writes run inline on the calling task: they hit the page cache and take
//! microseconds, less than a hand-off to a thread pool would. Syncs (`flush`, FUA writes) go to
//! tokio's blocking pool because they wait for the medium.
//!
//! [`FileDev::open_exclusive`] opens a file for one writer: it takes an exclusive `flock` on the
//! open file (and opens a block-device node with `O_EXCL`), so a second exclusive open, in this
//! process or another, is refused with [`InUse`], which names the holder from `/proc/locks`.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};

use crate::{blocks_in, BlockDev, BlockError, Geometry, Provisioning};

/// A file LUN. Writes land in the page cache (a volatile cache: WCE=1) until flushed.
pub struct FileDev {
    file: Arc<File>,
    path: PathBuf,
    geometry: Geometry,
    is_regular: bool,
}

impl FileDev {
    /// Opens `path`, creating a sparse file of `size` bytes if it does not exist. An existing
    /// file keeps its size unless `size` is larger, in which case it grows.
    pub fn open(path: &Path, size: Option<u64>, block_size: u32) -> io::Result<Self> {
        let file = OpenOptions::new().read(true).write(true).create(size.is_some()).truncate(false).open(path)?;
        FileDev::with_file(file, path, size, block_size)
    }

    /// [`FileDev::open`] for this open alone, for as long as the device lives: an exclusive
    /// `flock` on the open file is taken before the file is sized or read, and a block-device
    /// node is opened with `O_EXCL` besides. Another exclusive open of the same file, by another
    /// process or by this one, is refused with [`LockError::InUse`] until this device (every
    /// clone of its descriptor) is dropped; the kernel drops the lock with the process, so a
    /// killed holder leaves none behind. Plain [`FileDev::open`]s are not kept out: the lock is
    /// advisory.
    pub fn open_exclusive(path: &Path, size: Option<u64>, block_size: u32) -> Result<Self, LockError> {
        let node = std::fs::metadata(path).ok();
        let is_block_device = node.as_ref().is_some_and(|m| m.file_type().is_block_device());
        let mut options = OpenOptions::new();
        options.read(true).write(true).truncate(false);
        if is_block_device {
            // Without O_CREAT, O_EXCL on a block device asks the kernel for it alone: refused with
            // EBUSY while it is mounted or another exclusive opener (a device mapper, a RAID, a
            // second stics through another node of the same device) holds it.
            options.custom_flags(libc::O_EXCL);
        } else {
            options.create(size.is_some());
        }
        let file = match options.open(path) {
            Ok(file) => file,
            Err(e) if is_block_device && e.raw_os_error() == Some(libc::EBUSY) => {
                let holder = node.and_then(|m| flock_holder(m.dev(), m.ino()));
                return Err(InUse { path: path.to_owned(), holder, device_busy: true }.into());
            }
            Err(e) => return Err(e.into()),
        };
        loop {
            // SAFETY: flock on a descriptor we own; it changes no memory.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                break;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => {}
                Some(libc::EWOULDBLOCK) => {
                    let meta = file.metadata()?;
                    let holder = flock_holder(meta.dev(), meta.ino());
                    return Err(InUse { path: path.to_owned(), holder, device_busy: false }.into());
                }
                _ => return Err(e.into()),
            }
        }
        Ok(FileDev::with_file(file, path, size, block_size)?)
    }

    /// A device over `file`, opened from `path`, grown to `size` when that is larger.
    fn with_file(file: File, path: &Path, size: Option<u64>, block_size: u32) -> io::Result<Self> {
        let meta = file.metadata()?;
        let is_regular = meta.file_type().is_file();
        let mut len = if meta.file_type().is_block_device() { block_device_size(&file)? } else { meta.len() };
        if let Some(want) = size {
            if is_regular && want > len {
                file.set_len(want)?;
                len = want;
            }
        }
        let num_blocks = len / u64::from(block_size);
        if num_blocks == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} holds less than one {block_size}-byte block; give a size (file:PATH:SIZE)", path.display()),
            ));
        }
        Ok(FileDev {
            file: Arc::new(file),
            path: path.to_owned(),
            geometry: Geometry { block_size, num_blocks },
            is_regular,
        })
    }

    /// Allocates every block of a regular file now, so that later writes inside it cannot fail
    /// for want of space (a cache's log must not discover a full file system in the middle of
    /// a commit). Fails with [`io::ErrorKind::StorageFull`] and the sizes involved when the file
    /// system cannot hold it; a block-device node has nothing to allocate.
    pub fn reserve(&self) -> io::Result<()> {
        if !self.is_regular {
            return Ok(());
        }
        let len = self.geometry.num_blocks * u64::from(self.geometry.block_size);
        let meta = self.file.metadata()?;
        let missing = len.saturating_sub(std::os::unix::fs::MetadataExt::blocks(&meta) * 512);
        if missing == 0 {
            return Ok(());
        }
        let fd = self.file.as_raw_fd();
        // Checked first so that a request far beyond the free space fails at once, instead of
        // filling the file system before fallocate gives up.
        if let Some(free) = free_bytes(fd) {
            if free < missing {
                return Err(no_space(&self.path, len, missing, free));
            }
        }
        // SAFETY: fallocate on a descriptor we own, inside the file's length (mode 0 never
        // shrinks and, within the length, never grows it).
        let rc = unsafe { libc::fallocate(fd, 0, 0, len as i64) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            // The file system allocates on write (tmpfs before 2.6.x, some FUSE and CoW file
            // systems): nothing more can be promised than the free-space check above.
            Some(libc::EOPNOTSUPP) => Ok(()),
            Some(libc::ENOSPC) => Err(no_space(&self.path, len, missing, 0)),
            _ => Err(err),
        }
    }

    /// Writes zeros over the whole of a regular file that holds nothing yet (call it right
    /// after [`FileDev::reserve`] on a file this process created), and syncs them.
    ///
    /// fallocate leaves its extents *unwritten*: the first write into one converts it, a
    /// metadata change that a synchronous write must wait for as a journal commit (on ext4 here
    /// 358 µs against 239 µs per 4 KiB `O_DSYNC` write). A log is all converted only once it has
    /// gone round once, so without this every write of its first round pays; with it, they only
    /// overwrite. Unwritten blocks read as zeros, so the file's contents do not change.
    /// Blocking: it writes the whole file once (0.2 s for 512 MiB on this SSD).
    pub fn prefill(&self) -> io::Result<()> {
        if !self.is_regular {
            return Ok(());
        }
        const CHUNK: usize = 1 << 20;
        // Writeback is started every so often so that the dirty page cache stays bounded; the
        // sync at the end writes the rest.
        const KICK: u64 = 64 << 20;
        let len = self.geometry.num_blocks * u64::from(self.geometry.block_size);
        let zeros = vec![0u8; CHUNK];
        let fd = self.file.as_raw_fd();
        let mut off = 0u64;
        let mut kicked = 0u64;
        while off < len {
            let n = usize::try_from((len - off).min(CHUNK as u64)).unwrap_or(CHUNK);
            self.file.write_all_at(&zeros[..n], off)?;
            off += n as u64;
            if off - kicked >= KICK {
                // SAFETY: sync_file_range on a descriptor we own, over a range inside the file.
                let _ = unsafe {
                    libc::sync_file_range(fd, kicked as i64, (off - kicked) as i64, libc::SYNC_FILE_RANGE_WRITE)
                };
                kicked = off;
            }
        }
        self.file.sync_data()?;
        // The zeros are on disk; keeping them in the page cache would only push out useful pages.
        // SAFETY: posix_fadvise on a descriptor we own; advice only, no memory is touched.
        let _ = unsafe { libc::posix_fadvise(fd, 0, len as i64, libc::POSIX_FADV_DONTNEED) };
        Ok(())
    }

    /// The path this device was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    #[expect(clippy::unused_self, reason = "reads as part of the device's I/O path: self.io_err(lba)")]
    fn io_err(&self, lba: u64) -> impl FnOnce(io::Error) -> BlockError {
        move |source| match source.raw_os_error() {
            // A full file system is a full thin LUN to whoever writes to it.
            Some(libc::ENOSPC | libc::EDQUOT) => BlockError::NoSpace(format!("block {lba}: {source}")),
            Some(libc::EROFS) => BlockError::WriteProtected(format!("block {lba}: {source}")),
            _ => BlockError::Io { lba, source },
        }
    }

    async fn sync(&self, lba: u64) -> Result<(), BlockError> {
        let file = Arc::clone(&self.file);
        tokio::task::spawn_blocking(move || file.sync_data())
            .await
            .map_err(|e| BlockError::Io { lba, source: io::Error::other(e) })?
            .map_err(self.io_err(lba))
    }
}

/// Why [`FileDev::open_exclusive`] failed.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another exclusive open holds the file.
    #[error(transparent)]
    InUse(#[from] InUse),
    /// The file could not be opened, sized or locked (the error does not name the path).
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// A file (or block device) that another exclusive open holds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct InUse {
    /// The path it was to be opened from.
    pub path: PathBuf,
    /// Who holds it, when `/proc/locks` says.
    pub holder: Option<Holder>,
    /// True when the kernel refused to open a block device exclusively (it is mounted, or
    /// another program holds it), false when another open holds the file's lock.
    pub device_busy: bool,
}

impl fmt::Display for InUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} is in use", self.path.display())?;
        match (&self.holder, self.device_busy) {
            (Some(h), false) => write!(f, " by {h}"),
            (None, false) => f.write_str(" by another process, which /proc/locks does not name"),
            (Some(h), true) => write!(f, " by {h}, which has the block device open exclusively"),
            (None, true) => f.write_str(
                ": the kernel refuses to open the block device exclusively while it is mounted or another \
                 program holds it (lsblk and fuser -v name them)",
            ),
        }
    }
}

/// The process holding a file's lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    /// Its command line, arguments joined by spaces and cut at 200 characters; None when /proc
    /// does not show it.
    pub command: Option<String>,
}

impl Holder {
    /// The holder `pid`, with its command line from /proc.
    fn of(pid: u32) -> Holder {
        Holder { pid, command: command_line(pid) }
    }

    /// True when it is the calling process: another device here opened the file first.
    pub fn is_this_process(&self) -> bool {
        self.pid == std::process::id()
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let this = if self.is_this_process() { "this process, " } else { "process " };
        match &self.command {
            Some(c) => write!(f, "{this}{} ({c})", self.pid),
            None => write!(f, "{this}{}", self.pid),
        }
    }
}

/// Who holds an exclusive flock on inode `ino` of the file system `dev`, from /proc/locks.
fn flock_holder(dev: u64, ino: u64) -> Option<Holder> {
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let pid = flock_holder_pid(&locks, u64::from(libc::major(dev)), u64::from(libc::minor(dev)), ino)?;
    Some(Holder::of(pid))
}

/// The PID on the line of `locks` (the text of /proc/locks) that holds an exclusive flock on
/// inode `ino` of device `major:minor`. Lines read `1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0
/// EOF`, the device in hex; a waiter's line has `->` after the number. Where stat reports another
/// device than the lock's (overlayfs, btrfs subvolumes), the one holder of that inode number on
/// any device is taken, if there is just one.
fn flock_holder_pid(locks: &str, major: u64, minor: u64, ino: u64) -> Option<u32> {
    let mut same_inode = Vec::new();
    for line in locks.lines() {
        let fields: Vec<&str> = line.split_whitespace().skip(1).collect();
        let [kind, _, access, pid, id, ..] = fields[..] else { continue };
        if kind != "FLOCK" || access != "WRITE" {
            continue;
        }
        let Ok(pid) = pid.parse::<u32>() else { continue };
        let mut id = id.split(':');
        let (Some(maj), Some(min), Some(i)) = (id.next(), id.next(), id.next()) else { continue };
        let (Ok(maj), Ok(min), Ok(i)) = (u64::from_str_radix(maj, 16), u64::from_str_radix(min, 16), i.parse::<u64>())
        else {
            continue;
        };
        if pid == 0 || i != ino {
            continue;
        }
        if (maj, min) == (major, minor) {
            return Some(pid);
        }
        if !same_inode.contains(&pid) {
            same_inode.push(pid);
        }
    }
    match same_inode[..] {
        [pid] => Some(pid),
        _ => None,
    }
}

/// The command line of process `pid`, arguments joined by spaces and cut at 200 characters.
fn command_line(pid: u32) -> Option<String> {
    const MAX: usize = 200;
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let words: Vec<_> = raw.split(|&b| b == 0).filter(|w| !w.is_empty()).map(String::from_utf8_lossy).collect();
    if words.is_empty() {
        return None;
    }
    let line = words.join(" ");
    Some(match line.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line,
    })
}

/// Bytes an unprivileged writer may still allocate on the file system holding `fd`.
#[allow(clippy::useless_conversion, reason = "statvfs field widths differ between targets")]
fn free_bytes(fd: std::os::unix::io::RawFd) -> Option<u64> {
    // SAFETY: fstatvfs on a descriptor the caller owns, writing into a zeroed struct it fills.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstatvfs(fd, &raw mut st) } != 0 {
        return None;
    }
    Some(u64::from(st.f_bavail).saturating_mul(u64::from(st.f_frsize)))
}

fn no_space(path: &Path, len: u64, missing: u64, free: u64) -> io::Error {
    let mib = |n: u64| n.div_ceil(1 << 20);
    let free = if free > 0 { format!("; {} MiB are free", mib(free)) } else { String::new() };
    io::Error::new(
        io::ErrorKind::StorageFull,
        format!(
            "the file system holding {} has no room for it: {} MiB of its {} MiB are still to be allocated{free}",
            path.display(),
            mib(missing),
            mib(len)
        ),
    )
}

fn block_device_size(file: &File) -> io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let mut f = file;
    let end = f.seek(SeekFrom::End(0))?;
    f.seek(SeekFrom::Start(0))?;
    Ok(end)
}

#[async_trait]
impl BlockDev for FileDev {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn volatile_cache(&self) -> bool {
        true
    }

    fn supports_discard(&self) -> bool {
        self.is_regular
    }

    async fn read(&self, lba: u64, blocks: u32) -> Result<Bytes, BlockError> {
        self.geometry.check_range(lba, u64::from(blocks))?;
        let len = blocks as usize * self.geometry.block_size as usize;
        let start = lba * u64::from(self.geometry.block_size);
        // Read straight into uninitialised capacity: zero-filling a buffer that pread overwrites
        // anyway costs a measurable share of CPU on large reads.
        let mut buf = BytesMut::with_capacity(len);
        while buf.len() < len {
            let done = buf.len();
            let spare = buf.spare_capacity_mut();
            let want = (len - done).min(spare.len());
            let at = libc::off_t::try_from(start + done as u64).map_err(|_| BlockError::OutOfRange {
                lba,
                blocks: u64::from(blocks),
                num_blocks: self.geometry.num_blocks,
            })?;
            // SAFETY: `spare` is writable memory owned by `buf`, at least `want` bytes long;
            // pread writes at most `want` bytes into it and returns how many it wrote.
            let n = unsafe { libc::pread(self.file.as_raw_fd(), spare.as_mut_ptr().cast(), want, at) };
            match n {
                n if n > 0 => {
                    // SAFETY: pread initialised the `n` bytes that follow the current length.
                    unsafe { buf.set_len(done + n as usize) };
                }
                0 => return Err(self.io_err(lba)(io::ErrorKind::UnexpectedEof.into())),
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(self.io_err(lba)(e));
                    }
                }
            }
        }
        Ok(buf.freeze())
    }

    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> Result<(), BlockError> {
        let blocks = blocks_in(&data, self.geometry.block_size)?;
        self.geometry.check_range(lba, blocks)?;
        self.file.write_all_at(&data, lba * u64::from(self.geometry.block_size)).map_err(self.io_err(lba))?;
        if fua {
            self.sync(lba).await?;
        }
        Ok(())
    }

    async fn flush(&self) -> Result<(), BlockError> {
        self.sync(0).await
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        self.geometry.check_range(lba, blocks)?;
        if !self.is_regular {
            return Err(BlockError::Unsupported("discard on a block device node"));
        }
        let bs = i64::from(self.geometry.block_size);
        // SAFETY: fallocate on a file descriptor we own; the range was checked above.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                lba as i64 * bs,
                blocks as i64 * bs,
            )
        };
        if rc != 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EOPNOTSUPP) {
                // The file system cannot punch holes: write zeros so reads still return zeros.
                return self.write_zeros(lba, blocks).await;
            }
            return Err(BlockError::Io { lba, source: err });
        }
        Ok(())
    }

    async fn provisioning(&self, lba: u64) -> Result<(Provisioning, u64), BlockError> {
        self.geometry.check_range(lba, 1)?;
        let bs = u64::from(self.geometry.block_size);
        let end = self.geometry.num_blocks;
        if !self.is_regular {
            return Ok((Provisioning::Mapped, end - lba));
        }
        let fd = self.file.as_raw_fd();
        let pos = (lba * bs) as i64;
        // SAFETY: lseek on a descriptor we own; it only moves the shared offset, which no other
        // code path uses (all I/O is positional).
        let data = unsafe { libc::lseek(fd, pos, libc::SEEK_DATA) };
        if data < 0 {
            // ENXIO: no data at or after pos, the rest is a hole.
            return Ok((Provisioning::Deallocated, end - lba));
        }
        if data > pos {
            let upto = (data as u64 / bs).clamp(lba + 1, end);
            return Ok((Provisioning::Deallocated, upto - lba));
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, pos, libc::SEEK_HOLE) };
        let upto = if hole < 0 { end } else { (hole as u64).div_ceil(bs).clamp(lba + 1, end) };
        Ok((Provisioning::Mapped, upto - lba))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn creates_sparse_file_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("lun.img");
        let d = FileDev::open(&p, Some(1 << 20), 512).unwrap();
        assert_eq!(d.geometry().num_blocks, 2048);
        d.write(3, Bytes::from(vec![0xabu8; 1024]), true).await.unwrap();
        assert_eq!(&d.read(3, 2).await.unwrap()[..], &[0xabu8; 1024][..]);
        d.flush().await.unwrap();
        drop(d);
        let d = FileDev::open(&p, None, 512).unwrap();
        assert_eq!(d.read(4, 1).await.unwrap()[0], 0xab);
    }

    #[tokio::test]
    async fn discard_punches_a_hole() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("lun.img");
        let d = FileDev::open(&p, Some(4 << 20), 512).unwrap();
        d.write(0, Bytes::from(vec![1u8; 1 << 20]), false).await.unwrap();
        assert_eq!(d.provisioning(0).await.unwrap().0, Provisioning::Mapped);
        d.discard(0, 2048).await.unwrap();
        assert!(d.read(0, 8).await.unwrap().iter().all(|&b| b == 0));
        assert_eq!(d.provisioning(0).await.unwrap().0, Provisioning::Deallocated);
    }

    #[tokio::test]
    async fn large_read_returns_exactly_the_file_contents_and_a_truncated_file_is_an_io_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("lun.img");
        let d = FileDev::open(&p, Some(4 << 20), 512).unwrap();
        let data: Vec<u8> = (0..(2usize << 20)).map(|i| (i * 7 + i / 4096) as u8).collect();
        d.write(100, Bytes::from(data.clone()), false).await.unwrap();
        assert_eq!(&d.read(100, 4096).await.unwrap()[..], &data[..]);
        // Blocks never written read as zeros (a hole), not as leftover memory.
        assert!(d.read(0, 100).await.unwrap().iter().all(|&b| b == 0));
        // Someone shrank the file under the device: the read fails cleanly.
        std::fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(1 << 20).unwrap();
        assert!(matches!(d.read(2000, 100).await, Err(BlockError::Io { .. })));
    }

    #[test]
    fn reserve_allocates_the_whole_file_or_says_the_file_system_is_too_small() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log");
        let d = FileDev::open(&p, Some(4 << 20), 512).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().blocks(), 0, "created sparse");
        d.reserve().unwrap();
        assert!(std::fs::metadata(&p).unwrap().blocks() * 512 >= 4 << 20);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 4 << 20);
        d.reserve().unwrap();

        // One GiB more than the file system has free: refused before anything is allocated.
        let free = free_bytes(std::fs::File::open(dir.path()).unwrap().as_raw_fd()).unwrap();
        let big = dir.path().join("big");
        let d = FileDev::open(&big, Some((free + (1 << 30)).next_multiple_of(1 << 20)), 512).unwrap();
        let e = d.reserve().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull, "{e}");
        let text = e.to_string();
        assert!(text.contains("big") && text.contains("MiB are free"), "{text}");
        assert_eq!(std::fs::metadata(&big).unwrap().blocks(), 0, "nothing allocated");
    }

    /// The flags of each extent of `file`, as FS_IOC_FIEMAP reports them (up to 64 extents).
    fn extent_flags(file: &File) -> Vec<u32> {
        const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
        const FIEMAP_FLAG_SYNC: u32 = 1;
        const MAX: usize = 64;
        // struct fiemap (32 bytes) followed by MAX struct fiemap_extent (56 bytes each), as u64s
        // for alignment.
        let mut buf = vec![0u64; (32 + 56 * MAX) / 8];
        buf[1] = u64::MAX; // fm_length
        let hdr = buf.as_mut_ptr().cast::<u32>();
        // SAFETY: the buffer holds the header and MAX extents; the kernel writes inside it.
        let mapped = unsafe {
            *hdr.add(4) = FIEMAP_FLAG_SYNC; // fm_flags
            *hdr.add(5) = 0; // fm_mapped_extents
            *hdr.add(6) = MAX as u32; // fm_extent_count
            assert_eq!(
                libc::ioctl(file.as_raw_fd(), FS_IOC_FIEMAP, buf.as_mut_ptr()),
                0,
                "FIEMAP: {}",
                io::Error::last_os_error()
            );
            *hdr.add(5) as usize
        };
        // fe_flags sits at byte 40 of each 56-byte extent, after the 32-byte header.
        (0..mapped.min(MAX))
            .map(|i| {
                let at = (32 + 56 * i + 40) / 4;
                // SAFETY: inside the buffer (i < MAX).
                unsafe { *hdr.add(at) }
            })
            .collect()
    }

    #[test]
    fn prefill_writes_out_every_extent_fallocate_left_unwritten_and_keeps_the_zeros() {
        const UNWRITTEN: u32 = 0x800;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log");
        let d = FileDev::open(&p, Some(8 << 20), 4096).unwrap();
        d.reserve().unwrap();
        let before = extent_flags(&d.file);
        assert!(!before.is_empty() && before.iter().all(|f| f & UNWRITTEN != 0), "fallocate: {before:x?}");
        d.prefill().unwrap();
        let after = extent_flags(&d.file);
        assert!(!after.is_empty() && after.iter().all(|f| f & UNWRITTEN == 0), "prefilled: {after:x?}");
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 8 << 20);
        assert!(std::fs::read(&p).unwrap().iter().all(|&b| b == 0));
    }

    #[test]
    fn a_second_exclusive_open_is_refused_naming_this_process_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log");
        let first = FileDev::open_exclusive(&p, Some(1 << 20), 512).unwrap();
        // A second open in this very process is a second open file, and refused.
        let Err(LockError::InUse(e)) = FileDev::open_exclusive(&p, Some(2 << 20), 512) else {
            panic!("a second exclusive open of {} was not refused", p.display())
        };
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 1 << 20, "refused before it grew the file");
        let holder = e.holder.clone().expect("/proc/locks names the holder");
        assert_eq!(holder.pid, std::process::id());
        assert!(holder.is_this_process());
        let argv0 = std::env::args().next().unwrap();
        assert!(holder.command.as_deref().is_some_and(|c| c.starts_with(&argv0)), "{holder:?}");
        let text = e.to_string();
        assert!(text.starts_with(&format!("{} is in use by this process, {}", p.display(), holder.pid)), "{text}");
        assert!(!e.device_busy);
        drop(first);
        assert!(open_soon(&p).is_ok(), "free again once the first is dropped");
    }

    #[test]
    fn an_exclusive_open_names_another_process_holding_the_lock_and_takes_it_once_that_process_ends() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log");
        std::fs::write(&p, vec![0u8; 4096]).unwrap();
        // flock(1) takes LOCK_EX on the file and holds it while `sleep` runs (-o: without passing
        // the descriptor on to it, so that the lock goes with flock(1) itself).
        let mut child =
            std::process::Command::new("flock").args(["-x", "-o"]).arg(&p).args(["sleep", "30"]).spawn().unwrap();
        let refused = (0..200).find_map(|_| match FileDev::open_exclusive(&p, None, 512) {
            Err(LockError::InUse(e)) => Some(e),
            _ => {
                std::thread::sleep(std::time::Duration::from_millis(20));
                None
            }
        });
        let e = refused.expect("refused while flock(1) holds the file");
        let holder = e.holder.clone().expect("/proc/locks names the holder");
        assert_eq!(holder.pid, child.id());
        assert!(!holder.is_this_process());
        let text = e.to_string();
        assert!(text.contains(&format!("in use by process {} (flock -x -o {}", child.id(), p.display())), "{text}");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(open_soon(&p).is_ok(), "a killed holder leaves no lock behind");
    }

    /// An exclusive open, tried again for a while: a child another test forks in this process
    /// holds a copy of every descriptor until it execs, and with it the lock on the open file.
    fn open_soon(p: &Path) -> Result<FileDev, LockError> {
        let mut last = FileDev::open_exclusive(p, None, 512);
        for _ in 0..100 {
            if last.is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            last = FileDev::open_exclusive(p, None, 512);
        }
        last
    }

    #[test]
    fn proc_locks_lines_give_the_pid_of_the_exclusive_flock_on_the_inode() {
        let locks = "\
1: POSIX  ADVISORY  WRITE 700 fd:01:42 0 EOF
2: FLOCK  ADVISORY  READ 701 fd:01:42 0 EOF
3: FLOCK  ADVISORY  WRITE 702 fd:01:43 0 EOF
4: FLOCK  ADVISORY  WRITE 703 fd:01:42 0 EOF
4: -> FLOCK  ADVISORY  WRITE 704 fd:01:42 0 EOF
5: FLOCK  ADVISORY  WRITE 705 00:2d:42 0 EOF
";
        assert_eq!(flock_holder_pid(locks, 0xfd, 1, 42), Some(703));
        assert_eq!(flock_holder_pid(locks, 0, 0x2d, 42), Some(705));
        assert_eq!(flock_holder_pid(locks, 0xfd, 1, 99), None);
        // A device stat reports but no lock line has: the inode's one holder, else nobody.
        assert_eq!(flock_holder_pid(locks, 0, 0x30, 43), Some(702));
        assert_eq!(flock_holder_pid(locks, 0, 0x30, 42), None);
    }

    #[test]
    fn empty_file_without_size_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("empty");
        std::fs::write(&p, b"").unwrap();
        assert!(FileDev::open(&p, None, 512).is_err());
    }
}

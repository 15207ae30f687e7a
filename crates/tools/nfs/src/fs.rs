//! The file system: inode table, attribute/lookup/listing/data caches and the NFS operations
//! behind each FUSE request. Decisions come from `policy`; this module does the I/O.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use fuser::{Errno, FileAttr, FileType, INodeNo};
use nfs3_client::nfs3_types::nfs3::{
    createhow3, createverf3, devicedata3, diropargs3, fattr3, filename3, ftype3, mknoddata3, nfs_fh3, nfspath3,
    nfsstat3, nfstime3, post_op_attr, post_op_fh3, sattr3, set_atime, set_gid3, set_mode3, set_mtime, set_size3,
    set_uid3, specdata3, stable_how, symlinkdata3, wcc_data, writeverf3, COMMIT3args, CREATE3args, GETATTR3args,
    LINK3args, LOOKUP3args, MKDIR3args, MKNOD3args, Nfs3Option, Nfs3Result, READ3args, READDIRPLUS3args, READLINK3args,
    REMOVE3args, RENAME3args, RMDIR3args, SETATTR3args, SYMLINK3args, WRITE3args,
};
use nfs3_client::nfs3_types::xdr_codec::Opaque;
use tokio::sync::Notify;

use crate::policy::{self, AttrTimer, Bounds, ReadAhead, Stamp, Update, PAGE};
use crate::rpc::{call, errno, Pool};

/// Clean pages kept at most (256 MiB).
const CLEAN_LIMIT: u64 = (256 << 20) / PAGE;
/// Dirty or not-yet-committed bytes allowed before writers wait (64 MiB).
const DIRTY_LIMIT: u64 = 64 << 20;

type R<T> = Result<T, Errno>;
type Listing = Arc<Vec<(u64, FileType, Vec<u8>)>>;

/// Settings the file system runs with, after FSINFO resolved the transfer sizes.
#[derive(Debug, Clone)]
pub struct Tunables {
    pub rsize: u32,
    pub wsize: u32,
    pub reg: Bounds,
    pub dir: Bounds,
    pub cto: bool,
    pub readahead: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PState {
    Clean,
    Dirty,
    /// A WRITE carrying the page is on the wire.
    Writing,
    /// Written UNSTABLE with this verifier; kept until a COMMIT with the same verifier.
    Unstable([u8; 8]),
}

struct Page {
    data: Box<[u8]>,
    /// Bytes written locally and not yet sent (or sent but not committed).
    dirty: Option<(u16, u16)>,
    state: PState,
    /// Bumped by every local write, so a WRITE or COMMIT finishing late does not clean a page
    /// that was written again meanwhile.
    gen: u64,
    used: u64,
    /// A WRITE carrying this page is on the wire. A page written again meanwhile waits for it
    /// before going out again, so that two WRITEs of the same bytes are never in flight
    /// together and reach the server in the wrong order.
    inflight: bool,
}

struct Node {
    fh: nfs_fh3,
    attr: fattr3,
    timer: AttrTimer,
    nlookup: u64,
    /// name -> child inode, `None` for a cached "does not exist".
    dentries: HashMap<Vec<u8>, Option<u64>>,
    /// The directory's listing, until it changes.
    listing: Option<Listing>,
    pages: BTreeMap<u64, Page>,
    /// Pages with a READ on the wire.
    reading: HashSet<u64>,
    ra: ReadAhead,
    /// The size including local writes not yet reflected in the server's attributes.
    size: u64,
    wb_error: Option<Errno>,
    link: Option<Vec<u8>>,
    /// Instantiated by a LOOKUP in the current path walk: the kernel client does not
    /// revalidate such a dentry, so the open that follows sends no close-to-open GETATTR.
    just_looked_up: bool,
    /// Bumped by every local write and truncation: a READ sent before one of those carries
    /// data (and attributes) older than the cache and is thrown away.
    wgen: u64,
    /// Opens for writing: while there are any, a change seen in the attributes is taken to be
    /// ours and cached data is kept (`nfs_file_has_buffered_writers`).
    writers: u32,
}

impl Node {
    fn is_dir(&self) -> bool {
        self.attr.type_ == ftype3::NF3DIR
    }

    fn has_unwritten(&self) -> bool {
        self.pages.values().any(|p| p.state != PState::Clean)
    }
}

#[derive(Default)]
struct State {
    nodes: HashMap<u64, Node>,
    by_fileid: HashMap<u64, u64>,
    next_ino: u64,
    dirs: HashMap<u64, Listing>,
    next_fh: u64,
    clean_pages: u64,
    dirty_pages: u64,
    tick: u64,
}

pub struct Shared {
    pub pool: Pool,
    pub root_fh: nfs_fh3,
    pub t: Tunables,
    state: Mutex<State>,
    /// Woken whenever a READ or WRITE or COMMIT finishes, for callers waiting on one.
    changed: Notify,
    verifier: AtomicU64,
}

fn stamp(a: &fattr3) -> Stamp {
    Stamp { mtime: (a.mtime.seconds, a.mtime.nseconds), ctime: (a.ctime.seconds, a.ctime.nseconds), size: a.size }
}

fn before(w: &wcc_data) -> Option<Stamp> {
    match &w.before {
        Nfs3Option::Some(b) => Some(Stamp {
            mtime: (b.mtime.seconds, b.mtime.nseconds),
            ctime: (b.ctime.seconds, b.ctime.nseconds),
            size: b.size,
        }),
        Nfs3Option::None => None,
    }
}

fn after(p: &post_op_attr) -> Option<&fattr3> {
    match p {
        Nfs3Option::Some(a) => Some(a),
        Nfs3Option::None => None,
    }
}

fn kind(t: ftype3) -> FileType {
    match t {
        ftype3::NF3REG => FileType::RegularFile,
        ftype3::NF3DIR => FileType::Directory,
        ftype3::NF3BLK => FileType::BlockDevice,
        ftype3::NF3CHR => FileType::CharDevice,
        ftype3::NF3LNK => FileType::Symlink,
        ftype3::NF3SOCK => FileType::Socket,
        ftype3::NF3FIFO => FileType::NamedPipe,
    }
}

fn time(t: nfstime3) -> SystemTime {
    SystemTime::from(t)
}

fn name3(name: &OsStr) -> filename3<'static> {
    filename3::from(name.as_bytes().to_vec())
}

fn dirop(dir: &nfs_fh3, name: &OsStr) -> diropargs3<'static> {
    diropargs3 { dir: dir.clone(), name: name3(name) }
}

fn sattr_mode(mode: u32) -> sattr3 {
    sattr3 { mode: set_mode3::Some(mode & 0o7777), ..sattr3::default() }
}

/// The attributes a setattr(2)-like call changes.
#[derive(Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<fuser::TimeOrNow>,
    pub mtime: Option<fuser::TimeOrNow>,
}

fn page_range(off: u64, len: u64) -> std::ops::Range<u64> {
    off / PAGE..(off + len).div_ceil(PAGE)
}

impl State {
    fn node(&self, ino: u64) -> R<&Node> {
        self.nodes.get(&ino).ok_or(Errno::ESTALE)
    }

    fn node_mut(&mut self, ino: u64) -> R<&mut Node> {
        self.nodes.get_mut(&ino).ok_or(Errno::ESTALE)
    }

    /// A directory whose entries we changed: its listing must be read again, as the kernel
    /// client invalidates a directory's cached pages after a create, remove or rename in it.
    fn entry_changed(&mut self, dir: u64) -> R<&mut Node> {
        let n = self.node_mut(dir)?;
        n.listing = None;
        Ok(n)
    }

    fn set_page_state(&mut self, ino: u64, idx: u64, st: PState) {
        let Some(p) = self.nodes.get_mut(&ino).and_then(|n| n.pages.get_mut(&idx)) else { return };
        match (p.state == PState::Clean, st == PState::Clean) {
            (true, false) => {
                self.clean_pages -= 1;
                self.dirty_pages += 1;
            }
            (false, true) => {
                self.clean_pages += 1;
                self.dirty_pages -= 1;
                p.dirty = None;
            }
            _ => {}
        }
        p.state = st;
    }

    fn remove_page(&mut self, ino: u64, idx: u64) {
        if let Some(p) = self.nodes.get_mut(&ino).and_then(|n| n.pages.remove(&idx)) {
            if p.state == PState::Clean {
                self.clean_pages -= 1;
            } else {
                self.dirty_pages -= 1;
            }
        }
    }

    /// Drops the clean pages of a file (someone else changed it); local writes stay.
    fn drop_clean(&mut self, ino: u64) {
        let Some(n) = self.nodes.get_mut(&ino) else { return };
        let before = n.pages.len() as u64;
        n.pages.retain(|_, p| p.state != PState::Clean);
        self.clean_pages -= before - n.pages.len() as u64;
        n.ra = ReadAhead::default();
        n.link = None;
    }

    /// Takes attributes from any reply. `wcc_before` is the pre-operation attributes of an
    /// operation we sent, which make its own change expected.
    fn apply(&mut self, t: &Tunables, ino: u64, attr: &fattr3, wcc_before: Option<Stamp>, now: Instant) {
        let Some(n) = self.nodes.get_mut(&ino) else { return };
        // Replies overtake each other on different connections: attributes with an older
        // ctime than the cached ones describe an older version and are ignored.
        if (attr.ctime.seconds, attr.ctime.nseconds) < (n.attr.ctime.seconds, n.attr.ctime.nseconds) {
            return;
        }
        let bounds = if n.is_dir() { t.dir } else { t.reg };
        let expected = policy::wcc_expected(stamp(&n.attr), wcc_before, stamp(attr));
        let upd = n.timer.update(bounds, expected, stamp(attr), now);
        n.attr = attr.clone();
        n.size = if n.has_unwritten() { n.size.max(attr.size) } else { attr.size };
        if upd == Update::Changed {
            if n.is_dir() {
                n.dentries.clear();
                n.listing = None;
            } else if n.writers == 0 {
                self.drop_clean(ino);
            }
        }
    }

    fn apply_opt(&mut self, t: &Tunables, ino: u64, attr: &post_op_attr, now: Instant) {
        if let Some(a) = after(attr) {
            self.apply(t, ino, a, None, now);
        }
    }

    fn apply_wcc(&mut self, t: &Tunables, ino: u64, w: &wcc_data, now: Instant) {
        match after(&w.after) {
            Some(a) => self.apply(t, ino, a, before(w), now),
            // No attributes after our change: the cached ones are stale.
            None => {
                if let Some(n) = self.nodes.get_mut(&ino) {
                    n.timer.forced_stale = true;
                }
            }
        }
    }

    /// The inode for an object the server named, created on first sight.
    fn intern(&mut self, t: &Tunables, fh: &nfs_fh3, attr: &fattr3, now: Instant) -> u64 {
        if let Some(&ino) = self.by_fileid.get(&attr.fileid) {
            if self.nodes.get(&ino).is_some_and(|n| n.fh == *fh) {
                self.apply(t, ino, attr, None, now);
                return ino;
            }
        }
        // Inode numbers are never reused, so the kernel never confuses two objects.
        self.next_ino += 1;
        let ino = self.next_ino;
        let bounds = if attr.type_ == ftype3::NF3DIR { t.dir } else { t.reg };
        self.nodes.insert(
            ino,
            Node {
                fh: fh.clone(),
                attr: attr.clone(),
                timer: AttrTimer::new(bounds, now),
                nlookup: 0,
                dentries: HashMap::new(),
                listing: None,
                pages: BTreeMap::new(),
                reading: HashSet::new(),
                ra: ReadAhead::default(),
                size: attr.size,
                wb_error: None,
                link: None,
                just_looked_up: false,
                wgen: 0,
                writers: 0,
            },
        );
        self.by_fileid.insert(attr.fileid, ino);
        ino
    }

    fn fuse_attr(&self, ino: u64) -> R<FileAttr> {
        let n = self.node(ino)?;
        let a = &n.attr;
        Ok(FileAttr {
            ino: INodeNo(ino),
            size: n.size,
            blocks: a.used.div_ceil(512),
            atime: time(a.atime),
            mtime: time(a.mtime),
            ctime: time(a.ctime),
            crtime: time(a.ctime),
            kind: kind(a.type_),
            perm: (a.mode & 0o7777) as u16,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: (a.rdev.specdata1 << 8) | (a.rdev.specdata2 & 0xff),
            blksize: PAGE as u32,
            flags: 0,
        })
    }

    /// Keeps clean pages under the bound, evicting least recently used ones in batches.
    fn evict(&mut self) {
        if self.clean_pages <= CLEAN_LIMIT {
            return;
        }
        let mut clean: Vec<(u64, u64, u64)> = Vec::new();
        for (&ino, n) in &self.nodes {
            for (&idx, p) in &n.pages {
                if p.state == PState::Clean {
                    clean.push((p.used, ino, idx));
                }
            }
        }
        clean.sort_unstable();
        let target = CLEAN_LIMIT * 9 / 10;
        for (_, ino, idx) in clean {
            if self.clean_pages <= target {
                break;
            }
            self.remove_page(ino, idx);
        }
    }

    fn forget(&mut self, ino: u64, count: u64) {
        let Some(n) = self.nodes.get_mut(&ino) else { return };
        n.nlookup = n.nlookup.saturating_sub(count);
        if ino == 1 || n.nlookup > 0 || n.has_unwritten() || !n.reading.is_empty() {
            return;
        }
        let idxs: Vec<u64> = n.pages.keys().copied().collect();
        for idx in idxs {
            self.remove_page(ino, idx);
        }
        if let Some(n) = self.nodes.remove(&ino) {
            if self.by_fileid.get(&n.attr.fileid) == Some(&ino) {
                self.by_fileid.remove(&n.attr.fileid);
            }
        }
    }
}

impl Shared {
    pub fn new(pool: Pool, root_fh: nfs_fh3, root_attr: &fattr3, t: Tunables) -> Shared {
        let now = Instant::now();
        let mut st = State { next_ino: 1, ..State::default() };
        st.nodes.insert(
            1,
            Node {
                fh: root_fh.clone(),
                attr: root_attr.clone(),
                timer: AttrTimer::new(t.dir, now),
                nlookup: 1,
                dentries: HashMap::new(),
                listing: None,
                pages: BTreeMap::new(),
                reading: HashSet::new(),
                ra: ReadAhead::default(),
                size: root_attr.size,
                wb_error: None,
                link: None,
                just_looked_up: false,
                wgen: 0,
                writers: 0,
            },
        );
        st.by_fileid.insert(root_attr.fileid, 1);
        let seed = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        Shared { pool, root_fh, t, state: Mutex::new(st), changed: Notify::new(), verifier: AtomicU64::new(seed) }
    }

    fn st(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the caches merely stale, never unsafe.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn fh(&self, ino: u64) -> R<nfs_fh3> {
        Ok(self.st().node(ino)?.fh.clone())
    }

    /// Waits until `busy` is false, re-checking whenever an RPC finishes.
    async fn wait_until(&self, busy: impl Fn(&State) -> bool) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !busy(&self.st()) {
                return;
            }
            notified.await;
        }
    }

    pub async fn getattr_rpc(&self, ino: u64) -> R<()> {
        let fh = self.fh(ino)?;
        let res = call!(self.pool, Getattr, c => c.getattr(&GETATTR3args { object: fh }))?;
        match res {
            Nfs3Result::Ok(ok) => {
                self.st().apply(&self.t, ino, &ok.obj_attributes, None, Instant::now());
                Ok(())
            }
            Nfs3Result::Err((s, _)) => Err(errno(s)),
        }
    }

    /// Cached attributes if fresh, else a GETATTR.
    async fn revalidate(&self, ino: u64) -> R<()> {
        if self.st().node(ino)?.timer.fresh(Instant::now()) {
            return Ok(());
        }
        self.getattr_rpc(ino).await
    }

    pub async fn getattr(self: &Arc<Self>, ino: u64) -> R<FileAttr> {
        // Like nfs_getattr: write dirty data back first, so that the server's mtime and size
        // are the ones reported.
        let dirty = self.st().node(ino)?.pages.values().any(|p| p.state == PState::Dirty);
        if dirty {
            self.flush_dirty(ino, 0, u64::MAX).await;
            self.wait_until(|s| s.nodes.get(&ino).is_some_and(|n| n.pages.values().any(|p| p.inflight))).await;
        }
        self.revalidate(ino).await?;
        self.st().fuse_attr(ino)
    }

    pub async fn lookup(&self, parent: u64, name: &OsStr) -> R<FileAttr> {
        self.revalidate(parent).await?;
        {
            let mut st = self.st();
            let cached = st.node(parent)?.dentries.get(name.as_bytes()).copied();
            match cached {
                Some(None) => return Err(Errno::ENOENT),
                Some(Some(ino)) if st.nodes.contains_key(&ino) => {
                    let n = st.node_mut(ino)?;
                    n.nlookup += 1;
                    n.just_looked_up = false;
                    return st.fuse_attr(ino);
                }
                _ => {}
            }
        }
        let dir = self.fh(parent)?;
        let res = call!(self.pool, Lookup, c => c.lookup(&LOOKUP3args { what: dirop(&dir, name) }))?;
        let now = Instant::now();
        match res {
            Nfs3Result::Ok(ok) => {
                let attr = match ok.obj_attributes {
                    Nfs3Option::Some(a) => a,
                    Nfs3Option::None => self.getattr_fh(&ok.object).await?,
                };
                let mut st = self.st();
                st.apply_opt(&self.t, parent, &ok.dir_attributes, now);
                let ino = st.intern(&self.t, &ok.object, &attr, now);
                st.node_mut(parent)?.dentries.insert(name.as_bytes().to_vec(), Some(ino));
                let n = st.node_mut(ino)?;
                n.nlookup += 1;
                n.just_looked_up = true;
                st.fuse_attr(ino)
            }
            Nfs3Result::Err((s, fail)) => {
                let mut st = self.st();
                st.apply_opt(&self.t, parent, &fail.dir_attributes, now);
                if s == nfsstat3::NFS3ERR_NOENT {
                    st.node_mut(parent)?.dentries.insert(name.as_bytes().to_vec(), None);
                }
                Err(errno(s))
            }
        }
    }

    async fn getattr_fh(&self, fh: &nfs_fh3) -> R<fattr3> {
        let res = call!(self.pool, Getattr, c => c.getattr(&GETATTR3args { object: fh.clone() }))?;
        match res {
            Nfs3Result::Ok(ok) => Ok(ok.obj_attributes),
            Nfs3Result::Err((s, _)) => Err(errno(s)),
        }
    }

    pub fn forget(&self, ino: u64, n: u64) {
        self.st().forget(ino, n);
    }

    /// A new object from CREATE/MKDIR/SYMLINK/MKNOD/LINK: into the inode table and its
    /// parent's lookup cache, with a LOOKUP when the reply did not say what it is.
    /// What the reply to a CREATE, MKNOD, MKDIR or SYMLINK in `parent` means: the directory's
    /// change either way, then, when it worked, the new entry (its handle and attributes, or
    /// a LOOKUP when the server sent neither).
    async fn made(
        &self,
        parent: u64,
        name: &OsStr,
        reply: Result<(post_op_fh3, post_op_attr, wcc_data), (nfsstat3, wcc_data)>,
    ) -> R<FileAttr> {
        let now = Instant::now();
        match reply {
            Ok((fh, attr, wcc)) => {
                self.st().apply_wcc(&self.t, parent, &wcc, now);
                self.created(parent, name, fh, attr).await
            }
            Err((s, wcc)) => {
                self.st().apply_wcc(&self.t, parent, &wcc, now);
                Err(errno(s))
            }
        }
    }

    async fn created(&self, parent: u64, name: &OsStr, fh: post_op_fh3, attr: post_op_attr) -> R<FileAttr> {
        let fh = match fh {
            Nfs3Option::Some(fh) => fh,
            Nfs3Option::None => {
                self.st().entry_changed(parent)?.dentries.remove(name.as_bytes());
                return self.lookup(parent, name).await;
            }
        };
        let attr = match attr {
            Nfs3Option::Some(a) => a,
            Nfs3Option::None => self.getattr_fh(&fh).await?,
        };
        let mut st = self.st();
        let ino = st.intern(&self.t, &fh, &attr, Instant::now());
        st.entry_changed(parent)?.dentries.insert(name.as_bytes().to_vec(), Some(ino));
        st.node_mut(ino)?.nlookup += 1;
        st.fuse_attr(ino)
    }

    pub async fn create(&self, parent: u64, name: &OsStr, mode: u32, exclusive: bool) -> R<FileAttr> {
        let dir = self.fh(parent)?;
        // As nfs3_proc_create: O_EXCL becomes an EXCLUSIVE create (the verifier lands in the
        // times) followed by a SETATTR for the mode and the times.
        let how = if exclusive {
            createhow3::EXCLUSIVE(createverf3(self.verifier.fetch_add(1, Relaxed).to_be_bytes()))
        } else {
            createhow3::UNCHECKED(sattr_mode(mode))
        };
        let res = call!(self.pool, Create, c => c.create(&CREATE3args { where_: dirop(&dir, name), how }))?;
        let made = match res {
            Nfs3Result::Ok(ok) => Ok((ok.obj, ok.obj_attributes, ok.dir_wcc)),
            Nfs3Result::Err((s, fail)) => Err((s, fail.dir_wcc)),
        };
        let attr = self.made(parent, name, made).await?;
        if let Some(n) = self.st().nodes.get_mut(&attr.ino.0) {
            n.writers += 1;
        }
        if exclusive {
            let sattr = sattr3 {
                atime: set_atime::SET_TO_SERVER_TIME,
                mtime: set_mtime::SET_TO_SERVER_TIME,
                ..sattr_mode(mode)
            };
            return self.setattr_rpc(attr.ino.0, sattr).await;
        }
        Ok(attr)
    }

    pub async fn mknod(&self, parent: u64, name: &OsStr, mode: u32, rdev: u32) -> R<FileAttr> {
        let fmt = mode & libc::S_IFMT;
        if fmt == libc::S_IFREG || fmt == 0 {
            return self.create(parent, name, mode, false).await;
        }
        let dir = self.fh(parent)?;
        let sattr = sattr_mode(mode);
        let spec = specdata3 { specdata1: rdev >> 8, specdata2: rdev & 0xff };
        let what = match fmt {
            libc::S_IFCHR => mknoddata3::NF3CHR(devicedata3 { dev_attributes: sattr, spec }),
            libc::S_IFBLK => mknoddata3::NF3BLK(devicedata3 { dev_attributes: sattr, spec }),
            libc::S_IFIFO => mknoddata3::NF3FIFO(sattr),
            libc::S_IFSOCK => mknoddata3::NF3SOCK(sattr),
            _ => return Err(Errno::EINVAL),
        };
        let res = call!(self.pool, Mknod, c => c.mknod(&MKNOD3args { where_: dirop(&dir, name), what }))?;
        let made = match res {
            Nfs3Result::Ok(ok) => Ok((ok.obj, ok.obj_attributes, ok.dir_wcc)),
            Nfs3Result::Err((s, fail)) => Err((s, fail.dir_wcc)),
        };
        self.made(parent, name, made).await
    }

    pub async fn mkdir(&self, parent: u64, name: &OsStr, mode: u32) -> R<FileAttr> {
        let dir = self.fh(parent)?;
        let args = MKDIR3args { where_: dirop(&dir, name), attributes: sattr_mode(mode) };
        let res = call!(self.pool, Mkdir, c => c.mkdir(&args))?;
        let made = match res {
            Nfs3Result::Ok(ok) => Ok((ok.obj, ok.obj_attributes, ok.dir_wcc)),
            Nfs3Result::Err((s, fail)) => Err((s, fail.dir_wcc)),
        };
        self.made(parent, name, made).await
    }

    pub async fn symlink(&self, parent: u64, name: &OsStr, target: &[u8]) -> R<FileAttr> {
        let dir = self.fh(parent)?;
        let args = SYMLINK3args {
            where_: dirop(&dir, name),
            symlink: symlinkdata3 {
                symlink_attributes: sattr_mode(0o777),
                symlink_data: nfspath3::from(target.to_vec()),
            },
        };
        let res = call!(self.pool, Symlink, c => c.symlink(&args))?;
        let made = match res {
            Nfs3Result::Ok(ok) => Ok((ok.obj, ok.obj_attributes, ok.dir_wcc)),
            Nfs3Result::Err((s, fail)) => Err((s, fail.dir_wcc)),
        };
        self.made(parent, name, made).await
    }

    pub async fn link(&self, ino: u64, parent: u64, name: &OsStr) -> R<FileAttr> {
        let (file, dir) = (self.fh(ino)?, self.fh(parent)?);
        let res = call!(self.pool, Link, c => c.link(&LINK3args { file, link: dirop(&dir, name) }))?;
        let now = Instant::now();
        let mut st = self.st();
        match res {
            Nfs3Result::Ok(ok) => {
                st.apply_wcc(&self.t, parent, &ok.linkdir_wcc, now);
                match after(&ok.file_attributes) {
                    Some(a) => st.apply(&self.t, ino, a, None, now),
                    None => st.node_mut(ino)?.timer.forced_stale = true,
                }
                st.entry_changed(parent)?.dentries.insert(name.as_bytes().to_vec(), Some(ino));
                st.node_mut(ino)?.nlookup += 1;
                st.fuse_attr(ino)
            }
            Nfs3Result::Err((s, fail)) => {
                st.apply_wcc(&self.t, parent, &fail.linkdir_wcc, now);
                Err(errno(s))
            }
        }
    }

    pub async fn readlink(&self, ino: u64) -> R<Vec<u8>> {
        self.revalidate(ino).await?;
        if let Some(l) = self.st().node(ino)?.link.clone() {
            return Ok(l);
        }
        let fh = self.fh(ino)?;
        let res = call!(self.pool, Readlink, c => c.readlink(&READLINK3args { symlink: fh }))?;
        let mut st = self.st();
        match res {
            Nfs3Result::Ok(ok) => {
                st.apply_opt(&self.t, ino, &ok.symlink_attributes, Instant::now());
                let l = ok.data.0.to_vec();
                st.node_mut(ino)?.link = Some(l.clone());
                Ok(l)
            }
            Nfs3Result::Err((s, _)) => Err(errno(s)),
        }
    }

    /// The inode a directory entry names, if cached, so that it can be marked stale after a
    /// remove or rename changed its link count.
    fn cached_child(&self, parent: u64, name: &OsStr) -> Option<u64> {
        self.st().nodes.get(&parent).and_then(|n| n.dentries.get(name.as_bytes()).copied().flatten())
    }

    fn mark_stale(&self, ino: Option<u64>) {
        if let Some(i) = ino {
            if let Some(n) = self.st().nodes.get_mut(&i) {
                n.timer.forced_stale = true;
            }
        }
    }

    pub async fn remove(&self, parent: u64, name: &OsStr, dir: bool) -> R<()> {
        let victim = self.cached_child(parent, name);
        let object = dirop(&self.fh(parent)?, name);
        let (stat, wcc) = if dir {
            match call!(self.pool, Rmdir, c => c.rmdir(&RMDIR3args { object }))? {
                Nfs3Result::Ok(ok) => (None, ok.dir_wcc),
                Nfs3Result::Err((s, f)) => (Some(s), f.dir_wcc),
            }
        } else {
            match call!(self.pool, Remove, c => c.remove(&REMOVE3args { object }))? {
                Nfs3Result::Ok(ok) => (None, ok.dir_wcc),
                Nfs3Result::Err((s, f)) => (Some(s), f.dir_wcc),
            }
        };
        self.st().apply_wcc(&self.t, parent, &wcc, Instant::now());
        if let Some(s) = stat {
            return Err(errno(s));
        }
        self.mark_stale(victim);
        self.st().entry_changed(parent)?.dentries.insert(name.as_bytes().to_vec(), None);
        Ok(())
    }

    pub async fn rename(&self, parent: u64, name: &OsStr, newparent: u64, newname: &OsStr) -> R<()> {
        let moved = self.cached_child(parent, name);
        let victim = self.cached_child(newparent, newname);
        let args = RENAME3args { from: dirop(&self.fh(parent)?, name), to: dirop(&self.fh(newparent)?, newname) };
        let res = call!(self.pool, Rename, c => c.rename(&args))?;
        let now = Instant::now();
        let mut st = self.st();
        let (stat, from, to) = match res {
            Nfs3Result::Ok(ok) => (None, ok.fromdir_wcc, ok.todir_wcc),
            Nfs3Result::Err((s, f)) => (Some(s), f.fromdir_wcc, f.todir_wcc),
        };
        st.apply_wcc(&self.t, parent, &from, now);
        st.apply_wcc(&self.t, newparent, &to, now);
        if let Some(s) = stat {
            return Err(errno(s));
        }
        drop(st);
        self.mark_stale(victim);
        let mut st = self.st();
        st.entry_changed(parent)?.dentries.insert(name.as_bytes().to_vec(), None);
        match moved {
            Some(ino) => {
                st.entry_changed(newparent)?.dentries.insert(newname.as_bytes().to_vec(), Some(ino));
                // A rename changes the ctime of what moved.
                if let Some(n) = st.nodes.get_mut(&ino) {
                    n.timer.forced_stale = true;
                }
            }
            None => {
                st.entry_changed(newparent)?.dentries.remove(newname.as_bytes());
            }
        }
        Ok(())
    }

    async fn setattr_rpc(&self, ino: u64, sattr: sattr3) -> R<FileAttr> {
        let fh = self.fh(ino)?;
        let size = match sattr.size {
            set_size3::Some(s) => Some(s),
            set_size3::None => None,
        };
        let args = SETATTR3args { object: fh, new_attributes: sattr, guard: Nfs3Option::None };
        let res = call!(self.pool, Setattr, c => c.setattr(&args))?;
        let now = Instant::now();
        let (stat, wcc) = match res {
            Nfs3Result::Ok(ok) => (None, ok.obj_wcc),
            Nfs3Result::Err((s, f)) => (Some(s), f.obj_wcc),
        };
        {
            let mut st = self.st();
            st.apply_wcc(&self.t, ino, &wcc, now);
            if let Some(s) = stat {
                return Err(errno(s));
            }
            if let Some(size) = size {
                let n = st.node_mut(ino)?;
                n.size = size;
                n.wgen += 1;
                let drop: Vec<u64> = n.pages.range(size.div_ceil(PAGE)..).map(|(&i, _)| i).collect();
                if let Some(p) = n.pages.get_mut(&(size / PAGE)) {
                    p.data[(size % PAGE) as usize..].fill(0);
                }
                for idx in drop {
                    st.remove_page(ino, idx);
                }
            }
        }
        if self.st().node(ino)?.timer.forced_stale {
            self.getattr_rpc(ino).await?;
        }
        self.st().fuse_attr(ino)
    }

    pub async fn setattr(self: &Arc<Self>, ino: u64, a: SetAttr) -> R<FileAttr> {
        let SetAttr { mode, uid, gid, size, atime, mtime } = a;
        // As nfs_setattr: a regular file's dirty data is written and committed first.
        if !self.st().node(ino)?.is_dir() {
            self.sync(ino).await?;
        }
        let t3 = |t: SystemTime| nfstime3::try_from(t).unwrap_or_default();
        let sattr = sattr3 {
            mode: mode.map_or(set_mode3::None, |m| set_mode3::Some(m & 0o7777)),
            uid: uid.map_or(set_uid3::None, set_uid3::Some),
            gid: gid.map_or(set_gid3::None, set_gid3::Some),
            size: size.map_or(set_size3::None, set_size3::Some),
            atime: match atime {
                None => set_atime::DONT_CHANGE,
                Some(fuser::TimeOrNow::Now) => set_atime::SET_TO_SERVER_TIME,
                Some(fuser::TimeOrNow::SpecificTime(t)) => set_atime::SET_TO_CLIENT_TIME(t3(t)),
            },
            mtime: match mtime {
                None => set_mtime::DONT_CHANGE,
                Some(fuser::TimeOrNow::Now) => set_mtime::SET_TO_SERVER_TIME,
                Some(fuser::TimeOrNow::SpecificTime(t)) => set_mtime::SET_TO_CLIENT_TIME(t3(t)),
            },
        };
        self.setattr_rpc(ino, sattr).await
    }

    /// open(): close-to-open asks the server for fresh attributes, which drops cached data
    /// if the file changed.
    /// (Directories too: the kernel client applies close-to-open to them. The root is never
    /// revalidated that way, having no dentry to revalidate.)
    pub async fn open(&self, ino: u64, write: bool) -> R<()> {
        let fresh_lookup = {
            let mut st = self.st();
            let n = st.node_mut(ino)?;
            n.writers += u32::from(write);
            std::mem::take(&mut n.just_looked_up)
        };
        if self.t.cto && !fresh_lookup && ino != 1 {
            self.getattr_rpc(ino).await
        } else {
            self.revalidate(ino).await
        }
    }

    /// Reads one rsize chunk into the cache (the READ may be a foreground or a read-ahead one).
    /// READs pages `first..first + count` (at most rsize) into the cache.
    async fn fetch(self: &Arc<Self>, ino: u64, first: u64, count: u64) -> R<()> {
        let (fh, size, wgen) = {
            let st = self.st();
            let n = st.node(ino)?;
            (n.fh.clone(), n.size, n.wgen)
        };
        let current = |st: &State| st.nodes.get(&ino).is_some_and(|n| n.wgen == wgen);
        let start = first * PAGE;
        let end = ((first + count) * PAGE).min(size.max(start));
        let mut buf: Vec<u8> = Vec::with_capacity((end - start) as usize);
        let mut result = Ok(());
        while start + (buf.len() as u64) < end {
            let args = READ3args {
                file: fh.clone(),
                offset: start + buf.len() as u64,
                count: (end - start - buf.len() as u64) as u32,
            };
            let res = match call!(self.pool, Read, c => c.read(&args)) {
                Ok(r) => r,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            match res {
                Nfs3Result::Ok(ok) => {
                    self.pool.counters.bytes_read.fetch_add(ok.data.len() as u64, Relaxed);
                    let mut st = self.st();
                    if current(&st) {
                        st.apply_opt(&self.t, ino, &ok.file_attributes, Instant::now());
                    }
                    drop(st);
                    buf.extend_from_slice(&ok.data);
                    if ok.eof || ok.data.is_empty() {
                        break;
                    }
                }
                Nfs3Result::Err((s, f)) => {
                    self.st().apply_opt(&self.t, ino, &f.file_attributes, Instant::now());
                    result = Err(errno(s));
                    break;
                }
            }
        }
        let mut st = self.st();
        if result.is_ok() && current(&st) {
            st.tick += 1;
            let tick = st.tick;
            let mut added = 0;
            if let Some(n) = st.nodes.get_mut(&ino) {
                for idx in page_range(start, end - start) {
                    // A cached page is never older than what a READ brings: invalidation
                    // removes stale pages, and this READ may have passed our own WRITE.
                    if n.pages.contains_key(&idx) {
                        continue;
                    }
                    let mut data = vec![0u8; PAGE as usize].into_boxed_slice();
                    let from = (idx * PAGE - start) as usize;
                    if from < buf.len() {
                        let to = buf.len().min(from + PAGE as usize);
                        data[..to - from].copy_from_slice(&buf[from..to]);
                    }
                    let page = Page { data, dirty: None, state: PState::Clean, gen: 0, used: tick, inflight: false };
                    if n.pages.insert(idx, page).is_none() {
                        added += 1;
                    }
                }
            }
            st.clean_pages += added;
            st.evict();
        }
        if let Some(n) = st.nodes.get_mut(&ino) {
            for idx in first..first + count {
                n.reading.remove(&idx);
            }
        }
        drop(st);
        self.changed.notify_waiters();
        result
    }

    /// Makes the pages of `[off, off+len)` present: one READ per run of missing pages (at most
    /// rsize, as Linux's `nfs_pageio` coalesces the pages it is asked for), waiting for any
    /// already on the wire. A random read thus asks for its own pages only, and read-ahead for
    /// its window.
    async fn fill(self: &Arc<Self>, ino: u64, off: u64, len: u64) -> R<()> {
        let per_read = (u64::from(self.t.rsize) / PAGE).max(1);
        // A READ overtaken by a local write is discarded and sent again.
        for _ in 0..64 {
            let (runs, theirs) = {
                let mut st = self.st();
                let n = st.node_mut(ino)?;
                let end = off.saturating_add(len).min(n.size);
                let mut mine = Vec::new();
                let mut theirs = Vec::new();
                if off < end {
                    for idx in page_range(off, end - off) {
                        if n.pages.contains_key(&idx) {
                            continue;
                        }
                        if n.reading.insert(idx) {
                            mine.push(idx);
                        } else {
                            theirs.push(idx);
                        }
                    }
                }
                let runs = policy::read_runs(&mine, per_read);
                (runs, theirs)
            };
            if runs.is_empty() && theirs.is_empty() {
                return Ok(());
            }
            let mut set = tokio::task::JoinSet::new();
            for (first, count) in runs {
                let me = self.clone();
                set.spawn(async move { me.fetch(ino, first, count).await });
            }
            while let Some(r) = set.join_next().await {
                r.map_err(|_| Errno::EIO)??;
            }
            self.wait_until(|s| s.nodes.get(&ino).is_some_and(|n| theirs.iter().any(|c| n.reading.contains(c)))).await;
        }
        Ok(())
    }

    pub async fn read(self: &Arc<Self>, ino: u64, off: u64, len: u32) -> R<Vec<u8>> {
        // As nfs_revalidate_mapping: expired attributes are checked before cached data is used.
        self.revalidate(ino).await?;
        let (size, ahead) = {
            let mut st = self.st();
            let n = st.node_mut(ino)?;
            let size = n.size;
            let len = u64::from(len).min(size.saturating_sub(off));
            (size, n.ra.on_read(off, len, u64::from(self.t.readahead), size))
        };
        let len = u64::from(len).min(size.saturating_sub(off));
        if len == 0 {
            return Ok(Vec::new());
        }
        if let Some((from, to)) = ahead {
            let me = self.clone();
            tokio::spawn(async move {
                if let Err(e) = me.fill(ino, from, to - from).await {
                    tracing::debug!(ino, from, to, error = ?e, "read-ahead failed");
                }
            });
        }
        for _ in 0..8 {
            self.fill(ino, off, len).await?;
            let mut st = self.st();
            st.tick += 1;
            let tick = st.tick;
            let n = st.node_mut(ino)?;
            let len = len.min(n.size.saturating_sub(off));
            let mut out = Vec::with_capacity(len as usize);
            let mut complete = true;
            for idx in page_range(off, len) {
                let Some(p) = n.pages.get_mut(&idx) else {
                    complete = false;
                    break;
                };
                p.used = tick;
                let lo = off.max(idx * PAGE) - idx * PAGE;
                let hi = (off + len).min((idx + 1) * PAGE) - idx * PAGE;
                out.extend_from_slice(&p.data[lo as usize..hi as usize]);
            }
            if complete {
                return Ok(out);
            }
        }
        Err(Errno::EIO)
    }

    pub async fn write(self: &Arc<Self>, ino: u64, off: u64, data: &[u8]) -> R<u32> {
        let len = data.len() as u64;
        if len == 0 {
            return Ok(0);
        }
        while policy::must_throttle(self.st().dirty_pages * PAGE, DIRTY_LIMIT) {
            let _ = self.sync_all().await;
        }
        // A partial page inside the server's file is read first, so that every cached page
        // holds the whole page and a WRITE never carries bytes we do not have.
        for _ in 0..8 {
            let need: Vec<u64> = {
                let st = self.st();
                let n = st.node(ino)?;
                let server = n.attr.size.max(n.size);
                [off / PAGE, (off + len - 1) / PAGE]
                    .into_iter()
                    .filter(|&i| {
                        let partial = off > i * PAGE || off + len < (i + 1) * PAGE;
                        partial && i * PAGE < server && !n.pages.contains_key(&i)
                    })
                    .collect()
            };
            if need.is_empty() {
                break;
            }
            for i in need {
                self.fill(ino, i * PAGE, PAGE).await?;
            }
        }
        let full_chunks = {
            let mut st = self.st();
            st.tick += 1;
            let tick = st.tick;
            let mut newly_dirty = 0;
            let mut added_clean = 0i64;
            let n = st.node_mut(ino)?;
            for idx in page_range(off, len) {
                let p = n.pages.entry(idx).or_insert_with(|| {
                    added_clean += 1;
                    Page {
                        data: vec![0u8; PAGE as usize].into_boxed_slice(),
                        dirty: None,
                        state: PState::Clean,
                        gen: 0,
                        used: tick,
                        inflight: false,
                    }
                });
                let lo = off.max(idx * PAGE) - idx * PAGE;
                let hi = (off + len).min((idx + 1) * PAGE) - idx * PAGE;
                let src = (idx * PAGE + lo - off) as usize;
                p.data[lo as usize..hi as usize].copy_from_slice(&data[src..src + (hi - lo) as usize]);
                let (lo, hi) = (lo as u16, hi as u16);
                p.dirty = Some(p.dirty.map_or((lo, hi), |(a, b)| (a.min(lo), b.max(hi))));
                if p.state == PState::Clean {
                    newly_dirty += 1;
                }
                p.state = PState::Dirty;
                p.gen += 1;
                p.used = tick;
            }
            n.size = n.size.max(off + len);
            n.wgen += 1;
            let wsize = u64::from(self.t.wsize);
            let mut full = Vec::new();
            let mut c = off / wsize;
            while (c + 1) * wsize <= off + len {
                let complete = page_range(c * wsize, wsize).all(|i| {
                    n.pages.get(&i).is_some_and(|p| p.state == PState::Dirty && p.dirty == Some((0, PAGE as u16)))
                });
                if complete {
                    full.push(c);
                }
                c += 1;
            }
            st.clean_pages = (st.clean_pages as i64 + added_clean - newly_dirty) as u64;
            st.dirty_pages += newly_dirty as u64;
            full
        };
        // Write-behind: a whole wsize chunk goes out now, in the background.
        let wsize = u64::from(self.t.wsize);
        for c in full_chunks {
            let me = self.clone();
            tokio::spawn(async move { me.flush_dirty(ino, c * wsize, (c + 1) * wsize).await });
        }
        Ok(len as u32)
    }

    /// Sends the dirty pages of `[lo, hi)` as WRITE UNSTABLE, concurrently, and waits for them.
    async fn flush_dirty(self: &Arc<Self>, ino: u64, lo: u64, hi: u64) {
        let wsize = u64::from(self.t.wsize);
        let (fh, runs) = {
            let mut st = self.st();
            let Some(n) = st.nodes.get_mut(&ino) else { return };
            let mut pages = Vec::new();
            for (&idx, p) in n.pages.range(lo / PAGE..hi.div_ceil(PAGE)) {
                if p.state == PState::Dirty && !p.inflight {
                    if let Some((s, e)) = p.dirty {
                        pages.push((idx, s, e));
                    }
                }
            }
            let mut runs = Vec::new();
            for (off, len, first, count) in policy::write_runs(&pages, wsize, n.size) {
                let mut buf = Vec::with_capacity(len as usize);
                let mut gens = Vec::with_capacity(count);
                for idx in first..first + count as u64 {
                    if let Some(p) = n.pages.get_mut(&idx) {
                        let s = (off.max(idx * PAGE) - idx * PAGE) as usize;
                        let e = ((off + len).min((idx + 1) * PAGE) - idx * PAGE) as usize;
                        buf.extend_from_slice(&p.data[s..e]);
                        p.state = PState::Writing;
                        p.inflight = true;
                        gens.push((idx, p.gen));
                    }
                }
                runs.push((off, buf, gens));
            }
            (n.fh.clone(), runs)
        };
        let mut set = tokio::task::JoinSet::new();
        for (off, buf, gens) in runs {
            let me = self.clone();
            let fh = fh.clone();
            set.spawn(async move {
                let res = me.write_rpc(ino, fh, off, buf).await;
                let mut st = me.st();
                for (idx, gen) in gens {
                    let Some(p) = st.nodes.get_mut(&ino).and_then(|n| n.pages.get_mut(&idx)) else { continue };
                    p.inflight = false;
                    if p.gen != gen || p.state != PState::Writing {
                        continue;
                    }
                    match &res {
                        Ok((how, _)) if *how == stable_how::FILE_SYNC => st.set_page_state(ino, idx, PState::Clean),
                        Ok((_, verf)) => st.set_page_state(ino, idx, PState::Unstable(verf.0)),
                        Err(e) if *e == Errno::EAGAIN => st.set_page_state(ino, idx, PState::Dirty),
                        Err(e) => {
                            if let Some(n) = st.nodes.get_mut(&ino) {
                                n.wb_error = Some(*e);
                            }
                            st.remove_page(ino, idx);
                        }
                    }
                }
                drop(st);
                me.changed.notify_waiters();
            });
        }
        while set.join_next().await.is_some() {}
    }

    async fn write_rpc(&self, ino: u64, fh: nfs_fh3, off: u64, buf: Vec<u8>) -> R<(stable_how, writeverf3)> {
        let mut sent = 0usize;
        let mut how = stable_how::FILE_SYNC;
        let mut verf = writeverf3::default();
        while sent < buf.len() {
            let args = WRITE3args {
                file: fh.clone(),
                offset: off + sent as u64,
                count: (buf.len() - sent) as u32,
                stable: stable_how::UNSTABLE,
                data: Opaque::borrowed(&buf[sent..]),
            };
            // A lost connection is not the data's fault: the pages stay dirty and go again.
            let res = call!(self.pool, Write, c => c.write(&args)).map_err(|_| Errno::EAGAIN)?;
            let now = Instant::now();
            match res {
                Nfs3Result::Ok(ok) => {
                    self.pool.counters.bytes_written.fetch_add(u64::from(ok.count), Relaxed);
                    self.st().apply_wcc(&self.t, ino, &ok.file_wcc, now);
                    if ok.count == 0 {
                        return Err(Errno::EIO);
                    }
                    sent += ok.count as usize;
                    if ok.committed != stable_how::FILE_SYNC {
                        how = stable_how::UNSTABLE;
                    }
                    if verf != writeverf3::default() && verf != ok.verf {
                        // The server restarted between pieces: COMMIT will not match and the
                        // pages are sent again.
                        how = stable_how::UNSTABLE;
                    }
                    verf = ok.verf;
                }
                Nfs3Result::Err((s, f)) => {
                    self.st().apply_wcc(&self.t, ino, &f.file_wcc, now);
                    return Err(errno(s));
                }
            }
        }
        Ok((how, verf))
    }

    /// COMMIT; pages written with another verifier than the COMMIT's become dirty again.
    async fn commit(&self, ino: u64) -> R<()> {
        let (fh, pages) = {
            let st = self.st();
            let n = st.node(ino)?;
            let pages: Vec<(u64, u64, [u8; 8])> = n
                .pages
                .iter()
                .filter_map(|(&i, p)| match p.state {
                    PState::Unstable(v) => Some((i, p.gen, v)),
                    _ => None,
                })
                .collect();
            (n.fh.clone(), pages)
        };
        if pages.is_empty() {
            return Ok(());
        }
        let res = call!(self.pool, Commit, c => c.commit(&COMMIT3args { file: fh, offset: 0, count: 0 }));
        let now = Instant::now();
        let mut st = self.st();
        let outcome = match res {
            Ok(Nfs3Result::Ok(ok)) => {
                st.apply_wcc(&self.t, ino, &ok.file_wcc, now);
                Ok(ok.verf.0)
            }
            Ok(Nfs3Result::Err((s, f))) => {
                st.apply_wcc(&self.t, ino, &f.file_wcc, now);
                Err(errno(s))
            }
            // Lost connection: the pages stay unstable for a COMMIT on a new one.
            Err(_) => Err(Errno::EAGAIN),
        };
        if let Ok(cv) = outcome {
            let resend = pages.iter().filter(|p| p.2 != cv).count();
            tracing::debug!(ino, pages = pages.len(), resend, verifier = ?cv, "COMMIT");
        }
        for (idx, gen, v) in pages {
            let Some(p) = st.nodes.get_mut(&ino).and_then(|n| n.pages.get_mut(&idx)) else { continue };
            if p.gen != gen || p.state != PState::Unstable(v) {
                continue;
            }
            match outcome {
                Ok(cv) if cv == v => st.set_page_state(ino, idx, PState::Clean),
                Ok(_) => st.set_page_state(ino, idx, PState::Dirty),
                Err(e) if e == Errno::EAGAIN => {}
                Err(_) => st.remove_page(ino, idx),
            }
        }
        drop(st);
        self.changed.notify_waiters();
        outcome.map(|_| ())
    }

    /// Writes all dirty data of a file and commits it (close, fsync, truncate, unmount).
    pub async fn sync(self: &Arc<Self>, ino: u64) -> R<()> {
        for _ in 0..16 {
            self.flush_dirty(ino, 0, u64::MAX).await;
            self.wait_until(|s| s.nodes.get(&ino).is_some_and(|n| n.pages.values().any(|p| p.inflight))).await;
            let r = self.commit(ino).await;
            let mut st = self.st();
            let n = st.node_mut(ino)?;
            if let Some(e) = n.wb_error.take() {
                return Err(e);
            }
            match r {
                Err(e) if e == Errno::EAGAIN => continue,
                Err(e) => return Err(e),
                Ok(()) => {}
            }
            if !n.has_unwritten() {
                return Ok(());
            }
        }
        Err(Errno::EIO)
    }

    /// Writes back and commits every file; the first failure is returned after all were tried.
    pub async fn sync_all(self: &Arc<Self>) -> R<()> {
        let inos: Vec<u64> = self.st().nodes.iter().filter(|(_, n)| n.has_unwritten()).map(|(&i, _)| i).collect();
        let mut first = Ok(());
        for ino in inos {
            if let Err(e) = self.sync(ino).await {
                tracing::warn!(ino, error = ?e, "write-back failed");
                first = first.and(Err(e));
            }
        }
        first
    }

    /// Forgets every cached attribute, lookup, listing and clean page (dirty data is written
    /// and committed first), as after dropping the kernel's caches and remounting.
    pub async fn drop_caches(self: &Arc<Self>) {
        let _ = self.sync_all().await;
        {
            let mut st = self.st();
            let inos: Vec<u64> = st.nodes.keys().copied().collect();
            for ino in inos {
                st.drop_clean(ino);
                if let Some(n) = st.nodes.get_mut(&ino) {
                    n.timer.forced_stale = true;
                    n.dentries.clear();
                    n.listing = None;
                }
            }
            st.dirs.clear();
        }
        // A remount learns the root's attributes as it mounts; so does this cold start, which
        // then costs the next call what it costs after a remount.
        if let Err(e) = self.getattr_rpc(1).await {
            tracing::debug!(error = ?e, "GETATTR of the root after dropping the caches");
        }
    }

    pub fn release(&self, ino: u64, write: bool) {
        if let Some(n) = self.st().nodes.get_mut(&ino) {
            n.writers = n.writers.saturating_sub(u32::from(write));
        }
    }

    /// opendir: a handle whose listing is filled by the first readdir.
    pub fn opendir(&self) -> u64 {
        let mut st = self.st();
        st.next_fh += 1;
        st.next_fh
    }

    pub fn releasedir(&self, fh: u64) {
        self.st().dirs.remove(&fh);
    }

    /// The listing for readdir at `offset` (0 lists again; later offsets continue the same
    /// listing), from READDIRPLUS, whose attributes and handles prime the caches.
    pub async fn readdir(&self, ino: u64, fh: u64, offset: u64) -> R<Listing> {
        if offset > 0 {
            if let Some(l) = self.st().dirs.get(&fh) {
                return Ok(l.clone());
            }
        }
        self.revalidate(ino).await?;
        {
            let mut st = self.st();
            if let Some(l) = st.node(ino)?.listing.clone() {
                st.dirs.insert(fh, l.clone());
                return Ok(l);
            }
        }
        let dir = self.fh(ino)?;
        let mut cookie = 0;
        let mut cookieverf = nfs3_client::nfs3_types::nfs3::cookieverf3::default();
        let mut list: Vec<(u64, FileType, Vec<u8>)> =
            vec![(ino, FileType::Directory, b".".to_vec()), (ino, FileType::Directory, b"..".to_vec())];
        let mut names: Vec<(Vec<u8>, Option<u64>)> = Vec::new();
        loop {
            let args = READDIRPLUS3args {
                dir: dir.clone(),
                cookie,
                cookieverf,
                dircount: 32768.min(self.t.rsize),
                maxcount: self.t.rsize.min(1 << 20),
            };
            let res = call!(self.pool, Readdirplus, c => c.readdirplus(&args))?;
            let now = Instant::now();
            let ok = match res {
                Nfs3Result::Ok(ok) => ok,
                Nfs3Result::Err((s, f)) => {
                    self.st().apply_opt(&self.t, ino, &f.dir_attributes, now);
                    return Err(errno(s));
                }
            };
            let mut st = self.st();
            st.apply_opt(&self.t, ino, &ok.dir_attributes, now);
            cookieverf = ok.cookieverf;
            let eof = ok.reply.eof;
            let entries = ok.reply.entries.into_inner();
            let empty = entries.is_empty();
            for e in entries {
                cookie = e.cookie;
                let name = e.name.0.to_vec();
                if name == b"." || name == b".." {
                    continue;
                }
                let child = match (&e.name_handle, &e.name_attributes) {
                    (Nfs3Option::Some(h), Nfs3Option::Some(a)) => Some((st.intern(&self.t, h, a, now), kind(a.type_))),
                    _ => None,
                };
                match child {
                    Some((c, k)) => {
                        names.push((name.clone(), Some(c)));
                        list.push((c, k, name));
                    }
                    None => {
                        let c = st.by_fileid.get(&e.fileid).copied().unwrap_or(u64::MAX);
                        list.push((c, FileType::RegularFile, name));
                    }
                }
            }
            if eof || empty {
                break;
            }
        }
        let list = Arc::new(list);
        let mut st = self.st();
        let n = st.node_mut(ino)?;
        for (name, c) in names {
            n.dentries.insert(name, c);
        }
        n.listing = Some(list.clone());
        st.dirs.insert(fh, list.clone());
        Ok(list)
    }

    /// statfs: the kernel client sends FSSTAT on every statfs(2).
    pub async fn statfs(&self, namelen: u32) -> R<(u64, u64, u64, u64, u64, u32)> {
        let res = call!(self.pool, Fsstat, c => c.fsstat(&self.root_fh.clone().into()))?;
        match res {
            Nfs3Result::Ok(ok) => {
                self.st().apply_opt(&self.t, 1, &ok.obj_attributes, Instant::now());
                let b = PAGE;
                Ok((ok.tbytes / b, ok.fbytes / b, ok.abytes / b, ok.tfiles, ok.afiles, namelen))
            }
            Nfs3Result::Err((s, _)) => Err(errno(s)),
        }
    }
}

/// Attribute and entry lifetime in FUSE replies: zero, so every stat and lookup reaches us and
/// our cache alone decides.
pub const TTL: Duration = Duration::ZERO;

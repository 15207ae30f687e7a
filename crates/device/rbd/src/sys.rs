//! Safe handles over the few librados and librbd C calls the device needs: the one module with
//! `unsafe`. Declarations are written by hand from Ceph 16.2's `rados/librados.h` and
//! `rbd/librbd.h`.
//!
//! Ownership rules that make the asynchronous calls sound:
//! - An [`Image`] is shared as `Arc<Image>`; every request in flight holds one, so `rbd_close`
//!   (and, behind it, the I/O context and the cluster handle) runs only after librbd has
//!   completed every request, whatever happened to the futures that awaited them.
//! - A request's buffers live in a heap `Request` that librbd hands back to the completion
//!   callback; only the callback (or the submit path, when submission failed) frees it.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::mem::ManuallyDrop;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::ptr::{self, null, null_mut};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::oneshot;

#[allow(non_camel_case_types)]
mod ffi {
    use std::ffi::{c_char, c_int, c_void};

    pub type rados_t = *mut c_void;
    pub type rados_ioctx_t = *mut c_void;
    pub type rbd_image_t = *mut c_void;
    pub type rbd_completion_t = *mut c_void;
    /// `typedef void (*rbd_callback_t)(rbd_completion_t cb, void *arg);`
    pub type rbd_callback_t = Option<extern "C" fn(rbd_completion_t, *mut c_void)>;
    /// The extent callback of `rbd_diff_iterate2`: `int (*cb)(uint64_t, size_t, int, void *)`.
    pub type diff_cb_t = Option<extern "C" fn(u64, usize, c_int, *mut c_void) -> c_int>;

    /// `RBD_LOCK_MODE_EXCLUSIVE` of `rbd_lock_mode_t` (a C enum: `int`-sized).
    pub const RBD_LOCK_MODE_EXCLUSIVE: c_int = 0;

    /// `rbd_image_info_t`.
    #[repr(C)]
    pub struct rbd_image_info_t {
        pub size: u64,
        pub obj_size: u64,
        pub num_objs: u64,
        pub order: c_int,
        pub block_name_prefix: [c_char; 24],
        pub parent_pool: i64,
        pub parent_name: [c_char; 96],
    }

    /// `rbd_config_option_t`.
    #[repr(C)]
    pub struct rbd_config_option_t {
        pub name: *mut c_char,
        pub value: *mut c_char,
        pub source: c_int,
    }

    #[link(name = "rados")]
    extern "C" {
        pub fn rados_create2(
            pcluster: *mut rados_t,
            clustername: *const c_char,
            name: *const c_char,
            flags: u64,
        ) -> c_int;
        pub fn rados_conf_read_file(cluster: rados_t, path: *const c_char) -> c_int;
        pub fn rados_conf_set(cluster: rados_t, option: *const c_char, value: *const c_char) -> c_int;
        pub fn rados_conf_get(cluster: rados_t, option: *const c_char, buf: *mut c_char, len: usize) -> c_int;
        pub fn rados_connect(cluster: rados_t) -> c_int;
        pub fn rados_shutdown(cluster: rados_t);
        pub fn rados_cluster_fsid(cluster: rados_t, buf: *mut c_char, len: usize) -> c_int;
        pub fn rados_ioctx_create(cluster: rados_t, pool_name: *const c_char, ioctx: *mut rados_ioctx_t) -> c_int;
        pub fn rados_ioctx_destroy(io: rados_ioctx_t);
        pub fn rados_ioctx_get_id(io: rados_ioctx_t) -> i64;
    }

    #[link(name = "rbd")]
    extern "C" {
        pub fn rbd_open(
            io: rados_ioctx_t,
            name: *const c_char,
            image: *mut rbd_image_t,
            snap_name: *const c_char,
        ) -> c_int;
        pub fn rbd_open_read_only(
            io: rados_ioctx_t,
            name: *const c_char,
            image: *mut rbd_image_t,
            snap_name: *const c_char,
        ) -> c_int;
        pub fn rbd_close(image: rbd_image_t) -> c_int;
        pub fn rbd_stat(image: rbd_image_t, info: *mut rbd_image_info_t, infosize: usize) -> c_int;
        pub fn rbd_get_features(image: rbd_image_t, features: *mut u64) -> c_int;
        pub fn rbd_get_id(image: rbd_image_t, id: *mut c_char, id_len: usize) -> c_int;
        pub fn rbd_snap_get_id(image: rbd_image_t, snapname: *const c_char, snap_id: *mut u64) -> c_int;
        pub fn rbd_lock_acquire(image: rbd_image_t, lock_mode: c_int) -> c_int;
        pub fn rbd_lock_get_owners(
            image: rbd_image_t,
            lock_mode: *mut c_int,
            lock_owners: *mut *mut c_char,
            max_lock_owners: *mut usize,
        ) -> c_int;
        pub fn rbd_lock_get_owners_cleanup(lock_owners: *mut *mut c_char, lock_owner_count: usize);
        pub fn rbd_config_image_list(
            image: rbd_image_t,
            options: *mut rbd_config_option_t,
            max_options: *mut c_int,
        ) -> c_int;
        pub fn rbd_config_image_list_cleanup(options: *mut rbd_config_option_t, max_options: c_int);
        pub fn rbd_diff_iterate2(
            image: rbd_image_t,
            fromsnapname: *const c_char,
            ofs: u64,
            len: u64,
            include_parent: u8,
            whole_object: u8,
            cb: diff_cb_t,
            arg: *mut c_void,
        ) -> c_int;
        pub fn rbd_aio_create_completion(
            cb_arg: *mut c_void,
            complete_cb: rbd_callback_t,
            c: *mut rbd_completion_t,
        ) -> c_int;
        pub fn rbd_aio_get_return_value(c: rbd_completion_t) -> isize;
        pub fn rbd_aio_release(c: rbd_completion_t);
        pub fn rbd_aio_read(image: rbd_image_t, off: u64, len: usize, buf: *mut c_char, c: rbd_completion_t) -> c_int;
        pub fn rbd_aio_write(
            image: rbd_image_t,
            off: u64,
            len: usize,
            buf: *const c_char,
            c: rbd_completion_t,
        ) -> c_int;
        pub fn rbd_aio_flush(image: rbd_image_t, c: rbd_completion_t) -> c_int;
        pub fn rbd_aio_discard(image: rbd_image_t, off: u64, len: u64, c: rbd_completion_t) -> c_int;
        pub fn rbd_aio_writesame(
            image: rbd_image_t,
            off: u64,
            len: usize,
            buf: *const c_char,
            data_len: usize,
            c: rbd_completion_t,
            op_flags: c_int,
        ) -> c_int;
        pub fn rbd_aio_write_zeroes(
            image: rbd_image_t,
            off: u64,
            len: usize,
            c: rbd_completion_t,
            zero_flags: c_int,
            op_flags: c_int,
        ) -> c_int;
        pub fn rbd_aio_compare_and_write(
            image: rbd_image_t,
            off: u64,
            len: usize,
            cmp_buf: *const c_char,
            buf: *const c_char,
            c: rbd_completion_t,
            mismatch_off: *mut u64,
            op_flags: c_int,
        ) -> isize;
    }
}

/// `RBD_FEATURE_EXCLUSIVE_LOCK` of `rbd/features.h`.
pub const RBD_FEATURE_EXCLUSIVE_LOCK: u64 = 1 << 2;

/// A positive errno value from a failed librados or librbd call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    /// The error as `std::io::Error` (the form `BlockError::Io` carries).
    pub fn io(self) -> std::io::Error {
        std::io::Error::from_raw_os_error(self.0)
    }
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.io())
    }
}

impl std::error::Error for Errno {}

/// Ceph's convention: a negative return is `-errno`.
fn check(r: c_int) -> Result<c_int, Errno> {
    if r < 0 {
        Err(Errno(-r))
    } else {
        Ok(r)
    }
}

fn cstring(s: &str) -> Result<CString, Errno> {
    CString::new(s).map_err(|_| Errno(libc::EINVAL))
}

/// Text that librados or librbd wrote into `buf`, up to its first NUL.
fn text_of(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// A cluster handle (`rados_t`): configured, then connected; shut down on drop.
pub struct Rados {
    handle: ffi::rados_t,
}

// SAFETY: librados cluster handles may be used from any thread, and concurrently for the calls
// made here (configuration before connect happens on one thread; after it only thread-safe
// queries and I/O contexts are made).
unsafe impl Send for Rados {}
// SAFETY: as above.
unsafe impl Sync for Rados {}

impl Rados {
    /// A handle for cluster `ceph` as `name` (`client.ID`), not yet connected.
    pub fn create(name: &str) -> Result<Rados, Errno> {
        let cluster = cstring("ceph")?;
        let name = cstring(name)?;
        let mut handle: ffi::rados_t = null_mut();
        // SAFETY: both strings are NUL-terminated and outlive the call; `handle` is a valid out
        // pointer, set only on success.
        check(unsafe { ffi::rados_create2(&raw mut handle, cluster.as_ptr(), name.as_ptr(), 0) })?;
        Ok(Rados { handle })
    }

    /// Reads a config file; `None` searches the default places (`$CEPH_CONF`, then
    /// `/etc/ceph/ceph.conf`, `~/.ceph/config`, `./ceph.conf`).
    pub fn read_conf_file(&self, path: Option<&Path>) -> Result<(), Errno> {
        let path = path.map(|p| cstring(&p.to_string_lossy())).transpose()?;
        // SAFETY: a live handle; the path is NUL-terminated and outlives the call, or NULL, which
        // the header documents as "search the default locations".
        check(unsafe { ffi::rados_conf_read_file(self.handle, path.as_ref().map_or(null(), |p| p.as_ptr())) })?;
        Ok(())
    }

    /// Sets one configuration option.
    pub fn conf_set(&self, key: &str, value: &str) -> Result<(), Errno> {
        let (k, v) = (cstring(key)?, cstring(value)?);
        // SAFETY: a live handle and two NUL-terminated strings that outlive the call.
        check(unsafe { ffi::rados_conf_set(self.handle, k.as_ptr(), v.as_ptr()) })?;
        Ok(())
    }

    /// Reads one configuration option back.
    pub fn conf_get(&self, key: &str) -> Result<String, Errno> {
        let k = cstring(key)?;
        let mut buf = vec![0u8; 4096];
        // SAFETY: a live handle; `buf` is writable for its whole length, which is what we pass.
        check(unsafe { ffi::rados_conf_get(self.handle, k.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })?;
        Ok(text_of(&buf))
    }

    /// Connects to the monitors (blocks; bounded by `client_mount_timeout`).
    pub fn connect(&self) -> Result<(), Errno> {
        // SAFETY: a live, configured handle that is not connected yet.
        check(unsafe { ffi::rados_connect(self.handle) })?;
        Ok(())
    }

    /// The cluster's fsid (a UUID), once connected.
    pub fn fsid(&self) -> Result<String, Errno> {
        let mut buf = [0u8; 64];
        // SAFETY: a live, connected handle; `buf` is writable for the length we pass.
        check(unsafe { ffi::rados_cluster_fsid(self.handle, buf.as_mut_ptr().cast(), buf.len()) })?;
        Ok(text_of(&buf))
    }
}

impl Drop for Rados {
    fn drop(&mut self) {
        // SAFETY: the handle is live and this is its last use; every I/O context holds an `Arc`
        // of this `Rados`, so none outlives the shutdown.
        unsafe { ffi::rados_shutdown(self.handle) };
    }
}

/// An I/O context on one pool (`rados_ioctx_t`); keeps its cluster handle alive.
pub struct IoCtx {
    handle: ffi::rados_ioctx_t,
    _rados: Arc<Rados>,
}

// SAFETY: an I/O context may be shared between threads for I/O; nothing here changes its state
// (snapshot or namespace settings) after creation.
unsafe impl Send for IoCtx {}
// SAFETY: as above.
unsafe impl Sync for IoCtx {}

impl IoCtx {
    /// Opens pool `pool` (blocks until the cluster map is known).
    pub fn create(rados: &Arc<Rados>, pool: &str) -> Result<Arc<IoCtx>, Errno> {
        let name = cstring(pool)?;
        let mut handle: ffi::rados_ioctx_t = null_mut();
        // SAFETY: a live, connected cluster handle; NUL-terminated name; valid out pointer.
        check(unsafe { ffi::rados_ioctx_create(rados.handle, name.as_ptr(), &raw mut handle) })?;
        Ok(Arc::new(IoCtx { handle, _rados: Arc::clone(rados) }))
    }

    /// The pool's numeric id.
    pub fn pool_id(&self) -> i64 {
        // SAFETY: a live I/O context.
        unsafe { ffi::rados_ioctx_get_id(self.handle) }
    }
}

impl Drop for IoCtx {
    fn drop(&mut self) {
        // SAFETY: the handle is live and this is its last use: every image holds an `Arc` of
        // this context, so none is open on it any more.
        unsafe { ffi::rados_ioctx_destroy(self.handle) };
    }
}

/// Size and object size of an image (or snapshot), from `rbd_stat`.
#[derive(Debug, Clone, Copy)]
pub struct Stat {
    pub size: u64,
    pub obj_size: u64,
}

/// An open image (`rbd_image_t`), shared as `Arc<Image>`; closed when the last request that
/// uses it has completed and every handle is gone.
pub struct Image {
    handle: ffi::rbd_image_t,
    pool_id: i64,
    /// Always `Some` until `drop`, which may hand it to the closing thread.
    ioctx: Option<Arc<IoCtx>>,
}

// SAFETY: librbd image handles are thread-safe for I/O and for the queries made here (qemu and
// tcmu-runner submit from many threads at once); only `rbd_close` must not race with other
// calls, and it runs in `Drop`, when no other reference exists.
unsafe impl Send for Image {}
// SAFETY: as above.
unsafe impl Sync for Image {}

/// Raw handle that may cross to the closing thread (see `Drop for Image`).
struct CloseOnThread(ffi::rbd_image_t);
// SAFETY: the handle is only closed on the other thread, and nothing else refers to it then.
unsafe impl Send for CloseOnThread {}

thread_local! {
    /// True while this thread runs our completion callback, i.e. is one of librbd's own threads.
    static IN_CALLBACK: Cell<bool> = const { Cell::new(false) };
}

impl Drop for Image {
    fn drop(&mut self) {
        let handle = CloseOnThread(self.handle);
        if !IN_CALLBACK.with(Cell::get) {
            close(&handle);
            return;
        }
        // The last reference died inside a completion callback (its future was cancelled, the
        // device dropped meanwhile). Closing there would make librbd wait on the thread it is
        // running on, so the close, and dropping the context behind it, move to a thread of
        // their own: rare, one thread per device, never per request. Should no thread start,
        // the closure is dropped unrun and `ManuallyDrop` leaks the context with the image
        // still open, rather than deadlock or destroy the context under an open image.
        let ioctx = ManuallyDrop::new(self.ioctx.take());
        let _ = std::thread::Builder::new().name("rbd-close".into()).spawn(move || {
            close(&handle);
            drop(ManuallyDrop::into_inner(ioctx));
        });
    }
}

fn close(handle: &CloseOnThread) {
    // SAFETY: the handle came from a successful rbd_open and this is its only close: `Image`
    // is dropped once, and no request is in flight (each holds an `Arc<Image>`).
    unsafe { ffi::rbd_close(handle.0) };
}

impl Image {
    /// Opens image `name` of the pool (blocks). `snap` opens that snapshot; `read_only` opens
    /// without ever taking a lock or writing.
    pub fn open(ioctx: &Arc<IoCtx>, name: &str, snap: Option<&str>, read_only: bool) -> Result<Arc<Image>, Errno> {
        let name = cstring(name)?;
        let snap = snap.map(cstring).transpose()?;
        let snap_ptr = snap.as_ref().map_or(null(), |s| s.as_ptr());
        let mut handle: ffi::rbd_image_t = null_mut();
        // SAFETY: a live I/O context; NUL-terminated name and snapshot name (or NULL for the
        // head, as the header allows); a valid out pointer set only on success.
        let r = unsafe {
            if read_only {
                ffi::rbd_open_read_only(ioctx.handle, name.as_ptr(), &raw mut handle, snap_ptr)
            } else {
                ffi::rbd_open(ioctx.handle, name.as_ptr(), &raw mut handle, snap_ptr)
            }
        };
        check(r)?;
        Ok(Arc::new(Image { handle, pool_id: ioctx.pool_id(), ioctx: Some(Arc::clone(ioctx)) }))
    }

    /// The id of the pool the image lives in.
    pub fn pool_id(&self) -> i64 {
        self.pool_id
    }

    /// Size and object size of what was opened (the snapshot's, for a snapshot).
    pub fn stat(&self) -> Result<Stat, Errno> {
        // SAFETY: rbd_image_info_t is plain integers and byte arrays: all zeros is a valid value.
        let mut info: ffi::rbd_image_info_t = unsafe { std::mem::zeroed() };
        // SAFETY: a live image; `info` is writable and we pass its exact size.
        check(unsafe { ffi::rbd_stat(self.handle, &raw mut info, size_of::<ffi::rbd_image_info_t>()) })?;
        Ok(Stat { size: info.size, obj_size: info.obj_size })
    }

    /// The image's feature bits (`RBD_FEATURE_*`).
    pub fn features(&self) -> Result<u64, Errno> {
        let mut features = 0u64;
        // SAFETY: a live image and a valid out pointer.
        check(unsafe { ffi::rbd_get_features(self.handle, &raw mut features) })?;
        Ok(features)
    }

    /// The image's id: unlike its name, it survives renames.
    pub fn id(&self) -> Result<String, Errno> {
        let mut buf = [0u8; 128];
        // SAFETY: a live image; `buf` is writable for the length we pass.
        check(unsafe { ffi::rbd_get_id(self.handle, buf.as_mut_ptr().cast(), buf.len()) })?;
        Ok(text_of(&buf))
    }

    /// The id of snapshot `name`.
    pub fn snap_id(&self, name: &str) -> Result<u64, Errno> {
        let name = cstring(name)?;
        let mut id = 0u64;
        // SAFETY: a live image, a NUL-terminated name and a valid out pointer.
        check(unsafe { ffi::rbd_snap_get_id(self.handle, name.as_ptr(), &raw mut id) })?;
        Ok(id)
    }

    /// Takes the image's exclusive lock and keeps it: librbd then refuses to hand it to another
    /// client that asks (blocks while a previous owner's watch is still registered).
    pub fn lock_acquire_exclusive(&self) -> Result<(), Errno> {
        // SAFETY: a live image opened read-write.
        check(unsafe { ffi::rbd_lock_acquire(self.handle, ffi::RBD_LOCK_MODE_EXCLUSIVE) })?;
        Ok(())
    }

    /// The current owners of the image's lock (client addresses), empty when none.
    pub fn lock_owners(&self) -> Result<Vec<String>, Errno> {
        let mut cap = 4usize;
        for _ in 0..4 {
            let mut owners: Vec<*mut c_char> = vec![null_mut(); cap];
            let mut n = cap;
            let mut mode: c_int = 0;
            // SAFETY: a live image; `owners` has room for `n` pointers, which librbd fills with
            // strings it allocates (freed by the cleanup call below).
            let r = unsafe { ffi::rbd_lock_get_owners(self.handle, &raw mut mode, owners.as_mut_ptr(), &raw mut n) };
            if r == -libc::ERANGE && n > cap {
                cap = n;
                continue;
            }
            if r == -libc::ENOENT {
                return Ok(Vec::new());
            }
            check(r)?;
            let n = n.min(cap);
            let names = owners[..n]
                .iter()
                .filter(|p| !p.is_null())
                // SAFETY: librbd set the first `n` entries to NUL-terminated strings that stay
                // valid until the cleanup call.
                .map(|&p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
                .collect();
            // SAFETY: frees exactly the `n` strings the successful call allocated, once.
            unsafe { ffi::rbd_lock_get_owners_cleanup(owners.as_mut_ptr(), n) };
            return Ok(names);
        }
        Err(Errno(libc::ERANGE))
    }

    /// The value of librbd option `name` in force for this image: the client's setting, or
    /// the pool's or image's own override (`rbd config image set`).
    pub fn config(&self, name: &str) -> Result<Option<String>, Errno> {
        let mut cap: c_int = 256;
        for _ in 0..4 {
            let len = usize::try_from(cap).map_err(|_| Errno(libc::ERANGE))?;
            let mut options: Vec<ffi::rbd_config_option_t> = Vec::with_capacity(len);
            options.resize_with(len, || ffi::rbd_config_option_t { name: null_mut(), value: null_mut(), source: 0 });
            let mut n = cap;
            // SAFETY: a live image; `options` has room for `n` entries, which librbd fills with
            // strings it allocates (freed by the cleanup call below).
            let r = unsafe { ffi::rbd_config_image_list(self.handle, options.as_mut_ptr(), &raw mut n) };
            if r == -libc::ERANGE && n > cap {
                cap = n;
                continue;
            }
            check(r)?;
            let n = n.clamp(0, cap);
            let found = options[..n as usize]
                .iter()
                .filter(|o| !o.name.is_null() && !o.value.is_null())
                // SAFETY: librbd set both strings of the first `n` entries; they stay valid
                // until the cleanup call.
                .find(|o| unsafe { CStr::from_ptr(o.name) }.to_bytes() == name.as_bytes())
                // SAFETY: as above.
                .map(|o| unsafe { CStr::from_ptr(o.value) }.to_string_lossy().into_owned());
            // SAFETY: frees exactly the `n` entries the successful call filled, once.
            unsafe { ffi::rbd_config_image_list_cleanup(options.as_mut_ptr(), n) };
            return Ok(found);
        }
        Err(Errno(libc::ERANGE))
    }

    /// Byte extents `(offset, length)` that hold data within `off..off + len`, including what a
    /// clone's parent provides, in no particular order (blocks while it asks the OSDs).
    pub fn allocated_extents(&self, off: u64, len: u64) -> Result<Vec<(u64, u64)>, Errno> {
        // librbd may call back from its own threads while the call runs: hence the mutex.
        let found: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());
        // SAFETY: a live image; NULL "from snapshot" (diff against nothing: what exists), and
        // `arg` points at `found`, which outlives the call; librbd calls `extent_cb` only until
        // rbd_diff_iterate2 returns.
        let r = unsafe {
            ffi::rbd_diff_iterate2(
                self.handle,
                null(),
                off,
                len,
                1,
                0,
                Some(extent_cb),
                ptr::from_ref(&found) as *mut c_void,
            )
        };
        check(r)?;
        Ok(found.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

extern "C" fn extent_cb(off: u64, len: usize, exists: c_int, arg: *mut c_void) -> c_int {
    let r = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `arg` is the `&Mutex<Vec<..>>` that `allocated_extents` passed, alive for
        // the whole rbd_diff_iterate2 call during which librbd calls us; shared access only.
        let found = unsafe { &*(arg as *const Mutex<Vec<(u64, u64)>>) };
        if exists != 0 && len > 0 {
            found.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((off, len as u64));
        }
    }));
    // A non-zero return stops the iteration, which then fails: better than a wrong answer.
    if r.is_ok() {
        0
    } else {
        -libc::EIO
    }
}

/// What the completion callback sends back to the awaiting future.
struct Done {
    ret: isize,
    read: Option<Vec<u8>>,
    mismatch: u64,
}

/// Buffers a request lends to librbd until its completion.
enum Payload {
    None,
    Read(Vec<u8>),
    Write(Bytes),
    CompareAndWrite { cmp: Bytes, data: Bytes },
}

/// Per-request state, on the heap from submission until the callback (or a failed submit)
/// takes it back: librbd may use `payload` and `mismatch` until then, and `image` keeps the
/// image open even if the future awaiting `tx` is dropped.
struct Request {
    image: Arc<Image>,
    payload: Payload,
    mismatch: u64,
    tx: oneshot::Sender<Done>,
}

/// Which asynchronous call a request makes.
#[derive(Clone, Copy)]
enum Op {
    Read { off: u64 },
    Write { off: u64 },
    Flush,
    Discard { off: u64, len: u64 },
    WriteZeroes { off: u64, len: usize },
    WriteSame { off: u64, len: usize },
    CompareAndWrite { off: u64 },
}

/// The completion callback, on a librbd thread. It owns the `Request` from here on.
extern "C" fn complete(c: ffi::rbd_completion_t, arg: *mut c_void) {
    // Nothing below should panic; if it did, unwinding into librbd would be undefined, so the
    // request is given up (its future sees a closed channel and reports EIO).
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `c` is the completion librbd is completing; its value is read before the
        // release, and `c` is not used after it.
        let ret = unsafe { ffi::rbd_aio_get_return_value(c) };
        // SAFETY: as above: our one reference to `c`, released once.
        unsafe { ffi::rbd_aio_release(c) };
        // SAFETY: `arg` is the pointer `Box::into_raw` gave in `Image::submit`. librbd calls
        // this callback once per completion, and `submit` reclaims the box itself only when the
        // submit call failed, in which case librbd never took the completion: one owner.
        let req = unsafe { Box::from_raw(arg.cast::<Request>()) };
        let Request { image, payload, mismatch, tx } = *req;
        // librbd is done with the image for this request. Letting go of it before the result
        // is sent means an awaiting caller that then drops the device holds the last reference
        // and closes the image itself; only after a cancelled request can the last one be here.
        IN_CALLBACK.with(|f| f.set(true));
        drop(image);
        IN_CALLBACK.with(|f| f.set(false));
        let read = match payload {
            Payload::Read(buf) => Some(buf),
            _ => None,
        };
        // A receiver that is gone (a cancelled future) just drops the result.
        let _ = tx.send(Done { ret, read, mismatch });
    }));
}

impl Image {
    /// Hands one request to librbd and returns the channel its completion arrives on.
    fn submit(self: &Arc<Self>, op: Op, payload: Payload) -> Result<oneshot::Receiver<Done>, Errno> {
        let (tx, rx) = oneshot::channel();
        let req = Box::into_raw(Box::new(Request { image: Arc::clone(self), payload, mismatch: 0, tx }));
        // SAFETY: `req` came from Box::into_raw just above and nothing else uses it yet; the
        // pointers taken here are into the heap blocks of the payload's Vec/Bytes (which do not
        // move while the `Request` lives) and into the `Request` itself.
        let (buf, buf2, len, mismatch) = unsafe {
            let mismatch = &raw mut (*req).mismatch;
            match &mut (*req).payload {
                Payload::None => (null_mut::<u8>(), null::<u8>(), 0, mismatch),
                Payload::Read(v) => (v.as_mut_ptr(), null(), v.len(), mismatch),
                Payload::Write(b) => (b.as_ptr().cast_mut(), null(), b.len(), mismatch),
                Payload::CompareAndWrite { cmp, data } => {
                    (cmp.as_ptr().cast_mut(), data.as_ptr(), data.len(), mismatch)
                }
            }
        };
        let mut c: ffi::rbd_completion_t = null_mut();
        // SAFETY: `req` is a valid pointer that the callback will own; `complete` matches
        // rbd_callback_t; `c` is a valid out pointer.
        let r = unsafe { ffi::rbd_aio_create_completion(req.cast(), Some(complete), &raw mut c) };
        if r < 0 {
            // SAFETY: no completion exists, so no callback can run: we still own `req`.
            drop(unsafe { Box::from_raw(req) });
            return Err(Errno(-r));
        }
        let image = self.handle;
        // SAFETY: a live image (this `Arc` and the request's own keep it open); every buffer
        // pointer is valid for `len` bytes (reads: writable) and stays valid until the callback
        // frees the `Request`; `c` is a fresh completion used for exactly this call.
        let r: isize = unsafe {
            match op {
                Op::Read { off } => ffi::rbd_aio_read(image, off, len, buf.cast(), c) as isize,
                Op::Write { off } => ffi::rbd_aio_write(image, off, len, buf.cast_const().cast(), c) as isize,
                Op::Flush => ffi::rbd_aio_flush(image, c) as isize,
                Op::Discard { off, len } => ffi::rbd_aio_discard(image, off, len, c) as isize,
                Op::WriteZeroes { off, len } => ffi::rbd_aio_write_zeroes(image, off, len, c, 0, 0) as isize,
                Op::WriteSame { off, len: total } => {
                    ffi::rbd_aio_writesame(image, off, total, buf.cast_const().cast(), len, c, 0) as isize
                }
                Op::CompareAndWrite { off } => ffi::rbd_aio_compare_and_write(
                    image,
                    off,
                    len,
                    buf.cast_const().cast(),
                    buf2.cast(),
                    c,
                    mismatch,
                    0,
                ),
            }
        };
        if r < 0 {
            // librbd returns an error from a submit call only when it refused the request
            // before queuing it (errors of queued requests arrive through the completion), so
            // the callback never runs for `c`: we release the completion and reclaim the box
            // here, and the callback, which would otherwise own both, never sees them.
            // SAFETY: `c` was created above and never handed to a queued request.
            unsafe { ffi::rbd_aio_release(c) };
            // SAFETY: as above: no callback will run, so this is the box's only owner.
            drop(unsafe { Box::from_raw(req) });
            return Err(Errno(i32::try_from(-r).unwrap_or(libc::EIO)));
        }
        Ok(rx)
    }

    /// Waits for a request's completion; a negative return becomes `Err`, except `EILSEQ` when
    /// `miscompare_ok` (compare-and-write's "the data differ", whose offset rides in `Done`).
    async fn finish(rx: oneshot::Receiver<Done>, miscompare_ok: bool) -> Result<Done, Errno> {
        let done = rx.await.map_err(|_| Errno(libc::EIO))?;
        if done.ret >= 0 || (miscompare_ok && done.ret == -(libc::EILSEQ as isize)) {
            return Ok(done);
        }
        Err(Errno(i32::try_from(-done.ret).unwrap_or(libc::EIO)))
    }

    /// Reads `len` bytes at byte offset `off`.
    pub async fn read(self: &Arc<Self>, off: u64, len: usize) -> Result<Bytes, Errno> {
        let rx = self.submit(Op::Read { off }, Payload::Read(vec![0u8; len]))?;
        let done = Self::finish(rx, false).await?;
        Ok(done.read.map(Bytes::from).unwrap_or_default())
    }

    /// Writes `data` at byte offset `off`; durable on completion when librbd's cache is off.
    pub async fn write(self: &Arc<Self>, off: u64, data: Bytes) -> Result<(), Errno> {
        let rx = self.submit(Op::Write { off }, Payload::Write(data))?;
        Self::finish(rx, false).await.map(drop)
    }

    /// Makes every completed write durable (a no-op without librbd's cache, passed on anyway).
    pub async fn flush(self: &Arc<Self>) -> Result<(), Errno> {
        let rx = self.submit(Op::Flush, Payload::None)?;
        Self::finish(rx, false).await.map(drop)
    }

    /// Discards `len` bytes at `off`.
    pub async fn discard(self: &Arc<Self>, off: u64, len: u64) -> Result<(), Errno> {
        let rx = self.submit(Op::Discard { off, len }, Payload::None)?;
        Self::finish(rx, false).await.map(drop)
    }

    /// Zeroes `len` bytes at `off` (librbd frees what it can and zeroes the rest).
    pub async fn write_zeroes(self: &Arc<Self>, off: u64, len: usize) -> Result<(), Errno> {
        let rx = self.submit(Op::WriteZeroes { off, len }, Payload::None)?;
        Self::finish(rx, false).await.map(drop)
    }

    /// Writes `pattern` repeatedly over `len` bytes at `off` (`len` a multiple of its length).
    pub async fn write_same(self: &Arc<Self>, off: u64, len: usize, pattern: Bytes) -> Result<(), Errno> {
        let rx = self.submit(Op::WriteSame { off, len }, Payload::Write(pattern))?;
        Self::finish(rx, false).await.map(drop)
    }

    /// Writes `data` at `off` if the image holds `cmp` there, atomically. `Ok(None)` when it
    /// matched and was written; `Ok(Some(at))` on a miscompare, `at` being the offset librbd
    /// reported (see `RbdDev::compare_and_write` for what it counts from).
    pub async fn compare_and_write(self: &Arc<Self>, off: u64, cmp: Bytes, data: Bytes) -> Result<Option<u64>, Errno> {
        if cmp.len() != data.len() {
            return Err(Errno(libc::EINVAL));
        }
        let rx = self.submit(Op::CompareAndWrite { off }, Payload::CompareAndWrite { cmp, data })?;
        let done = Self::finish(rx, true).await?;
        if done.ret == -(libc::EILSEQ as isize) {
            return Ok(Some(done.mismatch));
        }
        Ok(None)
    }
}

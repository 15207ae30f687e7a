//! Thin wrappers over the system calls the emulator needs: netlink and packet sockets, joining a
//! network namespace, switching off segmentation offloads, clocks, absolute-deadline timers and
//! polling.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use crate::nfq;
use crate::{Result, WanError};

fn check(ret: libc::c_int, op: &str) -> Result<libc::c_int> {
    if ret < 0 {
        Err(WanError::last_os(op))
    } else {
        Ok(ret)
    }
}

/// Moves the calling thread into the network namespace at `path` (e.g. `/run/netns/NAME`).
pub fn setns_net(path: &Path) -> Result<()> {
    let f = File::open(path).map_err(|e| WanError::io(format!("open {}", path.display()), e))?;
    // SAFETY: setns takes a valid open descriptor, which `f` keeps alive for the call.
    check(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }, "setns")?;
    Ok(())
}

/// Asks the kernel to wake this thread's timers with 1 ns slack instead of the default 50 µs.
pub fn tight_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes an integer argument and touches no memory.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
    }
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid timespec for the call to fill; both clocks always exist on Linux.
    unsafe { libc::clock_gettime(clock, &raw mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of every delay-line time and timer deadline.
pub fn mono_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// `CLOCK_REALTIME` in nanoseconds: the clock of the kernel's packet timestamps.
pub fn realtime_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

/// Keeps the kernel stamping every received packet with its arrival time while it lives.
///
/// The stamps are switched on machine-wide by any socket that asks for receive timestamps (as
/// `ping` and `tcpdump` do); this one is held only for that and never reads anything. The
/// netfilter queue then hands each packet's stamp to user space, so the delay counts from the
/// moment the packet reached the router, not from when our thread got round to reading it.
#[derive(Debug)]
pub struct RxStamps {
    _fd: OwnedFd,
}

impl RxStamps {
    pub fn enable() -> Result<RxStamps> {
        // SAFETY: plain socket creation, owned right away.
        let fd = check(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) }, "socket")?;
        // SAFETY: fd was just created.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        setsockopt_int(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)?;
        Ok(RxStamps { _fd: fd })
    }
}

/// A `CLOCK_MONOTONIC` timerfd armed with absolute deadlines: unlike a poll timeout, its expiry
/// gets no slack proportional to the length of the sleep.
#[derive(Debug)]
pub struct Timer {
    fd: OwnedFd,
}

impl Timer {
    pub fn new() -> Result<Timer> {
        let fd = check(
            // SAFETY: plain timerfd creation, owned right away.
            unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) },
            "timerfd_create",
        )?;
        // SAFETY: fd was just created.
        Ok(Timer { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Fires at `deadline_ns` on [`mono_ns`]'s clock. Re-arming also clears an earlier expiry,
    /// so the descriptor is readable only once the new deadline has passed.
    pub fn arm_at(&self, deadline_ns: u64) -> Result<()> {
        // A zero it_value would disarm the timer; the clock is never that young anyway.
        let at = deadline_ns.max(1);
        let spec = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: libc::timespec {
                tv_sec: (at / 1_000_000_000) as libc::time_t,
                tv_nsec: (at % 1_000_000_000) as libc::c_long,
            },
        };
        check(
            // SAFETY: spec is a valid itimerspec; the old value is not asked for.
            unsafe {
                libc::timerfd_settime(
                    self.fd.as_raw_fd(),
                    libc::TFD_TIMER_ABSTIME,
                    &raw const spec,
                    std::ptr::null_mut(),
                )
            },
            "timerfd_settime",
        )?;
        Ok(())
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Sleeps until `a` or `b` is readable (or a signal arrives); says which are.
pub fn wait_either(a: RawFd, b: RawFd) -> Result<(bool, bool)> {
    let mut pfds = [
        libc::pollfd { fd: a, events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: b, events: libc::POLLIN, revents: 0 },
    ];
    // SAFETY: pfds outlives the call and its length is passed.
    let r = unsafe { libc::ppoll(pfds.as_mut_ptr(), 2, std::ptr::null(), std::ptr::null()) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok((false, false));
        }
        return Err(WanError::io("ppoll", e));
    }
    let ready = |p: &libc::pollfd| p.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0;
    Ok((ready(&pfds[0]), ready(&pfds[1])))
}

fn setsockopt_int(fd: RawFd, level: libc::c_int, name: libc::c_int, val: libc::c_int) -> Result<()> {
    check(
        // SAFETY: val lives across the call and its size is passed.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&raw const val).cast::<libc::c_void>(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        },
        "setsockopt",
    )?;
    Ok(())
}

/// Room for many netlink datagrams, filled by one `recvmmsg`.
pub struct RecvBatch {
    slot: usize,
    buf: Vec<u8>,
    iov: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
}

impl RecvBatch {
    /// `slots` datagrams of up to `slot` bytes each (a longer one is cut short and reported as
    /// truncated by its length).
    pub fn new(slots: usize, slot: usize) -> RecvBatch {
        let mut buf = vec![0u8; slots * slot];
        let base = buf.as_mut_ptr();
        // The vectors are never resized, so these pointers into `buf` stay valid for its life.
        let mut iov: Vec<libc::iovec> = (0..slots)
            // SAFETY: i * slot stays within buf's slots * slot bytes.
            .map(|i| libc::iovec { iov_base: unsafe { base.add(i * slot) }.cast::<libc::c_void>(), iov_len: slot })
            .collect();
        let iov_base = iov.as_mut_ptr();
        let hdrs = (0..slots)
            .map(|i| {
                // SAFETY: an all-zero msghdr (no name, no control data) is valid.
                let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
                // SAFETY: i < slots, the length of iov.
                h.msg_hdr.msg_iov = unsafe { iov_base.add(i) };
                h.msg_hdr.msg_iovlen = 1;
                h
            })
            .collect();
        RecvBatch { slot, buf, iov, hdrs }
    }

    pub fn slots(&self) -> usize {
        self.hdrs.len()
    }

    /// The `i`th datagram of the last receive (empty past the end).
    pub fn datagram(&self, i: usize) -> &[u8] {
        let len = self.hdrs.get(i).map_or(0, |h| h.msg_len as usize).min(self.slot);
        self.buf.get(i * self.slot..i * self.slot + len).unwrap_or(&[])
    }
}

/// Waits until one of `fds` is readable or `timeout_ns` passes; returns which fds are readable.
pub fn poll_in(fds: &[RawFd], timeout_ns: Option<u64>) -> Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> =
        fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    let ts = timeout_ns.map(|ns| libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    });
    let tsp = ts.as_ref().map_or(std::ptr::null(), std::ptr::from_ref::<libc::timespec>);
    // SAFETY: pfds and ts outlive the call; the length matches the vector.
    let r = unsafe { libc::ppoll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, tsp, std::ptr::null()) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(vec![false; fds.len()]);
        }
        return Err(WanError::io("ppoll", e));
    }
    Ok(pfds.iter().map(|p| p.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0).collect())
}

/// A netlink socket bound to one netfilter queue, in the namespace of the thread that opened it.
#[derive(Debug)]
pub struct NfqSocket {
    fd: OwnedFd,
    queue: u16,
    seq: u32,
}

impl NfqSocket {
    /// Opens a socket, binds `queue` and asks for the first `copy_range` bytes of each packet.
    pub fn open(queue: u16, copy_range: u32, maxlen: u32, rcvbuf: usize) -> Result<NfqSocket> {
        let fd = check(
            // SAFETY: plain socket creation; the descriptor is owned right away.
            unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, nfq::NETLINK_NETFILTER) },
            "socket(AF_NETLINK)",
        )?;
        // SAFETY: `fd` was just returned by socket() and nobody else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: a zeroed sockaddr_nl is valid; pid 0 lets the kernel pick the port id.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        check(
            // SAFETY: addr is a valid sockaddr_nl of the given size.
            unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    (&raw const addr).cast::<libc::sockaddr>(),
                    std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
                )
            },
            "bind(netlink)",
        )?;
        let s = NfqSocket { fd, queue, seq: 0 };
        // A large receive buffer absorbs bursts; without ENOBUFS reports a full buffer only
        // costs the packets the kernel could not deliver, which the kernel then drops.
        setsockopt_int(s.raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, rcvbuf as libc::c_int)?;
        setsockopt_int(s.raw_fd(), libc::SOL_NETLINK, libc::NETLINK_NO_ENOBUFS, 1)?;
        let mut s = s;
        let seq = s.next_seq();
        s.request(&nfq::bind(queue, seq), seq)?;
        let seq = s.next_seq();
        s.request(&nfq::params(queue, seq, copy_range, maxlen), seq)?;
        s.set_nonblocking()?;
        Ok(s)
    }

    fn next_seq(&mut self) -> u32 {
        self.seq += 1;
        self.seq
    }

    fn set_nonblocking(&self) -> Result<()> {
        // SAFETY: fcntl on an owned descriptor.
        let flags = check(unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_GETFL) }, "fcntl")?;
        // SAFETY: as above.
        check(unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) }, "fcntl")?;
        Ok(())
    }

    /// Sends a request and waits for its acknowledgement (the socket is still blocking here).
    fn request(&mut self, msg: &[u8], seq: u32) -> Result<()> {
        self.send(msg)?;
        let mut buf = vec![0u8; 8192];
        loop {
            let n = self.recv_blocking(&mut buf)?;
            let mut result = None;
            nfq::parse(buf.get(..n).unwrap_or(&[]), |m| {
                if let nfq::Msg::Ack { seq: s, errno } = m {
                    if s == seq {
                        result = Some(errno);
                    }
                }
            })
            .map_err(|e| WanError::Netlink(format!("bad reply: {}", e.0)))?;
            match result {
                Some(0) => return Ok(()),
                Some(errno) => {
                    return Err(WanError::Netlink(format!(
                        "queue {} config: {}",
                        self.queue,
                        io::Error::from_raw_os_error(errno)
                    )))
                }
                None => {}
            }
        }
    }

    fn recv_blocking(&self, buf: &mut [u8]) -> Result<usize> {
        // SAFETY: buf is valid for writes of its length.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast::<libc::c_void>(), buf.len(), 0) };
        if n < 0 {
            return Err(WanError::last_os("recv(netlink)"));
        }
        Ok(n as usize)
    }

    /// Receives as many waiting datagrams as `batch` holds with one system call, without
    /// blocking; returns how many (0 when nothing is waiting).
    pub fn recv_batch(&self, batch: &mut RecvBatch) -> Result<usize> {
        for h in &mut batch.hdrs {
            h.msg_len = 0;
            h.msg_hdr.msg_flags = 0;
        }
        debug_assert_eq!(batch.iov.len(), batch.hdrs.len());
        // SAFETY: every header points at its own iovec, which points into batch.buf; all live
        // across the call, and the count passed is the number of headers.
        let n = unsafe {
            libc::recvmmsg(
                self.fd.as_raw_fd(),
                batch.hdrs.as_mut_ptr(),
                batch.hdrs.len() as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                // Nothing waiting, or a lost notification that leaves nothing to answer.
                Some(libc::EAGAIN | libc::EINTR | libc::ENOBUFS) => Ok(0),
                _ => Err(WanError::io("recvmmsg(netlink)", e)),
            };
        }
        Ok(n as usize)
    }

    /// Sends one or more netlink messages in a single datagram.
    pub fn send(&self, msg: &[u8]) -> Result<()> {
        // SAFETY: msg is valid for reads of its length.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), msg.as_ptr().cast::<libc::c_void>(), msg.len(), 0) };
        if n < 0 {
            return Err(WanError::last_os("send(netlink)"));
        }
        Ok(())
    }

    pub fn queue(&self) -> u16 {
        self.queue
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

#[repr(C)]
struct IfreqData {
    name: [u8; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_STSO: u32 = 0x1f;
const ETHTOOL_SGSO: u32 = 0x24;
const ETHTOOL_SGRO: u32 = 0x2c;

fn ifname_bytes(ifname: &str) -> Result<[u8; libc::IFNAMSIZ]> {
    let mut name = [0u8; libc::IFNAMSIZ];
    if ifname.len() >= libc::IFNAMSIZ {
        return Err(WanError::param("interface", ifname, "name too long"));
    }
    name[..ifname.len()].copy_from_slice(ifname.as_bytes());
    Ok(name)
}

/// Switches TSO, GSO and GRO off on `ifname` (in the calling thread's namespace), so each loss
/// decision and each queue slot is one MSS-sized segment, not a 64 KB super-packet.
pub fn disable_offloads(ifname: &str) -> Result<()> {
    // SAFETY: plain socket creation, owned right away.
    let fd = check(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) }, "socket")?;
    // SAFETY: fd was just created.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    for cmd in [ETHTOOL_STSO, ETHTOOL_SGSO, ETHTOOL_SGRO] {
        let mut val = EthtoolValue { cmd, data: 0 };
        let mut ifr =
            IfreqData { name: ifname_bytes(ifname)?, data: (&raw mut val).cast::<libc::c_void>(), _pad: [0; 16] };
        check(
            // SAFETY: ifr and val outlive the ioctl; the kernel reads the ethtool_value through `data`.
            unsafe { libc::ioctl(fd.as_raw_fd(), SIOCETHTOOL as _, &raw mut ifr) },
            &format!("ethtool offloads off on {ifname}"),
        )?;
    }
    Ok(())
}

/// The index of an interface in the calling thread's namespace.
pub fn ifindex(ifname: &str) -> Result<i32> {
    let c = CString::new(ifname).map_err(|_| WanError::param("interface", ifname, "contains NUL"))?;
    // SAFETY: c is a valid C string.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        return Err(WanError::last_os(format!("if_nametoindex({ifname})")));
    }
    Ok(idx as i32)
}

/// A packet socket that writes whole Ethernet frames into an interface's egress queue (qdisc).
#[derive(Debug)]
pub struct FrameSender {
    fd: OwnedFd,
}

impl FrameSender {
    pub fn open(ifname: &str) -> Result<FrameSender> {
        let idx = ifindex(ifname)?;
        // Protocol 0: the socket sends only and never receives a copy of traffic.
        let fd = check(
            // SAFETY: plain socket creation, owned right away.
            unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0) },
            "socket(AF_PACKET)",
        )?;
        // SAFETY: fd was just created.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: a zeroed sockaddr_ll is valid.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_ifindex = idx;
        check(
            // SAFETY: sll is a valid sockaddr_ll of the given size.
            unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    (&raw const sll).cast::<libc::sockaddr>(),
                    std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
                )
            },
            "bind(AF_PACKET)",
        )?;
        Ok(FrameSender { fd })
    }

    /// Sends one frame; false when the qdisc dropped it (queue full) or the socket is busy.
    pub fn send(&self, frame: &[u8]) -> Result<bool> {
        // SAFETY: frame is valid for reads of its length.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast::<libc::c_void>(), frame.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOBUFS | libc::EAGAIN) => Ok(false),
                _ => Err(WanError::io("send(AF_PACKET)", e)),
            };
        }
        Ok(true)
    }
}

/// True if a process with this PID exists.
pub fn pid_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence and permission.
    pid > 0 && unsafe { libc::kill(pid, 0) } == 0
}

/// Sends `sig` to `pid`.
pub fn kill(pid: i32, sig: libc::c_int) {
    if pid > 0 {
        // SAFETY: kill has no memory effects; a vanished pid is harmless.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// True when running as root (the emulator needs CAP_NET_ADMIN and CAP_SYS_ADMIN).
pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Starts a new session so signals sent to the caller's process group do not reach us.
pub fn setsid() {
    // SAFETY: setsid has no memory effects; failing (already a leader) is fine.
    unsafe {
        libc::setsid();
    }
}

/// Handles SIGTERM, SIGINT and SIGHUP by raising a flag the caller polls.
pub fn install_stop_signals() {
    extern "C" fn on_signal(_: libc::c_int) {
        STOP.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

/// Raised by [`install_stop_signals`]'s handler.
pub static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

//! The emulator daemon: builds the link, then runs one thread per direction on its netfilter
//! queue (loss, delay, batch release), one thread for background load, and answers control
//! requests until told to stop; then removes everything it built.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::background::{Pacer, SizeMix, ETH_HEADER};
use crate::control::{size_bucket, BackgroundStatus, LinkStatus, PathStatus, Reply, Request, Status, SIZE_BUCKETS};
use crate::instance::{run_cmd, run_plan, Instance};
use crate::loss::LossModel;
use crate::nfq::{self, Msg, Verdict};
use crate::params::{Dir, Params};
use crate::rng::Rng;
use crate::sched::{self, DelayLine, DelaySampler, WakeMargin};
use crate::sys::{self, FrameSender, NfqSocket};
use crate::topo::{Role, Topology, END_IF, ROUTER_IF_STORAGE};
use crate::{Result, WanError};

/// Bytes of each packet copied to user space. None are read (the kernel reports the length), but
/// a copy shorter than the packet is what makes it report the length.
const COPY_RANGE: u32 = 20;
/// Packets the kernel may hold per queue: 16 ms at 10 Gbit/s of 1500-byte packets, with room.
const QUEUE_MAXLEN: u32 = 65_536;
const RCVBUF: usize = 64 << 20;
/// Datagrams read before the release queue is looked at again, so releases are never starved.
const RX_BATCH: usize = 256;
/// Datagrams (one packet each) taken per receive call, and room for each (a packet message with
/// its attributes and copied header is about 150 bytes).
const RX_SLOTS: usize = 64;
const RX_SLOT_BYTES: usize = 2048;
/// The longest a thread sleeps before it looks at the stop flag and parameters again.
const IDLE_NS: u64 = 50_000_000;

#[derive(Default)]
struct PathCounters {
    packets: AtomicU64,
    bytes: AtomicU64,
    dropped: AtomicU64,
    released: AtomicU64,
    held: AtomicU64,
    held_bytes: AtomicU64,
    max_held: AtomicU64,
    sizes: [AtomicU64; SIZE_BUCKETS.len()],
}

#[derive(Default)]
struct BgCounters {
    packets: AtomicU64,
    bytes: AtomicU64,
    dropped: AtomicU64,
}

struct Shared {
    params: Mutex<Params>,
    generation: AtomicU64,
    stop: AtomicBool,
    paths: [PathCounters; 2],
    bg: [BgCounters; 2],
    epoch: Instant,
}

impl Shared {
    #[expect(clippy::unused_self, reason = "the clock is part of the shared state so that tests can replace it")]
    fn now_ns(&self) -> u64 {
        sys::mono_ns()
    }

    fn params(&self) -> Params {
        match self.params.lock() {
            Ok(p) => p.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn stopping(&self) -> bool {
        self.stop.load(Relaxed) || sys::STOP.load(Relaxed)
    }
}

/// Runs the daemon of `inst` until a stop request or signal. `reaper_args` start the reaper
/// (`exe reaper_args...`) that removes the link if this process dies without cleaning up.
pub fn run_daemon(inst: &Instance, exe: &Path, reaper_args: &[String]) -> Result<()> {
    sys::install_stop_signals();
    inst.write_pid(false, std::process::id())?;
    let params = inst.read_params()?;
    let reaper = spawn_reaper(inst, exe, reaper_args)?;
    let result = build(inst, &params).and_then(|()| serve(inst, params));
    if let Err(e) = &result {
        eprintln!("stics wan daemon: {e}");
    }
    // Namespaces first, then the directory: the reaper only acts while the directory remains.
    let cleanup = inst.remove_namespaces();
    let _ = std::fs::remove_dir_all(&inst.dir);
    drop(reaper);
    result.and(cleanup)
}

/// Keeps the reaper's stdin open for the daemon's lifetime; dropping it (or dying) wakes it.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.wait();
    }
}

fn spawn_reaper(inst: &Instance, exe: &Path, args: &[String]) -> Result<Reaper> {
    let log = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(inst.log_path())
        .map_err(|e| WanError::io("open daemon log", e))?;
    let log2 = log.try_clone().map_err(|e| WanError::io("dup daemon log", e))?;
    let child = Command::new(exe)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(log)
        .stderr(log2)
        .process_group(0)
        .spawn()
        .map_err(|e| WanError::io("start reaper", e))?;
    inst.write_pid(true, child.id())?;
    Ok(Reaper(child))
}

/// Waits for EOF on stdin (its daemon is gone), then cleans up if the daemon could not.
pub fn run_reaper(inst: &Instance, token: &str) -> Result<()> {
    // SAFETY: ignoring terminal signals has no memory effects; only our daemon's death ends us.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
    }
    let mut sink = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
    inst.reap(token)
}

/// Builds namespaces, links, rules and qdiscs, and switches segmentation offloads off. Leaves the
/// calling thread in the router namespace, where the queues and packet sockets must be opened.
fn build(inst: &Instance, params: &Params) -> Result<()> {
    let topo = &inst.topo;
    run_plan(&topo.setup_plan(params.hosts))?;
    if let Some(cc) = params.cc {
        crate::instance::allow_congestion_control(cc)?;
        run_plan(&topo.cc_plan(cc, params.hosts))?;
    }
    if params.rate_bps.is_some() {
        run_plan(&topo.rate_plan(params))?;
    }
    let mut router_ifs: Vec<String> = Topology::egresses(Dir::ToHost, params.hosts);
    router_ifs.push(ROUTER_IF_STORAGE.into());
    let ends = Topology::ends(params.hosts).into_iter().map(|r| (r, vec![END_IF.to_string()]));
    for (role, ifs) in ends.chain([(Role::Router, router_ifs)]) {
        sys::setns_net(&Path::new("/run/netns").join(topo.ns(role)))?;
        for i in &ifs {
            sys::disable_offloads(i)?;
        }
    }
    Ok(())
}

fn serve(inst: &Instance, params: Params) -> Result<()> {
    let shared = Arc::new(Shared {
        params: Mutex::new(params),
        generation: AtomicU64::new(1),
        stop: AtomicBool::new(false),
        paths: Default::default(),
        bg: Default::default(),
        epoch: Instant::now(),
    });
    let _stamps = sys::RxStamps::enable()?;
    let mut threads: Vec<JoinHandle<Result<()>>> = Vec::new();
    for d in Dir::ALL {
        let sock = NfqSocket::open(d.index() as u16, COPY_RANGE, QUEUE_MAXLEN, RCVBUF)?;
        let sh = Arc::clone(&shared);
        threads.push(spawn(&format!("wan-{}", d.index()), move || run_path(&sh, d, &sock))?);
    }
    let senders =
        [FrameSender::open(Topology::egress(Dir::ToStorage))?, FrameSender::open(Topology::egress(Dir::ToHost))?];
    let sh = Arc::clone(&shared);
    threads.push(spawn("wan-bg", move || run_background(&sh, &senders))?);

    let sock_path = inst.sock_path();
    let _ = std::fs::remove_file(&sock_path);
    let listener =
        UnixListener::bind(&sock_path).map_err(|e| WanError::io(format!("bind {}", sock_path.display()), e))?;
    listener.set_nonblocking(true).map_err(|e| WanError::io("control socket", e))?;
    std::fs::write(inst.ready_path(), b"").map_err(|e| WanError::io("write ready", e))?;
    eprintln!("stics wan daemon: {} up", inst.name());

    let mut result = Ok(());
    while !shared.stopping() {
        if let Some(i) = threads.iter().position(std::thread::JoinHandle::is_finished) {
            let t = threads.swap_remove(i);
            result = t.join().unwrap_or_else(|_| Err(WanError::Start("a worker thread panicked".into())));
            if result.is_ok() {
                result = Err(WanError::Start("a worker thread stopped".into()));
            }
            break;
        }
        sys::poll_in(&[listener.as_raw_fd()], Some(100_000_000))?;
        while let Ok((conn, _)) = listener.accept() {
            if let Err(e) = handle(inst, &shared, &conn) {
                eprintln!("stics wan daemon: control request: {e}");
            }
        }
    }
    shared.stop.store(true, Relaxed);
    for t in threads {
        match t.join() {
            Ok(Err(e)) if result.is_ok() => result = Err(e),
            _ => {}
        }
    }
    eprintln!("stics wan daemon: {} stopping", inst.name());
    result
}

fn spawn(name: &str, f: impl FnOnce() -> Result<()> + Send + 'static) -> Result<JoinHandle<Result<()>>> {
    std::thread::Builder::new().name(name.into()).spawn(f).map_err(|e| WanError::io("spawn thread", e))
}

fn handle(inst: &Instance, shared: &Shared, conn: &UnixStream) -> Result<()> {
    let io = |e| WanError::io("control connection", e);
    conn.set_nonblocking(false).map_err(io)?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).map_err(io)?;
    let mut line = String::new();
    BufReader::new(conn).read_line(&mut line).map_err(io)?;
    let reply = match serde_json::from_str::<Request>(&line) {
        Err(e) => Reply { ok: false, error: Some(format!("bad request: {e}")), status: None },
        Ok(req) => match answer(inst, shared, req) {
            Ok(status) => Reply { ok: true, error: None, status },
            Err(e) => Reply { ok: false, error: Some(e.to_string()), status: None },
        },
    };
    let mut text = serde_json::to_string(&reply).map_err(|e| WanError::Protocol(e.to_string()))?;
    text.push('\n');
    let mut w = conn;
    w.write_all(text.as_bytes()).map_err(io)
}

fn answer(inst: &Instance, shared: &Shared, req: Request) -> Result<Option<Status>> {
    match req {
        Request::Stop => {
            shared.stop.store(true, Relaxed);
            Ok(None)
        }
        Request::Status => Ok(Some(status(inst, shared))),
        Request::Set { update } => {
            let old = shared.params();
            let mut new = old.clone();
            new.apply(&update)?;
            if new.rate_bps != old.rate_bps || new.effective_queue() != old.effective_queue() {
                run_plan(&inst.topo.rate_plan(&new))?;
            }
            if let (Some(cc), true) = (new.cc, new.cc != old.cc) {
                run_plan(&inst.topo.cc_plan(cc, new.hosts))?;
            }
            match shared.params.lock() {
                Ok(mut p) => *p = new.clone(),
                Err(poisoned) => *poisoned.into_inner() = new.clone(),
            }
            shared.generation.fetch_add(1, Relaxed);
            inst.write_params(&new)?;
            Ok(Some(status(inst, shared)))
        }
    }
}

fn status(inst: &Instance, shared: &Shared) -> Status {
    let overflow = queue_overflows();
    let paths = Dir::ALL
        .iter()
        .map(|&d| {
            let c = &shared.paths[d.index()];
            PathStatus {
                direction: d.name().into(),
                packets: c.packets.load(Relaxed),
                bytes: c.bytes.load(Relaxed),
                dropped: c.dropped.load(Relaxed),
                released: c.released.load(Relaxed),
                held: c.held.load(Relaxed),
                held_bytes: c.held_bytes.load(Relaxed),
                max_held: c.max_held.load(Relaxed),
                queue_overflow: overflow.get(d.index()).copied().unwrap_or(0),
                sizes: c.sizes.iter().map(|n| n.load(Relaxed)).collect(),
            }
        })
        .collect();
    let links = Dir::ALL.iter().map(|&d| link_status(&inst.topo, d)).collect();
    let background = Dir::ALL
        .iter()
        .map(|&d| {
            let c = &shared.bg[d.index()];
            BackgroundStatus {
                direction: d.name().into(),
                packets: c.packets.load(Relaxed),
                bytes: c.bytes.load(Relaxed),
                dropped: c.dropped.load(Relaxed),
            }
        })
        .collect();
    let cc = run_cmd(&[
        "ip".into(),
        "netns".into(),
        "exec".into(),
        inst.topo.ns(Role::HOST),
        "sysctl".into(),
        "-n".into(),
        "net.ipv4.tcp_congestion_control".into(),
    ])
    .map_or_else(|e| format!("unknown ({e})"), |s| s.trim().to_string());
    Status {
        name: inst.name().into(),
        pid: std::process::id(),
        uptime_s: shared.epoch.elapsed().as_secs_f64(),
        params: shared.params(),
        cc,
        paths,
        links,
        background,
    }
}

/// Overflow drops per queue number, from the kernel's table for this namespace.
fn queue_overflows() -> Vec<u64> {
    let mut out = vec![0, 0];
    let Ok(text) = std::fs::read_to_string("/proc/thread-self/net/netfilter/nfnetlink_queue") else { return out };
    for line in text.lines() {
        let f: Vec<u64> = line.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        // queue, portid, total, copy mode, copy range, queue dropped, user dropped, id seq, 1
        if let (Some(&q), Some(&qd), Some(&ud)) = (f.first(), f.get(5), f.get(6)) {
            if let Some(slot) = out.get_mut(q as usize) {
                *slot = qd + ud;
            }
        }
    }
    out
}

fn link_status(topo: &Topology, d: Dir) -> LinkStatus {
    let dev = Topology::egress(d);
    let mut s = LinkStatus { direction: d.name().into(), ..Default::default() };
    let cmd: Vec<String> = ["tc", "-s", "-j", "-n", &topo.ns(Role::Router), "qdisc", "show", "dev", dev]
        .iter()
        .map(std::string::ToString::to_string)
        .collect();
    let Ok(text) = run_cmd(&cmd) else { return s };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else { return s };
    let Some(q) =
        v.as_array().and_then(|a| a.iter().find(|q| q.get("root").and_then(serde_json::Value::as_bool) == Some(true)))
    else {
        return s;
    };
    let n = |k: &str| q.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
    s.qdisc = q.get("kind").and_then(|k| k.as_str()).unwrap_or("").into();
    s.sent_bytes = n("bytes");
    s.sent_packets = n("packets");
    s.drops = n("drops");
    s.overlimits = n("overlimits");
    s.backlog_bytes = n("backlog");
    s.backlog_packets = n("qlen");
    s
}

/// One direction's hot loop: read queued packets, decide loss, hold the rest in the delay line,
/// release due packets with one batch verdict, and sleep until the next departure or arrival.
///
/// Each packet's delay counts from its kernel arrival stamp, so the time it waited for this
/// thread to wake is part of the delay rather than added to it. Sleeps end on an absolute timer
/// a learnt wake-up latency before the next departure; the rest is spent polling the queue, so
/// departures leave within microseconds of their time.
fn run_path(shared: &Shared, dir: Dir, sock: &NfqSocket) -> Result<()> {
    sys::tight_timer_slack();
    let queue = sock.queue();
    let c = &shared.paths[dir.index()];
    let timer = sys::Timer::new()?;
    let mut armed_at = 0;
    let mut margin = WakeMargin::new();
    let mut generation = 0;
    let mut seed = None;
    let mut rng = Rng::new(0, 0);
    let mut loss = LossModel::new(crate::params::LossSpec::default());
    let mut sampler = DelaySampler { delay_ns: 0, jitter_ns: 0 };
    let mut line = DelayLine::new();
    let mut batch = sys::RecvBatch::new(RX_SLOTS, RX_SLOT_BYTES);
    let mut out: Vec<u8> = Vec::with_capacity(16 * 1024);
    while !shared.stopping() {
        let g = shared.generation.load(Relaxed);
        if g != generation {
            let p = shared.params();
            if seed != Some(p.seed) {
                seed = Some(p.seed);
                rng = Rng::new(p.seed, 1 + dir.index() as u64);
            }
            let path = p.path(dir);
            sampler = DelaySampler { delay_ns: path.delay_ns, jitter_ns: path.jitter_ns };
            loss.set_spec(path.loss);
            generation = g;
        }
        let (mut rx, mut packets, mut bytes, mut dropped) = (0, 0, 0, 0);
        let mut sizes = [0u64; SIZE_BUCKETS.len()];
        while rx < RX_BATCH {
            let n = sock.recv_batch(&mut batch)?;
            if n == 0 {
                break;
            }
            rx += n;
            let now = sys::mono_ns();
            let real_minus_mono = sys::realtime_ns().wrapping_sub(now);
            for i in 0..n {
                let parsed = nfq::parse(batch.datagram(i), |m| {
                    if let Msg::Packet { id, len, stamp_ns, .. } = m {
                        packets += 1;
                        bytes += u64::from(len);
                        // Bucketed by Ethernet frame length, as seed 004 counts them (a pure ACK is 66 bytes).
                        sizes[size_bucket(u64::from(len + ETH_HEADER))] += 1;
                        if loss.lose(&mut rng) {
                            // Drops go first in the datagram, before any batch that covers their id.
                            nfq::push_verdict(&mut out, queue, id, Verdict::Drop, false);
                            dropped += 1;
                        } else {
                            let arrived = sched::arrival_ns(now, stamp_ns, real_minus_mono);
                            line.push(id, len, arrived, sampler.sample(&mut rng));
                        }
                    }
                });
                if let Err(e) = parsed {
                    eprintln!("stics wan daemon: queue {queue}: malformed message: {}", e.0);
                }
            }
            if n < batch.slots() {
                break;
            }
        }
        if let Some(r) = line.pop_due(sys::mono_ns()) {
            nfq::push_verdict(&mut out, queue, r.last_id, Verdict::Accept, true);
            c.released.fetch_add(r.packets, Relaxed);
        }
        if !out.is_empty() {
            sock.send(&out)?;
            out.clear();
        }
        if packets > 0 {
            c.packets.fetch_add(packets, Relaxed);
            c.bytes.fetch_add(bytes, Relaxed);
            c.dropped.fetch_add(dropped, Relaxed);
            for (n, add) in c.sizes.iter().zip(sizes) {
                n.fetch_add(add, Relaxed);
            }
        }
        c.held.store(line.len() as u64, Relaxed);
        c.held_bytes.store(line.bytes(), Relaxed);
        c.max_held.store(line.max_len() as u64, Relaxed);
        if rx >= RX_BATCH {
            continue;
        }
        let now = sys::mono_ns();
        let next = line.next_release();
        let wake = match next {
            // Closer than a wake-up takes: poll the queue until it is due.
            Some(t) if t <= now + margin.margin_ns() => continue,
            Some(t) => (t - margin.margin_ns()).min(now + IDLE_NS),
            // Nothing held: any pending wake-up will do to look at the stop flag.
            None if armed_at > now => armed_at,
            None => now + IDLE_NS,
        };
        if wake != armed_at {
            timer.arm_at(wake)?;
            armed_at = wake;
        }
        let (_, fired) = sys::wait_either(sock.raw_fd(), timer.raw_fd())?;
        if fired {
            margin.observe(sys::mono_ns().saturating_sub(wake));
            // Re-arm next time round even for the same instant: that clears the expiry.
            armed_at = 0;
        }
    }
    // Let held packets go rather than dropping them on the way out.
    if let Some(r) = line.pop_all() {
        nfq::push_verdict(&mut out, queue, r.last_id, Verdict::Accept, true);
        let _ = sock.send(&out);
    }
    Ok(())
}

/// Writes background frames into both bottleneck queues at the configured share of the rate.
fn run_background(shared: &Shared, senders: &[FrameSender; 2]) -> Result<()> {
    sys::tight_timer_slack();
    let mix = SizeMix;
    let mut frame = vec![0u8; 1500 + ETH_HEADER as usize];
    // A locally administered unicast destination that no interface owns: the far end discards
    // the frame on arrival, after it has taken its share of the bottleneck.
    frame[..6].copy_from_slice(&[0x02, 0x53, 0x54, 0x49, 0x43, 0x53]);
    frame[6..12].copy_from_slice(&[0x02, 0x53, 0x54, 0x49, 0x43, 0x42]);
    // The IEEE local experimental EtherType.
    frame[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    let mut generation = 0;
    let mut load_bps = 0.0;
    let mut rngs = [Rng::new(0, 11), Rng::new(0, 12)];
    let mut pacers = [Pacer::new(0, 0.0), Pacer::new(0, 0.0)];
    while !shared.stopping() {
        let g = shared.generation.load(Relaxed);
        if g != generation {
            let p = shared.params();
            let new_load = p.rate_bps.map_or(0.0, |r| r as f64 * p.background_pct / 100.0);
            if generation == 0 || new_load != load_bps {
                let now = shared.now_ns();
                rngs = [Rng::new(p.seed, 11), Rng::new(p.seed, 12)];
                pacers = [Pacer::new(now, new_load), Pacer::new(now, new_load)];
                load_bps = new_load;
            }
            generation = g;
        }
        if load_bps <= 0.0 {
            sys::poll_in(&[], Some(IDLE_NS))?;
            continue;
        }
        let now = shared.now_ns();
        for d in Dir::ALL {
            let i = d.index();
            let (Some(pacer), Some(rng), Some(sender), Some(c)) =
                (pacers.get_mut(i), rngs.get_mut(i), senders.get(i), shared.bg.get(i))
            else {
                continue;
            };
            while let Some(size) = pacer.next_due(now, &mix, rng) {
                let len = (size + ETH_HEADER) as usize;
                if sender.send(frame.get(..len).unwrap_or(&frame))? {
                    c.packets.fetch_add(1, Relaxed);
                    c.bytes.fetch_add(len as u64, Relaxed);
                } else {
                    c.dropped.fetch_add(1, Relaxed);
                }
            }
        }
        let next = pacers.iter().map(Pacer::next_ns).min().unwrap_or(now + IDLE_NS);
        let wait = next.saturating_sub(shared.now_ns()).clamp(20_000, IDLE_NS);
        sys::poll_in(&[], Some(wait))?;
    }
    Ok(())
}

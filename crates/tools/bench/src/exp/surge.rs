//! Seed 000's Surge for `stics bench app`: a web server's document set drawn from Surge's
//! distributions (Barford and Crovella, 1998) on the ext4 under test, Python's threaded HTTP
//! server serving it with an access log beside it, and Surge's user equivalents requesting it.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, LogNormal, Pareto, Weibull, Zipf};

use crate::{Bench, Error, Result};

/// Surge's workload model with its published parameters. Files' sizes: a lognormal body and a
/// Pareto tail; popularity: Zipf; pages: one base file and a Pareto number of embedded files,
/// fetched with Weibull "active off" gaps; users: Pareto "inactive off" times between pages.
#[derive(Debug, Clone)]
pub struct Model {
    body: LogNormal<f64>,
    tail: Pareto<f64>,
    embedded: Pareto<f64>,
    active_off: Weibull<f64>,
    inactive_off: Pareto<f64>,
    /// Scales both off times.
    think: f64,
}

/// The share of files drawn from the Pareto tail.
const TAIL_SHARE: f64 = 0.07;
/// Where the body ends and the tail starts, in bytes.
const TAIL_START: f64 = 133_000.0;
/// The largest file. Surge's tail (alpha 1.1) has an unbounded mean; this bound makes 20,000
/// files about seed 000's 1 GB data set.
pub const LARGEST: u64 = 4 << 20;
/// The longest user think time, in seconds: a Pareto with alpha 1.5 draws hours now and then, and
/// a run lasts a minute.
const LONGEST_OFF: f64 = 60.0;

impl Model {
    pub fn new() -> Model {
        // Every parameter is a constant in range, so none of these can fail.
        let fixed = "Surge's parameters are in range";
        Model {
            body: LogNormal::new(9.357, 1.318).expect(fixed),
            tail: Pareto::new(TAIL_START, 1.1).expect(fixed),
            embedded: Pareto::new(1.0, 2.43).expect(fixed),
            active_off: Weibull::new(0.382, 1.46).expect(fixed),
            inactive_off: Pareto::new(1.0, 1.5).expect(fixed),
            think: 1.0,
        }
    }

    /// The model with its off times scaled by `factor` (0: users never pause).
    pub fn thinking(self, factor: f64) -> Model {
        Model { think: factor.max(0.0), ..self }
    }

    /// A file's size in bytes (at least one).
    pub fn file_size(&self, rng: &mut impl Rng) -> u64 {
        let s = if rng.gen_bool(TAIL_SHARE) {
            self.tail.sample(rng)
        } else {
            // The body is the lognormal below the tail's start.
            std::iter::repeat_with(|| self.body.sample(rng)).find(|&s| s <= TAIL_START).unwrap_or(TAIL_START)
        };
        (s as u64).clamp(1, LARGEST)
    }

    /// How many embedded files a page's base file references (at least one).
    pub fn embedded(&self, rng: &mut impl Rng) -> u32 {
        (self.embedded.sample(rng) as u32).clamp(1, 64)
    }

    /// The gap between a page's files.
    pub fn active_off(&self, rng: &mut impl Rng) -> Duration {
        Duration::from_secs_f64(self.active_off.sample(rng).min(LONGEST_OFF) * self.think)
    }

    /// A user's think time between pages.
    pub fn inactive_off(&self, rng: &mut impl Rng) -> Duration {
        Duration::from_secs_f64(self.inactive_off.sample(rng).min(LONGEST_OFF) * self.think)
    }
}

impl Default for Model {
    fn default() -> Model {
        Model::new()
    }
}

/// The document set: each file's size, and which file each popularity rank names.
#[derive(Debug, Clone)]
pub struct Docs {
    pub sizes: Vec<u64>,
    /// `by_rank[r]` is the file of popularity rank `r + 1` (Zipf); popularity is drawn apart from size.
    pub by_rank: Vec<usize>,
}

impl Docs {
    pub fn draw(model: &Model, files: usize, seed: u64) -> Docs {
        let mut rng = StdRng::seed_from_u64(seed);
        let sizes = (0..files).map(|_| model.file_size(&mut rng)).collect();
        let mut by_rank: Vec<usize> = (0..files).collect();
        by_rank.shuffle(&mut rng);
        Docs { sizes, by_rank }
    }

    pub fn bytes(&self) -> u64 {
        self.sizes.iter().sum()
    }

    /// The path of file `i` under the document root, a thousand files to a folder.
    pub fn path(i: usize) -> String {
        format!("d{:03}/f{i}.html", i / 1000)
    }
}

/// Byte `at` of file `i`: every file is its own pattern, so a reply with another file's bytes,
/// or stale or torn ones, is caught.
fn pattern(i: usize, at: u64) -> u8 {
    ((i as u64).wrapping_mul(131).wrapping_add(at) % 251) as u8
}

/// Writes the document set under `root`.
fn write_docs(docs: &Docs, root: &Path) -> Result<()> {
    let mut buf = Vec::new();
    for (i, &size) in docs.sizes.iter().enumerate() {
        let path = root.join(Docs::path(i));
        if i % 1000 == 0 {
            std::fs::create_dir_all(path.parent().unwrap_or(root))?;
        }
        buf.clear();
        buf.extend((0..size).map(|at| pattern(i, at)));
        std::fs::write(&path, &buf)?;
    }
    Ok(())
}

/// Drops the document set from the page cache, so that the server starts cold as after a boot
/// (the pages of an earlier repetition included).
fn drop_cached(docs: &Docs, root: &Path) -> Result<()> {
    for i in 0..docs.sizes.len() {
        let f = std::fs::File::open(root.join(Docs::path(i)))?;
        // SAFETY: the descriptor is open for the call's length; the advice only drops clean pages.
        unsafe {
            use std::os::fd::AsRawFd;
            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
    }
    Ok(())
}

/// Python's threaded HTTP server on `root` and `port` (loopback), writing a Common Log Format line
/// per request to `log` as it answers, as Apache did for the paper's Surge.
const SERVER: &str = r#"
import functools, http.server, sys
root, port, log = sys.argv[1], int(sys.argv[2]), open(sys.argv[3], "a", buffering=1)
class Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    def log_message(self, fmt, *args):
        log.write('%s - - [%s] %s\n' % (self.address_string(), self.log_date_time_string(), fmt % args))
class Server(http.server.ThreadingHTTPServer):
    request_queue_size = 1024
    daemon_threads = True
Server(("127.0.0.1", port), functools.partial(Handler, directory=root)).serve_forever()
"#;

/// The size of one Surge run.
#[derive(Debug, Clone, Copy)]
pub struct Size {
    pub files: usize,
    pub users: usize,
    pub seconds: u64,
    /// Scales the think times and the gaps within a page (1: Surge's own).
    pub think: f64,
}

/// Fails, before anything runs, on a size that cannot run: nothing to serve, nobody to ask, no
/// time to measure, or a document set larger than 75 % of an ext4 of `fs_mib` (it stays there while
/// the other workloads run).
pub fn check(size: Size, fs_mib: u64) -> Result<()> {
    if size.files == 0 || size.users == 0 || size.seconds == 0 {
        return Err(Error::Invalid("--surge-files, --surge-users and --surge-seconds must be at least 1".into()));
    }
    let bytes = Docs::draw(&Model::new(), size.files, SEED).bytes();
    if bytes > (fs_mib << 20) / 4 * 3 {
        return Err(Error::Invalid(format!(
            "Surge's {} files take {} MiB, more than 75 % of the {fs_mib} MiB ext4 (--fs-mib)",
            size.files,
            bytes >> 20
        )));
    }
    Ok(())
}

/// The document set's seed: every run serves the same files.
const SEED: u64 = 2000;

/// Writes Surge's document set of `size` under `root`; the caller's unmount puts it on the medium.
pub fn prepare(size: Size, root: &Path) -> Result<()> {
    write_docs(&Docs::draw(&Model::new(), size.files, SEED), root)
}

/// Seed 000's Surge on the document set [`prepare`] wrote under `root`: the set made cold, the
/// server started (as the host runs it) with its access log in `dir`, `size.users` users warming
/// it for a sixth of the time and then measured: files served in full and checked, per second.
pub fn run(b: &Bench, size: Size, root: &Path, dir: &Path) -> Result<f64> {
    let model = Model::new().thinking(size.think);
    let docs = Docs::draw(&model, size.files, SEED);
    drop_cached(&docs, root)?;
    // Below the ephemeral range, where the users' own connections take their ports.
    let port = stics_procs::free_port()?;
    let mut server = Command::new("python3");
    server.arg("-c").arg(SERVER).arg(root).arg(port.to_string()).arg(dir.join("access.log"));
    let mut server = b.spawn("surge-server", &mut b.host(server))?;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    server.wait_until(Duration::from_secs(30), || stics_procs::accepts(addr))?;
    let warm = Duration::from_secs(size.seconds.div_ceil(6));
    let measured = users(&model, &docs, addr, size.users, warm, Duration::from_secs(size.seconds));
    server.check()?;
    drop(server);
    measured
}

/// `n` users against the server at `addr`; counts what completes between `warm` and `warm + span`.
fn users(model: &Model, docs: &Docs, addr: SocketAddr, n: usize, warm: Duration, span: Duration) -> Result<f64> {
    let start = Instant::now();
    let (from, to) = (start + warm, start + warm + span);
    let failed = AtomicBool::new(false);
    let total = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|u| {
                let failed = &failed;
                std::thread::Builder::new()
                    .stack_size(256 << 10)
                    .spawn_scoped(s, move || user(model, docs, addr, u as u64, (from, to), failed))
            })
            .collect();
        let mut total = Ok(0u64);
        for h in handles {
            let r = match h {
                Ok(h) => h.join().unwrap_or_else(|_| Err(Error::Invalid("a Surge user panicked".into()))),
                Err(e) => Err(e.into()),
            };
            total = match (total, r) {
                (Ok(t), Ok(n)) => Ok(t + n),
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
        }
        total
    })?;
    Ok(total as f64 / span.as_secs_f64())
}

/// One user equivalent: pages of Zipf-chosen files with their embedded files, think times between
/// them, until `window.1`; the files it completed inside `window`. Every reply is
/// checked byte for byte.
fn user(
    model: &Model,
    docs: &Docs,
    addr: SocketAddr,
    seed: u64,
    window: (Instant, Instant),
    failed: &AtomicBool,
) -> Result<u64> {
    let mut rng = StdRng::seed_from_u64(seed);
    let zipf = Zipf::new(docs.sizes.len() as u64, 1.0).map_err(|e| Error::Invalid(format!("Surge's Zipf: {e}")))?;
    // Users start spread over one think time, not all at once.
    let mut next = Instant::now() + model.inactive_off(&mut rng);
    let mut ops = 0u64;
    let pick = |rng: &mut StdRng| docs.by_rank[(zipf.sample(rng) as usize).clamp(1, docs.sizes.len()) - 1];
    loop {
        let files = 1 + model.embedded(&mut rng);
        for k in 0..files {
            let now = Instant::now();
            if now < next {
                std::thread::sleep((next - now).min(window.1.saturating_duration_since(now)));
            }
            if Instant::now() >= window.1 || failed.load(Ordering::Relaxed) {
                return Ok(ops);
            }
            let i = pick(&mut rng);
            get(addr, i, docs.sizes[i]).inspect_err(|_| failed.store(true, Ordering::Relaxed))?;
            let done = Instant::now();
            if done >= window.0 && done < window.1 {
                ops += 1;
            }
            next = done + if k + 1 < files { model.active_off(&mut rng) } else { model.inactive_off(&mut rng) };
        }
    }
}

/// GET of file `i`: its status, its length and every byte checked.
fn get(addr: SocketAddr, i: usize, size: u64) -> Result<()> {
    let bad =
        |detail: String| Error::Output { what: format!("the Surge server's reply for {}", Docs::path(i)), detail };
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    write!(s, "GET /{} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", Docs::path(i))?;
    let mut reply = Vec::with_capacity(size as usize + 512);
    s.read_to_end(&mut reply)?;
    let head_end = reply.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| bad("no end of headers".into()))? + 4;
    let head = String::from_utf8_lossy(&reply[..head_end]);
    if !head.starts_with("HTTP/1.0 200") {
        return Err(bad(head.lines().next().unwrap_or_default().to_owned()));
    }
    let body = &reply[head_end..];
    if body.len() as u64 != size {
        return Err(bad(format!("{} bytes where the file has {size}", body.len())));
    }
    if let Some(at) = body.iter().enumerate().position(|(at, &v)| v != pattern(i, at as u64)) {
        return Err(bad(format!("byte {at} differs from what was written")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn twenty_thousand_files_are_about_seed_000_s_gigabyte() {
        let docs = Docs::draw(&Model::new(), 20_000, SEED);
        let gb = docs.bytes() as f64 / 1e9;
        assert!((0.8..1.4).contains(&gb), "{gb} GB");
        // Near the body's lognormal median, e^9.357 = 11.6 kB, moved up a little by the tail's 7 %.
        let mut s = docs.sizes.clone();
        s.sort_unstable();
        let median = s[s.len() / 2] as f64;
        assert!((10_000.0..16_000.0).contains(&median), "{median}");
        let tail = s.iter().filter(|&&v| v as f64 > TAIL_START).count() as f64 / s.len() as f64;
        assert!((0.05..0.09).contains(&tail), "{tail}");
        assert!(s.iter().all(|&v| (1..=LARGEST).contains(&v)));
    }

    #[test]
    fn the_set_is_the_same_for_a_seed_and_popularity_is_a_permutation() {
        let m = Model::new();
        let (a, b) = (Docs::draw(&m, 500, 7), Docs::draw(&m, 500, 7));
        assert_eq!(a.sizes, b.sizes);
        assert_eq!(a.by_rank, b.by_rank);
        let mut ranks = a.by_rank.clone();
        ranks.sort_unstable();
        assert_eq!(ranks, (0..500).collect::<Vec<_>>());
    }

    #[test]
    fn users_think_and_pages_embed_as_surge_draws_them() {
        let m = Model::new();
        let mut rng = StdRng::seed_from_u64(1);
        let n = 20_000u32;
        let think: f64 = (0..n).map(|_| m.inactive_off(&mut rng).as_secs_f64()).sum::<f64>() / f64::from(n);
        // Pareto(1, 1.5) has mean 3 s; the bound at a minute takes a little off.
        assert!((2.3..3.1).contains(&think), "{think}");
        let gap: f64 = (0..n).map(|_| m.active_off(&mut rng).as_secs_f64()).sum::<f64>() / f64::from(n);
        // Weibull(0.382, 1.46) has mean 0.346 s.
        assert!((0.32..0.37).contains(&gap), "{gap}");
        assert!((0..n).all(|_| (1..=64).contains(&m.embedded(&mut rng))));
        let eager = m.thinking(0.0);
        assert!((0..100).all(|_| eager.inactive_off(&mut rng).is_zero() && eager.active_off(&mut rng).is_zero()));
    }

    #[test]
    fn sizes_that_cannot_run_are_refused_before_the_run() {
        let size = Size { files: 20_000, users: 400, seconds: 60, think: 1.0 };
        assert!(check(size, 2048).is_ok());
        let e = check(size, 1024).unwrap_err().to_string();
        assert!(e.contains("--fs-mib"), "{e}");
        for bad in [Size { files: 0, ..size }, Size { users: 0, ..size }, Size { seconds: 0, ..size }] {
            assert!(check(bad, 2048).unwrap_err().to_string().contains("at least 1"));
        }
    }

    #[test]
    fn a_file_s_pattern_differs_from_its_neighbours() {
        let a: Vec<u8> = (0..64).map(|at| pattern(5, at)).collect();
        let b: Vec<u8> = (0..64).map(|at| pattern(6, at)).collect();
        assert_ne!(a, b);
    }

    #[test]
    fn a_server_that_answers_wrong_bytes_is_caught() {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            // The whole request read first: closing on unread bytes would reset the connection.
            let mut req = Vec::new();
            let mut byte = [0u8; 1];
            while !req.ends_with(b"\r\n\r\n") && c.read(&mut byte).unwrap() == 1 {
                req.push(byte[0]);
            }
            let mut body: Vec<u8> = (0..100).map(|at| pattern(3, at)).collect();
            body[42] ^= 1;
            c.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 100\r\n\r\n").unwrap();
            c.write_all(&body).unwrap();
        });
        let e = get(addr, 3, 100).unwrap_err().to_string();
        server.join().unwrap();
        assert!(e.contains("byte 42"), "{e}");
    }
}

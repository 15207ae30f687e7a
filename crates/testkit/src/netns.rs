//! Tests across `stics wan`: a link brought up for one test and taken down with it, processes
//! started in its namespaces, and test code that runs inside one (a thread that joins a network
//! namespace keeps it, and so do the threads it starts, a tokio runtime's workers among them).

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use stics_wan::topo::{Role, Topology};

/// A `stics wan` link of its own, taken down when dropped.
pub struct Wan {
    bin: PathBuf,
    name: String,
    dir: PathBuf,
}

impl Wan {
    /// `stics wan up ARGS` under a name unique to this process, `tag` (at most 8 characters)
    /// and this link: two tests of one binary never take each other's.
    pub fn up(bin: &Path, tag: &str, args: &[&str]) -> Wan {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("{tag}{}x{n}", std::process::id());
        let dir = std::env::temp_dir().join(format!("stics-wan-{name}"));
        let wan = Wan { bin: bin.to_owned(), name, dir };
        wan.ok(&[&["up"], args].concat());
        wan
    }

    /// `stics wan ARGS` for this link.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("wan").arg("--name").arg(&self.name).arg("--runtime-dir").arg(&self.dir).args(args);
        c
    }

    /// Runs `stics wan ARGS`; its stdout. Fails the test when it fails.
    pub fn ok(&self, args: &[&str]) -> String {
        crate::proc::run_ok(&mut self.cmd(args))
    }

    /// The namespace of `role` (`host`, `host2`, …, `storage`), as `stics wan` names it.
    pub fn ns(&self, role: &str) -> String {
        self.topo().ns(Self::role(role))
    }

    /// The address of `role`.
    pub fn addr(&self, role: &str) -> String {
        self.topo().addr(Self::role(role))
    }

    fn topo(&self) -> Topology {
        Topology::new(&self.name).unwrap_or_else(|e| panic!("link {}: {e}", self.name))
    }

    fn role(role: &str) -> Role {
        Role::parse(role).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A command that runs `program` in `role`'s network namespace (`stics wan exec`: its PID is
    /// the program's own, and it keeps this process's mounts rather than pinning a copy).
    pub fn exec(&self, role: &str, program: &Path) -> Command {
        let mut c = self.cmd(&["exec", role, "--"]);
        c.arg(program);
        c
    }

    /// Cuts `role` off: its packets vanish both ways.
    pub fn cut(&self, role: &str) {
        self.ok(&["cut", role]);
    }

    /// Joins `role` again.
    pub fn mend(&self, role: &str) {
        self.ok(&["mend", role]);
    }
}

impl Drop for Wan {
    fn drop(&mut self) {
        let _ = self.cmd(&["down"]).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Joins the calling thread to the network namespace `ns` (under `/run/netns`).
pub fn enter(ns: &str) {
    stics_wan::sys::setns_net(&Path::new("/run/netns").join(ns)).unwrap_or_else(|e| panic!("enter {ns}: {e}"));
}

/// Runs `f` on a thread of its own inside `ns`; what it returns.
pub fn run_in<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let ns = ns.to_owned();
    std::thread::spawn(move || {
        enter(&ns);
        f()
    })
    .join()
    .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// Waits until `addr` accepts connections from inside `ns`; false after `limit`.
pub fn wait_port(ns: &str, addr: SocketAddr, limit: Duration) -> bool {
    run_in(ns, move || {
        let start = Instant::now();
        while start.elapsed() < limit {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    })
}

type Job<S> = Box<dyn FnOnce(&mut S) + Send>;

/// A thread inside a network namespace that owns a state `S` (a runtime and the sessions made
/// there) and runs each call on it, so that every socket it opens, reconnections included, is
/// in that namespace.
pub struct Resident<S> {
    jobs: Option<mpsc::Sender<Job<S>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl<S: 'static> Resident<S> {
    /// A thread in `ns` whose state `init` makes there.
    pub fn start(ns: &str, init: impl FnOnce() -> S + Send + 'static) -> Resident<S> {
        let (tx, rx) = mpsc::channel::<Job<S>>();
        let ns = ns.to_owned();
        let thread = std::thread::spawn(move || {
            enter(&ns);
            let mut state = init();
            for job in rx {
                job(&mut state);
            }
        });
        Resident { jobs: Some(tx), thread: Some(thread) }
    }

    /// Runs `f` on the state, in the namespace; what it returns. A panic in `f` fails the
    /// caller.
    pub fn call<T: Send + 'static>(&self, f: impl FnOnce(&mut S) -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        let job: Job<S> = Box::new(move |s| {
            let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(s))));
        });
        self.jobs.as_ref().and_then(|j| j.send(job).ok()).expect("the resident thread is gone");
        match rx.recv().expect("the resident thread is gone") {
            Ok(v) => v,
            Err(e) => std::panic::resume_unwind(e),
        }
    }
}

impl<S> Drop for Resident<S> {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

//! Targets for tests to talk to: tgt (tgtd, a peer written elsewhere), `stics target` as a
//! process, and the stics target in process; each stops when dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use std::sync::Arc;

use stics_block::{BlockDev, MemDev};
use stics_target::{Server, ServerConfig, Target};
use tokio::sync::oneshot;

use crate::net::free_port;
use crate::proc::{spawn, wait_port, Guard};
use crate::IQN;

/// How long a peer may take to listen.
const START: Duration = Duration::from_secs(20);

/// A sparse file of `size_mib` MiB in a temporary directory of its own, removed with it.
pub struct FileLun {
    pub dir: tempfile::TempDir,
    pub file: PathBuf,
}

impl FileLun {
    pub fn new(size_mib: u64) -> FileLun {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("lun.img");
        std::fs::File::create(&file).unwrap().set_len(size_mib << 20).unwrap();
        FileLun { dir, file }
    }
}

/// CHAP accounts and target parameters to set up on the tgt target.
#[derive(Clone, Default)]
pub struct TgtOptions {
    pub incoming: Option<(String, String)>,
    pub outgoing: Option<(String, String)>,
    /// `tgtadm --op update --mode target --name N --value V` pairs (e.g. HeaderDigest=CRC32C).
    pub params: Vec<(String, String)>,
}

/// A tgtd on a random loopback port with one target ([`IQN`]) and one file-backed LUN (LUN 1).
pub struct Tgt {
    pub port: u16,
    /// tgtd's control socket index, its own so that parallel tests never reach each other's.
    pub control: u16,
    pub file: PathBuf,
    /// The sparse file it made, when it was not given one.
    _lun: Option<FileLun>,
    options: TgtOptions,
    proc: Guard,
}

fn tgtadm(control: u16, args: &[&str]) -> std::io::Result<std::process::Output> {
    Command::new("tgtadm").arg("-C").arg(control.to_string()).args(["--lld", "iscsi"]).args(args).output()
}

impl Tgt {
    pub fn start(size_mib: u64) -> Tgt {
        Tgt::start_with(size_mib, TgtOptions::default())
    }

    pub fn start_with(size_mib: u64, options: TgtOptions) -> Tgt {
        let lun = FileLun::new(size_mib);
        Tgt::launch(lun.file.clone(), Some(lun), options)
    }

    /// A tgtd serving `file` (a regular file or a block device, which outlives it) as LUN 1.
    pub fn serve(file: &Path) -> Tgt {
        Tgt::launch(file.to_owned(), None, TgtOptions::default())
    }

    fn launch(file: PathBuf, lun: Option<FileLun>, options: TgtOptions) -> Tgt {
        let port = free_port();
        let control = 10000 + (port % 20000);
        let mut t = Tgt { port, control, file, _lun: lun, options, proc: Guard::default() };
        t.spawn();
        t
    }

    fn spawn(&mut self) {
        self.spawn_with(true);
    }

    /// Starts tgtd with the target and its LUN; `bind` also lets initiators in, without it
    /// tgtd's portal is open and every login is refused with "target not found".
    fn spawn_with(&mut self, bind: bool) {
        let mut cmd = Command::new("tgtd");
        cmd.args(["-f", "-C", &self.control.to_string(), "--iscsi", &format!("portal=127.0.0.1:{}", self.port)]);
        self.proc = spawn(&mut cmd, None);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let out = tgtadm(self.control, &["--op", "new", "--mode", "target", "--tid", "1", "-T", IQN])
                .expect("tgtadm (Debian package tgt) must be installed");
            if out.status.success() {
                break;
            }
            assert!(Instant::now() < deadline, "tgtd did not come up: {}", String::from_utf8_lossy(&out.stderr));
            std::thread::sleep(Duration::from_millis(50));
        }
        let file = self.file.to_str().unwrap().to_owned();
        self.tgtadm_ok(&["--op", "new", "--mode", "logicalunit", "--tid", "1", "--lun", "1", "-b", &file]);
        if bind {
            self.bind();
        }
        // The portal listens once the target exists; wait until it accepts.
        assert!(wait_port(self.port, Duration::from_secs(10)), "tgtd portal never opened");
    }

    /// Runs `tgtadm` on this tgtd's control socket; fails the test if it fails.
    fn tgtadm_ok(&self, args: &[&str]) {
        let out = tgtadm(self.control, args).unwrap();
        assert!(out.status.success(), "tgtadm {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Lets every initiator in (`--op bind -I ALL`) and applies the settings and accounts.
    fn bind(&self) {
        self.tgtadm_ok(&["--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL"]);
        for (n, v) in &self.options.params {
            self.tgtadm_ok(&["--op", "update", "--mode", "target", "--tid", "1", "--name", n, "--value", v]);
        }
        if let Some((u, p)) = &self.options.incoming {
            self.tgtadm_ok(&["--op", "new", "--mode", "account", "--user", u, "--password", p]);
            self.tgtadm_ok(&["--op", "bind", "--mode", "account", "--tid", "1", "--user", u]);
        }
        if let Some((u, p)) = &self.options.outgoing {
            self.tgtadm_ok(&["--op", "new", "--mode", "account", "--user", u, "--password", p]);
            self.tgtadm_ok(&["--op", "bind", "--mode", "account", "--tid", "1", "--user", u, "--outgoing"]);
        }
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// SIGKILL (tgtd ignores SIGTERM while targets exist).
    pub fn kill(&mut self) {
        self.proc.kill();
        let _ = std::fs::remove_file(format!("/var/run/tgtd/socket.{}", self.control));
        let _ = std::fs::remove_file(format!("/var/run/tgtd/socket.{}.lock", self.control));
    }

    /// Starts tgtd again on the same port and file (after [`Tgt::kill`], a fresh start: the
    /// target, its LUN and its settings are made again, persistent reservations are gone).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// [`Tgt::restart`] stopped halfway, as a tgt whose configuration is still loading: the
    /// portal is open and the target exists, but every login is refused with "target not found"
    /// until [`Tgt::finish_restart`].
    pub fn restart_unbound(&mut self) {
        self.kill();
        self.spawn_with(false);
    }

    /// Lets initiators in after [`Tgt::restart_unbound`].
    pub fn finish_restart(&mut self) {
        self.bind();
    }

    pub fn url(&self) -> String {
        self.url_via(self.port)
    }

    /// The LUN's URL through another port (a [`crate::net::Proxy`] in front of tgtd).
    pub fn url_via(&self, port: u16) -> String {
        format!("iscsi://127.0.0.1:{port}/{IQN}/1")
    }
}

impl Drop for Tgt {
    fn drop(&mut self) {
        self.kill();
    }
}

/// How to start `stics target`.
#[derive(Clone, Debug, Default)]
pub struct SticsOptions {
    /// `--iqn`; None when the arguments name the targets (`--config`).
    pub iqn: Option<String>,
    /// Arguments after `target --listen ADDR [--iqn IQN]`.
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Where its stderr goes (otherwise nowhere).
    pub stderr: Option<PathBuf>,
}

impl SticsOptions {
    /// Target [`IQN`] with these arguments.
    pub fn args(args: &[&str]) -> SticsOptions {
        SticsOptions {
            iqn: Some(IQN.into()),
            args: args.iter().map(std::string::ToString::to_string).collect(),
            ..Default::default()
        }
    }
}

/// `stics target` as a child process on a random loopback port.
pub struct SticsTarget {
    pub port: u16,
    bin: PathBuf,
    options: SticsOptions,
    lun: Option<FileLun>,
    proc: Guard,
}

impl SticsTarget {
    /// Starts the binary at `bin` (`env!("CARGO_BIN_EXE_stics")`) and waits until it listens.
    pub fn start(bin: &Path, options: SticsOptions) -> SticsTarget {
        let mut t = SticsTarget { port: free_port(), bin: bin.to_owned(), options, lun: None, proc: Guard::default() };
        t.spawn();
        t
    }

    /// Target [`IQN`] with LUN 0 on a new sparse file of `size_mib` MiB, plus `extra` arguments.
    pub fn with_file_lun(bin: &Path, size_mib: u64, extra: &[&str]) -> SticsTarget {
        let lun = FileLun::new(size_mib);
        let mut options = SticsOptions::args(&["--lun", &format!("file:{}", lun.file.display())]);
        options.args.extend(extra.iter().map(std::string::ToString::to_string));
        let mut t =
            SticsTarget { port: free_port(), bin: bin.to_owned(), options, lun: Some(lun), proc: Guard::default() };
        t.spawn();
        t
    }

    /// Target `iqn` with one `--lun` per spec.
    pub fn with_luns(bin: &Path, iqn: &str, luns: &[&str]) -> SticsTarget {
        let args = luns.iter().flat_map(|l| ["--lun".to_owned(), l.to_string()]).collect();
        SticsTarget::start(bin, SticsOptions { iqn: Some(iqn.into()), args, ..Default::default() })
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new(&self.bin);
        cmd.args(["target", "--listen", &format!("127.0.0.1:{}", self.port)]);
        if let Some(iqn) = &self.options.iqn {
            cmd.args(["--iqn", iqn]);
        }
        cmd.args(&self.options.args).envs(self.options.env.iter().map(|(k, v)| (k, v)));
        self.proc = spawn(&mut cmd, self.options.stderr.as_deref());
        assert!(wait_port(self.port, START), "stics target did not listen on {}", self.port);
        // Another test's listener on a port both were given would answer for a target that
        // failed to bind it; such a target has exited by now.
        std::thread::sleep(Duration::from_millis(20));
        assert!(self.proc.alive(), "stics target exited right after starting on {}", self.port);
    }

    /// The backing file made by [`SticsTarget::with_file_lun`].
    pub fn file(&self) -> &Path {
        &self.lun.as_ref().expect("a target started with_file_lun").file
    }

    /// The `--iqn` it was started with (None when its config file names the targets).
    pub fn iqn(&self) -> Option<&str> {
        self.options.iqn.as_deref()
    }

    /// The URL of `lun` of the `--iqn` target; panics for a target named by a config file.
    pub fn url(&self, lun: u32) -> String {
        let iqn = self.iqn().expect("a URL for a target named by --iqn");
        format!("iscsi://127.0.0.1:{}/{iqn}/{lun}", self.port)
    }

    pub fn process(&mut self) -> &mut Guard {
        &mut self.proc
    }

    pub fn kill(&mut self) {
        self.proc.kill();
    }

    /// Starts it again on the same port with the same arguments.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

/// `127.0.0.1:0`: a free port on loopback.
pub fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// A memory LUN of `bytes` in blocks of `block_size`.
pub fn mem(bytes: u64, block_size: u32) -> Arc<dyn BlockDev> {
    Arc::new(MemDev::new(block_size, bytes / u64::from(block_size)))
}

/// The stics target inside the test's runtime, stopped by [`InProcess::stop`] (or when the
/// runtime ends).
pub struct InProcess {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl InProcess {
    /// Binds `config` (listen on `127.0.0.1:0` for a free port) and serves it in a task.
    pub async fn start(config: ServerConfig) -> InProcess {
        InProcess::serve(Server::bind(config).await.unwrap())
    }

    /// One target `iqn` on a free loopback port over `luns`.
    pub async fn over(iqn: &str, luns: Vec<Arc<dyn BlockDev>>) -> InProcess {
        InProcess::start(ServerConfig::new(vec![loopback()], vec![Target::new(iqn, luns)])).await
    }

    /// One target `iqn` on a free loopback port with one memory LUN of `bytes` in 512-byte blocks.
    pub async fn mem(iqn: &str, bytes: u64) -> InProcess {
        InProcess::over(iqn, vec![mem(bytes, 512)]).await
    }

    /// Serves a bound server in a task.
    pub fn serve(server: Server) -> InProcess {
        let addr = server.local_addrs()[0];
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            server
                .run(async {
                    let _ = rx.await;
                })
                .await
                .unwrap();
        });
        InProcess { addr, stop: Some(tx), task }
    }

    /// Shuts the server down and waits (up to 10 s) for it to finish.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), &mut self.task).await;
    }

    /// Stops serving at once, as a host that lost power does: the listener and every
    /// connection are dropped without a word, commands in flight never answered. Reservations
    /// and every other state of the served LUNs go with the server.
    pub async fn kill(mut self) {
        // The shutdown signal stays unsent (dropping it would start an orderly stop).
        let _signal = self.stop.take();
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

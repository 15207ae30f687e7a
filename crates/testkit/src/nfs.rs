//! NFS for tests: nfs-ganesha exporting ext4 on an image from a `stics wan` link's storage
//! namespace ([`Server`]), and `stics nfs-mount` clients of it in a host namespace ([`Client`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use stics_procs::ganesha::{Export, Setup, EXPORT_PATH};

use crate::netns::Wan;
use crate::proc::{run_ok, spawn, wait_mounted, Guard};

/// nfs-ganesha in `wan`'s storage namespace, exporting a fresh ext4 of `bytes` bytes.
pub struct Server {
    setup: Setup,
    pub guard: Guard,
    /// The URL clients mount.
    pub url: String,
    image: PathBuf,
    dir: PathBuf,
}

impl Server {
    /// Makes the image under `dir`, starts the server and waits until it serves.
    pub fn start(wan: &Wan, dir: &Path, bytes: u64) -> Server {
        let image = dir.join("export.img");
        let f = std::fs::File::create(&image).unwrap_or_else(|e| panic!("create {}: {e}", image.display()));
        f.set_len(bytes).unwrap();
        drop(f);
        run_ok(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image));
        let setup = Setup::new(dir.join("ganesha"), Export::Ext4Image(image.clone()));
        let guard = Self::run(wan, &setup, dir);
        let url = format!("nfs://{}{EXPORT_PATH}", wan.addr("storage"));
        Server { setup, guard, url, image, dir: dir.to_owned() }
    }

    fn run(wan: &Wan, setup: &Setup, dir: &Path) -> Guard {
        let script = setup.write().unwrap_or_else(|e| panic!("ganesha's files: {e}"));
        let mut exec = wan.exec("storage", Path::new("bash"));
        exec.arg(&script);
        let mut guard = spawn(&mut exec, Some(&dir.join("ganesha.stderr")));
        let up = stics_procs::wait_for(Duration::from_secs(30), || setup.ready() || !guard.alive());
        assert!(
            up && guard.alive(),
            "nfs-ganesha did not start: {}\n{}",
            std::fs::read_to_string(dir.join("ganesha.stderr")).unwrap_or_default(),
            std::fs::read_to_string(setup.log()).unwrap_or_default()
        );
        guard
    }

    /// Stops the server (its file system unmounted) and starts it again on the same file system:
    /// a new instance, whose write verifier differs from the last one's.
    pub fn restart(&mut self, wan: &Wan) {
        self.guard.kill();
        let image = self.image.clone();
        let gone = stics_procs::wait_for(Duration::from_secs(60), || stics_procs::loop_of(&image).is_none());
        assert!(gone, "the export's file system outlived its server");
        self.guard = Self::run(wan, &self.setup, &self.dir);
    }

    /// The server's log, for a failing test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.setup.log()).unwrap_or_default()
    }
}

/// A `stics nfs-mount` of a server, in a host namespace; unmounted when dropped.
pub struct Client {
    pub guard: Guard,
    pub dir: PathBuf,
    pub counters: PathBuf,
    pub stderr: PathBuf,
}

impl Client {
    /// Mounts `url` on `dir` (made if missing) from `role`'s namespace with `extra` arguments;
    /// its stderr and counters beside `dir`.
    pub fn mount(bin: &Path, wan: &Wan, role: &str, url: &str, dir: &Path, extra: &[&str]) -> Client {
        std::fs::create_dir_all(dir).unwrap();
        let counters = dir.with_extension("counts.json");
        let stderr = dir.with_extension("stderr");
        let mut exec = wan.exec(role, bin);
        exec.args(["nfs-mount", url]).arg(dir).arg("--counters").arg(&counters).args(extra);
        let mut guard = spawn(&mut exec, Some(&stderr));
        let up = stics_procs::wait_for(Duration::from_secs(30), || mounted(dir) || !guard.alive());
        assert!(
            up && guard.alive(),
            "stics nfs-mount did not mount: {}",
            std::fs::read_to_string(&stderr).unwrap_or_default()
        );
        Client { guard, dir: dir.to_owned(), counters, stderr }
    }

    /// The RPCs sent so far by procedure (and `total`, `bytes_read`, `bytes_written`).
    pub fn counts(&self) -> serde_json::Value {
        let _ = std::fs::remove_file(&self.counters);
        assert!(self.guard.signal(libc::SIGUSR1));
        let mut v = None;
        stics_procs::wait_for(Duration::from_secs(10), || {
            v = std::fs::read_to_string(&self.counters).ok().and_then(|t| serde_json::from_str(&t).ok());
            v.is_some()
        });
        v.unwrap_or_else(|| panic!("no counts in {}", self.counters.display()))
    }

    /// One procedure's count so far.
    pub fn count(&self, procedure: &str) -> u64 {
        self.counts()[procedure].as_u64().unwrap_or_else(|| panic!("no count of {procedure}"))
    }

    /// Forgets the client's caches (SIGUSR2), as a remount would; returns once they are gone
    /// (the client writes its counts after it dropped them).
    pub fn drop_caches(&self) {
        let _ = std::fs::remove_file(&self.counters);
        assert!(self.guard.signal(libc::SIGUSR2));
        let done = stics_procs::wait_for(Duration::from_secs(30), || self.counters.exists());
        assert!(done, "the client did not drop its caches");
    }

    /// Unmounts (SIGTERM: dirty data is written and committed first) and waits for the process.
    pub fn unmount(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if self.guard.alive() {
            self.guard.signal(libc::SIGTERM);
            let st = self.guard.wait_exit(Duration::from_secs(60));
            assert!(
                st.is_some_and(|s| s.success()) || std::thread::panicking(),
                "stics nfs-mount did not stop cleanly ({st:?}): {}",
                std::fs::read_to_string(&self.stderr).unwrap_or_default()
            );
        }
        if mounted(&self.dir) {
            let _ = Command::new("fusermount3").arg("-u").arg("-z").arg(&self.dir).status();
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.stop();
    }
}

/// True while `dir` is a mount point.
pub fn mounted(dir: &Path) -> bool {
    wait_mounted(dir, true, Duration::ZERO)
}

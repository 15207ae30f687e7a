//! A child process ended by PID: a guard that kills it (SIGKILL) and reaps it when dropped, so
//! that a failing test or an interrupted run leaves nothing running.

use std::process::{Child, ExitStatus};
use std::time::Duration;

/// A child process, killed with SIGKILL and reaped when dropped. [`Guard::default`] holds none.
#[derive(Debug, Default)]
pub struct Guard(Option<Child>);

impl Guard {
    pub fn new(child: Child) -> Guard {
        Guard(Some(child))
    }

    /// The PID, or 0 once the child is gone.
    pub fn pid(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }

    /// Sends `signal` (`libc::SIGTERM`, …); false if there is no child or kill(2) failed.
    pub fn signal(&self, signal: i32) -> bool {
        let Ok(pid) = i32::try_from(self.pid()) else { return false };
        if pid == 0 {
            return false;
        }
        // SAFETY: kill(2) on a child we spawned and have not reaped, so its PID is still ours.
        unsafe { libc::kill(pid, signal) == 0 }
    }

    /// True while the child runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.0.as_mut().map(Child::try_wait), Some(Ok(None)))
    }

    /// The child's exit status if it has exited, without waiting (the guard keeps it).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.0.as_mut()?.try_wait().ok().flatten()
    }

    /// Waits up to `limit` for the child to exit and returns its status (the guard then holds
    /// nothing); None if it still runs, and then the guard still holds it.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let mut status = None;
        crate::wait_for(limit, || {
            status = self.exited();
            status.is_some() || self.0.is_none()
        });
        if status.is_some() {
            self.0 = None;
        }
        status
    }

    /// True once 127.0.0.1:`port` accepts a connection ([`crate::port::accepts`]); false when
    /// `limit` passes or as soon as the child has exited, which then need not be waited out.
    pub fn wait_port(&mut self, port: u16, limit: Duration) -> bool {
        let mut up = false;
        crate::wait_for(limit, || {
            up = crate::port::accepts(("127.0.0.1", port));
            up || !self.alive()
        });
        up
    }

    /// Sends `signal` and waits up to `limit` for the child to exit; SIGKILL after that.
    pub fn stop(&mut self, signal: i32, limit: Duration) {
        self.signal(signal);
        if self.wait_exit(limit).is_none() {
            self.kill();
        }
    }

    /// SIGKILL, then waits for the child to exit.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The resident set size in KiB, from /proc.
    pub fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// User + system CPU seconds the child has used so far.
    pub fn cpu_secs(&self) -> Option<f64> {
        cpu_secs_of(self.pid())
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// User + system CPU seconds process `pid` has used, from /proc.
pub fn cpu_secs_of(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which may hold spaces, start after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some(ticks / hz.max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::process::{Command, Stdio};
    use std::time::Instant;

    fn sleeper() -> Guard {
        Guard::new(Command::new("sleep").arg("30").stdout(Stdio::null()).spawn().unwrap())
    }

    #[test]
    fn guard_kills_on_drop_and_reports_exit() {
        let mut g = sleeper();
        let pid = g.pid();
        assert!(pid != 0 && g.alive());
        assert!(g.rss_kib().is_some_and(|k| k > 0));
        assert!(g.cpu_secs().is_some());
        drop(g);
        // Killed and reaped: the PID is gone (reuse within these microseconds is not a concern).
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
        g = sleeper();
        assert!(g.signal(libc::SIGTERM));
        let st = g.wait_exit(Duration::from_secs(5)).expect("exited on SIGTERM");
        assert!(!st.success());
        assert_eq!(g.pid(), 0);
        assert!(!g.signal(libc::SIGTERM), "nothing left to signal");
    }

    #[test]
    fn stop_signals_then_kills_what_does_not_exit() {
        // A shell that ignores SIGTERM is killed once the grace time has passed.
        let child = Command::new("sh").args(["-c", "trap '' TERM; exec sleep 30"]).spawn().unwrap();
        let mut g = Guard::new(child);
        std::thread::sleep(Duration::from_millis(100));
        let t0 = Instant::now();
        g.stop(libc::SIGTERM, Duration::from_millis(300));
        assert!(t0.elapsed() >= Duration::from_millis(300));
        assert_eq!(g.pid(), 0);
        let mut g = sleeper();
        g.stop(libc::SIGTERM, Duration::from_secs(5));
        assert!(!g.alive());
    }

    #[test]
    fn wait_port_gives_up_as_soon_as_the_child_has_exited() {
        // Nothing will listen on the port: the child exits at once, and the wait ends with it
        // instead of running out its limit.
        let port = crate::port::free_port().unwrap();
        let mut g = Guard::new(Command::new("true").spawn().unwrap());
        let t0 = Instant::now();
        assert!(!g.wait_port(port, Duration::from_secs(30)));
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        let l = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let mut g = sleeper();
        assert!(g.wait_port(l.local_addr().unwrap().port(), Duration::from_secs(5)));
    }
}

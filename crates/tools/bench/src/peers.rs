//! The processes under test: `stics target`, tgt and `stics gateway`, in this namespace or in one
//! of a `stics wan` instance's, and the WAN instance itself. Every process is a [`Proc`], ended by
//! PID; a [`Wan`] is taken down when dropped.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use stics_procs::{accepts, free_port};

use crate::env::Undo;
use crate::{Bench, Error, Proc, Result};

/// The IQN `stics bench` serves its stics targets under.
pub const STICS_IQN: &str = "iqn.2024-01.org.stics.bench:target";
/// The IQN of the tgt peer (its data LUN is 1; LUN 0 is its controller).
pub const TGT_IQN: &str = "iqn.2024-01.org.stics.bench:tgt";

/// A running target and the URL of the LUN under test.
#[derive(Debug)]
pub struct Target {
    pub proc: Proc,
    pub url: String,
    /// tgtadm's control port, for tgt.
    ctl: Option<u16>,
}

impl Target {
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// CPU seconds the target has used so far.
    pub fn cpu_secs(&self) -> f64 {
        self.proc.cpu_secs().unwrap_or(f64::NAN)
    }

    /// `HOST:PORT` of the target's URL, as libiscsi's tools and qemu's iscsi driver take it.
    pub fn portal(&self) -> &str {
        let rest = self.url.trim_start_matches("iscsi://");
        rest.split('/').next().unwrap_or(rest)
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(ctl) = self.ctl {
            // tgtd ignores SIGTERM while it has targets; this deletes them and stops it cleanly.
            let _ =
                Command::new("tgtadm").args(["-C", &ctl.to_string(), "--op", "delete", "--mode", "system"]).output();
            self.proc.stop(libc::SIGKILL, Duration::from_secs(2));
        }
    }
}

/// `stics target` serving `luns` (device specs) on 127.0.0.1, LUN 0 in the URL.
pub fn stics_target(b: &Bench, name: &str, luns: &[&str]) -> Result<Target> {
    stics_target_with(b, name, luns, &[])
}

/// [`stics_target`] with more arguments (`--tls-cert`, ...).
pub fn stics_target_with(b: &Bench, name: &str, luns: &[&str], extra: &[&str]) -> Result<Target> {
    let port = free_port()?;
    let addr = format!("127.0.0.1:{port}");
    let mut proc = b.spawn(name, target_args(&mut b.stics_cmd(), &addr, luns).args(extra))?;
    proc.wait_until(Duration::from_secs(20), || accepts(&addr))?;
    Ok(Target { proc, url: format!("iscsi://{addr}/{STICS_IQN}/0"), ctl: None })
}

/// `cmd` (the `stics` binary) made `stics target` serving `luns` on `listen` under [`STICS_IQN`].
fn target_args<'a>(cmd: &'a mut Command, listen: &str, luns: &[&str]) -> &'a mut Command {
    cmd.args(["target", "--listen", listen, "--iqn", STICS_IQN]);
    for l in luns {
        cmd.args(["--lun", l]);
    }
    cmd
}

/// tgtd serving `file` as LUN 1 on 127.0.0.1.
pub fn tgt(b: &Bench, name: &str, file: &Path) -> Result<Target> {
    let t = tgtd(b, name, None)?;
    t.tgtadm(b, &["--op", "new", "--mode", "logicalunit", "--tid", "1", "--lun", "1", "-b", &file.to_string_lossy()])?;
    t.tgtadm(b, &["--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL"])?;
    Ok(t)
}

/// tgtd on a free loopback port (with `ceph_args` in its environment as `CEPH_ARGS`) with
/// target 1 made and no LUN yet.
fn tgtd(b: &Bench, name: &str, ceph_args: Option<&str>) -> Result<Target> {
    b.need(&["tgtd", "tgtadm"])?;
    let port = free_port()?;
    let ctl = port % 30000 + 1000;
    let addr = format!("127.0.0.1:{port}");
    // Through env(1), so that the commands of the report show the setting; env execs tgtd, whose
    // PID stays the one spawned.
    let mut cmd = Command::new("env");
    if let Some(a) = ceph_args {
        cmd.arg(format!("CEPH_ARGS={a}"));
    }
    cmd.args(["tgtd", "-f", "-C", &ctl.to_string(), "--iscsi", &format!("portal={addr}")]);
    let mut proc = b.spawn(name, &mut cmd)?;
    proc.wait_until(Duration::from_secs(20), || accepts(&addr))?;
    let t = Target { proc, url: format!("iscsi://{addr}/{TGT_IQN}/1"), ctl: Some(ctl) };
    t.tgtadm(b, &["--op", "new", "--mode", "target", "--tid", "1", "-T", TGT_IQN])?;
    Ok(t)
}

/// Where Debian's tgt-rbd installs tgt's rbd backing store.
const TGT_BS_RBD: &str = "/usr/lib/tgt/backing-store/bs_rbd.so";

/// tgtd serving the Ceph RBD image `image` (`POOL/NAME`) of the cluster whose config file is
/// `conf` as LUN 1 on 127.0.0.1, through tgt's `rbd` backing store (Debian: tgt-rbd), which
/// opens the image with librbd when the LUN is made. librbd's cache is off (`CEPH_ARGS`, which
/// the backing store reads), as `stics target` runs it: a completed write is in the OSDs, not
/// acknowledged early from the client's memory. End it with [`Target::close`], so that the image
/// is closed (and its exclusive lock given back) before tgtd goes.
pub fn tgt_rbd(b: &Bench, name: &str, image: &str, conf: &Path) -> Result<Target> {
    let ceph_args = std::env::var("CEPH_ARGS").map_or_else(|_| String::new(), |a| a + " ") + "--rbd-cache=false";
    let t = tgtd(b, name, Some(&ceph_args))?;
    let bsopts = format!("conf={}", conf.display());
    let lun = ["--op", "new", "--mode", "logicalunit", "--tid", "1", "--lun", "1", "--bstype", "rbd"];
    if let Err(e) = t.tgtadm(b, &[&lun[..], &["--backing-store", image, "--bsopts", &bsopts]].concat()) {
        if !Path::new(TGT_BS_RBD).exists() {
            return Err(Error::Missing {
                tool: format!("tgt's rbd backing store ({TGT_BS_RBD})"),
                package: "tgt-rbd".into(),
            });
        }
        // tgtadm only says "invalid request"; tgtd's log says why librbd refused.
        let log = std::fs::read_to_string(t.proc.log()).unwrap_or_default();
        return Err(Error::Command {
            command: format!("tgt's rbd backing store opening {image}"),
            status: e.to_string(),
            stderr: crate::env::tail(&log),
        });
    }
    t.tgtadm(b, &["--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL"])?;
    Ok(t)
}

impl Target {
    /// Runs `tgtadm` with `args` against this tgtd (an error for a `stics target`).
    fn tgtadm(&self, b: &Bench, args: &[&str]) -> Result<()> {
        let ctl = self.ctl.ok_or_else(|| Error::Output { what: "tgtadm".into(), detail: "not a tgtd".into() })?;
        b.run(Command::new("tgtadm").args(["-C", &ctl.to_string(), "--lld", "iscsi"]).args(args)).map(|_| ())
    }

    /// Ends the target after it has let go of what it serves: tgt deletes its LUN and target
    /// (closing an RBD image, which gives its exclusive lock back) and exits; `stics target` gets
    /// SIGTERM and closes its LUNs. Either is killed if it has not gone within 30 s.
    pub fn close(mut self, b: &Bench) {
        let limit = Duration::from_secs(30);
        let Some(ctl) = self.ctl else {
            self.proc.stop(libc::SIGTERM, limit);
            return;
        };
        let c = ctl.to_string();
        for args in [
            &["--op", "delete", "--mode", "logicalunit", "--tid", "1", "--lun", "1"][..],
            &["--op", "delete", "--mode", "target", "--tid", "1", "--force"],
            &["--op", "delete", "--mode", "system"],
        ] {
            let _ = b.run(Command::new("tgtadm").args(["-C", &c, "--lld", "iscsi"]).args(args));
        }
        // tgtd exits by itself once the system is deleted (then `kill` only reaps it); SIGTERM is
        // the fallback.
        match self.proc.wait_until(limit, || false) {
            Err(Error::Command { .. }) => self.proc.kill(),
            _ => self.proc.stop(libc::SIGTERM, Duration::from_secs(2)),
        }
    }
}

/// A file of `bytes` random bytes in the scratch folder, just written and so in the page cache
/// for every target that serves it.
pub fn random_file(b: &Bench, name: &str, bytes: u64) -> Result<PathBuf> {
    let path = b.work().join(name);
    fill_random(&path, bytes)?;
    Ok(path)
}

/// Writes `bytes` random bytes to a new file at `path`.
pub fn fill_random(path: &Path, bytes: u64) -> Result<()> {
    use rand::RngCore;
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut rng = rand::thread_rng();
    let mut buf = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        rng.fill_bytes(&mut buf[..n]);
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.flush()?;
    Ok(())
}

/// A `stics wan` instance: two namespaces (`host`, `storage`) joined through an emulated link.
#[derive(Debug)]
pub struct Wan {
    name: String,
    stics: PathBuf,
}

impl Wan {
    /// `stics wan --name NAME up ARGS…` (root, iproute2, iptables).
    pub fn up(b: &Bench, name: &str, args: &[&str]) -> Result<Wan> {
        b.need(&["ip", "iptables"])?;
        crate::env::remember(Undo::Wan { stics: b.stics().to_owned(), name: name.to_owned() });
        if let Err(e) = b.run(b.stics_cmd().args(["wan", "--name", name, "up"]).args(args)) {
            drop(Wan { name: name.to_owned(), stics: b.stics().to_owned() });
            return Err(e);
        }
        Ok(Wan { name: name.to_owned(), stics: b.stics().to_owned() })
    }

    /// Changes the link: `stics wan set ARGS…`.
    pub fn set(&self, b: &Bench, args: &[&str]) -> Result<()> {
        b.run(b.stics_cmd().args(["wan", "--name", &self.name, "set"]).args(args)).map(|_| ())
    }

    /// A command that runs `program` inside `role`'s namespace ("host" or "storage").
    pub fn exec(&self, role: &str, program: &Path) -> Command {
        let mut c = Command::new(&self.stics);
        c.args(["wan", "--name", &self.name, "exec", role, "--"]).arg(program);
        c
    }

    /// The address of `role`'s namespace.
    pub fn addr(&self, b: &Bench, role: &str) -> Result<String> {
        Ok(b.run(b.stics_cmd().args(["wan", "--name", &self.name, "addr", role]))?.stdout.trim().to_owned())
    }

    /// Packets, bytes and packets by frame length that crossed the link so far, both directions.
    pub fn counts(&self, b: &Bench) -> Result<Counts> {
        let v = self.status(b)?;
        let paths = v["paths"].as_array().cloned().unwrap_or_default();
        let sum = |k: &str| paths.iter().filter_map(|p| p[k].as_u64()).sum();
        let mut sizes = Vec::new();
        for p in &paths {
            for (i, n) in p["sizes"].as_array().into_iter().flatten().enumerate() {
                if sizes.len() <= i {
                    sizes.push(0);
                }
                sizes[i] += n.as_u64().unwrap_or(0);
            }
        }
        Ok(Counts { packets: sum("packets"), bytes: sum("bytes"), sizes })
    }

    /// `stics wan status --json`: the link's settings and each path's counters.
    pub fn status(&self, b: &Bench) -> Result<serde_json::Value> {
        let out = b.run(b.stics_cmd().args(["wan", "--name", &self.name, "status", "--json"]))?;
        serde_json::from_str(&out.stdout)
            .map_err(|e| Error::Output { what: "stics wan status --json".into(), detail: e.to_string() })
    }

    /// Waits until `addr:port` accepts connections from inside `role`'s namespace.
    pub fn wait_port(&self, proc: &mut Proc, role: &str, addr: &str, port: u16) -> Result<()> {
        let probe = format!("exec 3<>/dev/tcp/{addr}/{port}");
        let mut cmd = self.exec(role, Path::new("bash"));
        cmd.args(["-c", &probe]);
        proc.wait_until(Duration::from_secs(20), || cmd.output().is_ok_and(|o| o.status.success()))
    }

    /// `stics target` inside `role`'s namespace, listening on its address.
    pub fn stics_target(&self, b: &Bench, name: &str, role: &str, luns: &[&str]) -> Result<Target> {
        self.stics_target_on(b, name, role, 3260, luns)
    }

    /// [`Wan::stics_target`] on another port, beside one on 3260 (the gateway's port on
    /// loopback is 3260 too, but a target listens on the namespace's WAN address).
    pub fn stics_target_on(&self, b: &Bench, name: &str, role: &str, port: u16, luns: &[&str]) -> Result<Target> {
        self.stics_target_on_with(b, name, role, port, luns, &[])
    }

    /// [`Wan::stics_target_on`] with more arguments (`--metrics`, ...).
    pub fn stics_target_on_with(
        &self,
        b: &Bench,
        name: &str,
        role: &str,
        port: u16,
        luns: &[&str],
        extra: &[&str],
    ) -> Result<Target> {
        let addr = self.addr(b, role)?;
        let listen = format!("{addr}:{port}");
        let mut proc = b.spawn(name, target_args(&mut self.exec(role, b.stics()), &listen, luns).args(extra))?;
        self.wait_port(&mut proc, role, &addr, port)?;
        Ok(Target { proc, url: format!("iscsi://{addr}:{port}/{STICS_IQN}/0"), ctl: None })
    }

    /// The commands a stics target or gateway in `role`'s namespace, whose `--metrics` listens on
    /// `metrics`, has answered so far.
    pub fn waits(&self, b: &Bench, role: &str, metrics: &str) -> Result<Waits> {
        Ok(Waits::parse(&self.get(b, role, metrics, "/metrics")?))
    }

    /// The body of `GET path` from `metrics` (`host:port`) in `role`'s namespace.
    fn get(&self, b: &Bench, role: &str, metrics: &str, path: &str) -> Result<String> {
        b.need(&["curl"])?;
        let mut cmd = self.exec(role, Path::new("curl"));
        cmd.args(["-sf", &format!("http://{metrics}{path}")]);
        Ok(b.run(&mut cmd)?.stdout)
    }

    /// [`Wan::waits`] of a gateway: the host's commands it answered.
    pub fn gateway_waits(&self, b: &Bench, g: &Gateway) -> Result<Waits> {
        self.waits(b, &g.role, &g.metrics)
    }

    /// `/status` of a target or gateway in `role`'s namespace whose `--metrics` listens on
    /// `metrics`.
    pub fn target_status(&self, b: &Bench, role: &str, metrics: &str) -> Result<serde_json::Value> {
        serde_json::from_str(&self.get(b, role, metrics, "/status")?)
            .map_err(|e| Error::Output { what: format!("/status at {metrics} in {role}"), detail: e.to_string() })
    }
}

/// The SCSI commands a stics target or gateway answered, by kind (`read`, `write`, `flush`,
/// `other`): how many, and their latencies summed (from each command's start to its response),
/// from the `stics_target_commands` and `stics_target_command_latency_seconds` families of its
/// `/metrics`, summed over its LUNs.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Waits(pub std::collections::BTreeMap<String, Wait>);

/// Commands of one kind and their latencies summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Wait {
    pub commands: f64,
    pub secs: f64,
}

impl Waits {
    /// Reads a `/metrics` page (Prometheus text format); other families are skipped.
    pub fn parse(text: &str) -> Waits {
        let mut w = Waits::default();
        for line in text.lines() {
            let Some((name, rest)) = line.split_once('{') else { continue };
            let is_count = name == "stics_target_commands_total";
            if !is_count && name != "stics_target_command_latency_seconds_sum" {
                continue;
            }
            let Some((labels, value)) = rest.rsplit_once('}') else { continue };
            let kind = labels.split(',').find_map(|l| l.strip_prefix("kind=\"")?.strip_suffix('"'));
            let (Some(kind), Ok(value)) = (kind, value.trim().parse::<f64>()) else { continue };
            let e = w.0.entry(kind.to_owned()).or_default();
            if is_count {
                e.commands += value;
            } else {
                e.secs += value;
            }
        }
        w
    }

    /// What was answered since `earlier`, a reading of the same process.
    pub fn since(&self, earlier: &Waits) -> Waits {
        let mut w = self.clone();
        for (kind, e) in &mut w.0 {
            let before = earlier.0.get(kind).copied().unwrap_or_default();
            e.commands -= before.commands;
            e.secs -= before.secs;
        }
        w.0.retain(|_, e| e.commands > 0.0);
        w
    }

    /// The sum of `runs` readings' kinds, divided by `runs`: what one run answered on average.
    pub fn mean(runs: &[Waits]) -> Waits {
        let mut w = Waits::default();
        for r in runs {
            for (kind, e) in &r.0 {
                let m = w.0.entry(kind.clone()).or_default();
                m.commands += e.commands / runs.len() as f64;
                m.secs += e.secs / runs.len() as f64;
            }
        }
        w
    }
}

/// Counters of a WAN's link, both directions summed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    pub packets: u64,
    pub bytes: u64,
    /// Packets by Ethernet frame length, in `stics_wan`'s buckets (≤64, 65–127, 128–255, 256–511, 512–1023, ≥1024).
    pub sizes: Vec<u64>,
}

/// A `stics gateway` running in a WAN namespace, and how to reach it from there.
#[derive(Debug)]
pub struct Gateway {
    pub proc: Proc,
    /// The cached LUN, as a client in the same namespace reaches it.
    pub url: String,
    /// `host:port` of its metrics endpoint (`/status`, `/metrics`, `POST /drain`).
    pub metrics: String,
    /// The URL of the LUN it caches, as it reaches it.
    pub remote: String,
    role: String,
}

/// The IQN `stics bench` serves its gateways under.
pub const GATEWAY_IQN: &str = "iqn.2024-01.org.stics.bench:gateway";

/// How a gateway is started.
#[derive(Debug, Clone)]
pub struct GatewayOptions {
    /// `log`, `immediate` or `write-through`.
    pub mode: String,
    /// `PATH:SIZE` of its write log (a fresh file is best: a log names the LUN it caches).
    pub log: String,
    pub ram: String,
    pub read_cache: String,
    /// More `stics gateway` arguments (`--max-lag SECS`).
    pub extra: Vec<String>,
}

impl GatewayOptions {
    /// The experiments' usual gateway: `mode` over a fresh log of `size` at `path`, a 64 MiB RAM
    /// buffer and a 256 MiB read cache, no more arguments.
    pub fn usual(mode: &str, path: &Path, size: &str) -> GatewayOptions {
        GatewayOptions {
            mode: mode.to_owned(),
            log: format!("{}:{size}", path.display()),
            ram: "64MiB".into(),
            read_cache: "256MiB".into(),
            extra: Vec::new(),
        }
    }
}

impl Wan {
    /// `stics gateway` in `role`'s namespace on 127.0.0.1:3260, caching `remote`.
    pub fn gateway(&self, b: &Bench, name: &str, role: &str, remote: &str, o: &GatewayOptions) -> Result<Gateway> {
        self.gateway_at(b, name, role, "127.0.0.1", remote, o)
    }

    /// The `n`th of several `stics gateway`s in `role`'s namespace, on 127.0.0.1:3270+n with its
    /// metrics on 127.0.0.1:9110+n, caching `remote`.
    pub fn gateway_n(
        &self,
        b: &Bench,
        name: &str,
        role: &str,
        n: u16,
        remote: &str,
        o: &GatewayOptions,
    ) -> Result<Gateway> {
        self.start_gateway(b, name, role, ("127.0.0.1", 3270 + n, 9110 + n), remote, o, None)
    }

    /// `stics gateway` in `role`'s namespace serving on `addr`:3261 (so that it may share the
    /// namespace with a target on port 3260), caching `remote`.
    pub fn gateway_at(
        &self,
        b: &Bench,
        name: &str,
        role: &str,
        addr: &str,
        remote: &str,
        o: &GatewayOptions,
    ) -> Result<Gateway> {
        let port = if addr == "127.0.0.1" { 3260 } else { 3261 };
        self.start_gateway(b, name, role, (addr, port, 9100), remote, o, b.log_disk())
    }

    /// `stics gateway` in `role`'s namespace serving on `addr:port` with its metrics on
    /// 127.0.0.1:`metrics_port`, caching `remote`, its log behind `log_disk` if given; returns
    /// once both ports answer.
    #[allow(clippy::too_many_arguments)]
    fn start_gateway(
        &self,
        b: &Bench,
        name: &str,
        role: &str,
        (addr, port, metrics_port): (&str, u16, u16),
        remote: &str,
        o: &GatewayOptions,
        log_disk: Option<stics_disk::Preset>,
    ) -> Result<Gateway> {
        let metrics = format!("127.0.0.1:{metrics_port}");
        let mut cmd = self.exec(role, b.stics());
        cmd.args(["gateway", "--listen", &format!("{addr}:{port}"), "--iqn", GATEWAY_IQN, "--remote", remote])
            .args(["--log", &o.log, "--mode", &o.mode, "--ram", &o.ram, "--read-cache", &o.read_cache])
            .args(&o.extra)
            .args(["--metrics", &metrics]);
        if let Some(m) = log_disk {
            cmd.args(["--log-disk", m.name()]);
        }
        if let Some(p) = b.read_cache_policy() {
            cmd.args(["--policy", p]);
        }
        let mut proc = b.spawn(name, &mut cmd)?;
        self.wait_port(&mut proc, role, addr, port)?;
        self.wait_port(&mut proc, role, "127.0.0.1", metrics_port)?;
        Ok(Gateway {
            proc,
            url: format!("iscsi://{addr}:{port}/{GATEWAY_IQN}/0"),
            metrics,
            remote: remote.to_owned(),
            role: role.to_owned(),
        })
    }

    /// The gateway's `/status` as JSON.
    pub fn gateway_status(&self, b: &Bench, g: &Gateway) -> Result<serde_json::Value> {
        self.target_status(b, &g.role, &g.metrics)
    }

    /// Destages everything the gateway holds and returns when the remote has it all.
    pub fn gateway_drain(&self, b: &Bench, g: &Gateway) -> Result<()> {
        b.need(&["curl"])?;
        let mut cmd = self.exec(&g.role, Path::new("curl"));
        cmd.args(["-sf", "-X", "POST", &format!("http://{}/drain", g.metrics)]);
        b.run(&mut cmd).map(|_| ())
    }

    /// Stops the gateway (SIGTERM, dirty data stays in its log), deletes its log file and
    /// breaks the reservation it held on `remote`, so that another gateway may take the LUN.
    pub fn gateway_stop(&self, b: &Bench, mut g: Gateway, remote: &str, log_path: &Path) -> Result<()> {
        g.proc.stop(libc::SIGTERM, Duration::from_secs(60));
        let text = std::fs::read_to_string(g.proc.log()).unwrap_or_default();
        let _ = std::fs::remove_file(log_path);
        if let Some(key) = text.rsplit("key=").next().filter(|_| text.contains("key=")) {
            let key: String = key.chars().take_while(char::is_ascii_alphanumeric).collect();
            let mut cmd = self.exec(&g.role, b.stics());
            cmd.args(["release", remote, "--holder", &key]);
            b.run(&mut cmd)?;
        }
        Ok(())
    }
}

impl Drop for Wan {
    fn drop(&mut self) {
        let _ = Command::new(&self.stics).args(["wan", "--name", &self.name, "down"]).output();
        crate::env::forget(&Undo::Wan { stics: self.stics.clone(), name: self.name.clone() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_read_commands_and_summed_latency_by_kind_from_metrics() {
        let page = r#"# HELP stics_target_commands SCSI commands by kind.
# TYPE stics_target_commands counter
stics_target_commands_total{target="iqn.2024-01.org.stics.bench:gateway",lun="0",kind="read"} 10
stics_target_commands_total{target="iqn.2024-01.org.stics.bench:gateway",lun="0",kind="write"} 4
stics_target_commands_total{target="iqn.2024-01.org.stics.bench:gateway",lun="1",kind="write"} 2
stics_target_failed_commands_total{target="iqn.2024-01.org.stics.bench:gateway",lun="0",kind="read"} 1
stics_target_command_latency_seconds_sum{target="iqn.2024-01.org.stics.bench:gateway",lun="0",kind="read"} 0.5
stics_target_command_latency_seconds_count{target="iqn.2024-01.org.stics.bench:gateway",lun="0",kind="read"} 10
stics_target_command_latency_seconds_bucket{le="0.001",target="iqn.2024-01.org.stics.bench:gateway",lun="0",kind="read"} 3
stics_target_command_latency_seconds_sum{target="iqn.2024-01.org.stics.bench:gateway",lun="0",kind="write"} 0.25
stics_cache_dirty_bytes{target="iqn.2024-01.org.stics.bench:gateway",lun="0"} 4096
"#;
        let w = Waits::parse(page);
        assert_eq!(w.0.len(), 2, "{w:?}");
        assert_eq!(w.0["read"], Wait { commands: 10.0, secs: 0.5 });
        assert_eq!(w.0["write"], Wait { commands: 6.0, secs: 0.25 }, "summed over LUNs");
        let earlier = Waits::parse(&page.replace("} 10\n", "} 8\n").replace("} 0.5\n", "} 0.1\n"));
        let d = w.since(&earlier);
        assert_eq!(d.0["read"].commands, 2.0);
        assert!((d.0["read"].secs - 0.4).abs() < 1e-12);
        assert!(!d.0.contains_key("write"), "a kind with no command since is left out: {d:?}");
        let m = Waits::mean(&[w.clone(), d]);
        assert_eq!(m.0["read"].commands, 6.0);
        assert_eq!(m.0["write"].commands, 3.0);
        assert_eq!(Waits::parse("garbage{kind=\"read\"\n{}\n"), Waits::default());
    }
}

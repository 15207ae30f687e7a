//! PostMark on ext4 over a LUN, the way seeds 000, 002 and 004 run it: the LUN exported as a file
//! by `stics mount` in a WAN namespace, ext4 on it through a loop device mounted `-o sync` (so the
//! run reaches the device instead of the page cache), timed, with the WAN's packets and bytes
//! counted around it and `e2fsck -fn` after it. Shared by postmark, packets, cache-location and
//! congestion.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::env::{forget, remember, Undo};
use crate::peers::{Gateway, Waits, Wan};
use crate::{Bench, Error, Proc, Result};

/// A PostMark configuration (its defaults: file sizes 500 B to 9.77 KB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    pub files: u64,
    pub transactions: u64,
    /// Read and write block size.
    pub block: u64,
}

impl Pool {
    /// Bytes the pool holds on average: files × the mean of PostMark's default sizes.
    pub fn working_set(&self) -> u64 {
        self.files * (500 + 10_000) / 2
    }
}

/// What one run measured.
#[derive(Debug, Clone, Default)]
pub struct Run {
    /// PostMark's own run time.
    pub seconds: f64,
    /// Packets and IP bytes on the emulated link, both directions, from mkfs done to the gateway
    /// drained after the run (what the run made cross the WAN, destage included).
    pub packets: u64,
    pub bytes: u64,
    /// Packets by IP length (stics_wan's buckets).
    pub sizes: Vec<u64>,
    /// Bytes the host wrote to the LUN (the loop device's count).
    pub host_bytes: u64,
    /// `e2fsck -fn` found nothing.
    pub fsck_clean: bool,
    /// What a gateway over the link shipped (its `/status` `groups`), None otherwise.
    pub groups: Option<Groups>,
    /// Over the same span: the host's commands a gateway answered (None without one), and the
    /// commands the remote answered (None when its metrics were not asked for).
    pub gateway_waits: Option<Waits>,
    pub remote_waits: Option<Waits>,
}

/// Where a stics target's `--metrics` listens: its role's namespace and `host:port` there.
#[derive(Debug, Clone, Copy)]
pub struct Metrics<'a> {
    pub role: &'a str,
    pub addr: &'a str,
}

/// The groups a gateway shipped to a stics SG, from its `/status`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Groups {
    pub groups: u64,
    pub epochs: u64,
    /// Bytes of the groups' epochs as the host wrote them, after merging (last write wins,
    /// neighbours coalesced) and as shipped (compressed, with their tables).
    pub before_merge: u64,
    pub merged: u64,
    pub shipped: u64,
    /// Epochs too large for a group, sent as plain writes.
    pub plain_epochs: u64,
}

impl Groups {
    /// Reads the `groups` object of a gateway's `/status`.
    pub fn of(v: &serde_json::Value) -> Option<Groups> {
        let n = |k: &str| v.get(k).and_then(serde_json::Value::as_u64);
        Some(Groups {
            groups: n("groups")?,
            epochs: n("epochs")?,
            before_merge: n("bytes_before_merge")?,
            merged: n("bytes_merged")?,
            shipped: n("bytes_shipped")?,
            plain_epochs: n("plain_epochs").unwrap_or(0),
        })
    }
}

/// A LUN exported as a file by `stics mount`, and the folder ext4 on it is mounted at; ext4 is
/// unmounted and the export stopped when this drops, also when a run fails half way.
pub struct Export {
    pub proc: Proc,
    /// The exported LUN, as a file.
    pub lun: PathBuf,
    /// Where ext4 on it is mounted.
    pub fs: PathBuf,
}

impl Export {
    /// Starts `cmd`, a `stics mount URL LUN` (perhaps inside a namespace) exporting onto `lun`,
    /// and waits until the export is mounted; `fs` is made for ext4 to be mounted at.
    pub fn start(b: &Bench, name: &str, cmd: &mut Command, lun: PathBuf, fs: PathBuf) -> Result<Export> {
        std::fs::File::create(&lun)?;
        std::fs::create_dir_all(&fs)?;
        // Unmounted last first when a run is interrupted: ext4, then the export under it.
        remember(Undo::Mount(lun.clone()));
        remember(Undo::Mount(fs.clone()));
        let proc = match b.spawn(name, cmd) {
            Ok(p) => p,
            Err(e) => {
                forget(&Undo::Mount(fs));
                forget(&Undo::Mount(lun));
                return Err(e);
            }
        };
        let mut e = Export { proc, lun, fs };
        let lun = e.lun.clone();
        e.proc.wait_until(Duration::from_secs(30), || mounted(&lun))?;
        Ok(e)
    }

    /// qemu-storage-daemon's FUSE export (libiscsi inside qemu) of LUN `lun_no` of target `iqn`
    /// at `portal` (`HOST:PORT`) onto `lun`; `fs` is made for ext4 to be mounted at.
    pub fn qsd(
        b: &Bench,
        name: &str,
        portal: &str,
        iqn: &str,
        lun_no: u32,
        lun: PathBuf,
        fs: PathBuf,
    ) -> Result<Export> {
        let mut qsd = Command::new("qemu-storage-daemon");
        qsd.arg("--blockdev")
            .arg(format!(
                "driver=iscsi,transport=tcp,portal={portal},target={iqn},lun={lun_no},node-name=lun,cache.direct=on"
            ))
            .arg("--export")
            .arg(format!("type=fuse,id=exp,node-name=lun,mountpoint={},writable=on", lun.display()));
        Export::start(b, name, &mut qsd, lun, fs)
    }

    /// PostMark (`files`, `transactions`, seed 42) on a fresh ext4 of `mib` MiB on the export,
    /// mounted `-o sync` and unmounted afterwards: PostMark's seconds.
    pub fn postmark(&self, b: &Bench, mib: u64, files: u64, transactions: u64) -> Result<f64> {
        self.mkfs(b, mib)?;
        mount_ext4(b, &self.lun, &self.fs, b.ext4_options())?;
        let run = postmark_in(b, &b.work().join("pm.cfg"), &self.fs, files, transactions);
        unmount(b, &self.fs, &self.lun)?;
        Ok(run?.secs)
    }

    /// A fresh ext4 of `mib` MiB on the export, its inode tables and journal written now rather
    /// than by ext4lazyinit during a run.
    pub fn mkfs(&self, b: &Bench, mib: u64) -> Result<()> {
        b.run(
            Command::new("mkfs.ext4")
                .args(["-F", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard"])
                .arg(&self.lun)
                .arg(format!("{mib}M")),
        )
        .map(|_| ())
    }
}

/// Mounts the ext4 on `lun` (a file: through a loop device) at `fs` as the host does, with
/// `options` (the run's are [`Bench::ext4_options`]).
///
/// With [`Bench::loop_direct_io`], the loop device `mount -o loop` makes is then put on direct
/// I/O. A buffered loop device reads and writes its file from one worker, one request at a time,
/// so a read waits behind every write queued before it; over a file that is page-cached it also
/// keeps a second copy of every block, outside the host's memory limit (`stics mount` opens its
/// file in direct-I/O mode, so there only the one worker applies). Once the remote is a few
/// milliseconds away that worker, not the network, sets the pace (59 random reads/s at 8 ms one
/// way where the export itself serves 461/s, 459/s on direct I/O).
pub(crate) fn mount_ext4(b: &Bench, lun: &Path, fs: &Path, options: &str) -> Result<()> {
    let mut mount = Command::new("mount");
    mount.args(["-o", options]).arg(lun).arg(fs);
    b.run(&mut b.host(mount))?;
    if !b.loop_direct_io() {
        return Ok(());
    }
    let switched = match stics_procs::loop_of(lun) {
        Some(dev) => b.run(Command::new("losetup").args(["--direct-io=on", &dev])).map(|_| ()),
        None => Err(Error::Invalid(format!(
            "{} is mounted but no loop device is backed by {}",
            fs.display(),
            lun.display()
        ))),
    };
    if switched.is_err() {
        // The run stops on this error; the ext4 just mounted must not outlive it. The error
        // reported is the one above, whatever the unmount says.
        let _ = unmount(b, fs, lun);
    }
    switched
}

/// PostMark with its default sizes and seed 42, `files` files and `transactions` transactions in
/// `location`, as the host runs it; its configuration file is written at `cfg`.
pub(crate) fn postmark_in(
    b: &Bench,
    cfg: &Path,
    location: &Path,
    files: u64,
    transactions: u64,
) -> Result<crate::env::Output> {
    std::fs::write(
        cfg,
        format!(
            "set location {}\nset number {files}\nset transactions {transactions}\nset seed 42\nrun\nquit\n",
            location.display()
        ),
    )?;
    run_postmark(b, cfg)
}

/// PostMark with the configuration file `cfg`, as the host runs it.
fn run_postmark(b: &Bench, cfg: &Path) -> Result<crate::env::Output> {
    let mut postmark = Command::new("postmark");
    postmark.arg(cfg);
    b.run(&mut b.host(postmark))
}

/// Unmounts the file system at `fs`, loop-mounted from the file `lun`, and waits until it is gone
/// (see [`released`]).
pub(crate) fn unmount(b: &Bench, fs: &Path, lun: &Path) -> Result<()> {
    b.run(Command::new("umount").arg(fs))?;
    released(lun, Duration::from_secs(60))
}

/// Waits up to `limit` until no loop device is backed by the file `lun`.
///
/// `umount` ends a file system only where no other mount namespace has it too: one made while it
/// was mounted (`unshare -m`, `ip netns exec`) holds a copy, and the file system, its journal
/// unreplayed and its writes still coming, lives on in it until that namespace ends. Its loop
/// device (which `mount` makes to clear itself) lets go of `lun` only once the file system is
/// really gone, so that is what is waited for; an error names the processes still holding it.
pub fn released(lun: &Path, limit: Duration) -> Result<()> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let Some(dev) = stics_procs::loop_of(lun) else { return Ok(()) };
        if std::time::Instant::now() >= deadline {
            return Err(Error::StillMounted {
                lun: lun.display().to_string(),
                secs: limit.as_secs(),
                holders: holders(&dev),
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The processes whose mount namespace has `dev` mounted, one per namespace, as "PID (name)".
fn holders(dev: &str) -> String {
    let mut seen = std::collections::BTreeSet::new();
    let mut found = Vec::new();
    let procs = std::fs::read_dir("/proc").into_iter().flatten().filter_map(std::result::Result::ok);
    for pid in procs.filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok())) {
        let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/mnt")) else { continue };
        if seen.contains(&ns) {
            continue;
        }
        let Ok(mounts) = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")) else { continue };
        // mountinfo: the mount source is the field after " - " and the file system type.
        if mounts.lines().any(|l| l.split(" - ").nth(1).and_then(|t| t.split(' ').nth(1)) == Some(dev)) {
            let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            found.push(format!("{pid} ({})", name.trim()));
        }
        seen.insert(ns);
    }
    if found.is_empty() {
        format!("{dev} is open, but mounted in no mount namespace")
    } else {
        format!("{dev} is mounted in the mount namespace of {}", found.join(", "))
    }
}

/// Whether `e2fsck -fn` finds the ext4 on `lun` clean; a check that cannot run counts as not clean.
/// What an unclean check said is logged, since the report's column keeps only the verdict.
pub fn fsck_clean(lun: &Path) -> bool {
    match Command::new("e2fsck").arg("-fn").arg(lun).output() {
        Ok(o) if o.status.success() => true,
        Ok(o) => {
            tracing::warn!(
                lun = %lun.display(),
                status = %o.status,
                stdout = %String::from_utf8_lossy(&o.stdout),
                stderr = %String::from_utf8_lossy(&o.stderr),
                "e2fsck -fn found the file system unclean"
            );
            false
        }
        Err(e) => {
            tracing::warn!(lun = %lun.display(), "e2fsck -fn could not run: {e}");
            false
        }
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.fs).output();
        self.proc.stop(libc::SIGTERM, Duration::from_secs(20));
        let _ = Command::new("umount").arg("-l").arg(&self.lun).output();
        forget(&Undo::Mount(self.fs.clone()));
        forget(&Undo::Mount(self.lun.clone()));
    }
}

pub(crate) fn mounted(path: &Path) -> bool {
    let needle = format!(" {} ", path.display());
    std::fs::read_to_string("/proc/mounts").is_ok_and(|m| m.contains(&needle))
}

/// Sectors written to the block device behind `fs`, in bytes.
fn written(b: &Bench, fs: &Path) -> Result<u64> {
    let out = b.run(Command::new("findmnt").args(["-n", "-o", "SOURCE"]).arg(fs))?;
    let dev = out.stdout.trim().trim_start_matches("/dev/").to_owned();
    let stat = std::fs::read_to_string(format!("/sys/block/{dev}/stat"))?;
    let sectors: u64 = stat
        .split_whitespace()
        .nth(6)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| Error::Output { what: format!("/sys/block/{dev}/stat"), detail: stat.clone() })?;
    Ok(sectors * 512)
}

/// Runs PostMark `pool` on a fresh ext4 of `fs_mib` MiB over `url`, from `role`'s namespace of
/// `wan`. With `gateway`, it is drained before counting starts and after the run. The commands
/// the gateway and the remote (at `remote`'s metrics) answered are counted over the same span.
#[expect(clippy::too_many_arguments, reason = "one run's setup, each argument a different part")]
pub fn postmark(
    b: &Bench,
    wan: &Wan,
    role: &str,
    url: &str,
    fs_mib: u64,
    pool: &Pool,
    gateway: Option<&Gateway>,
    remote: Option<Metrics<'_>>,
) -> Result<Run> {
    b.need(&["postmark", "mkfs.ext4", "e2fsck", "findmnt"])?;
    let lun = b.work().join("export");
    let mut cmd = wan.exec(role, b.stics());
    cmd.args(["mount", url]).arg(&lun);
    let m = Export::start(b, "export", &mut cmd, lun, b.work().join("fs"))?;
    m.mkfs(b, fs_mib)?;
    let (lun, fs) = (&m.lun, &m.fs);
    mount_ext4(b, lun, fs, b.ext4_options())?;
    if let Some(g) = gateway {
        wan.gateway_drain(b, g)?;
    }
    let waits = |at: &str| -> Result<(Option<Waits>, Option<Waits>)> {
        let g = gateway.map(|g| wan.gateway_waits(b, g)).transpose()?;
        let r = remote.map(|m| wan.waits(b, m.role, m.addr)).transpose()?;
        tracing::debug!(at, ?g, ?r, "commands answered so far");
        Ok((g, r))
    };
    let (g0, r0) = waits("before the run")?;
    let c0 = wan.counts(b)?;
    let w0 = written(b, fs)?;
    let cfg = b.work().join("pm.cfg");
    std::fs::write(
        &cfg,
        format!(
            "set location {}\nset number {}\nset transactions {}\nset read {}\nset write {}\nrun\nquit\n",
            fs.display(),
            pool.files,
            pool.transactions,
            pool.block,
            pool.block
        ),
    )?;
    let seconds = run_postmark(b, &cfg)?.secs;
    b.run(Command::new("sync").arg("-f").arg(fs))?;
    let host_bytes = written(b, fs)? - w0;
    unmount(b, fs, lun)?;
    if let Some(g) = gateway {
        wan.gateway_drain(b, g)?;
    }
    let c1 = wan.counts(b)?;
    let (g1, r1) = waits("after the run")?;
    let fsck_clean = fsck_clean(lun);
    drop(m);
    Ok(Run {
        seconds,
        packets: c1.packets - c0.packets,
        bytes: c1.bytes - c0.bytes,
        sizes: c1.sizes.iter().zip(&c0.sizes).map(|(a, b)| a - b).collect(),
        host_bytes,
        fsck_clean,
        groups: None,
        gateway_waits: g1.zip(g0).map(|(after, before)| after.since(&before)),
        remote_waits: r1.zip(r0).map(|(after, before)| after.since(&before)),
    })
}

/// PostMark's size on the command line of the seed 000 experiments (cache-location, congestion),
/// 4 KiB blocks.
#[derive(Debug, Clone, clap::Args)]
pub struct PoolArgs {
    /// PostMark files (`--quick`: 100).
    #[arg(long, default_value_t = 1_000)]
    pub files: u64,
    /// PostMark transactions (`--quick`: 200).
    #[arg(long, default_value_t = 5_000)]
    pub transactions: u64,
}

impl PoolArgs {
    /// The pool asked for, scaled down for `--quick`.
    pub fn pool(&self, b: &Bench) -> Pool {
        let (files, transactions) =
            if b.quick() { (self.files.min(100), self.transactions.min(200)) } else { (self.files, self.transactions) };
        Pool { files, transactions, block: 4096 }
    }
}

/// The ext4 the PostMark experiments make: 512 MiB, 256 MiB for `--quick` (mkfs writes its
/// inode tables through the path under test).
pub fn fs_mib(b: &Bench) -> u64 {
    if b.quick() {
        256
    } else {
        512
    }
}

/// How the host reaches the LUN in a comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// Straight to the remote target: plain iSCSI.
    Plain,
    /// Through a gateway in `side`'s namespace ("host" or "storage"); with `link`, its remote is
    /// a stics SG (a journal LUN) and destage ships merged groups of epochs over the link.
    Gateway { mode: String, ram: String, read_cache: String, log: String, side: &'static str, link: bool },
}

impl Via {
    /// A host-side gateway with the default sizes (64 MiB RAM, 256 MiB read cache, 512 MiB log).
    pub fn gateway(mode: &str) -> Via {
        Via::Gateway {
            mode: mode.to_owned(),
            ram: "64MiB".into(),
            read_cache: "256MiB".into(),
            log: "512MiB".into(),
            side: "host",
            link: false,
        }
    }

    /// A host-side gateway like [`Via::gateway`] in front of a stics SG: the caller passes the
    /// SG's URL as the remote.
    pub fn link(mode: &str) -> Via {
        match Via::gateway(mode) {
            Via::Gateway { mode, ram, read_cache, log, side, .. } => {
                Via::Gateway { mode, ram, read_cache, log, side, link: true }
            }
            Via::Plain => Via::Plain,
        }
    }

    /// Whether the remote must be a stics SG.
    pub fn is_link(&self) -> bool {
        matches!(self, Via::Gateway { link: true, .. })
    }

    /// A `log`-mode gateway on `side` whose RAM buffer and read cache hold `bytes` each (at least
    /// 64 KiB), over the smallest log that takes a RAM buffer and a pipeline of epochs (the
    /// cache's minimum): seed 000's small caches.
    pub fn small_cache(bytes: u64, side: &'static str) -> Via {
        let size = format!("{}KiB", bytes.div_ceil(1024).max(64));
        Via::Gateway {
            mode: "log".into(),
            ram: size.clone(),
            read_cache: size,
            log: "256MiB".into(),
            side,
            link: false,
        }
    }

    /// "plain", or the gateway's mode (and side when it is not the host's).
    pub fn label(&self) -> String {
        match self {
            Via::Plain => "plain".into(),
            Via::Gateway { mode, side: "host", link: true, .. } => format!("{mode} + link"),
            Via::Gateway { mode, side: "host", .. } => mode.clone(),
            Via::Gateway { mode, side, .. } => format!("{mode} ({side})"),
        }
    }
}

/// A stics SG's LUN for the storage namespace: a journal (512 MiB) in front of a sparse medium
/// of `bytes`, both files in the run's scratch space under `name`.
pub fn sg_lun(b: &Bench, name: &str, bytes: u64) -> Result<String> {
    let medium = b.work().join(format!("{name}.img"));
    std::fs::File::create(&medium)?.set_len(bytes)?;
    let journal = b.work().join(format!("{name}.journal"));
    let _ = std::fs::remove_file(&journal);
    Ok(format!("journal({}, journal={}:512MiB)", b.remote_medium(&medium), journal.display()))
}

/// The papers' conditions this run has, for captions: "; the remote's medium on …; the host's
/// memory bounded to …", or nothing.
pub fn setup(b: &Bench) -> String {
    let mut s = String::new();
    if let Some(m) = b.remote_disk() {
        s += &format!("; the remote's medium on the {m} disk model");
    }
    if let Some(m) = b.log_disk() {
        s += &format!("; the gateway's log on the {m} disk model");
    }
    if let Some(p) = b.read_cache_policy() {
        s += &format!("; the gateway's read cache {}", if p == "lru" { "LRU" } else { "S3-FIFO" });
    }
    if let Some(m) = b.host_memory() {
        s += &format!("; the host's memory bounded to {} MiB by a memory cgroup", m >> 20);
    }
    if b.loop_direct_io() {
        s += "; the loop device under the host's ext4 on direct I/O";
    }
    s
}

/// The SG's port in the storage namespace, beside the plain target's 3260.
pub const SG_PORT: u16 = 3262;

/// The SG's `--metrics` address in the storage namespace.
pub const SG_METRICS: &str = "127.0.0.1:9119";

/// PostMark from the host namespace over `remote` (a target in the storage namespace, whose
/// commands are counted when its `metrics` are given), either straight or through a fresh
/// gateway that is stopped, its log removed and its reservation released afterwards.
pub fn postmark_via(
    b: &Bench,
    wan: &Wan,
    remote: &str,
    metrics: Option<Metrics<'_>>,
    via: &Via,
    fs_mib: u64,
    pool: &Pool,
) -> Result<Run> {
    match via {
        Via::Plain => postmark(b, wan, "host", remote, fs_mib, pool, None, metrics),
        Via::Gateway { mode, ram, read_cache, log, side, .. } => {
            let path = b.work().join("gateway-log.img");
            let _ = std::fs::remove_file(&path);
            let o = crate::peers::GatewayOptions {
                mode: mode.clone(),
                log: format!("{}:{log}", path.display()),
                ram: ram.clone(),
                read_cache: read_cache.clone(),
                extra: Vec::new(),
            };
            let g = if *side == "host" {
                wan.gateway(b, "gateway", "host", remote, &o)?
            } else {
                // Beside the target, in its namespace (its traffic to the target never crosses
                // the WAN); the host reaches the gateway over the WAN.
                let addr = wan.addr(b, side)?;
                wan.gateway_at(b, "gateway", side, &addr, remote, &o)?
            };
            let remote_of_gateway = g.remote.clone();
            // The host's mkfs, PostMark and e2fsck talk to the gateway; it is drained around the run.
            let url = g.url.clone();
            let mut run = postmark(b, wan, "host", &url, fs_mib, pool, Some(&g), metrics);
            if let Ok(r) = &mut run {
                r.groups = wan.gateway_status(b, &g)?.get("groups").and_then(Groups::of);
            }
            wan.gateway_stop(b, g, &remote_of_gateway, &path)?;
            run
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mounts a fresh 64 MiB ext4 image as the benchmarks do; whether its loop device is on
    /// direct I/O, and the commands run.
    fn mounted_dio(loop_direct_io: bool) -> (String, Vec<String>) {
        let opts = crate::Options { quick: true, reps: 1, loop_direct_io, ..crate::Options::default() };
        let b = Bench::new(opts).unwrap();
        let (img, fs) = (b.work().join("ext4.img"), b.work().join("fs"));
        std::fs::File::create(&img).unwrap().set_len(64 << 20).unwrap();
        std::fs::create_dir(&fs).unwrap();
        b.run(Command::new("mkfs.ext4").args(["-F", "-q"]).arg(&img)).unwrap();
        mount_ext4(&b, &img, &fs, "loop").unwrap();
        let dev = stics_procs::loop_of(&img).unwrap();
        let dio = std::fs::read_to_string(format!("/sys/block/{}/loop/dio", dev.trim_start_matches("/dev/")));
        unmount(&b, &fs, &img).unwrap();
        (dio.unwrap().trim().to_owned(), b.commands())
    }

    /// A buffered loop device serves one request at a time; `--loop-direct-io` lifts that.
    #[test]
    fn the_host_s_loop_device_is_on_direct_io_when_asked_and_buffered_otherwise() {
        let (dio, commands) = mounted_dio(true);
        assert_eq!(dio, "1", "{commands:?}");
        assert!(commands.iter().any(|c| c.contains("losetup --direct-io=on")), "{commands:?}");
        let (dio, commands) = mounted_dio(false);
        assert_eq!(dio, "0", "{commands:?}");
        assert!(!commands.iter().any(|c| c.contains("losetup")), "{commands:?}");
    }
}

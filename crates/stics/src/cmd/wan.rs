//! `stics wan`: a packet-level WAN emulator (delay, jitter, loss, rate, background load) between
//! network namespaces: one or more hosts (`host`, `host2`, …) and `storage`.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Subcommand;
use stics_wan::control::{self, Request, Status};
use stics_wan::instance::{allow_congestion_control, Instance, DEFAULT_RUNTIME_DIR};
use stics_wan::params::{self, fmt_duration, fmt_rate, Cc, Dir, Directions, Params, Update};
use stics_wan::topo::Role;

#[derive(clap::Args)]
pub struct Args {
    /// Instance name; its namespaces are NAME-host (NAME-host2, … with --hosts), NAME-storage and
    /// NAME-wan (the router).
    #[arg(long, global = true, default_value = "stics", env = "STICS_WAN_NAME")]
    name: String,
    /// Directory for PID files, the control socket, parameters and the daemon log.
    #[arg(long, global = true, default_value = DEFAULT_RUNTIME_DIR, hide = true)]
    runtime_dir: PathBuf,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create the namespaces and the emulated link and start the emulator (replaces a running one).
    Up {
        #[command(flatten)]
        link: LinkArgs,
        /// Hosts joined to the storage side, each in a namespace and subnet of its own (1 to 8):
        /// host (10.201.1.2), host2 (10.201.3.2), host3 (10.201.4.2), …. They share the path's
        /// delay, jitter and loss; each has its own bottleneck queue toward it, and background
        /// load goes to the first. Hosts reach the storage side only, not each other.
        #[arg(long, default_value_t = 1)]
        hosts: u8,
    },
    /// Stop the emulator and remove its namespaces, rules and state (also after a crash).
    Down,
    /// Change parameters of the running emulator (only the options given change).
    Set(LinkArgs),
    /// Show parameters and counters (packets, bytes, drops, queues).
    Status {
        /// Print the status as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the address of a host (`host`, `host2`, …) or of the `storage` namespace.
    Addr {
        /// host (= host1), host2 … host8, or storage.
        role: String,
    },
    /// Cut an end off: every packet from and to it is dropped in the router, with no reset and
    /// no ICMP, as on a dead line (connections hang until their peers time out). `mend` joins it
    /// again; `status` lists the ends that are cut.
    Cut {
        /// host (= host1), host2 … host8, or storage (which cuts every host off).
        role: String,
    },
    /// Join an end cut off by `cut` again.
    Mend {
        /// host (= host1), host2 … host8, or storage.
        role: String,
    },
    /// Run a command inside a host's, the `storage` or the `wan` (router) network namespace. It
    /// keeps the caller's mounts (what it mounts is mounted for the caller too), and its PID is
    /// the command's own.
    Exec {
        /// host (= host1), host2 … host8, storage or wan.
        role: String,
        /// The command and its arguments (after `--`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        command: Vec<String>,
    },
    /// Run the emulator in the foreground (started by `up`).
    #[command(hide = true)]
    Daemon,
    /// Wait for the daemon to die, then remove what it left (started by the daemon).
    #[command(hide = true)]
    Reap {
        #[arg(long)]
        token: String,
    },
}

#[derive(clap::Args, Default)]
struct LinkArgs {
    /// One-way delay added to every packet, e.g. 5ms, 250us (default 0; the round trip is twice it).
    #[arg(long)]
    delay: Option<String>,
    /// Each packet's delay is drawn uniformly from delay ± jitter; packets keep their order (default 0).
    #[arg(long)]
    jitter: Option<String>,
    /// Long-run packet loss probability, e.g. 1e-2 or 1% (default 0).
    #[arg(long)]
    loss: Option<String>,
    /// bernoulli (independent losses, default), gilbert:burst=L (mean burst of L packets at --loss),
    /// or gilbert:p=P,r=R[,bad=B][,good=G] (Gilbert–Elliott transition and loss probabilities).
    #[arg(long)]
    loss_model: Option<String>,
    /// Which directions --delay, --jitter, --loss and --loss-model apply to: both (default),
    /// to-storage or to-host.
    #[arg(long, default_value = "both")]
    direction: String,
    /// Bottleneck rate in each direction, e.g. 100mbit, 1gbit (decimal bit/s) or 12.5MB/s (default:
    /// none, the speed of the veth); `none` removes it.
    #[arg(long)]
    rate: Option<String>,
    /// Bottleneck queue in bytes, e.g. 256KiB (= 256k, binary) or 1MB (= 10^6 B) (default: 50 ms at
    /// the rate, at least 64 KiB); `default` restores that.
    #[arg(long)]
    queue: Option<String>,
    /// Share of the rate taken by generated cross traffic in each direction, e.g. 30% (default 0;
    /// needs --rate). Packet sizes follow seed 000: 50% < 44 B, 75% < 576 B, 99% < 1500 B.
    #[arg(long)]
    background: Option<String>,
    /// TCP congestion control in both namespaces: reno, cubic or bbr (default: the kernel's, bbr here).
    #[arg(long)]
    cc: Option<String>,
    /// Seed of the loss, jitter and background generators (default: random, shown by `status`).
    #[arg(long)]
    seed: Option<u64>,
}

impl LinkArgs {
    fn update(&self) -> anyhow::Result<Update> {
        let opt = |s: &Option<String>, f: fn(&str) -> stics_wan::Result<u64>| s.as_deref().map(f).transpose();
        Ok(Update {
            directions: Directions::parse(&self.direction)?,
            delay_ns: opt(&self.delay, params::parse_duration)?,
            jitter_ns: opt(&self.jitter, params::parse_duration)?,
            loss: self.loss.as_deref().map(params::parse_probability).transpose()?,
            loss_model: self.loss_model.clone(),
            rate_bps: match self.rate.as_deref() {
                None => None,
                Some("none") => Some(None),
                Some(r) => Some(Some(params::parse_rate(r)?)),
            },
            queue_bytes: match self.queue.as_deref() {
                None => None,
                Some("default") => Some(None),
                Some(q) => Some(Some(stics_units::parse_size_within(q, 0..=params::MAX_QUEUE_BYTES, 1)?)),
            },
            background_pct: self.background.as_deref().map(params::parse_load).transpose()?,
            cc: self.cc.as_deref().map(Cc::parse).transpose()?,
            seed: self.seed,
        })
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let inst = Instance::new(&args.name, &args.runtime_dir)?;
    let base = |sub: &str| -> Vec<String> {
        vec![
            "wan".into(),
            "--name".into(),
            args.name.clone(),
            "--runtime-dir".into(),
            args.runtime_dir.display().to_string(),
            sub.into(),
        ]
    };
    match args.cmd {
        Cmd::Up { link, hosts } => {
            need_root()?;
            let mut p = Params::new(link.seed.unwrap_or_else(random_seed));
            p.hosts = hosts;
            p.apply(&link.update()?)?;
            inst.teardown().context("removing the previous instance")?;
            inst.prepare(&p)?;
            let exe = std::env::current_exe().context("locating the stics binary")?;
            if let Err(e) = inst.spawn_daemon(&exe, &base("daemon"), Duration::from_secs(30)) {
                let _ = inst.teardown();
                return Err(e.into());
            }
            println!("{}: {}; {}", inst.name(), ends(&inst, p.hosts), describe(&p));
            Ok(())
        }
        Cmd::Cut { role } | Cmd::Mend { role } if inst.existing_namespaces().is_empty() => {
            bail!("WAN emulator {:?} is not up (no end {role} to cut or mend)", inst.name())
        }
        Cmd::Cut { role } => {
            need_root()?;
            inst.set_cut(Role::parse(&role)?, true)?;
            Ok(())
        }
        Cmd::Mend { role } => {
            need_root()?;
            inst.set_cut(Role::parse(&role)?, false)?;
            Ok(())
        }
        Cmd::Down => {
            need_root()?;
            inst.teardown()?;
            Ok(())
        }
        Cmd::Set(link) => {
            let update = link.update()?;
            if let Some(cc) = update.cc {
                // Only the initial namespace may widen the list; the daemon lives in the router's.
                allow_congestion_control(cc)?;
            }
            let reply = control::call(&inst.sock_path(), inst.name(), &Request::Set { update })?;
            if let Some(s) = reply.status {
                println!("{}: {}", inst.name(), describe(&s.params));
            }
            Ok(())
        }
        Cmd::Status { json } => {
            let reply = control::call(&inst.sock_path(), inst.name(), &Request::Status).map_err(|e| {
                let left = inst.existing_namespaces();
                if left.is_empty() {
                    anyhow::Error::from(e)
                } else {
                    anyhow::anyhow!("{e}; stale namespaces remain ({}): run `stics wan down`", left.join(", "))
                }
            })?;
            let status = reply.status.context("the daemon sent no status")?;
            let cut: Vec<String> = inst.cut_ends()?.into_iter().map(|r| inst.topo.ns(r)).collect();
            if json {
                let mut v = serde_json::to_value(&status)?;
                v["cut"] = serde_json::json!(cut);
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print_status(&inst, &status, &cut);
            }
            Ok(())
        }
        Cmd::Addr { role } => {
            let role = Role::parse(&role)?;
            if inst.existing_namespaces().is_empty() {
                bail!("WAN emulator {:?} is not up", inst.name());
            }
            inst.check_role(role)?;
            println!("{}", inst.topo.addr(role));
            Ok(())
        }
        Cmd::Exec { role, command } => {
            let role = Role::parse(&role)?;
            let ns = inst.topo.ns(role);
            if !std::path::Path::new("/run/netns").join(&ns).exists() {
                inst.check_role(role)?;
                bail!("namespace {ns} does not exist: run `stics wan up` first");
            }
            // The network namespace alone, not `ip netns exec`'s mount namespace too: a copy of
            // the caller's mounts would keep every file system mounted at the time alive in it
            // after its unmount, for as long as the command runs (an e2fsck after such an
            // unmount reads a file system still in use).
            stics_wan::sys::setns_net(&std::path::Path::new("/run/netns").join(&ns))
                .with_context(|| format!("entering {ns}"))?;
            let err = std::process::Command::new(&command[0]).args(&command[1..]).exec();
            Err(anyhow::Error::from(err).context(format!("running {command:?} in {ns}")))
        }
        Cmd::Daemon => {
            let token = std::fs::read_to_string(inst.token_path()).context("reading the instance token")?;
            let mut reap = base("reap");
            reap.extend(["--token".into(), token.trim().to_string()]);
            let exe = std::env::current_exe().context("locating the stics binary")?;
            stics_wan::engine::run_daemon(&inst, &exe, &reap)?;
            Ok(())
        }
        Cmd::Reap { token } => {
            stics_wan::engine::run_reaper(&inst, &token)?;
            Ok(())
        }
    }
}

fn need_root() -> anyhow::Result<()> {
    if !stics_wan::sys::is_root() {
        bail!("stics wan needs root (network namespaces, iptables, tc)");
    }
    Ok(())
}

fn random_seed() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    (t as u64) ^ (u64::from(std::process::id()) << 32)
}

fn describe(p: &Params) -> String {
    let path = |d: Dir| {
        let x = p.path(d);
        let mut s = format!("delay {}", fmt_duration(x.delay_ns));
        if x.jitter_ns > 0 {
            s += &format!(" ±{}", fmt_duration(x.jitter_ns));
        }
        s + &format!(", loss {}", x.loss.describe())
    };
    let (a, b) = (path(Dir::ToStorage), path(Dir::ToHost));
    let paths = if a == b { format!("each way {a}") } else { format!("to storage {a}; to host {b}") };
    let rate = match (p.rate_bps, p.effective_queue()) {
        (Some(r), Some(q)) => format!("rate {} queue {} B", fmt_rate(r), q),
        _ => "no rate limit".into(),
    };
    format!(
        "{paths}; {rate}; background {}%; cc {}; seed {}",
        p.background_pct,
        p.cc.map_or("default", |c| c.name()),
        p.seed
    )
}

/// Each end's name, address and namespace.
fn ends(inst: &Instance, hosts: u8) -> String {
    stics_wan::topo::Topology::ends(hosts)
        .into_iter()
        .map(|r| {
            let ns = inst.topo.ns(r);
            let name = ns.strip_prefix(&format!("{}-", inst.name())).unwrap_or(&ns).to_string();
            format!("{name} {} (netns {ns})", inst.topo.addr(r))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn print_status(inst: &Instance, s: &Status, cut: &[String]) {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ =
        writeln!(o, "WAN emulator {:?}: pid {}, up {:.1} s, congestion control {}", s.name, s.pid, s.uptime_s, s.cc);
    let _ = writeln!(o, "  {}", ends(inst, s.params.hosts));
    if !cut.is_empty() {
        let _ = writeln!(o, "  cut off: {}", cut.join(", "));
    }
    let _ = writeln!(o, "  {}", describe(&s.params));
    let _ = writeln!(
        o,
        "  {:<14} {:>10} {:>13} {:>8} {:>10} {:>6} {:>8} {:>8}",
        "delay path", "packets", "bytes", "lost", "released", "held", "max-held", "overflow"
    );
    for p in &s.paths {
        let _ = writeln!(
            o,
            "  {:<14} {:>10} {:>13} {:>8} {:>10} {:>6} {:>8} {:>8}",
            p.direction, p.packets, p.bytes, p.dropped, p.released, p.held, p.max_held, p.queue_overflow
        );
    }
    let heads: Vec<String> = stics_wan::control::SIZE_BUCKETS.iter().map(|(h, _)| format!("{h:>10}")).collect();
    let _ = writeln!(o, "  {:<14}{}", "frame [B]", heads.join(""));
    for p in &s.paths {
        let counts: Vec<String> = p.sizes.iter().map(|n| format!("{n:>10}")).collect();
        let _ = writeln!(o, "  {:<14}{}", p.direction, counts.join(""));
    }
    let _ = writeln!(
        o,
        "  {:<14} {:>6} {:>10} {:>13} {:>8} {:>10} {:>9} {:>6}",
        "bottleneck", "qdisc", "packets", "bytes", "drops", "overlimits", "backlog-B", "qlen"
    );
    for l in &s.links {
        let _ = writeln!(
            o,
            "  {:<14} {:>6} {:>10} {:>13} {:>8} {:>10} {:>9} {:>6}",
            l.direction,
            l.qdisc,
            l.sent_packets,
            l.sent_bytes,
            l.drops,
            l.overlimits,
            l.backlog_bytes,
            l.backlog_packets
        );
    }
    let _ = writeln!(o, "  {:<14} {:>10} {:>13} {:>8}", "background", "packets", "bytes", "refused");
    for b in &s.background {
        let _ = writeln!(o, "  {:<14} {:>10} {:>13} {:>8}", b.direction, b.packets, b.bytes, b.dropped);
    }
    // A closed pipe (`| head`) is not an error worth a panic.
    let _ = std::io::Write::write_all(&mut std::io::stdout(), o.as_bytes());
}

//! The shape of an emulated link (namespace, interface and address names) and the plan of
//! `ip`, `sysctl`, `iptables` and `tc` commands that builds, adjusts and removes it.
//!
//! ```text
//!  NAME-host            NAME-wan (router)                         NAME-storage
//!  eth0 10.201.1.2 ──── rh 10.201.1.1 │ NFQUEUE 0/1 │ rs 10.201.2.1 ──── eth0 10.201.2.2
//!                       tbf (to host) ◄┘            └► tbf (to storage)
//!  NAME-host2           (more hosts, `--hosts N`)
//!  eth0 10.201.3.2 ──── rh2 10.201.3.1
//! ```
//!
//! Packets entering the router are queued to user space (queue 0 from a host, queue 1 from
//! the storage side) in the raw table, before anything else sees them; the bottleneck queue is a
//! `tbf` qdisc on each router egress. The ends hold no emulation state: a dead emulator leaves
//! a plain routed link (`--queue-bypass`). Host `k` (1 to [`MAX_HOSTS`]) has the subnet
//! `10.201.{k+1}.0/24` (host 1 keeps `10.201.1.0/24`); hosts reach the storage side only, never
//! each other. A cut end is two `DROP` rules ahead of the queue rules: its packets vanish both
//! ways, with no reset and no ICMP, as on a dead line.

use crate::params::{fmt_rate, Cc, Dir, Params};
use crate::{Result, WanError};

/// The most hosts one emulated link joins to its storage side.
pub const MAX_HOSTS: u8 = 8;

/// One end of the link, or the router between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Host `k`, 1 to [`MAX_HOSTS`]; `Role::HOST` is the first.
    Host(u8),
    Storage,
    Router,
}

impl Role {
    /// The first host (the only one unless the link was brought up with `--hosts`).
    pub const HOST: Role = Role::Host(1);

    /// `host` (the first host), `host1` to `host8`, `storage`, or `wan` (also `router`).
    pub fn parse(s: &str) -> Result<Role> {
        match s {
            "host" => Ok(Role::HOST),
            "storage" => Ok(Role::Storage),
            "wan" | "router" => Ok(Role::Router),
            _ => match s.strip_prefix("host").and_then(|k| k.parse::<u8>().ok()) {
                Some(k) if (1..=MAX_HOSTS).contains(&k) && !s.starts_with("host0") => Ok(Role::Host(k)),
                _ => Err(WanError::param("role", s, "expected host, host1 to host8, storage or wan")),
            },
        }
    }

    fn suffix(self) -> String {
        match self {
            Role::Host(1) => "host".into(),
            Role::Host(k) => format!("host{k}"),
            Role::Storage => "storage".into(),
            Role::Router => "wan".into(),
        }
    }

    /// The third byte of the end's subnet, `10.201.N.0/24`.
    fn subnet(self) -> u8 {
        match self {
            Role::Host(1) | Role::Router => 1,
            Role::Host(k) => k + 1,
            Role::Storage => 2,
        }
    }
}

/// Interface name of each end (inside its own namespace).
pub const END_IF: &str = "eth0";
/// Router interfaces toward the (first) host and toward the storage side.
pub const ROUTER_IF_HOST: &str = "rh";
pub const ROUTER_IF_STORAGE: &str = "rs";

/// The router's interface toward host `k`.
pub fn router_if_host(k: u8) -> String {
    if k == 1 {
        ROUTER_IF_HOST.into()
    } else {
        format!("{ROUTER_IF_HOST}{k}")
    }
}

/// TCP buffer limits in the end namespaces: enough for 10 Gbit/s over 100 ms.
pub const TCP_MEM: &str = "4096 131072 134217728";

/// Names of one emulated link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub name: String,
}

impl Topology {
    /// Checks `name` (letters, digits, `-`, `_`; at most 32) so it is safe in paths and names.
    pub fn new(name: &str) -> Result<Topology> {
        let ok = !name.is_empty()
            && name.len() <= 32
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !ok {
            return Err(WanError::param("name", name, "use 1-32 letters, digits, '-' or '_'"));
        }
        Ok(Topology { name: name.to_string() })
    }

    pub fn ns(&self, role: Role) -> String {
        format!("{}-{}", self.name, role.suffix())
    }

    /// Every namespace an instance of this name can have, whatever its number of hosts (the
    /// first host, the storage side and the router first).
    pub fn all_ns(&self) -> Vec<String> {
        let mut all = vec![self.ns(Role::HOST), self.ns(Role::Storage), self.ns(Role::Router)];
        all.extend((2..=MAX_HOSTS).map(|k| self.ns(Role::Host(k))));
        all
    }

    /// The address of an end (or the router's address toward the first host).
    pub fn addr(&self, role: Role) -> String {
        let last = if role == Role::Router { 1 } else { 2 };
        format!("10.201.{}.{last}", role.subnet())
    }

    /// The router's address on an end's subnet (its gateway).
    fn router_addr(role: Role) -> String {
        format!("10.201.{}.1", role.subnet())
    }

    /// An end's subnet, `10.201.N.0/24`.
    pub fn subnet(role: Role) -> String {
        format!("10.201.{}.0/24", role.subnet())
    }

    /// The `iptables` rule specs (after `-t raw`, `-A`/`-I`/`-C`/`-D PREROUTING`) that drop
    /// everything from and to `role` in the router: a cut line.
    pub fn cut_rules(role: Role) -> Vec<Vec<String>> {
        let strs = |a: &[&str]| a.iter().map(std::string::ToString::to_string).collect::<Vec<String>>();
        vec![strs(&["-i", &Self::router_if(role), "-j", "DROP"]), strs(&["-d", &Self::subnet(role), "-j", "DROP"])]
    }

    /// The router's interface toward an end (toward the storage side for the router itself).
    pub fn router_if(role: Role) -> String {
        match role {
            Role::Host(k) => router_if_host(k),
            Role::Storage | Role::Router => ROUTER_IF_STORAGE.into(),
        }
    }

    /// The command that adds (`-I`, ahead of the queue rules), checks (`-C`) or deletes (`-D`)
    /// one cut rule.
    pub fn cut_cmd(&self, op: &str, rule: &[String]) -> Vec<String> {
        let mut cmd: Vec<String> =
            ["ip", "netns", "exec", &self.ns(Role::Router), "iptables", "-w", "-t", "raw", op, "PREROUTING"]
                .iter()
                .map(std::string::ToString::to_string)
                .collect();
        cmd.extend(rule.iter().cloned());
        cmd
    }

    /// The router interface a direction leaves through toward the first host or the storage
    /// side (where its bottleneck queue sits and where background load goes in).
    pub fn egress(dir: Dir) -> &'static str {
        match dir {
            Dir::ToStorage => ROUTER_IF_STORAGE,
            Dir::ToHost => ROUTER_IF_HOST,
        }
    }

    /// Every router interface a direction leaves through: toward the storage side, one; toward
    /// the hosts, one per host (each with its own bottleneck queue).
    pub fn egresses(dir: Dir, hosts: u8) -> Vec<String> {
        match dir {
            Dir::ToStorage => vec![ROUTER_IF_STORAGE.into()],
            Dir::ToHost => (1..=hosts.max(1)).map(router_if_host).collect(),
        }
    }

    /// The ends of a link with `hosts` hosts: the hosts, then the storage side.
    pub fn ends(hosts: u8) -> Vec<Role> {
        (1..=hosts.max(1)).map(Role::Host).chain([Role::Storage]).collect()
    }

    /// Commands that build the namespaces, links, addresses, routes, sysctls and queue rules of
    /// a link with `hosts` hosts.
    pub fn setup_plan(&self, hosts: u8) -> Vec<Vec<String>> {
        let w = self.ns(Role::Router);
        let ends = Self::ends(hosts);
        let mut plan: Vec<Vec<String>> = Vec::new();
        let mut cmd = |args: &[&str]| plan.push(args.iter().map(std::string::ToString::to_string).collect());
        for ns in ends.iter().map(|&r| self.ns(r)).chain([w.clone()]) {
            cmd(&["ip", "netns", "add", &ns]);
        }
        let router_if = Self::router_if;
        for &r in &ends {
            cmd(&[
                "ip",
                "link",
                "add",
                END_IF,
                "netns",
                &self.ns(r),
                "type",
                "veth",
                "peer",
                "name",
                &router_if(r),
                "netns",
                &w,
            ]);
        }
        for ns in ends.iter().map(|&r| self.ns(r)).chain([w.clone()]) {
            // IPv6 would send router solicitations past the IPv4-only queue rules; keep counters clean.
            cmd(&[
                "ip",
                "netns",
                "exec",
                &ns,
                "sysctl",
                "-qw",
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1",
            ]);
            cmd(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
        }
        for &r in &ends {
            let (ns, rif) = (self.ns(r), router_if(r));
            cmd(&["ip", "-n", &ns, "addr", "add", &format!("{}/24", self.addr(r)), "dev", END_IF]);
            cmd(&["ip", "-n", &w, "addr", "add", &format!("{}/24", Self::router_addr(r)), "dev", &rif]);
            cmd(&["ip", "-n", &ns, "link", "set", END_IF, "up"]);
            cmd(&["ip", "-n", &w, "link", "set", &rif, "up"]);
        }
        // Only the far side is routed: nothing can leave for any other address, and hosts do not
        // reach each other.
        let storage = Self::subnet(Role::Storage);
        let storage_gw = Self::router_addr(Role::Storage);
        for &r in &ends {
            if let Role::Host(_) = r {
                cmd(&["ip", "-n", &self.ns(r), "route", "add", &storage, "via", &Self::router_addr(r)]);
                cmd(&["ip", "-n", &self.ns(Role::Storage), "route", "add", &Self::subnet(r), "via", &storage_gw]);
            }
        }
        cmd(&["ip", "netns", "exec", &w, "sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        for &r in &ends {
            cmd(&[
                "ip",
                "netns",
                "exec",
                &self.ns(r),
                "sysctl",
                "-qw",
                &format!("net.ipv4.tcp_rmem={TCP_MEM}"),
                &format!("net.ipv4.tcp_wmem={TCP_MEM}"),
                // Cached ssthresh and RTT from an earlier connection would make runs depend on order.
                "net.ipv4.tcp_no_metrics_save=1",
            ]);
        }
        for &r in &ends {
            let queue = if r == Role::Storage { Dir::ToHost } else { Dir::ToStorage };
            cmd(&[
                "ip",
                "netns",
                "exec",
                &w,
                "iptables",
                "-w",
                "-t",
                "raw",
                "-A",
                "PREROUTING",
                "-i",
                &router_if(r),
                "-j",
                "NFQUEUE",
                "--queue-num",
                &queue.index().to_string(),
                "--queue-bypass",
            ]);
        }
        plan
    }

    /// Commands that set the congestion control in every end.
    pub fn cc_plan(&self, cc: Cc, hosts: u8) -> Vec<Vec<String>> {
        Self::ends(hosts)
            .iter()
            .map(|&r| {
                vec![
                    "ip".into(),
                    "netns".into(),
                    "exec".into(),
                    self.ns(r),
                    "sysctl".into(),
                    "-qw".into(),
                    format!("net.ipv4.tcp_congestion_control={}", cc.name()),
                ]
            })
            .collect()
    }

    /// Commands that put the rate limit and queue in force (or remove them), on every egress.
    pub fn rate_plan(&self, p: &Params) -> Vec<Vec<String>> {
        let w = self.ns(Role::Router);
        Dir::ALL
            .iter()
            .flat_map(|&d| Self::egresses(d, p.hosts))
            .map(|dev| {
                let mut cmd: Vec<String> =
                    vec!["tc".into(), "-n".into(), w.clone(), "qdisc".into(), "replace".into(), "dev".into(), dev];
                match (p.rate_bps, p.effective_queue()) {
                    (Some(rate), Some(limit)) => cmd.extend([
                        "root".into(),
                        "tbf".into(),
                        "rate".into(),
                        fmt_rate(rate),
                        "burst".into(),
                        Params::tbf_burst(rate).to_string(),
                        "limit".into(),
                        limit.to_string(),
                    ]),
                    // Back to the veth's default (no queueing discipline).
                    _ => cmd.extend(["root".into(), "pfifo".into(), "limit".into(), "10000".into()]),
                }
                cmd
            })
            .collect()
    }

    /// Commands that remove everything (each may fail harmlessly if already gone).
    pub fn teardown_plan(&self) -> Vec<Vec<String>> {
        self.all_ns().iter().map(|ns| vec!["ip".into(), "netns".into(), "del".into(), ns.clone()]).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(Topology::new("stics").is_ok());
        assert!(Topology::new("t-1_x").is_ok());
        assert!(Topology::new("").is_err());
        assert!(Topology::new("a/b").is_err());
        assert!(Topology::new(&"x".repeat(33)).is_err());
    }

    #[test]
    fn namespaces_carry_the_name_prefix() {
        let t = Topology::new("t1").unwrap();
        assert_eq!(t.all_ns()[..4], ["t1-host", "t1-storage", "t1-wan", "t1-host2"]);
        assert_eq!(t.all_ns().len(), 3 + usize::from(MAX_HOSTS) - 1);
    }

    #[test]
    fn queue_rules_sit_in_raw_prerouting_with_bypass() {
        let plan = Topology::new("t").unwrap().setup_plan(1);
        let rules: Vec<&Vec<String>> = plan.iter().filter(|c| c.iter().any(|a| a == "NFQUEUE")).collect();
        assert_eq!(rules.len(), 2);
        for r in rules {
            assert!(r.windows(2).any(|w| w[0] == "-t" && w[1] == "raw"));
            assert!(r.iter().any(|a| a == "PREROUTING"));
            assert!(r.iter().any(|a| a == "--queue-bypass"));
        }
    }

    #[test]
    fn namespaces_are_created_before_anything_uses_them() {
        let plan = Topology::new("t").unwrap().setup_plan(1);
        assert!(plan[..3].iter().all(|c| c[..3] == ["ip", "netns", "add"]));
        let plan = Topology::new("t").unwrap().setup_plan(3);
        assert!(plan[..5].iter().all(|c| c[..3] == ["ip", "netns", "add"]));
    }

    #[test]
    fn hosts_have_subnets_of_their_own_and_reach_only_the_storage_side() {
        let t = Topology::new("t").unwrap();
        assert_eq!(t.addr(Role::HOST), "10.201.1.2");
        assert_eq!(t.addr(Role::Storage), "10.201.2.2");
        assert_eq!(t.addr(Role::Host(2)), "10.201.3.2");
        assert_eq!(t.addr(Role::Host(8)), "10.201.9.2");
        assert_eq!(t.ns(Role::Host(3)), "t-host3");
        let plan = t.setup_plan(3);
        let routes: Vec<String> = plan.iter().filter(|c| c.iter().any(|a| a == "route")).map(|c| c.join(" ")).collect();
        assert_eq!(routes.len(), 6, "{routes:?}");
        assert!(routes.contains(&"ip -n t-host3 route add 10.201.2.0/24 via 10.201.4.1".to_string()));
        assert!(routes.contains(&"ip -n t-storage route add 10.201.4.0/24 via 10.201.2.1".to_string()));
        assert!(!routes.iter().any(|r| r.starts_with("ip -n t-host") && r.contains("10.201.3.0")));
        let queued: Vec<&Vec<String>> = plan.iter().filter(|c| c.iter().any(|a| a == "NFQUEUE")).collect();
        assert_eq!(queued.len(), 4);
    }

    #[test]
    fn roles_parse_with_and_without_a_host_number() {
        assert_eq!(Role::parse("host").unwrap(), Role::HOST);
        assert_eq!(Role::parse("host1").unwrap(), Role::HOST);
        assert_eq!(Role::parse("host8").unwrap(), Role::Host(8));
        for bad in ["host0", "host9", "host01", "hosts", "h2"] {
            assert!(Role::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_cut_drops_both_ways_ahead_of_the_queue_rules() {
        let t = Topology::new("t").unwrap();
        let rules = Topology::cut_rules(Role::Host(2));
        assert_eq!(rules[0], ["-i", "rh2", "-j", "DROP"]);
        assert_eq!(rules[1], ["-d", "10.201.3.0/24", "-j", "DROP"]);
        let cmd = t.cut_cmd("-I", &rules[0]);
        assert_eq!(cmd.join(" "), "ip netns exec t-wan iptables -w -t raw -I PREROUTING -i rh2 -j DROP");
    }

    #[test]
    fn rate_plan_uses_tbf_with_burst_and_limit() {
        let t = Topology::new("t").unwrap();
        let mut p = Params::new(0);
        p.rate_bps = Some(100_000_000);
        let plan = t.rate_plan(&p);
        assert_eq!(plan.len(), 2);
        p.hosts = 3;
        assert_eq!(t.rate_plan(&p).len(), 4);
        p.hosts = 1;
        assert!(plan[0].iter().any(|a| a == "tbf"));
        assert!(plan[0].iter().any(|a| a == "100mbit"));
        assert!(plan[0].iter().any(|a| a == "625000"));
        p.rate_bps = None;
        assert!(t.rate_plan(&p)[0].iter().any(|a| a == "pfifo"));
    }
}

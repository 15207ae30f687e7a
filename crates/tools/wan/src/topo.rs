//! The shape of an emulated link (namespace, interface and address names) and the plan of
//! `ip`, `sysctl`, `iptables` and `tc` commands that builds, adjusts and removes it.
//!
//! ```text
//!  NAME-host            NAME-wan (router)                         NAME-storage
//!  eth0 10.201.1.2 ──── rh 10.201.1.1 │ NFQUEUE 0/1 │ rs 10.201.2.1 ──── eth0 10.201.2.2
//!                       tbf (to host) ◄┘            └► tbf (to storage)
//! ```
//!
//! Packets entering the router are queued to user space (queue 0 from the host, queue 1 from
//! the storage side) in the raw table, before anything else sees them; the bottleneck queue is a
//! `tbf` qdisc on each router egress. The ends hold no emulation state: a dead emulator leaves
//! a plain routed link (`--queue-bypass`).

use crate::params::{fmt_rate, Cc, Dir, Params};
use crate::{Result, WanError};

/// One end of the link, or the router between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Host,
    Storage,
    Router,
}

impl Role {
    pub fn parse(s: &str) -> Result<Role> {
        match s {
            "host" => Ok(Role::Host),
            "storage" => Ok(Role::Storage),
            "wan" | "router" => Ok(Role::Router),
            _ => Err(WanError::param("role", s, "expected host, storage or wan")),
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Role::Host => "host",
            Role::Storage => "storage",
            Role::Router => "wan",
        }
    }
}

/// Interface name of each end (inside its own namespace).
pub const END_IF: &str = "eth0";
/// Router interfaces toward the host and toward the storage side.
pub const ROUTER_IF_HOST: &str = "rh";
pub const ROUTER_IF_STORAGE: &str = "rs";

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

    pub fn all_ns(&self) -> [String; 3] {
        [self.ns(Role::Host), self.ns(Role::Storage), self.ns(Role::Router)]
    }

    /// The address of an end (or the router's address toward the host).
    pub fn addr(&self, role: Role) -> &'static str {
        match role {
            Role::Host => "10.201.1.2",
            Role::Storage => "10.201.2.2",
            Role::Router => "10.201.1.1",
        }
    }

    /// The router interface a direction leaves through (where its bottleneck queue sits).
    pub fn egress(dir: Dir) -> &'static str {
        match dir {
            Dir::ToStorage => ROUTER_IF_STORAGE,
            Dir::ToHost => ROUTER_IF_HOST,
        }
    }

    /// Commands that build the namespaces, links, addresses, routes, sysctls and queue rules.
    pub fn setup_plan(&self) -> Vec<Vec<String>> {
        let (h, s, w) = (self.ns(Role::Host), self.ns(Role::Storage), self.ns(Role::Router));
        let mut plan: Vec<Vec<String>> = Vec::new();
        let mut cmd = |args: &[&str]| plan.push(args.iter().map(std::string::ToString::to_string).collect());
        for ns in [&h, &s, &w] {
            cmd(&["ip", "netns", "add", ns]);
        }
        cmd(&["ip", "link", "add", END_IF, "netns", &h, "type", "veth", "peer", "name", ROUTER_IF_HOST, "netns", &w]);
        cmd(&[
            "ip",
            "link",
            "add",
            END_IF,
            "netns",
            &s,
            "type",
            "veth",
            "peer",
            "name",
            ROUTER_IF_STORAGE,
            "netns",
            &w,
        ]);
        for ns in [&h, &s, &w] {
            // IPv6 would send router solicitations past the IPv4-only queue rules; keep counters clean.
            cmd(&[
                "ip",
                "netns",
                "exec",
                ns,
                "sysctl",
                "-qw",
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1",
            ]);
            cmd(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        cmd(&["ip", "-n", &h, "addr", "add", "10.201.1.2/24", "dev", END_IF]);
        cmd(&["ip", "-n", &s, "addr", "add", "10.201.2.2/24", "dev", END_IF]);
        cmd(&["ip", "-n", &w, "addr", "add", "10.201.1.1/24", "dev", ROUTER_IF_HOST]);
        cmd(&["ip", "-n", &w, "addr", "add", "10.201.2.1/24", "dev", ROUTER_IF_STORAGE]);
        for (ns, dev) in [(&h, END_IF), (&s, END_IF), (&w, ROUTER_IF_HOST), (&w, ROUTER_IF_STORAGE)] {
            cmd(&["ip", "-n", ns, "link", "set", dev, "up"]);
        }
        // Only the far subnet is routed: nothing can leave for any other address.
        cmd(&["ip", "-n", &h, "route", "add", "10.201.2.0/24", "via", "10.201.1.1"]);
        cmd(&["ip", "-n", &s, "route", "add", "10.201.1.0/24", "via", "10.201.2.1"]);
        cmd(&["ip", "netns", "exec", &w, "sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        for ns in [&h, &s] {
            cmd(&[
                "ip",
                "netns",
                "exec",
                ns,
                "sysctl",
                "-qw",
                &format!("net.ipv4.tcp_rmem={TCP_MEM}"),
                &format!("net.ipv4.tcp_wmem={TCP_MEM}"),
                // Cached ssthresh and RTT from an earlier connection would make runs depend on order.
                "net.ipv4.tcp_no_metrics_save=1",
            ]);
        }
        for (dev, queue) in [(ROUTER_IF_HOST, Dir::ToStorage), (ROUTER_IF_STORAGE, Dir::ToHost)] {
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
                dev,
                "-j",
                "NFQUEUE",
                "--queue-num",
                &queue.index().to_string(),
                "--queue-bypass",
            ]);
        }
        plan
    }

    /// Commands that set the congestion control in both ends.
    pub fn cc_plan(&self, cc: Cc) -> Vec<Vec<String>> {
        [Role::Host, Role::Storage]
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

    /// Commands that put the rate limit and queue in force (or remove them).
    pub fn rate_plan(&self, p: &Params) -> Vec<Vec<String>> {
        let w = self.ns(Role::Router);
        Dir::ALL
            .iter()
            .map(|&d| {
                let dev = Self::egress(d).to_string();
                match (p.rate_bps, p.effective_queue()) {
                    (Some(rate), Some(limit)) => vec![
                        "tc".into(),
                        "-n".into(),
                        w.clone(),
                        "qdisc".into(),
                        "replace".into(),
                        "dev".into(),
                        dev,
                        "root".into(),
                        "tbf".into(),
                        "rate".into(),
                        fmt_rate(rate),
                        "burst".into(),
                        Params::tbf_burst(rate).to_string(),
                        "limit".into(),
                        limit.to_string(),
                    ],
                    // Back to the veth's default (no queueing discipline).
                    _ => vec![
                        "tc".into(),
                        "-n".into(),
                        w.clone(),
                        "qdisc".into(),
                        "replace".into(),
                        "dev".into(),
                        dev,
                        "root".into(),
                        "pfifo".into(),
                        "limit".into(),
                        "10000".into(),
                    ],
                }
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
        assert_eq!(t.all_ns(), ["t1-host", "t1-storage", "t1-wan"]);
    }

    #[test]
    fn queue_rules_sit_in_raw_prerouting_with_bypass() {
        let plan = Topology::new("t").unwrap().setup_plan();
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
        let plan = Topology::new("t").unwrap().setup_plan();
        assert!(plan[..3].iter().all(|c| c[..3] == ["ip", "netns", "add"]));
    }

    #[test]
    fn rate_plan_uses_tbf_with_burst_and_limit() {
        let t = Topology::new("t").unwrap();
        let mut p = Params::new(0);
        p.rate_bps = Some(100_000_000);
        let plan = t.rate_plan(&p);
        assert_eq!(plan.len(), 2);
        assert!(plan[0].iter().any(|a| a == "tbf"));
        assert!(plan[0].iter().any(|a| a == "100mbit"));
        assert!(plan[0].iter().any(|a| a == "625000"));
        p.rate_bps = None;
        assert!(t.rate_plan(&p)[0].iter().any(|a| a == "pfifo"));
    }
}

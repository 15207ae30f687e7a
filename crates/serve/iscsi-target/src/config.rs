//! The target's configuration: listen addresses, limits, discovery CHAP and one or more targets
//! with their LUNs, CHAP credentials and allowed initiators, read from TOML or the command line.

use std::fmt;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use stics_stack::DeviceSpec;

/// The port iSCSI uses (RFC 7143 §13.5 registers 3260).
pub const DEFAULT_PORT: u16 = 3260;
/// The target name `stics target` serves when none is given.
pub const DEFAULT_IQN: &str = "iqn.2024-01.org.stics:target0";

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The TOML does not parse or has unknown fields (the parser's message).
    #[error("config: {0}")]
    Toml(String),
    /// A value breaks a rule; the message says which.
    #[error("config: {0}")]
    Invalid(String),
}

fn invalid(msg: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(msg.into())
}

/// Everything `stics target` serves.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Addresses to listen on (`HOST:PORT`).
    #[serde(default = "default_listen")]
    pub listen: Vec<String>,
    /// Resource limits and the values the target offers in negotiation.
    #[serde(default)]
    pub limits: Limits,
    /// Who may open a discovery session; what discovery lists follows [`DiscoveryConfig`]'s rule.
    #[serde(default, skip_serializing_if = "DiscoveryConfig::is_open")]
    pub discovery: DiscoveryConfig,
    /// The targets, each with its own LUNs.
    #[serde(default, rename = "target")]
    pub targets: Vec<TargetConfig>,
    /// How `rbd:` LUNs reach their Ceph cluster when their spec does not say.
    #[serde(default, skip_serializing_if = "RbdConfig::is_default")]
    pub rbd: RbdConfig,
    /// TLS 1.3 on every listen address: connections that do not complete a handshake are closed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
}

/// The `[tls]` table: the target's certificate chain and key in PEM, and for mutual TLS the CA
/// whose certificates clients must present.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ca: Option<std::path::PathBuf>,
}

impl TlsConfig {
    /// As the TLS layer takes it.
    pub fn options(&self) -> stics_tls::ServerOptions {
        stics_tls::ServerOptions { cert: self.cert.clone(), key: self.key.clone(), client_ca: self.client_ca.clone() }
    }
}

/// The `[rbd]` table: the Ceph cluster of every `rbd:` LUN whose spec names none.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct RbdConfig {
    /// The cluster's config file (librbd's search, `CEPH_CONF` then /etc/ceph/ceph.conf, if unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conf: Option<std::path::PathBuf>,
    /// The client id: `admin` (the default) is `client.admin`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The client's keyring (the config file's `keyring` if unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keyring: Option<std::path::PathBuf>,
    /// Seconds reaching the cluster and opening an image may take before the target refuses to
    /// start (10 if unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connect_timeout_secs: Option<u64>,
}

impl RbdConfig {
    fn is_default(&self) -> bool {
        *self == RbdConfig::default()
    }

    /// As the device stack takes it.
    pub fn defaults(&self) -> stics_stack::RbdDefaults {
        stics_stack::RbdDefaults {
            conf: self.conf.clone(),
            id: self.id.clone(),
            keyring: self.keyring.clone(),
            timeout_secs: self.connect_timeout_secs,
        }
    }
}

fn default_listen() -> Vec<String> {
    vec![format!("127.0.0.1:{DEFAULT_PORT}")]
}

/// Limits that bound memory and work whatever peers send, and the target's negotiation offers.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Sessions in full feature phase at once, over all targets.
    pub max_sessions: usize,
    /// TCP connections at once (logged in or not).
    pub max_connections: usize,
    /// Connections in the login phase at once; more wait in the kernel's accept queue.
    pub max_logins: usize,
    /// Seconds a connection may take to log in before it is closed.
    pub login_timeout_secs: u64,
    /// MaxRecvDataSegmentLength the target declares: the largest data segment it accepts.
    pub max_recv_data_segment_length: u32,
    /// MaxBurstLength offered (the smaller of both sides' values wins).
    pub max_burst_length: u32,
    /// FirstBurstLength offered.
    pub first_burst_length: u32,
    /// MaxOutstandingR2T offered.
    pub max_outstanding_r2t: u32,
    /// Whether the target asks for InitialR2T=Yes (no unsolicited Data-Out).
    pub initial_r2t: bool,
    /// Whether the target accepts immediate data.
    pub immediate_data: bool,
    /// CmdSN window: commands a session may have queued or running at once.
    pub queue_depth: u32,
    /// Largest Expected Data Transfer Length of one write the target buffers.
    pub max_command_bytes: u32,
    /// Write data a session may hold buffered for commands still waiting for more data.
    pub session_write_buffer_bytes: u64,
    /// Output a session may have read from its devices or queued but not yet written to its
    /// socket. A read is executed only once its data fits (a read larger than this waits until
    /// the session has nothing else queued), and no new request is taken while the queue is
    /// over it: a peer that does not read its socket holds at most this much memory.
    pub session_output_buffer_bytes: u64,
    /// The same bound over all sessions together.
    pub target_output_buffer_bytes: u64,
    /// Interval over which the warnings one peer causes are limited: a few of each kind are
    /// logged, the rest counted and reported with the next one logged.
    pub warning_interval_secs: u64,
    /// Seconds of silence from an initiator after which the target pings it with a NOP-In;
    /// 0 turns pings off.
    pub nop_in_interval_secs: u64,
    /// Seconds the initiator has to answer a ping before its connection is dropped.
    pub nop_in_timeout_secs: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_sessions: 64,
            max_connections: 256,
            max_logins: 16,
            login_timeout_secs: 15,
            max_recv_data_segment_length: 256 * 1024,
            max_burst_length: 1024 * 1024,
            first_burst_length: 256 * 1024,
            max_outstanding_r2t: 8,
            initial_r2t: false,
            immediate_data: true,
            queue_depth: 128,
            max_command_bytes: 32 * 1024 * 1024,
            session_write_buffer_bytes: 128 * 1024 * 1024,
            session_output_buffer_bytes: 64 * 1024 * 1024,
            target_output_buffer_bytes: 1024 * 1024 * 1024,
            warning_interval_secs: 60,
            nop_in_interval_secs: 30,
            nop_in_timeout_secs: 30,
        }
    }
}

/// CHAP for discovery sessions (`[discovery]`), and the rule for what SendTargets lists.
///
/// SendTargets never names a target to an initiator that target refuses, nor a CHAP target to a
/// session that has not authenticated: a target is listed only if its `initiators` admit the
/// session's InitiatorName and, when the target has `chap`, only if the session itself passed
/// CHAP at login. Without `chap` here discovery is open to anyone and never names a CHAP target
/// (its initiators must be told the name); with `chap` here every discovery login must pass CHAP
/// (a missing or wrong answer is refused with status 0x0201) and then sees the CHAP targets its
/// name is allowed. Logging in to a target still takes that target's own secret. The same rule
/// answers SendTargets in a normal session, which counts as authenticated if it passed its
/// target's CHAP.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// One-way CHAP: every discovery login must prove it knows this user's secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chap: Option<Credentials>,
    /// Mutual CHAP: what the target answers when a discovering initiator challenges it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutual_chap: Option<Credentials>,
}

impl DiscoveryConfig {
    /// True when discovery needs no authentication (nothing to print).
    pub fn is_open(&self) -> bool {
        self.chap.is_none() && self.mutual_chap.is_none()
    }
}

/// One iSCSI target.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    /// iSCSI name (iqn., eui. or naa. form).
    pub iqn: String,
    /// TargetAlias sent at login.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// LUN specs in the device stack's language (`mem:SIZE`, `null:SIZE`, `file:PATH[:SIZE]`,
    /// `iscsi://host/IQN/LUN`, see `stics_stack::DeviceSpec`); LUN n is the n-th. The spec
    /// carries the logical block size, so there is no separate key for it: `:BLOCK` after the
    /// size (`mem:1GiB:4096`, `file:PATH:SIZE:4096`, or `file:PATH::4096` for an existing file)
    /// takes 512, 1024, 2048 or 4096, and 512 when left out; an `iscsi://` LUN keeps the remote
    /// LUN's block size.
    pub luns: Vec<String>,
    /// One-way CHAP: the initiator must prove it knows this user's secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chap: Option<Credentials>,
    /// Mutual CHAP: what the target answers when the initiator challenges it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutual_chap: Option<Credentials>,
    /// Initiator names allowed to log in and to see this target in discovery; empty allows all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub initiators: Vec<String>,
}

/// A CHAP user name and secret. `Debug` never shows the secret.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Credentials {
    pub user: String,
    pub secret: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials").field("user", &self.user).field("secret", &"<redacted>").finish()
    }
}

impl Default for Config {
    /// One target with a 1 GiB memory LUN on 127.0.0.1:3260.
    fn default() -> Self {
        Config {
            listen: default_listen(),
            limits: Limits::default(),
            discovery: DiscoveryConfig::default(),
            targets: vec![TargetConfig {
                iqn: DEFAULT_IQN.into(),
                alias: None,
                luns: vec!["mem:1GiB".into()],
                chap: None,
                mutual_chap: None,
                initiators: Vec::new(),
            }],
            rbd: RbdConfig::default(),
            tls: None,
        }
    }
}

/// RFC 3722 names: `iqn.YYYY-MM.reversed.domain[:anything]`, `eui.` + 16 hex digits, `naa.` + 16 or
/// 32 hex digits. Checked loosely: the prefix, length and character set.
pub fn valid_iscsi_name(name: &str) -> bool {
    let ok_chars = name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':'));
    let hex = |s: &str| s.bytes().all(|b| b.is_ascii_hexdigit());
    if name.len() > 223 || !ok_chars {
        return false;
    }
    if let Some(rest) = name.strip_prefix("iqn.") {
        rest.len() > 8 && rest.as_bytes().get(4) == Some(&b'-')
    } else if let Some(rest) = name.strip_prefix("eui.") {
        rest.len() == 16 && hex(rest)
    } else if let Some(rest) = name.strip_prefix("naa.") {
        (rest.len() == 16 || rest.len() == 32) && hex(rest)
    } else {
        false
    }
}

impl Config {
    /// Parses TOML and validates it.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let c: Config = toml::from_str(text).map_err(|e| ConfigError::Toml(e.to_string()))?;
        c.validate()?;
        Ok(c)
    }

    /// The configuration as TOML with every CHAP secret replaced by `<redacted>` (and those of
    /// `iscsi://` LUNs by `***`).
    pub fn to_toml_redacted(&self) -> String {
        let mut c = self.clone();
        let redact = |cred: &mut Option<Credentials>| {
            if let Some(cred) = cred {
                cred.secret = "<redacted>".into();
            }
        };
        redact(&mut c.discovery.chap);
        redact(&mut c.discovery.mutual_chap);
        for t in &mut c.targets {
            redact(&mut t.chap);
            redact(&mut t.mutual_chap);
            for lun in &mut t.luns {
                // Only specs with secrets are rewritten; the others stay as written.
                if let Ok(spec) = lun.parse::<DeviceSpec>() {
                    let redacted = spec.redacted().to_string();
                    if redacted != spec.to_string() {
                        *lun = redacted;
                    }
                }
            }
        }
        toml::to_string_pretty(&c).unwrap_or_else(|e| format!("# cannot print configuration: {e}\n"))
    }

    /// The listen addresses, parsed.
    pub fn listen_addrs(&self) -> Result<Vec<SocketAddr>, ConfigError> {
        self.listen
            .iter()
            .map(|s| s.parse::<SocketAddr>().map_err(|_| invalid(format!("listen address {s:?} is not HOST:PORT"))))
            .collect()
    }

    /// Checks every rule a running target relies on.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check(true)
    }

    /// [`Config::validate`] for a target whose LUNs are devices already open: the `luns` only
    /// name them and are not read as specs.
    pub(crate) fn validate_for_devices(&self) -> Result<(), ConfigError> {
        self.check(false)
    }

    fn check(&self, specs: bool) -> Result<(), ConfigError> {
        if self.listen.is_empty() {
            return Err(invalid("no listen address"));
        }
        self.listen_addrs()?;
        if self.targets.is_empty() {
            return Err(invalid("no [[target]]"));
        }
        let l = &self.limits;
        let range = |name: &str, v: u64, lo: u64, hi: u64| {
            if v < lo || v > hi {
                Err(invalid(format!("limits.{name} = {v} is outside {lo}..={hi}")))
            } else {
                Ok(())
            }
        };
        range("max_sessions", l.max_sessions as u64, 1, 65535)?;
        range("max_connections", l.max_connections as u64, 1, 1 << 20)?;
        range("max_logins", l.max_logins as u64, 1, 1 << 16)?;
        range("login_timeout_secs", l.login_timeout_secs, 1, 3600)?;
        range("max_recv_data_segment_length", l.max_recv_data_segment_length.into(), 512, 16_777_215)?;
        range("max_burst_length", l.max_burst_length.into(), 512, 16_777_215)?;
        range("first_burst_length", l.first_burst_length.into(), 512, 16_777_215)?;
        range("max_outstanding_r2t", l.max_outstanding_r2t.into(), 1, 65535)?;
        range("queue_depth", l.queue_depth.into(), 1, 1 << 16)?;
        range("max_command_bytes", l.max_command_bytes.into(), 512, 1 << 30)?;
        range("session_write_buffer_bytes", l.session_write_buffer_bytes, 1 << 20, 1 << 40)?;
        range("session_output_buffer_bytes", l.session_output_buffer_bytes, 1 << 20, 1 << 40)?;
        range("target_output_buffer_bytes", l.target_output_buffer_bytes, l.session_output_buffer_bytes, 1 << 44)?;
        range("warning_interval_secs", l.warning_interval_secs, 1, 86_400)?;
        if let Some(n) = self.rbd.connect_timeout_secs {
            if !(1..=stics_stack::MAX_RBD_TIMEOUT_SECS).contains(&n) {
                return Err(invalid(format!(
                    "rbd.connect_timeout_secs = {n} is outside 1..={}",
                    stics_stack::MAX_RBD_TIMEOUT_SECS
                )));
            }
        }
        check_chap("discovery", self.discovery.chap.as_ref(), self.discovery.mutual_chap.as_ref())?;
        let mut seen = std::collections::HashSet::new();
        for t in &self.targets {
            if !valid_iscsi_name(&t.iqn) {
                return Err(invalid(format!("target name {:?} is not an iqn./eui./naa. name", t.iqn)));
            }
            if !seen.insert(t.iqn.to_ascii_lowercase()) {
                return Err(invalid(format!("target {} is configured twice", t.iqn)));
            }
            if t.luns.is_empty() {
                return Err(invalid(format!("target {} has no LUNs", t.iqn)));
            }
            if t.luns.len() > 16384 {
                return Err(invalid(format!("target {} has more than 16384 LUNs", t.iqn)));
            }
            for spec in t.luns.iter().filter(|_| specs) {
                spec.parse::<DeviceSpec>().map_err(|e| invalid(format!("target {}: bad LUN spec: {e}", t.iqn)))?;
            }
            check_chap(&format!("target {}", t.iqn), t.chap.as_ref(), t.mutual_chap.as_ref())?;
        }
        Ok(())
    }
}

/// The rules for one pair of CHAP credentials (a target's or discovery's), named by `owner`.
fn check_chap(owner: &str, chap: Option<&Credentials>, mutual: Option<&Credentials>) -> Result<(), ConfigError> {
    for (what, cred) in [("chap", chap), ("mutual_chap", mutual)] {
        if let Some(c) = cred {
            if c.user.is_empty() || c.secret.is_empty() {
                return Err(invalid(format!("{owner}: {what} needs a user and a secret")));
            }
            if c.secret.len() > 255 {
                return Err(invalid(format!("{owner}: {what} secret is longer than 255 bytes")));
            }
        }
    }
    match (chap, mutual) {
        (None, Some(_)) => Err(invalid(format!("{owner}: mutual_chap needs chap as well"))),
        // RFC 7143 §12.1.3: the secrets of the two directions must differ.
        (Some(c), Some(m)) if c.secret == m.secret => {
            Err(invalid(format!("{owner}: chap and mutual_chap secrets must differ")))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn default_config_serves_one_gib_memory_lun_on_3260() {
        let c = Config::default();
        c.validate().unwrap();
        assert_eq!(c.listen, vec!["127.0.0.1:3260"]);
        assert_eq!(c.targets[0].luns, vec!["mem:1GiB"]);
    }

    #[test]
    fn toml_with_two_targets_and_chap_parses() {
        let c = Config::from_toml(
            r#"
            listen = ["127.0.0.1:3261"]
            [limits]
            max_sessions = 4
            [[target]]
            iqn = "iqn.2024-01.org.example:a"
            luns = ["mem:64M", "null:1G"]
            chap = { user = "u", secret = "secretsecret1" }
            mutual_chap = { user = "t", secret = "secretsecret2" }
            [[target]]
            iqn = "iqn.2024-01.org.example:b"
            luns = ["mem:1M"]
            initiators = ["iqn.1994-05.com.redhat:x"]
            "#,
        )
        .unwrap();
        assert_eq!(c.targets.len(), 2);
        assert_eq!(c.limits.max_sessions, 4);
        assert_eq!(c.limits.queue_depth, Limits::default().queue_depth);
        let printed = c.to_toml_redacted();
        assert!(!printed.contains("secretsecret"));
        assert!(printed.contains("<redacted>"));
        assert!(!format!("{c:?}").contains("secretsecret"));
    }

    #[test]
    fn lun_specs_carry_the_block_size_and_only_valid_ones_pass() {
        let toml = |luns: &str| format!("[[target]]\niqn = \"iqn.2024-01.org.example:a\"\nluns = [{luns}]\n");
        let c =
            Config::from_toml(&toml(r#""mem:1GiB:4096", "null:1G:1024", "file:/x.img:1GiB:2048", "mem:1M""#)).unwrap();
        let block_sizes: Vec<u32> = c.targets[0]
            .luns
            .iter()
            .map(|l| match l.parse::<DeviceSpec>().unwrap() {
                DeviceSpec::Mem { block_size, .. }
                | DeviceSpec::Null { block_size, .. }
                | DeviceSpec::File { block_size, .. } => block_size,
                other => panic!("unexpected spec {other:?}"),
            })
            .collect();
        assert_eq!(block_sizes, vec![4096, 1024, 2048, 512]);
        for bad in [r#""mem:1GiB:1000""#, r#""mem:1GiB:8192""#, r#""mem:1GiB:256""#, r#""mem:6KiB:4096""#] {
            let e = Config::from_toml(&toml(bad)).unwrap_err().to_string();
            assert!(e.contains("bad LUN spec"), "{bad}: {e}");
        }
    }

    #[test]
    fn printed_config_hides_the_secrets_of_remote_luns() {
        let mut c = Config::default();
        c.targets[0].luns.push("iscsi://u%hush@10.0.0.2/iqn.2024-01.org.x:y/0".into());
        c.targets[0].luns.push("mem:64M".into());
        c.validate().unwrap();
        let printed = c.to_toml_redacted();
        assert!(!printed.contains("hush"), "{printed}");
        assert!(printed.contains("\"iscsi://u%***@10.0.0.2:3260/iqn.2024-01.org.x:y/0\""), "{printed}");
        assert!(printed.contains("\"mem:64M\""), "{printed}");
    }

    #[test]
    fn bad_configs_are_refused_with_a_reason() {
        let bad = [
            ("listen = [\"nope\"]\n[[target]]\niqn=\"iqn.2024-01.a:b\"\nluns=[\"mem:1M\"]", "listen"),
            ("[[target]]\niqn=\"foo\"\nluns=[\"mem:1M\"]", "not an iqn"),
            ("[[target]]\niqn=\"iqn.2024-01.a:b\"\nluns=[]", "no LUNs"),
            ("[[target]]\niqn=\"iqn.2024-01.a:b\"\nluns=[\"disk:1M\"]", "bad LUN spec"),
            ("[[target]]\niqn=\"iqn.2024-01.a:b\"\nluns=[\"mem:1M\"]\nfoo=1", "unknown field"),
            ("[limits]\nqueue_depth=0\n[[target]]\niqn=\"iqn.2024-01.a:b\"\nluns=[\"mem:1M\"]", "queue_depth"),
            ("listen=[\"127.0.0.1:1\"]", "no [[target]]"),
        ];
        for (text, want) in bad {
            let e = Config::from_toml(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn iscsi_names_follow_rfc_3722_forms() {
        assert!(valid_iscsi_name("iqn.2024-01.org.stics:target0"));
        assert!(valid_iscsi_name("eui.02004567A425678D"));
        assert!(valid_iscsi_name("naa.52004567BA64678D"));
        assert!(!valid_iscsi_name("iqn.x"));
        assert!(!valid_iscsi_name("target0"));
        assert!(!valid_iscsi_name("iqn.2024-01.org stics"));
    }

    #[test]
    fn discovery_chap_parses_and_its_secrets_never_print() {
        let c = Config::from_toml(
            r#"
            [discovery]
            chap = { user = "seeker", secret = "hush-discovery-1" }
            mutual_chap = { user = "portal", secret = "hush-portal-2" }
            [[target]]
            iqn = "iqn.2024-01.org.example:a"
            luns = ["mem:1M"]
            "#,
        )
        .unwrap();
        assert_eq!(c.discovery.chap.as_ref().map(|c| c.user.as_str()), Some("seeker"));
        assert_eq!(c.discovery.mutual_chap.as_ref().map(|c| c.user.as_str()), Some("portal"));
        let printed = c.to_toml_redacted();
        assert!(!printed.contains("hush"), "{printed}");
        assert!(printed.contains("[discovery"), "{printed}");
        assert!(printed.contains("\"seeker\"") && printed.contains("\"portal\""), "{printed}");
        assert!(!format!("{c:?}").contains("hush"));
    }

    #[test]
    fn the_example_configuration_is_valid() {
        let c = Config::from_toml(include_str!("../../../../examples/target.toml")).unwrap();
        assert!(c.discovery.chap.is_some());
        assert_eq!(c.targets.len(), 2);
    }

    #[test]
    fn the_rbd_table_sets_how_rbd_luns_reach_their_cluster() {
        let t = "[[target]]\niqn=\"iqn.2024-01.a:b\"\nluns=[\"rbd:rbd/img\"]\n";
        let c = Config::from_toml(t).unwrap();
        assert_eq!(c.rbd, RbdConfig::default());
        assert!(!c.to_toml_redacted().contains("rbd]"), "an empty [rbd] table is not printed");
        let c = Config::from_toml(&format!(
            "{t}[rbd]\nconf=\"/c.conf\"\nid=\"gw\"\nkeyring=\"/k\"\nconnect_timeout_secs=3\n"
        ))
        .unwrap();
        let d = c.rbd.defaults();
        assert_eq!(d.conf.as_deref(), Some(std::path::Path::new("/c.conf")));
        assert_eq!((d.id.as_deref(), d.timeout_secs), (Some("gw"), Some(3)));
        assert!(c.to_toml_redacted().contains("connect_timeout_secs = 3"));
        let e = Config::from_toml(&format!("{t}[rbd]\nconnect_timeout_secs=0\n")).unwrap_err();
        assert!(e.to_string().contains("rbd.connect_timeout_secs"), "{e}");
        assert!(Config::from_toml(&format!("{t}[rbd]\npool=\"x\"\n")).is_err(), "unknown keys are refused");
    }

    #[test]
    fn open_discovery_is_the_default_and_is_not_printed() {
        let c = Config::from_toml("[[target]]\niqn=\"iqn.2024-01.a:b\"\nluns=[\"mem:1M\"]").unwrap();
        assert!(c.discovery.is_open());
        assert!(!c.to_toml_redacted().contains("discovery"));
    }

    #[test]
    fn discovery_chap_is_checked_like_a_targets() {
        let target = "\n[[target]]\niqn=\"iqn.2024-01.a:b\"\nluns=[\"mem:1M\"]";
        let bad = [
            ("[discovery]\nchap = { user = \"\", secret = \"s3cret-s3cret\" }", "discovery: chap needs a user"),
            ("[discovery]\nchap = { user = \"u\", secret = \"\" }", "discovery: chap needs a user"),
            ("[discovery]\nmutual_chap = { user = \"u\", secret = \"s3cret-s3cret\" }", "discovery: mutual_chap needs chap"),
            (
                "[discovery]\nchap = { user = \"u\", secret = \"same-same-1\" }\nmutual_chap = { user = \"t\", secret = \"same-same-1\" }",
                "discovery: chap and mutual_chap secrets must differ",
            ),
            ("[discovery]\nchap = { user = \"u\", secret = \"s3cret-s3cret\" }\nusers = []", "unknown field"),
        ];
        for (text, want) in bad {
            let e = Config::from_toml(&format!("{text}{target}")).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        let long = format!("[discovery]\nchap = {{ user = \"u\", secret = \"{}\" }}{target}", "x".repeat(256));
        let e = Config::from_toml(&long).unwrap_err().to_string();
        assert!(e.contains("discovery: chap secret is longer than 255 bytes"), "{e}");
    }
}

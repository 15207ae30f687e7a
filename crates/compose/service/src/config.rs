//! The configuration file of `stics target` and `stics gateway`: listen addresses, limits,
//! discovery CHAP and targets whose LUNs are device specs (`mem:1GiB`, `iscsi://…`) or cached
//! LUNs (a remote, a log and the cache's options), read from TOML and checked before anything
//! is opened.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use stics_stack::DeviceSpec;
use stics_target::config::{check_distinct, check_target, DEFAULT_IQN, DEFAULT_PORT};
use stics_target::{Credentials, DiscoveryAuth, Limits};

use crate::cached::CachedLun;

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

impl From<stics_target::ConfigError> for ConfigError {
    fn from(e: stics_target::ConfigError) -> Self {
        ConfigError::Invalid(e.0)
    }
}

fn invalid(msg: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(msg.into())
}

/// Everything `stics target` or `stics gateway` serves.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Addresses to listen on (`HOST:PORT`).
    #[serde(default = "default_listen")]
    pub listen: Vec<String>,
    /// Resource limits and the values the target offers in negotiation.
    #[serde(default)]
    pub limits: Limits,
    /// Who may open a discovery session; what discovery lists follows [`DiscoveryAuth`]'s rule.
    #[serde(default, skip_serializing_if = "DiscoveryAuth::is_open")]
    pub discovery: DiscoveryAuth,
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
    pub cert: PathBuf,
    pub key: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ca: Option<PathBuf>,
}

impl TlsConfig {
    /// Reads the PEM files into the acceptor the target runs its handshakes with.
    pub fn acceptor(&self) -> Result<stics_tls::Acceptor, stics_tls::TlsError> {
        stics_tls::Acceptor::new(&stics_tls::ServerOptions {
            cert: self.cert.clone(),
            key: self.key.clone(),
            client_ca: self.client_ca.clone(),
        })
    }
}

/// The `[rbd]` table: the Ceph cluster of every `rbd:` LUN whose spec names none.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct RbdConfig {
    /// The cluster's config file (librbd's search, `CEPH_CONF` then /etc/ceph/ceph.conf, if unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conf: Option<PathBuf>,
    /// The client id: `admin` (the default) is `client.admin`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The client's keyring (the config file's `keyring` if unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keyring: Option<PathBuf>,
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

/// One iSCSI target.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    /// iSCSI name (iqn., eui. or naa. form).
    pub iqn: String,
    /// TargetAlias sent at login.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// The LUNs; LUN n is the n-th. Each is a device spec (see [`LunConfig::Spec`]) or a table
    /// that describes a cached LUN ([`LunConfig::Cached`]).
    pub luns: Vec<LunConfig>,
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

impl TargetConfig {
    /// A target `iqn` anyone may log in to, over `luns`.
    pub fn new(iqn: impl Into<String>, luns: Vec<LunConfig>) -> TargetConfig {
        TargetConfig { iqn: iqn.into(), alias: None, luns, chap: None, mutual_chap: None, initiators: Vec::new() }
    }
}

/// One LUN of a target.
#[derive(Clone, PartialEq)]
#[expect(clippy::large_enum_variant, reason = "a handful per configuration file, read once")]
pub enum LunConfig {
    /// A spec in the device stack's language (`mem:SIZE`, `null:SIZE`, `file:PATH[:SIZE]`,
    /// `iscsi://host/IQN/LUN`, `rbd:POOL/IMAGE`, `cache(SPEC, log=…)`, see
    /// `stics_stack::DeviceSpec`). The spec carries the logical block size: `:BLOCK` after the
    /// size (`mem:1GiB:4096`, `file:PATH:SIZE:4096`, or `file:PATH::4096` for an existing file)
    /// takes 512, 1024, 2048 or 4096, and 512 when left out; an `iscsi://` LUN keeps the remote
    /// LUN's block size.
    Spec(String),
    /// A remote served through the STICS cache, with a log and options of its own: the LUNs of
    /// `stics gateway`. Its status and metrics are reported per LUN.
    Cached(CachedLunConfig),
}

impl fmt::Debug for LunConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LunConfig::Spec(s) => match s.parse::<DeviceSpec>() {
                Ok(spec) => write!(f, "Spec({:?})", spec.redacted().to_string()),
                Err(_) => f.write_str("Spec(<unparsed>)"),
            },
            LunConfig::Cached(c) => c.fmt(f),
        }
    }
}

impl Serialize for LunConfig {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            LunConfig::Spec(text) => s.serialize_str(text),
            LunConfig::Cached(c) => c.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for LunConfig {
    /// A string is a spec, a table a cached LUN; the table's own errors (an unknown key, a
    /// missing `remote`) are reported as they are.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = LunConfig;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a device spec (\"mem:1GiB\") or a cached LUN's table ({ remote = …, log = … })")
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<LunConfig, E> {
                Ok(LunConfig::Spec(v.to_owned()))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<LunConfig, A::Error> {
                CachedLunConfig::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(LunConfig::Cached)
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// A size given as text (`"64MiB"`) or as a number of bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct SizeText(pub String);

impl<'de> Deserialize<'de> for SizeText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = SizeText;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as \"64MiB\" or a number of bytes")
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<SizeText, E> {
                Ok(SizeText(v.to_owned()))
            }

            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<SizeText, E> {
                Ok(SizeText(v.to_string()))
            }

            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<SizeText, E> {
                Ok(SizeText(v.to_string()))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// A cached LUN as the file gives it: `{ remote = "iscsi://…", log = "/var/lib/stics/lun0.log",
/// mode = "log", … }`. Every key but `remote` and `log` has the cache's default.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CachedLunConfig {
    /// The remote LUN: `iscsi://[user[%secret]@]host[:port]/IQN/LUN`, or any device spec.
    pub remote: String,
    /// The write log: a file or a block device; each cached LUN needs its own.
    pub log: PathBuf,
    /// Size a missing log file is created at (1GiB if unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_size: Option<SizeText>,
    /// When writes are acknowledged: `log`, `immediate` or `write-through` (`log` if unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// RAM write buffer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ram: Option<SizeText>,
    /// DRAM read cache of clean blocks (0: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_cache: Option<SizeText>,
    /// Read cache policy: `s3fifo` or `lru`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// Seconds host writes wait for room in a full log while the remote keeps failing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_timeout_secs: Option<u64>,
    /// Memory the dirty index may take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_memory: Option<SizeText>,
    /// Oldest a write the remote does not hold yet may get, in seconds (no bound if unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_lag_secs: Option<u64>,
    /// Put the log's file behind this disk model (as `stics bench disk` checks them), for the
    /// papers' setups: `o7n3200`, `as010a1`, `91366u4`, `dnes`, `ddys`, `raid5`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_disk: Option<String>,
    /// Other gateways cache the same remote LUN of a stics SG: commands run under tokens from
    /// the SG, which keep every gateway's copy coherent (seed 004 §3.4). Mode log or immediate.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared: bool,
    /// How long the SG's answers keep a shared cache's tokens good, in seconds (at most the
    /// SG's `lease`; 30 if unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_secs: Option<u64>,
    /// Most tokens a shared cache keeps: past it, it gives its least recently used idle ones
    /// up (an exclusive one's writes shipped first). 65,536 if unset: 4 GiB of 64 KiB segments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Whether a shared cache takes the blocks a read waits for with its shared grant, where the
    /// SG sends them (true if unset); false reads them after the grant, a round trip later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant_data: Option<bool>,
}

impl CachedLunConfig {
    /// A cached LUN over `remote` with its log at `log` and every option at its default.
    pub fn new(remote: impl Into<String>, log: impl Into<PathBuf>) -> CachedLunConfig {
        CachedLunConfig {
            remote: remote.into(),
            log: log.into(),
            log_size: None,
            mode: None,
            ram: None,
            read_cache: None,
            policy: None,
            full_timeout_secs: None,
            index_memory: None,
            max_lag_secs: None,
            log_disk: None,
            shared: false,
            lease_secs: None,
            max_tokens: None,
            grant_data: None,
        }
    }

    /// The typed LUN, or what is wrong with it.
    pub fn typed(&self) -> Result<CachedLun, String> {
        let remote: DeviceSpec = self.remote.parse().map_err(|e| format!("remote: {e}"))?;
        if self.log.as_os_str().is_empty() {
            return Err("log: needs a path".into());
        }
        let size = |key: &str, v: &Option<SizeText>, zero: bool| -> Result<Option<u64>, String> {
            let Some(SizeText(text)) = v else { return Ok(None) };
            // As a device spec reads them: whole 512-byte blocks; a read cache may be none.
            let (least, block) = if zero { (0, 1) } else { (1, 512) };
            match stics_units::parse_size_within(text, least..=i64::MAX as u64, block) {
                Ok(n) => Ok(Some(n)),
                Err(e) => Err(format!("{key}: {e}")),
            }
        };
        let mut cache = stics_cache::Config::default();
        if let Some(m) = &self.mode {
            cache.mode = m.parse().map_err(|e| format!("mode: {e}"))?;
        }
        if let Some(n) = size("ram", &self.ram, false)? {
            cache.ram_bytes = n;
        }
        if let Some(n) = size("read_cache", &self.read_cache, true)? {
            cache.read_cache_bytes = n;
        }
        if let Some(p) = &self.policy {
            cache.read_cache_policy = p.parse().map_err(|_| format!("policy = {p:?}: use lru or s3fifo"))?;
        }
        if let Some(n) = self.full_timeout_secs {
            if !(1..=86_400).contains(&n) {
                return Err(format!("full_timeout_secs = {n} is outside 1..=86400"));
            }
            cache.full_timeout = std::time::Duration::from_secs(n);
        }
        if let Some(n) = size("index_memory", &self.index_memory, false)? {
            cache.index_bytes = n;
        }
        if let Some(n) = self.max_lag_secs {
            if !(1..=86_400).contains(&n) {
                return Err(format!("max_lag_secs = {n} is outside 1..=86400"));
            }
            cache.max_lag = Some(std::time::Duration::from_secs(n));
        }
        let log_disk = self.log_disk.as_deref().map(str::parse).transpose().map_err(|e| format!("log_disk: {e}"))?;
        if self.lease_secs.is_some() && !self.shared {
            return Err("lease_secs is for a shared LUN (shared = true)".into());
        }
        if self.max_tokens.is_some() && !self.shared {
            return Err("max_tokens is for a shared LUN (shared = true)".into());
        }
        if self.grant_data.is_some() && !self.shared {
            return Err("grant_data is for a shared LUN (shared = true)".into());
        }
        let shared = match (self.shared, self.lease_secs, self.max_tokens) {
            (false, ..) => None,
            (true, Some(n), _) if !(1..=3600).contains(&n) => {
                return Err(format!("lease_secs = {n} is outside 1..=3600"));
            }
            (true, _, Some(n)) if !(1..=1 << 24).contains(&n) => {
                return Err(format!("max_tokens = {n} is outside 1..=16777216"));
            }
            (true, lease, max) => {
                let mut d = stics_coherence::driver::DriverConfig::default();
                if let Some(n) = lease {
                    d.lease = std::time::Duration::from_secs(n);
                }
                if let Some(n) = max {
                    d.max_tokens = n as usize;
                }
                d.grant_data = self.grant_data.unwrap_or(true);
                Some(d)
            }
        };
        if shared.is_some() && cache.mode == stics_cache::Mode::WriteThrough {
            return Err(
                "mode = write-through: a shared LUN's writes would reach the SG unfenced; use log or immediate".into(),
            );
        }
        Ok(CachedLun {
            remote,
            log: self.log.clone(),
            log_size: size("log_size", &self.log_size, false)?,
            cache,
            log_disk,
            shared,
        })
    }
}

impl Default for Config {
    /// One target with a 1 GiB memory LUN on 127.0.0.1:3260.
    fn default() -> Self {
        Config {
            listen: default_listen(),
            limits: Limits::default(),
            discovery: DiscoveryAuth::default(),
            targets: vec![TargetConfig::new(DEFAULT_IQN, vec![LunConfig::Spec("mem:1GiB".into())])],
            rbd: RbdConfig::default(),
            tls: None,
        }
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
    /// `iscsi://` LUNs and remotes by `***`).
    pub fn to_toml_redacted(&self) -> String {
        let mut c = self.clone();
        let redact = |cred: &mut Option<Credentials>| {
            if let Some(cred) = cred {
                cred.secret = "<redacted>".into();
            }
        };
        // Only specs with secrets are rewritten; the others stay as written.
        let redact_spec = |text: &mut String| {
            if let Ok(spec) = text.parse::<DeviceSpec>() {
                let redacted = spec.redacted().to_string();
                if redacted != spec.to_string() {
                    *text = redacted;
                }
            }
        };
        redact(&mut c.discovery.chap);
        redact(&mut c.discovery.mutual_chap);
        for t in &mut c.targets {
            redact(&mut t.chap);
            redact(&mut t.mutual_chap);
            for lun in &mut t.luns {
                match lun {
                    LunConfig::Spec(text) => redact_spec(text),
                    LunConfig::Cached(cached) => redact_spec(&mut cached.remote),
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

    /// Whether any LUN is a cached one (a gateway's).
    pub fn has_cached_luns(&self) -> bool {
        self.targets.iter().flat_map(|t| &t.luns).any(|l| matches!(l, LunConfig::Cached(_)))
    }

    /// Checks every rule a running target relies on, and that every LUN can be read, without
    /// opening anything.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.listen.is_empty() {
            return Err(invalid("no listen address"));
        }
        self.listen_addrs()?;
        if self.targets.is_empty() {
            return Err(invalid("no [[target]]"));
        }
        self.limits.validate()?;
        if let Some(n) = self.rbd.connect_timeout_secs {
            if !(1..=stics_stack::MAX_RBD_TIMEOUT_SECS).contains(&n) {
                return Err(invalid(format!(
                    "rbd.connect_timeout_secs = {n} is outside 1..={}",
                    stics_stack::MAX_RBD_TIMEOUT_SECS
                )));
            }
        }
        self.discovery.validate()?;
        let mut logs = std::collections::HashMap::new();
        for t in &self.targets {
            check_target(&t.iqn, t.luns.len(), t.chap.as_ref(), t.mutual_chap.as_ref())?;
            for (i, lun) in t.luns.iter().enumerate() {
                match lun {
                    LunConfig::Spec(spec) => {
                        spec.parse::<DeviceSpec>()
                            .map_err(|e| invalid(format!("target {}: bad LUN spec: {e}", t.iqn)))?;
                    }
                    LunConfig::Cached(c) => {
                        c.typed().map_err(|e| invalid(format!("target {} LUN {i}: {e}", t.iqn)))?;
                        // Two caches on one log would be refused at open; say so before.
                        if let Some((other, j)) = logs.insert(c.log.clone(), (t.iqn.clone(), i)) {
                            return Err(invalid(format!(
                                "target {} LUN {i} and target {other} LUN {j} name the same log {}: each cached LUN \
                                 needs a log of its own",
                                t.iqn,
                                c.log.display()
                            )));
                        }
                    }
                }
            }
        }
        check_distinct(self.targets.iter().map(|t| t.iqn.as_str()))?;
        Ok(())
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::*;
    use std::path::Path;

    fn spec(text: &str) -> LunConfig {
        LunConfig::Spec(text.into())
    }

    #[test]
    fn a_shared_lun_takes_a_lease_and_refuses_write_through() {
        let lun = |shared, lease, mode: &str| CachedLunConfig {
            shared,
            lease_secs: lease,
            mode: Some(mode.into()),
            ..CachedLunConfig::new("iscsi://127.0.0.1/iqn.2024-01.org.example:sg/0", "/tmp/log")
        };
        let t = lun(true, Some(10), "log").typed().unwrap();
        assert_eq!(t.shared.map(|d| d.lease), Some(std::time::Duration::from_secs(10)));
        assert_eq!(t.quarantine_dir(), std::path::Path::new("/tmp/log.quarantine"));
        let on_a_disk = CachedLunConfig { log: "/dev/sdb".into(), ..lun(true, None, "log") };
        assert_eq!(on_a_disk.typed().unwrap().quarantine_dir(), std::path::Path::new("/var/lib/stics/sdb.quarantine"));
        assert!(lun(false, None, "log").typed().unwrap().shared.is_none());
        assert!(lun(true, None, "write-through").typed().unwrap_err().contains("unfenced"));
        assert!(lun(false, Some(10), "log").typed().unwrap_err().contains("shared"));
        assert!(lun(true, Some(0), "log").typed().unwrap_err().contains("lease_secs"));
        let bounded = CachedLunConfig { max_tokens: Some(4), ..lun(true, None, "log") };
        assert_eq!(bounded.typed().unwrap().shared.map(|d| d.max_tokens), Some(4));
        for (max, shared, says) in [(0, true, "outside"), (1 << 25, true, "outside"), (4, false, "shared")] {
            let bad = CachedLunConfig { max_tokens: Some(max), ..lun(shared, None, "log") };
            assert!(bad.typed().unwrap_err().contains(says), "max_tokens = {max}");
        }
        // Blocks with shared grants: on unless turned off, and only for a shared LUN.
        assert_eq!(t.shared.map(|d| d.grant_data), Some(true));
        let plain = CachedLunConfig { grant_data: Some(false), ..lun(true, None, "log") };
        assert_eq!(plain.typed().unwrap().shared.map(|d| d.grant_data), Some(false));
        let alone = CachedLunConfig { grant_data: Some(false), ..lun(false, None, "log") };
        assert!(alone.typed().unwrap_err().contains("grant_data"));
        let text = toml::to_string(&lun(true, None, "log")).unwrap();
        assert!(text.contains("shared = true"), "{text}");
        assert!(!toml::to_string(&lun(false, None, "log")).unwrap().contains("shared"));
    }

    #[test]
    fn default_config_serves_one_gib_memory_lun_on_3260() {
        let c = Config::default();
        c.validate().unwrap();
        assert_eq!(c.listen, vec!["127.0.0.1:3260"]);
        assert_eq!(c.targets[0].luns, vec![spec("mem:1GiB")]);
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
    fn a_tls_table_parses_prints_back_and_refuses_unknown_keys() {
        let base = "[[target]]\niqn = \"iqn.2024-01.org.example:a\"\nluns = [\"mem:1M\"]\n";
        let c =
            Config::from_toml(&format!("{base}[tls]\ncert = \"/c.pem\"\nkey = \"/k.pem\"\nclient_ca = \"/ca.pem\"\n"))
                .unwrap();
        let tls = c.tls.clone().unwrap();
        assert_eq!(
            (tls.cert.to_str(), tls.key.to_str(), tls.client_ca.as_deref()),
            (Some("/c.pem"), Some("/k.pem"), Some(Path::new("/ca.pem")))
        );
        assert_eq!(Config::from_toml(&c.to_toml_redacted()).unwrap().tls, c.tls);
        assert!(Config::from_toml(&format!("{base}[tls]\ncert = \"/c.pem\"\n")).is_err(), "a key is required");
        assert!(Config::from_toml(&format!("{base}[tls]\ncert = \"/c\"\nkey = \"/k\"\nca = \"/x\"\n")).is_err());
        let missing = c.tls.unwrap().acceptor().unwrap_err().to_string();
        assert!(missing.contains("/c.pem"), "{missing}");
    }

    #[test]
    fn lun_specs_carry_the_block_size_and_only_valid_ones_pass() {
        let toml = |luns: &str| format!("[[target]]\niqn = \"iqn.2024-01.org.example:a\"\nluns = [{luns}]\n");
        let c =
            Config::from_toml(&toml(r#""mem:1GiB:4096", "null:1G:1024", "file:/x.img:1GiB:2048", "mem:1M""#)).unwrap();
        let block_sizes: Vec<u32> = c.targets[0]
            .luns
            .iter()
            .map(|l| {
                let LunConfig::Spec(text) = l else { panic!("{l:?}") };
                match text.parse::<DeviceSpec>().unwrap() {
                    DeviceSpec::Mem { block_size, .. }
                    | DeviceSpec::Null { block_size, .. }
                    | DeviceSpec::File { block_size, .. } => block_size,
                    other => panic!("unexpected spec {other:?}"),
                }
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
        c.targets[0].luns.push(spec("iscsi://u%hush@10.0.0.2/iqn.2024-01.org.x:y/0"));
        c.targets[0].luns.push(spec("mem:64M"));
        c.targets[0].luns.push(LunConfig::Cached(CachedLunConfig::new(
            "iscsi://u%quiet@10.0.0.3/iqn.2024-01.org.x:z/0",
            "/var/lib/stics/z.log",
        )));
        c.validate().unwrap();
        let printed = c.to_toml_redacted();
        assert!(!printed.contains("hush") && !printed.contains("quiet"), "{printed}");
        assert!(printed.contains("\"iscsi://u%***@10.0.0.2:3260/iqn.2024-01.org.x:y/0\""), "{printed}");
        assert!(printed.contains("\"mem:64M\""), "{printed}");
        assert!(!format!("{c:?}").contains("hush"));
        // What is printed reads back as the same configuration, secrets aside.
        let again = Config::from_toml(&printed).unwrap();
        assert_eq!(again.targets[0].luns.len(), 4);
        assert!(matches!(&again.targets[0].luns[3], LunConfig::Cached(l) if l.log == c_log()));
    }

    fn c_log() -> PathBuf {
        PathBuf::from("/var/lib/stics/z.log")
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
            ("[[target]]\niqn=\"iqn.2024-01.a:b\"\nluns=[\"mem:1M\"]\n[[target]]\niqn=\"iqn.2024-01.a:B\"\nluns=[\"mem:1M\"]", "twice"),
        ];
        for (text, want) in bad {
            let e = Config::from_toml(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
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
            (
                "[discovery]\nmutual_chap = { user = \"u\", secret = \"s3cret-s3cret\" }",
                "discovery: mutual_chap needs chap",
            ),
            ("[discovery]\nchap = { user = \"u\", secret = \"s3cret-s3cret\" }\nusers = []", "unknown field"),
        ];
        for (text, want) in bad {
            let e = Config::from_toml(&format!("{text}{target}")).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn the_example_configurations_are_valid() {
        let c = Config::from_toml(include_str!("../../../../examples/target.toml")).unwrap();
        assert!(c.discovery.chap.is_some());
        assert_eq!(c.targets.len(), 2);
        assert!(!c.has_cached_luns());
        let g = Config::from_toml(include_str!("../../../../examples/gateway.toml")).unwrap();
        assert!(g.discovery.chap.is_some());
        let [t] = &g.targets[..] else { panic!("one target: {:?}", g.targets) };
        assert!(t.chap.is_some() && t.mutual_chap.is_some() && !t.initiators.is_empty());
        let logs: Vec<_> = t
            .luns
            .iter()
            .map(|l| match l {
                LunConfig::Cached(c) => c.typed().unwrap().log,
                LunConfig::Spec(_) => panic!("a gateway's LUNs are cached"),
            })
            .collect();
        assert_eq!(logs.len(), 2);
        assert_ne!(logs[0], logs[1], "each cached LUN has a log of its own");
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
    fn cached_luns_are_tables_with_the_caches_options() {
        let c = Config::from_toml(
            r#"
            [[target]]
            iqn = "iqn.2024-01.org.example:gw"
            [[target.luns]]
            remote = "iscsi://127.0.0.1:3261/iqn.2024-01.org.example:r/0"
            log = "/tmp/a.log"
            log_size = "256MiB"
            mode = "immediate"
            ram = "8MiB"
            read_cache = 0
            policy = "lru"
            full_timeout_secs = 5
            index_memory = 1048576
            log_disk = "as010a1"
            [[target.luns]]
            remote = "mem:64MiB"
            log = "/tmp/b.log"
            "#,
        )
        .unwrap();
        assert!(c.has_cached_luns());
        let LunConfig::Cached(a) = &c.targets[0].luns[0] else { panic!() };
        let a = a.typed().unwrap();
        assert_eq!(
            (a.log_size, a.cache.mode, a.cache.ram_bytes),
            (Some(256 << 20), stics_cache::Mode::Immediate, 8 << 20)
        );
        assert_eq!((a.cache.read_cache_bytes, a.cache.index_bytes), (0, 1 << 20));
        assert_eq!(a.cache.read_cache_policy, stics_cache::readcache::Policy::Lru);
        assert_eq!(a.cache.full_timeout, std::time::Duration::from_secs(5));
        assert_eq!(a.log_disk, Some(stics_disk::Preset::As010a1));
        let LunConfig::Cached(b) = &c.targets[0].luns[1] else { panic!() };
        let b_typed = b.typed().unwrap();
        assert_eq!((b_typed.log_size, b_typed.cache.mode, b_typed.log_disk), (None, stics_cache::Mode::Log, None));
        let floppy = CachedLunConfig { log_disk: Some("floppy".into()), ..b.clone() };
        let e = floppy.typed().unwrap_err();
        assert!(e.starts_with("log_disk:") && e.contains("floppy"), "{e}");
        // A spec and a table mix in one list.
        let mixed = "[[target]]\niqn=\"iqn.2024-01.a:b\"\nluns=[\"mem:1M\", { remote = \"mem:1M\", log = \"/tmp/c\" }]";
        assert_eq!(Config::from_toml(mixed).unwrap().targets[0].luns.len(), 2);
    }

    #[test]
    fn bad_cached_luns_are_refused_naming_the_lun_and_key() {
        let lun = |body: &str| format!("[[target]]\niqn=\"iqn.2024-01.a:b\"\n[[target.luns]]\n{body}\n");
        let bad = [
            ("remote = \"mem:1M\"", "missing field `log`"),
            ("remote = \"mem:1M\"\nlog = \"/l\"\nmode = \"fast\"", "LUN 0: mode: unknown mode"),
            ("remote = \"mem:1M\"\nlog = \"/l\"\nram = \"lots\"", "LUN 0: ram"),
            ("remote = \"mem:1M\"\nlog = \"/l\"\nram = 0", "ram: cannot read size \"0\": must be at least 1 bytes"),
            ("remote = \"mem:1M\"\nlog = \"/l\"\npolicy = \"fifo\"", "use lru or s3fifo"),
            ("remote = \"mem:1M\"\nlog = \"/l\"\nfull_timeout_secs = 0", "full_timeout_secs = 0"),
            ("remote = \"disk:1M\"\nlog = \"/l\"", "LUN 0: remote:"),
            ("remote = \"mem:1M\"\nlog = \"/l\"\nsize = 3", "unknown field `size`"),
            ("remote = \"mem:1M\"\nlog = \"/l\"\n[[target.luns]]\nremote = \"mem:1M\"\nlog = \"/l\"", "same log /l"),
        ];
        for (body, want) in bad {
            let e = Config::from_toml(&lun(body)).unwrap_err().to_string();
            assert!(e.contains(want), "{body:?}: {e}");
        }
    }
}

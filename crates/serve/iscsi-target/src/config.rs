//! The rules of what a target serves: limits, CHAP credentials, discovery's authentication and
//! target names, as typed values with the checks a running target relies on. Reading them from a
//! file is the composition layer's business (stics-service); they derive serde only so that a
//! file can carry them as they are.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The port iSCSI uses (RFC 7143 §13.5 registers 3260).
pub const DEFAULT_PORT: u16 = 3260;
/// The target name `stics target` serves when none is given.
pub const DEFAULT_IQN: &str = "iqn.2024-01.org.stics:target0";
/// Most LUNs one target may have (REPORT LUNS and the flat addressing method reach this far).
pub const MAX_LUNS: usize = 16384;

/// A configuration that cannot be used: the message says which rule it breaks.
#[derive(Debug, thiserror::Error)]
#[error("config: {0}")]
pub struct ConfigError(pub String);

fn invalid(msg: impl Into<String>) -> ConfigError {
    ConfigError(msg.into())
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

impl Limits {
    /// Checks every limit against the range a running target relies on.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let l = self;
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
        Ok(())
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
pub struct DiscoveryAuth {
    /// One-way CHAP: every discovery login must prove it knows this user's secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chap: Option<Credentials>,
    /// Mutual CHAP: what the target answers when a discovering initiator challenges it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutual_chap: Option<Credentials>,
}

impl DiscoveryAuth {
    /// True when discovery needs no authentication (nothing to print).
    pub fn is_open(&self) -> bool {
        self.chap.is_none() && self.mutual_chap.is_none()
    }
}

impl DiscoveryAuth {
    /// Checks the credentials as [`check_chap`] does a target's.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_chap("discovery", self.chap.as_ref(), self.mutual_chap.as_ref())
    }
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

/// The rules for one target that do not need its devices: an iSCSI name, one to [`MAX_LUNS`]
/// LUNs, CHAP credentials that can be used.
pub fn check_target(
    iqn: &str,
    luns: usize,
    chap: Option<&Credentials>,
    mutual_chap: Option<&Credentials>,
) -> Result<(), ConfigError> {
    if !valid_iscsi_name(iqn) {
        return Err(invalid(format!("target name {iqn:?} is not an iqn./eui./naa. name")));
    }
    if luns == 0 {
        return Err(invalid(format!("target {iqn} has no LUNs")));
    }
    if luns > MAX_LUNS {
        return Err(invalid(format!("target {iqn} has more than {MAX_LUNS} LUNs")));
    }
    check_chap(&format!("target {iqn}"), chap, mutual_chap)
}

/// Refuses a target name given twice (iSCSI names compare without case).
pub fn check_distinct<'a>(iqns: impl IntoIterator<Item = &'a str>) -> Result<(), ConfigError> {
    let mut seen = std::collections::HashSet::new();
    for iqn in iqns {
        if !seen.insert(iqn.to_ascii_lowercase()) {
            return Err(invalid(format!("target {iqn} is configured twice")));
        }
    }
    Ok(())
}

/// The rules for one pair of CHAP credentials (a target's or discovery's), named by `owner`.
pub fn check_chap(owner: &str, chap: Option<&Credentials>, mutual: Option<&Credentials>) -> Result<(), ConfigError> {
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

    fn cred(user: &str, secret: &str) -> Credentials {
        Credentials { user: user.into(), secret: secret.into() }
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
    fn default_limits_pass_and_each_range_names_its_limit() {
        Limits::default().validate().unwrap();
        let e = Limits { queue_depth: 0, ..Limits::default() }.validate().unwrap_err().to_string();
        assert!(e.contains("limits.queue_depth = 0"), "{e}");
        let e = Limits { target_output_buffer_bytes: 1 << 20, ..Limits::default() }.validate().unwrap_err();
        assert!(e.to_string().contains("limits.target_output_buffer_bytes"), "{e}");
    }

    #[test]
    fn a_target_needs_a_name_luns_and_usable_chap() {
        let iqn = "iqn.2024-01.a:b";
        check_target(iqn, 1, None, None).unwrap();
        let refused = [
            (check_target("foo", 1, None, None), "not an iqn"),
            (check_target(iqn, 0, None, None), "no LUNs"),
            (check_target(iqn, MAX_LUNS + 1, None, None), "more than 16384 LUNs"),
            (check_target(iqn, 1, None, Some(&cred("t", "secret-secret"))), "mutual_chap needs chap"),
            (check_target(iqn, 1, Some(&cred("u", "same-same-1")), Some(&cred("t", "same-same-1"))), "must differ"),
            (check_target(iqn, 1, Some(&cred("", "secret-secret")), None), "chap needs a user"),
            (check_target(iqn, 1, Some(&cred("u", &"x".repeat(256))), None), "longer than 255 bytes"),
        ];
        for (result, want) in refused {
            let e = result.unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
        let e = check_distinct(["iqn.2024-01.a:b", "iqn.2024-01.A:B"]).unwrap_err().to_string();
        assert!(e.contains("configured twice"), "{e}");
    }

    #[test]
    fn discovery_chap_is_checked_like_a_targets_and_secrets_never_print() {
        let d = DiscoveryAuth { chap: None, mutual_chap: Some(cred("portal", "hush-portal-2")) };
        let e = d.validate().unwrap_err().to_string();
        assert!(e.contains("discovery: mutual_chap needs chap"), "{e}");
        let d = DiscoveryAuth { chap: Some(cred("seeker", "hush-discovery-1")), ..d };
        d.validate().unwrap();
        assert!(!format!("{d:?}").contains("hush"));
    }
}

//! Login/Text keys (RFC 7143 §13): each key's kind, range and default, the responder's and
//! originator's negotiation rules, and the typed result of a negotiation ([`Params`]).

use std::fmt;

/// How a key's value is agreed (RFC 7143 §6.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Boolean, result is the AND of both values.
    And,
    /// Boolean, result is the OR of both values.
    Or,
    /// Number in `lo..=hi`, result is the smaller value.
    Min(u32, u32),
    /// Number in `lo..=hi`, result is the larger value.
    Max(u32, u32),
    /// Number in `lo..=hi` that each side declares for itself (MaxRecvDataSegmentLength).
    DeclaredNumber(u32, u32),
    /// A list of values in the originator's order of preference; the responder picks one.
    List,
    /// A string one side declares (names, aliases, addresses).
    Declared,
}

/// Whether a key is negotiated once per session or per connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Session,
    Connection,
}

/// One key of RFC 7143 §13 (and RFC 7144's iSCSIProtocolLevel).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyDef {
    pub name: &'static str,
    pub kind: Kind,
    pub scope: Scope,
    /// The value in force when the key is not negotiated.
    pub default: &'static str,
    /// Only negotiable in the leading login of a session (LO).
    pub leading_only: bool,
    /// Meaningful in Normal sessions only: answer `Irrelevant` in Discovery sessions.
    pub normal_only: bool,
}

const MAX24: u32 = 16_777_215;

macro_rules! key {
    ($name:expr, $kind:expr, $scope:ident, $default:expr, $lo:expr, $normal:expr) => {
        KeyDef {
            name: $name,
            kind: $kind,
            scope: Scope::$scope,
            default: $default,
            leading_only: $lo,
            normal_only: $normal,
        }
    };
}

/// Every key this codec understands.
pub static KEYS: &[KeyDef] = &[
    key!("HeaderDigest", Kind::List, Connection, "None", false, false),
    key!("DataDigest", Kind::List, Connection, "None", false, false),
    key!("MaxConnections", Kind::Min(1, 65535), Session, "1", true, true),
    key!("SendTargets", Kind::Declared, Session, "", false, false),
    key!("TargetName", Kind::Declared, Session, "", true, false),
    key!("InitiatorName", Kind::Declared, Session, "", true, false),
    key!("TargetAlias", Kind::Declared, Session, "", true, false),
    key!("InitiatorAlias", Kind::Declared, Session, "", true, false),
    key!("TargetAddress", Kind::Declared, Session, "", false, false),
    key!("TargetPortalGroupTag", Kind::Declared, Session, "", true, false),
    key!("InitialR2T", Kind::Or, Session, "Yes", true, true),
    key!("ImmediateData", Kind::And, Session, "Yes", true, true),
    key!("MaxRecvDataSegmentLength", Kind::DeclaredNumber(512, MAX24), Connection, "8192", false, false),
    key!("MaxBurstLength", Kind::Min(512, MAX24), Session, "262144", true, true),
    key!("FirstBurstLength", Kind::Min(512, MAX24), Session, "65536", true, true),
    key!("DefaultTime2Wait", Kind::Max(0, 3600), Session, "2", true, false),
    key!("DefaultTime2Retain", Kind::Min(0, 3600), Session, "20", true, false),
    key!("MaxOutstandingR2T", Kind::Min(1, 65535), Session, "1", true, true),
    key!("DataPDUInOrder", Kind::Or, Session, "Yes", true, true),
    key!("DataSequenceInOrder", Kind::Or, Session, "Yes", true, true),
    key!("ErrorRecoveryLevel", Kind::Min(0, 2), Session, "0", true, false),
    key!("SessionType", Kind::Declared, Session, "Normal", true, false),
    key!("AuthMethod", Kind::List, Connection, "None", false, false),
    key!("OFMarker", Kind::And, Connection, "No", false, false),
    key!("IFMarker", Kind::And, Connection, "No", false, false),
    key!("OFMarkInt", Kind::Min(1, 65535), Connection, "2048", false, false),
    key!("IFMarkInt", Kind::Min(1, 65535), Connection, "2048", false, false),
    key!("iSCSIProtocolLevel", Kind::Min(0, 31), Session, "0", true, false),
    key!("TaskReporting", Kind::List, Session, "RFC3720", true, true),
];

/// Finds a key by name (names are case-sensitive, RFC 7143 §6.1).
pub fn lookup(name: &str) -> Option<&'static KeyDef> {
    KEYS.iter().find(|k| k.name == name)
}

/// Special values of RFC 7143 §6.2.
pub const NOT_UNDERSTOOD: &str = "NotUnderstood";
pub const IRRELEVANT: &str = "Irrelevant";
pub const REJECT: &str = "Reject";

/// A value that breaks a key's rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Not a number, or outside the key's range.
    #[error("{key}={value}: outside {lo}..={hi} or not a number")]
    Range { key: &'static str, value: String, lo: u32, hi: u32 },
    /// Not `Yes` or `No`.
    #[error("{key}={value}: expected Yes or No")]
    NotBool { key: &'static str, value: String },
    /// A response the originator did not allow (e.g. a larger value for a Min key).
    #[error("{key}: answer {value} does not follow the negotiation rule for an offer of {offered}")]
    BadAnswer { key: &'static str, offered: String, value: String },
    /// No acceptable value in common.
    #[error("{key}: no value in common with {value}")]
    NoCommonValue { key: &'static str, value: String },
}

fn parse_bool(def: &KeyDef, v: &str) -> Result<bool, KeyError> {
    match v {
        "Yes" => Ok(true),
        "No" => Ok(false),
        _ => Err(KeyError::NotBool { key: def.name, value: v.to_owned() }),
    }
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "Yes"
    } else {
        "No"
    }
}

fn parse_num(def: &KeyDef, v: &str, lo: u32, hi: u32) -> Result<u32, KeyError> {
    let err = || KeyError::Range { key: def.name, value: v.to_owned(), lo, hi };
    // RFC 7143 §6.1 allows hex (0x) numbers too.
    let n = if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).map_err(|_| err())?
    } else {
        if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err());
        }
        v.parse::<u64>().map_err(|_| err())?
    };
    if n < u64::from(lo) || n > u64::from(hi) {
        return Err(err());
    }
    Ok(n as u32)
}

/// The responder's answer to `offered`, given what this side supports or prefers (`own`; for
/// lists, a comma-separated list of acceptable values). An offer that breaks the key's rules is
/// an error; the caller answers `Reject` or fails the login.
pub fn respond(def: &KeyDef, offered: &str, own: &str) -> Result<String, KeyError> {
    Ok(match def.kind {
        Kind::And => yes_no(parse_bool(def, offered)? && parse_bool(def, own)?).to_owned(),
        Kind::Or => yes_no(parse_bool(def, offered)? || parse_bool(def, own)?).to_owned(),
        Kind::Min(lo, hi) => parse_num(def, offered, lo, hi)?.min(parse_num(def, own, lo, hi)?).to_string(),
        Kind::Max(lo, hi) => parse_num(def, offered, lo, hi)?.max(parse_num(def, own, lo, hi)?).to_string(),
        Kind::DeclaredNumber(lo, hi) => {
            parse_num(def, offered, lo, hi)?;
            own.to_owned()
        }
        Kind::List => {
            let ours: Vec<&str> = own.split(',').collect();
            match offered.split(',').find(|v| ours.contains(v)) {
                Some(v) => v.to_owned(),
                None => REJECT.to_owned(),
            }
        }
        Kind::Declared => own.to_owned(),
    })
}

/// The originator's view: given what it `offered` and the `answer`, the value now in force.
pub fn resolve(def: &KeyDef, offered: &str, answer: &str) -> Result<String, KeyError> {
    let bad = || KeyError::BadAnswer { key: def.name, offered: offered.to_owned(), value: answer.to_owned() };
    Ok(match def.kind {
        Kind::And => {
            let (o, a) = (parse_bool(def, offered)?, parse_bool(def, answer)?);
            if a && !o {
                return Err(bad());
            }
            yes_no(a).to_owned()
        }
        Kind::Or => {
            let (o, a) = (parse_bool(def, offered)?, parse_bool(def, answer)?);
            if o && !a {
                return Err(bad());
            }
            yes_no(a).to_owned()
        }
        Kind::Min(lo, hi) => {
            let (o, a) = (parse_num(def, offered, lo, hi)?, parse_num(def, answer, lo, hi)?);
            if a > o {
                return Err(bad());
            }
            a.to_string()
        }
        Kind::Max(lo, hi) => {
            let (o, a) = (parse_num(def, offered, lo, hi)?, parse_num(def, answer, lo, hi)?);
            if a < o {
                return Err(bad());
            }
            a.to_string()
        }
        Kind::DeclaredNumber(lo, hi) => parse_num(def, answer, lo, hi)?.to_string(),
        Kind::List => {
            if answer == REJECT || !offered.split(',').any(|v| v == answer) {
                return Err(KeyError::NoCommonValue { key: def.name, value: offered.to_owned() });
            }
            answer.to_owned()
        }
        Kind::Declared => answer.to_owned(),
    })
}

/// Whether a session is a discovery or a normal session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionType {
    Discovery,
    #[default]
    Normal,
}

/// The operational parameters in force on a connection of a session, as typed values.
/// `Default` gives RFC 7143's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Params {
    pub session_type: SessionType,
    pub header_digest: bool,
    pub data_digest: bool,
    pub max_connections: u32,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    /// Largest data segment this side may receive (it declared this).
    pub max_recv_data_segment_length: u32,
    /// Largest data segment this side may send (the peer declared this).
    pub max_xmit_data_segment_length: u32,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub default_time2wait: u32,
    pub default_time2retain: u32,
    pub max_outstanding_r2t: u32,
    pub data_pdu_in_order: bool,
    pub data_sequence_in_order: bool,
    pub error_recovery_level: u32,
    pub protocol_level: u32,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            session_type: SessionType::Normal,
            header_digest: false,
            data_digest: false,
            max_connections: 1,
            initial_r2t: true,
            immediate_data: true,
            max_recv_data_segment_length: 8192,
            max_xmit_data_segment_length: 8192,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            default_time2wait: 2,
            default_time2retain: 20,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
            protocol_level: 0,
        }
    }
}

impl Params {
    /// Records the value now in force for `key`. `declared_by_peer` matters only for
    /// MaxRecvDataSegmentLength: the peer's declaration bounds what this side sends.
    /// Unknown and declarative string keys are ignored here; their callers keep them.
    pub fn apply(&mut self, key: &str, value: &str, declared_by_peer: bool) -> Result<(), KeyError> {
        let Some(def) = lookup(key) else { return Ok(()) };
        let num = |lo, hi| parse_num(def, value, lo, hi);
        match key {
            "HeaderDigest" => self.header_digest = value == "CRC32C",
            "DataDigest" => self.data_digest = value == "CRC32C",
            "MaxConnections" => self.max_connections = num(1, 65535)?,
            "InitialR2T" => self.initial_r2t = parse_bool(def, value)?,
            "ImmediateData" => self.immediate_data = parse_bool(def, value)?,
            "MaxRecvDataSegmentLength" => {
                let v = num(512, MAX24)?;
                if declared_by_peer {
                    self.max_xmit_data_segment_length = v;
                } else {
                    self.max_recv_data_segment_length = v;
                }
            }
            "MaxBurstLength" => self.max_burst_length = num(512, MAX24)?,
            "FirstBurstLength" => self.first_burst_length = num(512, MAX24)?,
            "DefaultTime2Wait" => self.default_time2wait = num(0, 3600)?,
            "DefaultTime2Retain" => self.default_time2retain = num(0, 3600)?,
            "MaxOutstandingR2T" => self.max_outstanding_r2t = num(1, 65535)?,
            "DataPDUInOrder" => self.data_pdu_in_order = parse_bool(def, value)?,
            "DataSequenceInOrder" => self.data_sequence_in_order = parse_bool(def, value)?,
            "ErrorRecoveryLevel" => self.error_recovery_level = num(0, 2)?,
            "iSCSIProtocolLevel" => self.protocol_level = num(0, 31)?,
            "SessionType" => {
                self.session_type = match value {
                    "Discovery" => SessionType::Discovery,
                    "Normal" => SessionType::Normal,
                    _ => return Err(KeyError::NoCommonValue { key: def.name, value: value.to_owned() }),
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// RFC 7143 §13.14: FirstBurstLength never exceeds MaxBurstLength. Call once negotiation ends.
    pub fn finish(&mut self) {
        self.first_burst_length = self.first_burst_length.min(self.max_burst_length);
    }
}

impl fmt::Display for SessionType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SessionType::Discovery => "Discovery",
            SessionType::Normal => "Normal",
        })
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    fn k(name: &str) -> &'static KeyDef {
        lookup(name).unwrap()
    }

    #[test]
    fn responder_takes_minimum_for_max_burst_length() {
        assert_eq!(respond(k("MaxBurstLength"), "1048576", "262144").unwrap(), "262144");
        assert_eq!(respond(k("MaxBurstLength"), "4096", "262144").unwrap(), "4096");
        assert!(respond(k("MaxBurstLength"), "100", "262144").is_err());
        assert!(respond(k("MaxBurstLength"), "16777216", "262144").is_err());
        assert!(respond(k("MaxBurstLength"), "-1", "262144").is_err());
        assert_eq!(respond(k("MaxBurstLength"), "0x1000", "262144").unwrap(), "4096");
    }

    #[test]
    fn boolean_and_or_rules() {
        assert_eq!(respond(k("ImmediateData"), "Yes", "No").unwrap(), "No");
        assert_eq!(respond(k("InitialR2T"), "No", "No").unwrap(), "No");
        assert_eq!(respond(k("InitialR2T"), "No", "Yes").unwrap(), "Yes");
        assert!(respond(k("InitialR2T"), "maybe", "Yes").is_err());
        assert!(resolve(k("ImmediateData"), "No", "Yes").is_err());
        assert!(resolve(k("InitialR2T"), "Yes", "No").is_err());
    }

    #[test]
    fn default_time2wait_takes_maximum() {
        assert_eq!(respond(k("DefaultTime2Wait"), "1", "2").unwrap(), "2");
        assert!(resolve(k("DefaultTime2Wait"), "5", "2").is_err());
    }

    #[test]
    fn list_picks_first_supported_in_offer_order() {
        assert_eq!(respond(k("HeaderDigest"), "CRC32C,None", "None,CRC32C").unwrap(), "CRC32C");
        assert_eq!(respond(k("HeaderDigest"), "None,CRC32C", "None,CRC32C").unwrap(), "None");
        assert_eq!(respond(k("AuthMethod"), "SRP,KRB5", "CHAP,None").unwrap(), "Reject");
        assert_eq!(resolve(k("AuthMethod"), "CHAP,None", "CHAP").unwrap(), "CHAP");
        assert!(resolve(k("AuthMethod"), "None", "CHAP").is_err());
    }

    #[test]
    fn params_apply_declarations_by_side() {
        let mut p = Params::default();
        p.apply("MaxRecvDataSegmentLength", "262144", true).unwrap();
        p.apply("MaxRecvDataSegmentLength", "65536", false).unwrap();
        assert_eq!((p.max_xmit_data_segment_length, p.max_recv_data_segment_length), (262144, 65536));
        p.apply("FirstBurstLength", "1048576", false).unwrap();
        p.apply("MaxBurstLength", "262144", false).unwrap();
        p.finish();
        assert_eq!(p.first_burst_length, 262144);
        p.apply("X-com.example.Foo", "bar", true).unwrap();
    }

    #[test]
    fn every_default_is_valid_for_its_kind() {
        for def in KEYS {
            if matches!(def.kind, Kind::Min(..) | Kind::Max(..) | Kind::DeclaredNumber(..) | Kind::And | Kind::Or) {
                respond(def, def.default, def.default).unwrap();
            }
        }
    }
}

//! The initiator's login state machine (RFC 7143 §6, §12.1.3): security stage with CHAP
//! (one-way or mutual), then operational negotiation. Pure: it takes Login Responses and returns
//! the next Login Request or the negotiated result; the caller owns the socket.

#![deny(clippy::unwrap_used, clippy::indexing_slicing)]

use bytes::Bytes;
use stics_wire::keys::{self, Kind, Params, SessionType};
use stics_wire::{chap, stage, text, Header, LoginRequest, LoginResponse, Pdu};

use crate::url::Chap;

/// What this initiator offers in operational negotiation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    pub header_digest: bool,
    pub data_digest: bool,
    pub max_recv_data_segment_length: u32,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub max_outstanding_r2t: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    /// Private keys (`X-…`, RFC 7143 §13) offered on normal sessions; the target's answers come
    /// back in [`Outcome::private`].
    pub private: Vec<(String, String)>,
}

impl Default for Offer {
    /// Large bursts, immediate and unsolicited data: fewest round trips per write (seed 000).
    fn default() -> Self {
        Offer {
            header_digest: false,
            data_digest: false,
            max_recv_data_segment_length: 262_144,
            max_burst_length: 1_048_576,
            first_burst_length: 262_144,
            max_outstanding_r2t: 8,
            immediate_data: true,
            initial_r2t: false,
            private: Vec::new(),
        }
    }
}

/// Everything the login needs to know.
#[derive(Debug, Clone)]
pub struct LoginConfig {
    pub initiator_name: String,
    /// The target to log in to; `None` for a discovery session.
    pub target_name: Option<String>,
    pub isid: [u8; 6],
    /// 0 for a new session (or to reinstate one with the same ISID).
    pub tsih: u16,
    pub cid: u16,
    pub itt: u32,
    pub cmd_sn: u32,
    pub chap: Option<Chap>,
    /// Identifier and challenge this side sends for mutual CHAP (the caller draws them at random).
    pub mutual_challenge: (u8, [u8; 16]),
    pub offer: Offer,
}

/// The result of a successful login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub params: Params,
    pub tsih: u16,
    /// StatSN expected next on this connection.
    pub exp_stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub target_alias: Option<String>,
    pub target_portal_group_tag: Option<String>,
    /// The target's answers to the private keys offered, where it understood them.
    pub private: Vec<(String, String)>,
}

/// What to do after a Login Response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Send this Login Request and wait for the next response.
    Send(Pdu),
    /// Full-feature phase reached.
    Done(Outcome),
}

/// Why a login failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoginError {
    /// The target refused our credentials, or demanded ones we lack. Retrying will not help.
    #[error("authentication failed: {0}")]
    Auth(String),
    /// The target answered with a non-zero status class.
    #[error("login refused by target: {reason} (status {class:#04x}/{detail:#04x})")]
    Refused { class: u8, detail: u8, reason: &'static str },
    /// The target broke the login rules.
    #[error("login protocol error: {0}")]
    Protocol(String),
}

impl LoginError {
    /// True when trying again later cannot succeed (bad credentials, unknown target).
    pub fn is_permanent(&self) -> bool {
        match self {
            LoginError::Auth(_) | LoginError::Protocol(_) => true,
            // Class 3 (target error) and "target removed" may clear up; class 2 otherwise will not.
            LoginError::Refused { class, detail, .. } => *class == 2 && *detail != 0x04,
        }
    }

    /// True when reinstating a session the target accepted before cannot succeed by trying
    /// again. A target that restarts opens its portal before it has made its targets and their
    /// access lists again (tgtd, then `tgtadm` or `tgt-admin`), so "target not found" and
    /// "authorization failure" from it are retried within the recovery window; bad credentials
    /// and broken logins still end the recovery at once.
    pub fn is_permanent_on_reinstatement(&self) -> bool {
        match self {
            LoginError::Refused { class: 2, detail: 0x02 | 0x03, .. } => false,
            e => e.is_permanent(),
        }
    }
}

fn status_reason(class: u8, detail: u8) -> &'static str {
    match (class, detail) {
        (1, _) => "target moved (redirection is not supported)",
        (2, 0x01) => "authentication failure",
        (2, 0x02) => "authorization failure",
        (2, 0x03) => "target not found",
        (2, 0x04) => "target removed",
        (2, 0x05) => "unsupported version",
        (2, 0x06) => "too many connections",
        (2, 0x07) => "missing parameter",
        (2, 0x08) => "cannot include connection in session",
        (2, 0x09) => "session type not supported",
        (2, 0x0a) => "session does not exist",
        (2, 0x0b) => "invalid request during login",
        (2, _) => "initiator error",
        (3, 0x01) => "service unavailable",
        (3, 0x02) => "out of resources",
        (3, _) => "target error",
        _ => "unknown status",
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Sent AuthMethod; waiting for the target's choice.
    AuthMethod,
    /// Sent CHAP_A; waiting for CHAP_I and CHAP_C.
    ChapAlgorithm,
    /// Sent CHAP_N/CHAP_R (and our challenge); waiting for the target to move on.
    ChapResponse,
    /// Sent operational keys; waiting for answers and the move to full feature.
    Operational,
    Done,
}

/// The login of one connection.
#[derive(Debug)]
pub struct Login {
    cfg: LoginConfig,
    state: State,
    params: Params,
    /// Operational keys offered and not yet answered.
    offered: Vec<(String, String)>,
    exp_stat_sn: u32,
    tsih: u16,
    /// Text of a response still coming in pieces (C bit).
    partial: Vec<u8>,
    target_alias: Option<String>,
    tpgt: Option<String>,
    mutual_verified: bool,
    private: Vec<(String, String)>,
}

impl Login {
    /// Starts a login; returns the machine and the first Login Request.
    pub fn start(cfg: LoginConfig) -> (Login, Pdu) {
        let mut params = Params::default();
        if cfg.target_name.is_none() {
            params.session_type = SessionType::Discovery;
        }
        let login = Login {
            state: State::AuthMethod,
            params,
            offered: Vec::new(),
            exp_stat_sn: 0,
            tsih: cfg.tsih,
            partial: Vec::new(),
            target_alias: None,
            tpgt: None,
            mutual_verified: false,
            private: Vec::new(),
            cfg,
        };
        let mut keys = vec![("InitiatorName".to_owned(), login.cfg.initiator_name.clone())];
        match &login.cfg.target_name {
            Some(t) => {
                keys.push(("SessionType".into(), "Normal".into()));
                keys.push(("TargetName".into(), t.clone()));
            }
            None => keys.push(("SessionType".into(), "Discovery".into())),
        }
        let with_chap = login.cfg.chap.is_some();
        keys.push(("AuthMethod".into(), if with_chap { "CHAP,None" } else { "None" }.into()));
        let pdu = login.request(stage::SECURITY, stage::OPERATIONAL, !with_chap, &keys);
        (login, pdu)
    }

    fn request(&self, csg: u8, nsg: u8, transit: bool, keys: &[(String, String)]) -> Pdu {
        let h = LoginRequest {
            transit,
            cont: false,
            csg,
            nsg: if transit { nsg } else { 0 },
            version_max: 0,
            version_min: 0,
            isid: self.cfg.isid,
            tsih: self.tsih,
            itt: self.cfg.itt,
            cid: self.cfg.cid,
            cmd_sn: self.cfg.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        };
        Pdu::new(h, if keys.is_empty() { Bytes::new() } else { text::encode(keys) })
    }

    fn operational_offers(&self) -> Vec<(String, String)> {
        let o = &self.cfg.offer;
        let digest = |on: bool| if on { "CRC32C" } else { "None" }.to_owned();
        let yn = |b: bool| if b { "Yes" } else { "No" }.to_owned();
        let mut keys = vec![
            ("HeaderDigest".to_owned(), digest(o.header_digest)),
            ("DataDigest".to_owned(), digest(o.data_digest)),
            ("MaxRecvDataSegmentLength".to_owned(), o.max_recv_data_segment_length.to_string()),
        ];
        if self.cfg.target_name.is_some() {
            keys.extend([
                ("MaxConnections".to_owned(), "1".to_owned()),
                ("InitialR2T".to_owned(), yn(o.initial_r2t)),
                ("ImmediateData".to_owned(), yn(o.immediate_data)),
                ("MaxBurstLength".to_owned(), o.max_burst_length.to_string()),
                ("FirstBurstLength".to_owned(), o.first_burst_length.to_string()),
                ("MaxOutstandingR2T".to_owned(), o.max_outstanding_r2t.to_string()),
                ("DataPDUInOrder".to_owned(), "Yes".to_owned()),
                ("DataSequenceInOrder".to_owned(), "Yes".to_owned()),
                ("ErrorRecoveryLevel".to_owned(), "0".to_owned()),
                ("DefaultTime2Wait".to_owned(), "0".to_owned()),
                ("DefaultTime2Retain".to_owned(), "0".to_owned()),
            ]);
            keys.extend(o.private.iter().cloned());
        }
        keys.extend([("IFMarker".to_owned(), "No".to_owned()), ("OFMarker".to_owned(), "No".to_owned())]);
        keys
    }

    fn enter_operational(&mut self) -> Result<Step, LoginError> {
        self.state = State::Operational;
        let keys = self.operational_offers();
        let declared = self.cfg.offer.max_recv_data_segment_length.to_string();
        self.params
            .apply("MaxRecvDataSegmentLength", &declared, false)
            .map_err(|e| LoginError::Protocol(e.to_string()))?;
        self.offered.clone_from(&keys);
        Ok(Step::Send(self.request(stage::OPERATIONAL, stage::FULL_FEATURE, true, &keys)))
    }

    /// Feeds one response PDU.
    pub fn step(&mut self, pdu: &Pdu) -> Result<Step, LoginError> {
        let Header::LoginResponse(r) = pdu.header else {
            return Err(LoginError::Protocol(format!("expected a Login Response, got {:?}", pdu.header.opcode())));
        };
        if r.status_class != 0 {
            let reason = status_reason(r.status_class, r.status_detail);
            if (r.status_class, r.status_detail) == (2, 1) {
                return Err(LoginError::Auth(format!("target rejected the credentials ({reason})")));
            }
            return Err(LoginError::Refused { class: r.status_class, detail: r.status_detail, reason });
        }
        if r.itt != self.cfg.itt {
            return Err(LoginError::Protocol("Login Response for another task tag".into()));
        }
        self.exp_stat_sn = r.stat_sn.wrapping_add(1);
        if r.tsih != 0 {
            self.tsih = r.tsih;
        }
        self.partial.extend_from_slice(&pdu.data);
        if r.cont {
            // More text follows: ask for it with an empty request in the same stage.
            let csg = if self.state == State::Operational { stage::OPERATIONAL } else { stage::SECURITY };
            return Ok(Step::Send(self.request(csg, 0, false, &[])));
        }
        let data = std::mem::take(&mut self.partial);
        let pairs = text::parse(&data).map_err(|e| LoginError::Protocol(e.to_string()))?;
        for (k, v) in &pairs {
            match k.as_str() {
                "TargetAlias" => self.target_alias = Some(v.clone()),
                "TargetPortalGroupTag" => self.tpgt = Some(v.clone()),
                _ => {}
            }
        }
        let get = |name: &str| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        match self.state {
            State::AuthMethod => {
                if r.csg != stage::SECURITY {
                    return Err(LoginError::Protocol("target left the security stage out of turn".into()));
                }
                match get("AuthMethod") {
                    Some("CHAP") if self.cfg.chap.is_some() => {
                        self.state = State::ChapAlgorithm;
                        let keys = vec![("CHAP_A".to_owned(), chap::ALGORITHM_MD5.to_owned())];
                        Ok(Step::Send(self.request(stage::SECURITY, 0, false, &keys)))
                    }
                    Some("None") | None => {
                        if self.cfg.chap.as_ref().is_some_and(|c| c.mutual.is_some()) {
                            return Err(LoginError::Auth(
                                "target would not authenticate itself (mutual CHAP asked)".into(),
                            ));
                        }
                        if r.transit && r.nsg == stage::OPERATIONAL {
                            self.enter_operational()
                        } else {
                            // The target wants another exchange before moving on.
                            Ok(Step::Send(self.request(stage::SECURITY, stage::OPERATIONAL, true, &[])))
                        }
                    }
                    Some("Reject" | _) if self.cfg.chap.is_none() => {
                        Err(LoginError::Auth("target requires authentication; give user%secret@ in the URL".into()))
                    }
                    Some(other) => Err(LoginError::Auth(format!("target chose authentication method {other:?}"))),
                }
            }
            State::ChapAlgorithm => {
                let chap_cfg = self
                    .cfg
                    .chap
                    .clone()
                    .ok_or_else(|| LoginError::Protocol("CHAP state without credentials".into()))?;
                if get("CHAP_A") != Some(chap::ALGORITHM_MD5) {
                    return Err(LoginError::Auth("target did not accept CHAP with MD5".into()));
                }
                let id = get("CHAP_I").ok_or_else(|| LoginError::Protocol("CHAP_I missing".into()))?;
                let id = chap::parse_identifier(id).map_err(|e| LoginError::Protocol(e.to_string()))?;
                let challenge = get("CHAP_C").ok_or_else(|| LoginError::Protocol("CHAP_C missing".into()))?;
                let challenge = chap::decode_binary(challenge).map_err(|e| LoginError::Protocol(e.to_string()))?;
                let resp = chap::response(id, chap_cfg.secret.as_bytes(), &challenge);
                let mut keys =
                    vec![("CHAP_N".to_owned(), chap_cfg.user.clone()), ("CHAP_R".to_owned(), chap::encode_hex(&resp))];
                if chap_cfg.mutual.is_some() {
                    let (mid, mc) = self.cfg.mutual_challenge;
                    keys.push(("CHAP_I".to_owned(), mid.to_string()));
                    keys.push(("CHAP_C".to_owned(), chap::encode_hex(&mc)));
                }
                self.state = State::ChapResponse;
                Ok(Step::Send(self.request(stage::SECURITY, stage::OPERATIONAL, true, &keys)))
            }
            State::ChapResponse => {
                if let Some(c) = &self.cfg.chap {
                    if let Some((tuser, tsecret)) = &c.mutual {
                        if !self.mutual_verified {
                            let (Some(n), Some(rr)) = (get("CHAP_N"), get("CHAP_R")) else {
                                return Err(LoginError::Auth("target did not answer our CHAP challenge".into()));
                            };
                            let rr = chap::decode_binary(rr).map_err(|e| LoginError::Auth(e.to_string()))?;
                            let (mid, mc) = self.cfg.mutual_challenge;
                            if n != tuser || !chap::verify(mid, tsecret.as_bytes(), &mc, &rr) {
                                return Err(LoginError::Auth(
                                    "target failed mutual CHAP (wrong name or secret)".into(),
                                ));
                            }
                            self.mutual_verified = true;
                        }
                    }
                }
                if r.transit && r.nsg == stage::OPERATIONAL {
                    self.enter_operational()
                } else if r.transit && r.nsg == stage::FULL_FEATURE {
                    self.finish(&r)
                } else {
                    Ok(Step::Send(self.request(stage::SECURITY, stage::OPERATIONAL, true, &[])))
                }
            }
            State::Operational => {
                let mut reply = Vec::new();
                for (k, v) in &pairs {
                    self.absorb(k, v, &mut reply)?;
                }
                if r.transit && r.nsg == stage::FULL_FEATURE && reply.is_empty() {
                    self.finish(&r)
                } else {
                    Ok(Step::Send(self.request(stage::OPERATIONAL, stage::FULL_FEATURE, true, &reply)))
                }
            }
            State::Done => Err(LoginError::Protocol("Login Response after the login ended".into())),
        }
    }

    /// Takes one key of an operational response: an answer to our offer, a declaration, or the
    /// target's own offer (which gets an answer in `reply`).
    fn absorb(&mut self, k: &str, v: &str, reply: &mut Vec<(String, String)>) -> Result<(), LoginError> {
        let perr = |e: keys::KeyError| LoginError::Protocol(e.to_string());
        let Some(def) = keys::lookup(k) else {
            if let Some(pos) = self.offered.iter().position(|(o, _)| o == k) {
                self.offered.remove(pos);
                if ![keys::NOT_UNDERSTOOD, keys::IRRELEVANT, keys::REJECT].contains(&v) {
                    self.private.push((k.to_owned(), v.to_owned()));
                }
                return Ok(());
            }
            if !k.starts_with("X-") && !k.starts_with("X#") {
                reply.push((k.to_owned(), keys::NOT_UNDERSTOOD.to_owned()));
            }
            return Ok(());
        };
        if matches!(def.kind, Kind::Declared) {
            return Ok(());
        }
        if k == "MaxRecvDataSegmentLength" {
            return self.params.apply(k, v, true).map_err(perr);
        }
        if let Some(pos) = self.offered.iter().position(|(o, _)| o == k) {
            let (_, offered) = self.offered.remove(pos);
            if v == keys::NOT_UNDERSTOOD || v == keys::IRRELEVANT {
                return Ok(());
            }
            let value = keys::resolve(def, &offered, v).map_err(perr)?;
            return self.params.apply(k, &value, false).map_err(perr);
        }
        // The target offers a key we did not: answer with our defaults.
        let own = def.default;
        let answer = keys::respond(def, v, own).map_err(perr)?;
        self.params.apply(k, &answer, false).map_err(perr)?;
        reply.push((k.to_owned(), answer));
        Ok(())
    }

    #[expect(clippy::unnecessary_wraps, reason = "every login step answers Result<Step, LoginError>")]
    fn finish(&mut self, r: &LoginResponse) -> Result<Step, LoginError> {
        self.state = State::Done;
        let mut params = self.params.clone();
        params.finish();
        Ok(Step::Done(Outcome {
            params,
            tsih: self.tsih,
            exp_stat_sn: self.exp_stat_sn,
            exp_cmd_sn: r.exp_cmd_sn,
            max_cmd_sn: r.max_cmd_sn,
            target_alias: self.target_alias.clone(),
            target_portal_group_tag: self.tpgt.clone(),
            private: self.private.clone(),
        }))
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    fn cfg(chap: Option<Chap>) -> LoginConfig {
        LoginConfig {
            initiator_name: "iqn.2024-01.test:init".into(),
            target_name: Some("iqn.2024-01.test:tgt".into()),
            isid: [0x80, 0, 0, 0, 0, 1],
            tsih: 0,
            cid: 0,
            itt: 7,
            cmd_sn: 1,
            chap,
            mutual_challenge: (9, [0x5a; 16]),
            offer: Offer::default(),
        }
    }

    fn resp(transit: bool, csg: u8, nsg: u8, keys: &[(&str, &str)]) -> Pdu {
        let h = LoginResponse {
            transit,
            csg,
            nsg,
            itt: 7,
            tsih: 0x11,
            stat_sn: 100,
            exp_cmd_sn: 1,
            max_cmd_sn: 32,
            ..Default::default()
        };
        Pdu::new(h, text::encode(keys))
    }

    fn keys_of(p: &Pdu) -> Vec<(String, String)> {
        text::parse(&p.data).unwrap()
    }

    fn key<'a>(k: &'a [(String, String)], name: &str) -> Option<&'a str> {
        k.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    #[test]
    fn login_without_auth_negotiates_smaller_of_both_limits() {
        let (mut l, first) = Login::start(cfg(None));
        let Header::LoginRequest(h) = first.header else { panic!() };
        assert!(h.transit && h.csg == 0 && h.nsg == 1);
        assert_eq!(key(&keys_of(&first), "AuthMethod"), Some("None"));
        let Step::Send(op) =
            l.step(&resp(true, 0, 1, &[("AuthMethod", "None"), ("TargetPortalGroupTag", "1")])).unwrap()
        else {
            panic!()
        };
        let Header::LoginRequest(h) = op.header else { panic!() };
        assert_eq!((h.csg, h.nsg, h.transit, h.exp_stat_sn, h.tsih), (1, 3, true, 101, 0x11));
        let answers = [
            ("HeaderDigest", "None"),
            ("DataDigest", "None"),
            ("MaxRecvDataSegmentLength", "8192"),
            ("MaxConnections", "1"),
            ("InitialR2T", "Yes"),
            ("ImmediateData", "Yes"),
            ("MaxBurstLength", "262144"),
            ("FirstBurstLength", "65536"),
            ("MaxOutstandingR2T", "1"),
            ("DataPDUInOrder", "Yes"),
            ("DataSequenceInOrder", "Yes"),
            ("ErrorRecoveryLevel", "0"),
            ("DefaultTime2Wait", "2"),
            ("DefaultTime2Retain", "0"),
            ("IFMarker", "No"),
            ("OFMarker", "No"),
        ];
        let Step::Done(o) = l.step(&resp(true, 1, 3, &answers)).unwrap() else { panic!() };
        assert_eq!(o.params.max_xmit_data_segment_length, 8192);
        assert_eq!(o.params.max_recv_data_segment_length, 262_144);
        assert_eq!(o.params.max_burst_length, 262_144);
        assert_eq!(o.params.first_burst_length, 65536);
        assert!(o.params.initial_r2t && o.params.immediate_data);
        assert_eq!(o.tsih, 0x11);
        assert_eq!(o.target_portal_group_tag.as_deref(), Some("1"));
    }

    #[test]
    fn target_offered_key_gets_an_answer_before_full_feature() {
        let (mut l, _) = Login::start(cfg(None));
        l.step(&resp(true, 0, 1, &[("AuthMethod", "None")])).unwrap();
        let Step::Send(again) =
            l.step(&resp(false, 1, 0, &[("MaxOutstandingR2T", "4"), ("X-vendor", "1"), ("Foo", "1")])).unwrap()
        else {
            panic!()
        };
        let k = keys_of(&again);
        assert_eq!(key(&k, "Foo"), Some("NotUnderstood"));
        assert_eq!(key(&k, "X-vendor"), None);
        let Step::Done(o) = l.step(&resp(true, 1, 3, &[])).unwrap() else { panic!() };
        assert_eq!(o.params.max_outstanding_r2t, 4);
    }

    #[test]
    fn answer_breaking_the_min_rule_fails_the_login() {
        let (mut l, _) = Login::start(cfg(None));
        l.step(&resp(true, 0, 1, &[("AuthMethod", "None")])).unwrap();
        let e = l.step(&resp(true, 1, 3, &[("MaxBurstLength", "4194304")])).unwrap_err();
        assert!(matches!(e, LoginError::Protocol(_)), "{e}");
    }

    fn chap_cfg(mutual: bool) -> Chap {
        Chap {
            user: "alice".into(),
            secret: "alicesecret1".into(),
            mutual: mutual.then(|| ("tgt".into(), "targetsecret".into())),
        }
    }

    #[test]
    fn one_way_chap_answers_md5_of_id_secret_challenge() {
        let (mut l, first) = Login::start(cfg(Some(chap_cfg(false))));
        assert_eq!(key(&keys_of(&first), "AuthMethod"), Some("CHAP,None"));
        let Step::Send(a) = l.step(&resp(false, 0, 0, &[("AuthMethod", "CHAP")])).unwrap() else { panic!() };
        assert_eq!(key(&keys_of(&a), "CHAP_A"), Some("5"));
        let Step::Send(r) =
            l.step(&resp(false, 0, 0, &[("CHAP_A", "5"), ("CHAP_I", "3"), ("CHAP_C", "0x0102")])).unwrap()
        else {
            panic!()
        };
        let k = keys_of(&r);
        assert_eq!(key(&k, "CHAP_N"), Some("alice"));
        let expected = chap::encode_hex(&chap::response(3, b"alicesecret1", &[1, 2]));
        assert_eq!(key(&k, "CHAP_R"), Some(expected.as_str()));
        assert_eq!(key(&k, "CHAP_C"), None);
        let Step::Send(op) = l.step(&resp(true, 0, 1, &[])).unwrap() else { panic!() };
        assert_eq!(key(&keys_of(&op), "HeaderDigest"), Some("None"));
    }

    #[test]
    fn mutual_chap_checks_the_target_response() {
        for (good, secret) in [(true, "targetsecret"), (false, "wrongsecret1")] {
            let (mut l, _) = Login::start(cfg(Some(chap_cfg(true))));
            l.step(&resp(false, 0, 0, &[("AuthMethod", "CHAP")])).unwrap();
            let Step::Send(r) =
                l.step(&resp(false, 0, 0, &[("CHAP_A", "5"), ("CHAP_I", "3"), ("CHAP_C", "0x0102")])).unwrap()
            else {
                panic!()
            };
            let k = keys_of(&r);
            assert_eq!(key(&k, "CHAP_I"), Some("9"));
            let tr = chap::encode_hex(&chap::response(9, secret.as_bytes(), &[0x5a; 16]));
            let out = l.step(&resp(true, 0, 1, &[("CHAP_N", "tgt"), ("CHAP_R", &tr)]));
            assert_eq!(out.is_ok(), good, "{out:?}");
        }
    }

    #[test]
    fn authentication_failure_is_permanent() {
        let (mut l, _) = Login::start(cfg(Some(chap_cfg(false))));
        let mut bad = resp(false, 0, 0, &[]);
        if let Header::LoginResponse(r) = &mut bad.header {
            r.status_class = 2;
            r.status_detail = 1;
        }
        let e = l.step(&bad).unwrap_err();
        assert!(matches!(e, LoginError::Auth(_)) && e.is_permanent());
        let unavailable = LoginError::Refused { class: 3, detail: 1, reason: "" };
        assert!(!unavailable.is_permanent());
        assert!(e.is_permanent_on_reinstatement(), "bad credentials stay bad");
    }

    #[test]
    fn an_unknown_target_is_permanent_at_first_and_retried_while_reinstating() {
        for detail in [0x02, 0x03] {
            let e = LoginError::Refused { class: 2, detail, reason: status_reason(2, detail) };
            assert!(e.is_permanent(), "{e}");
            assert!(!e.is_permanent_on_reinstatement(), "{e}");
        }
        let version = LoginError::Refused { class: 2, detail: 0x05, reason: status_reason(2, 0x05) };
        assert!(version.is_permanent_on_reinstatement());
        assert!(LoginError::Protocol("bad".into()).is_permanent_on_reinstatement());
    }

    #[test]
    fn target_demanding_chap_without_credentials_is_a_clear_error() {
        let (mut l, _) = Login::start(cfg(None));
        let e = l.step(&resp(false, 0, 0, &[("AuthMethod", "Reject")])).unwrap_err();
        assert!(e.to_string().contains("requires authentication"), "{e}");
    }

    #[test]
    fn continued_text_is_collected_before_use() {
        let (mut l, _) = Login::start(cfg(None));
        let mut part = resp(false, 0, 0, &[]);
        part.data = Bytes::from_static(b"AuthMeth");
        if let Header::LoginResponse(r) = &mut part.header {
            r.cont = true;
        }
        let Step::Send(empty) = l.step(&part).unwrap() else { panic!() };
        assert!(empty.data.is_empty());
        let mut rest = resp(true, 0, 1, &[]);
        rest.data = Bytes::from_static(b"od=None\0");
        let Step::Send(op) = l.step(&rest).unwrap() else { panic!() };
        let Header::LoginRequest(h) = op.header else { panic!() };
        assert_eq!(h.csg, 1);
    }

    #[test]
    fn discovery_login_offers_no_session_keys() {
        let mut c = cfg(None);
        c.target_name = None;
        let (mut l, first) = Login::start(c);
        assert_eq!(key(&keys_of(&first), "SessionType"), Some("Discovery"));
        let Step::Send(op) = l.step(&resp(true, 0, 1, &[("AuthMethod", "None")])).unwrap() else { panic!() };
        let k = keys_of(&op);
        assert!(key(&k, "MaxBurstLength").is_none() && key(&k, "HeaderDigest").is_some());
    }
}

//! The login phase of one connection (RFC 7143 §6 and §11.12): security negotiation with CHAP
//! (one-way and mutual, a target's or discovery's), operational negotiation of every key, stage
//! transitions and the checks that end a login with a status class, and which targets a logged-in
//! session may discover. A pure state machine: requests in, responses out.

#![deny(clippy::unwrap_used, clippy::indexing_slicing)]

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use stics_wire::keys::{self, Kind, Params, SessionType};
use stics_wire::pdu::{login_status, stage, LoginRequest, LoginResponse, Pdu};
use stics_wire::{chap, text};

use crate::config::{Credentials, DiscoveryAuth, Limits};

/// Largest login text (all continuation PDUs of one request together) the target accepts.
pub const MAX_LOGIN_TEXT: usize = 64 * 1024;

/// What a login needs to know about one target.
#[derive(Debug, Clone)]
pub struct TargetAuth {
    pub iqn: String,
    pub alias: Option<String>,
    pub chap: Option<Credentials>,
    pub mutual_chap: Option<Credentials>,
    /// Allowed initiator names; empty allows all.
    pub initiators: Vec<String>,
    /// A LUN of this target takes groups over the link (`stics_link`): the target accepts the
    /// link's login key.
    pub link: bool,
}

impl TargetAuth {
    /// True if `initiator` may log in to (and discover) this target.
    pub fn allows(&self, initiator: &str) -> bool {
        self.initiators.is_empty() || self.initiators.iter().any(|i| i.eq_ignore_ascii_case(initiator))
    }

    /// True if a session of `initiator` may learn this target's name from SendTargets: its
    /// name is allowed and, for a target with CHAP, the session `authenticated` with CHAP (the
    /// rule documented on [`DiscoveryAuth`]).
    pub fn listed_to(&self, initiator: &str, authenticated: bool) -> bool {
        self.allows(initiator) && (self.chap.is_none() || authenticated)
    }
}

/// The targets behind a portal and the values the target offers.
#[derive(Debug, Clone)]
pub struct Policy {
    pub targets: Vec<TargetAuth>,
    /// CHAP that discovery sessions must pass.
    pub discovery: DiscoveryAuth,
    pub limits: Limits,
    /// TargetPortalGroupTag of every portal (one portal group).
    pub tpgt: u16,
}

impl Policy {
    /// Finds a target by name (iSCSI names compare case-insensitively, RFC 3722).
    pub fn target(&self, iqn: &str) -> Option<(usize, &TargetAuth)> {
        self.targets.iter().enumerate().find(|(_, t)| t.iqn.eq_ignore_ascii_case(iqn))
    }

    /// The targets SendTargets may name to a session of `initiator` that `authenticated` (or
    /// not) with CHAP: see [`TargetAuth::listed_to`].
    pub fn listed(&self, initiator: &str, authenticated: bool) -> Vec<&TargetAuth> {
        self.targets.iter().filter(|t| t.listed_to(initiator, authenticated)).collect()
    }

    /// The target's own value for a key, as `keys::respond` takes it.
    fn own(&self, key: &str) -> Option<String> {
        let l = &self.limits;
        let yn = |b: bool| if b { "Yes" } else { "No" }.to_owned();
        Some(match key {
            "HeaderDigest" | "DataDigest" => "CRC32C,None".into(),
            "MaxConnections" => "1".into(),
            "InitialR2T" => yn(l.initial_r2t),
            "ImmediateData" => yn(l.immediate_data),
            "MaxRecvDataSegmentLength" => l.max_recv_data_segment_length.to_string(),
            "MaxBurstLength" => l.max_burst_length.to_string(),
            "FirstBurstLength" => l.first_burst_length.to_string(),
            "DefaultTime2Wait" => "2".into(),
            "DefaultTime2Retain" => "0".into(),
            "MaxOutstandingR2T" => l.max_outstanding_r2t.to_string(),
            "DataPDUInOrder" | "DataSequenceInOrder" => "Yes".into(),
            "ErrorRecoveryLevel" => "0".into(),
            "OFMarker" | "IFMarker" => "No".into(),
            "OFMarkInt" | "IFMarkInt" => "2048".into(),
            "iSCSIProtocolLevel" => "1".into(),
            "TaskReporting" => "RFC3720".into(),
            _ => return None,
        })
    }
}

/// Where the CHAP exchange stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Auth {
    /// No AuthMethod agreed yet.
    Start,
    /// AuthMethod=None agreed, or none required.
    NotNeeded,
    /// AuthMethod=CHAP agreed; waiting for CHAP_A.
    ChapAgreed,
    /// Challenge sent; waiting for CHAP_N and CHAP_R.
    ChallengeSent { id: u8 },
    /// The initiator proved its identity (and the target its own, if asked).
    Done,
}

/// The login's position in RFC 7143's stage diagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Security,
    Operational,
    Finished,
}

/// What the connection driver does next.
#[derive(Debug)]
pub enum Step {
    /// Send this response and wait for the next request.
    Continue(Pdu),
    /// Send this response (a failure status) and close the connection.
    Fail(Pdu),
    /// Login succeeded: fill in the TSIH, send this response and enter full feature phase.
    Ready(Pdu, Box<Outcome>),
}

/// What a successful login agreed.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub session_type: SessionType,
    pub initiator_name: String,
    pub initiator_alias: Option<String>,
    /// Index into [`Policy::targets`] for a normal session.
    pub target: Option<usize>,
    /// The initiator proved its identity with CHAP (to the target's or discovery's secret).
    pub authenticated: bool,
    pub isid: [u8; 6],
    /// TSIH the initiator sent (zero for a new session).
    pub tsih: u16,
    pub cid: u16,
    /// CmdSN the first full-feature command carries.
    pub exp_cmd_sn: u32,
    /// StatSN the first full-feature status carries.
    pub next_stat_sn: u32,
    pub params: Params,
}

/// The login state machine of one connection.
#[derive(Debug)]
pub struct Login {
    policy: Arc<Policy>,
    /// Challenge bytes and CHAP identifier to use (supplied by the caller: no randomness here).
    challenge: Vec<u8>,
    chap_id: u8,
    phase: Phase,
    auth: Auth,
    first: Option<LoginRequest>,
    initiator_name: Option<String>,
    initiator_alias: Option<String>,
    session_type: SessionType,
    target: Option<usize>,
    params: Params,
    /// Keys already answered, so each is negotiated once.
    negotiated: HashSet<String>,
    /// MaxRecvDataSegmentLength has been declared to the initiator.
    declared_mrdsl: bool,
    /// TargetPortalGroupTag (and alias) have been sent.
    sent_tpgt: bool,
    /// Text of a request split over several PDUs with the C bit.
    pending: Vec<u8>,
    stat_sn: u32,
}

type Status = (u8, u8);

impl Login {
    /// A login over `policy`. `challenge` (16 random bytes is good) and `chap_id` are what the
    /// target sends if CHAP is used.
    pub fn new(policy: Arc<Policy>, challenge: Vec<u8>, chap_id: u8) -> Login {
        // The target declares its own receive limit; until it does, RFC 7143's 8192 applies.
        let params = Params { max_recv_data_segment_length: 8192, ..Params::default() };
        Login {
            policy,
            challenge,
            chap_id,
            phase: Phase::Security,
            auth: Auth::Start,
            first: None,
            initiator_name: None,
            initiator_alias: None,
            session_type: SessionType::Normal,
            target: None,
            params,
            negotiated: HashSet::new(),
            declared_mrdsl: false,
            sent_tpgt: false,
            pending: Vec::new(),
            stat_sn: 0,
        }
    }

    /// True once the exchange has ended (either way).
    pub fn finished(&self) -> bool {
        self.phase == Phase::Finished
    }

    fn response(&mut self, req: &LoginRequest, status: Status, data: Bytes) -> Pdu {
        let first = self.first.unwrap_or(*req);
        let h = LoginResponse {
            transit: false,
            cont: false,
            csg: req.csg,
            nsg: req.nsg,
            version_max: 0,
            version_active: 0,
            isid: first.isid,
            tsih: first.tsih,
            itt: req.itt,
            stat_sn: self.stat_sn,
            exp_cmd_sn: req.cmd_sn,
            max_cmd_sn: req.cmd_sn.wrapping_add(self.policy.limits.queue_depth.max(1) - 1),
            status_class: status.0,
            status_detail: status.1,
        };
        self.stat_sn = self.stat_sn.wrapping_add(1);
        Pdu::new(h, data)
    }

    /// Ends the login with `status` (used by the driver too, e.g. when sessions run out).
    pub fn fail(&mut self, req: &LoginRequest, status: Status) -> Pdu {
        self.phase = Phase::Finished;
        let mut p = self.response(req, status, Bytes::new());
        if let stics_wire::Header::LoginResponse(h) = &mut p.header {
            h.nsg = 0;
            h.csg = req.csg;
        }
        p
    }

    fn failed(&mut self, req: &LoginRequest, status: Status) -> Step {
        Step::Fail(self.fail(req, status))
    }

    /// Handles one Login Request.
    pub fn step(&mut self, req: &LoginRequest, data: &[u8]) -> Step {
        if self.phase == Phase::Finished {
            return self.failed(req, login_status::INITIATOR_ERROR);
        }
        match self.first {
            None => {
                if req.version_min > 0 {
                    return self.failed(req, login_status::UNSUPPORTED_VERSION);
                }
                // The target's StatSN starts where the initiator expects it.
                self.stat_sn = req.exp_stat_sn;
                self.first = Some(*req);
            }
            Some(f) => {
                if f.isid != req.isid || f.tsih != req.tsih || f.cid != req.cid {
                    return self.failed(req, login_status::INITIATOR_ERROR);
                }
            }
        }
        // Stage checks (RFC 7143 §6.3): CSG must be where we are (security may be skipped only at
        // the start), and a transit must go forward to a real stage.
        let expected = match self.phase {
            Phase::Security => stage::SECURITY,
            _ => stage::OPERATIONAL,
        };
        let skipping_security =
            self.phase == Phase::Security && req.csg == stage::OPERATIONAL && self.auth == Auth::Start;
        if req.csg != expected && !skipping_security {
            return self.failed(req, login_status::INITIATOR_ERROR);
        }
        if req.transit && (req.nsg <= req.csg || req.nsg == 2) {
            return self.failed(req, login_status::INITIATOR_ERROR);
        }
        if req.cont && req.transit {
            return self.failed(req, login_status::INITIATOR_ERROR);
        }
        if self.pending.len() + data.len() > MAX_LOGIN_TEXT {
            return self.failed(req, login_status::OUT_OF_RESOURCES);
        }
        self.pending.extend_from_slice(data);
        if req.cont {
            // RFC 7143 §6.1: answer each partial text with an empty response until the last.
            let mut p = self.response(req, login_status::SUCCESS, Bytes::new());
            if let stics_wire::Header::LoginResponse(h) = &mut p.header {
                h.nsg = 0;
            }
            return Step::Continue(p);
        }
        let text = std::mem::take(&mut self.pending);
        let Ok(pairs) = text::parse(&text) else {
            return self.failed(req, login_status::INITIATOR_ERROR);
        };
        if skipping_security {
            if let Err(s) = self.leading_keys(&pairs) {
                return self.failed(req, s);
            }
            if self.auth_required() {
                return self.failed(req, login_status::AUTHENTICATION_FAILURE);
            }
            self.auth = Auth::NotNeeded;
            self.phase = Phase::Operational;
        }
        let mut out: Vec<(String, String)> = Vec::new();
        let result = match self.phase {
            Phase::Security => self.security(req, &pairs, &mut out),
            _ => self.operational(&pairs, &mut out),
        };
        if let Err(s) = result {
            return self.failed(req, s);
        }
        // Decide the transition.
        let mut transit = false;
        if req.transit {
            transit = match self.phase {
                Phase::Security => matches!(self.auth, Auth::NotNeeded | Auth::Done),
                _ => true,
            };
        }
        if !self.sent_tpgt && self.session_type == SessionType::Normal {
            self.sent_tpgt = true;
            out.push(("TargetPortalGroupTag".into(), self.policy.tpgt.to_string()));
            if let Some(alias) = self.target.and_then(|i| self.policy.targets.get(i)).and_then(|t| t.alias.clone()) {
                out.push(("TargetAlias".into(), alias));
            }
        }
        if transit && req.nsg == stage::FULL_FEATURE || (self.phase == Phase::Operational && !self.declared_mrdsl) {
            self.declare_mrdsl(&mut out);
        }
        let data = text::encode(&out);
        let mut pdu = self.response(req, login_status::SUCCESS, data);
        if let stics_wire::Header::LoginResponse(h) = &mut pdu.header {
            h.transit = transit;
            h.nsg = if transit { req.nsg } else { 0 };
        }
        if !transit {
            return Step::Continue(pdu);
        }
        if req.nsg == stage::OPERATIONAL {
            self.phase = Phase::Operational;
            return Step::Continue(pdu);
        }
        // Into full feature phase.
        self.phase = Phase::Finished;
        let first = self.first.unwrap_or(*req);
        let mut params = self.params.clone();
        params.session_type = self.session_type;
        params.finish();
        let outcome = Outcome {
            session_type: self.session_type,
            initiator_name: self.initiator_name.clone().unwrap_or_default(),
            initiator_alias: self.initiator_alias.clone(),
            target: self.target,
            authenticated: self.auth == Auth::Done,
            isid: first.isid,
            tsih: first.tsih,
            cid: first.cid,
            exp_cmd_sn: req.cmd_sn,
            next_stat_sn: self.stat_sn,
            params,
        };
        Step::Ready(pdu, Box::new(outcome))
    }

    fn declare_mrdsl(&mut self, out: &mut Vec<(String, String)>) {
        if !self.declared_mrdsl {
            self.declared_mrdsl = true;
            let v = self.policy.limits.max_recv_data_segment_length;
            self.params.max_recv_data_segment_length = v;
            out.push(("MaxRecvDataSegmentLength".into(), v.to_string()));
        }
    }

    /// The CHAP credentials this login answers to, one-way and mutual: the target's for a
    /// normal session, `[discovery]`'s for a discovery session. Known once the leading keys are.
    fn credentials(&self) -> (Option<&Credentials>, Option<&Credentials>) {
        match self.session_type {
            SessionType::Discovery => (self.policy.discovery.chap.as_ref(), self.policy.discovery.mutual_chap.as_ref()),
            SessionType::Normal => {
                self.target_auth().map_or((None, None), |t| (t.chap.as_ref(), t.mutual_chap.as_ref()))
            }
        }
    }

    fn auth_required(&self) -> bool {
        self.credentials().0.is_some()
    }

    fn target_auth(&self) -> Option<&TargetAuth> {
        self.target.and_then(|i| self.policy.targets.get(i))
    }

    /// InitiatorName, SessionType and TargetName, which the first request must carry.
    fn leading_keys(&mut self, pairs: &[(String, String)]) -> Result<(), Status> {
        if self.initiator_name.is_some() {
            return Ok(());
        }
        let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        let name = get("InitiatorName").filter(|n| !n.is_empty()).ok_or(login_status::MISSING_PARAMETER)?;
        self.initiator_name = Some(name.to_owned());
        self.initiator_alias = get("InitiatorAlias").map(str::to_owned);
        self.session_type = match get("SessionType").unwrap_or("Normal") {
            "Normal" => SessionType::Normal,
            "Discovery" => SessionType::Discovery,
            _ => return Err(login_status::SESSION_TYPE_NOT_SUPPORTED),
        };
        if self.session_type == SessionType::Normal {
            let t = get("TargetName").ok_or(login_status::MISSING_PARAMETER)?;
            let (idx, auth) = self.policy.target(t).ok_or(login_status::NOT_FOUND)?;
            if !auth.allows(name) {
                return Err(login_status::AUTHORIZATION_FAILURE);
            }
            self.target = Some(idx);
        }
        Ok(())
    }

    fn security(
        &mut self,
        req: &LoginRequest,
        pairs: &[(String, String)],
        out: &mut Vec<(String, String)>,
    ) -> Result<(), Status> {
        self.leading_keys(pairs)?;
        let required = self.auth_required();
        let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        if let Some(offer) = get("AuthMethod") {
            if self.auth != Auth::Start {
                return Err(login_status::INITIATOR_ERROR);
            }
            let own = if required { "CHAP" } else { "None" };
            let def = keys::lookup("AuthMethod").ok_or(login_status::TARGET_ERROR)?;
            let answer = keys::respond(def, offer, own).map_err(|_| login_status::INITIATOR_ERROR)?;
            match answer.as_str() {
                "CHAP" => self.auth = Auth::ChapAgreed,
                "None" => self.auth = Auth::NotNeeded,
                _ => {
                    return Err(if required {
                        login_status::AUTHENTICATION_FAILURE
                    } else {
                        login_status::INITIATOR_ERROR
                    })
                }
            }
            out.push(("AuthMethod".into(), answer));
        } else if self.auth == Auth::Start && req.transit {
            // No AuthMethod at all: only acceptable when the target requires none.
            if required {
                return Err(login_status::AUTHENTICATION_FAILURE);
            }
            self.auth = Auth::NotNeeded;
        }
        if let Some(algs) = get("CHAP_A") {
            if self.auth != Auth::ChapAgreed {
                return Err(login_status::INITIATOR_ERROR);
            }
            if !algs.split(',').any(|a| a == chap::ALGORITHM_MD5) {
                return Err(login_status::AUTHENTICATION_FAILURE);
            }
            out.push(("CHAP_A".into(), chap::ALGORITHM_MD5.into()));
            out.push(("CHAP_I".into(), self.chap_id.to_string()));
            out.push(("CHAP_C".into(), chap::encode_hex(&self.challenge)));
            self.auth = Auth::ChallengeSent { id: self.chap_id };
        } else if get("CHAP_N").is_some() || get("CHAP_R").is_some() {
            let Auth::ChallengeSent { id } = self.auth else { return Err(login_status::INITIATOR_ERROR) };
            self.verify_chap(id, pairs, out)?;
            self.auth = Auth::Done;
        }
        // Operational keys may come along in the security stage; answer them the same way.
        let rest: Vec<(String, String)> =
            pairs.iter().filter(|(k, _)| !k.starts_with("CHAP_") && k != "AuthMethod").cloned().collect();
        self.operational_keys(&rest, out)
    }

    fn verify_chap(&self, id: u8, pairs: &[(String, String)], out: &mut Vec<(String, String)>) -> Result<(), Status> {
        let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        let fail = login_status::AUTHENTICATION_FAILURE;
        let (cred, mutual) = self.credentials();
        let cred = cred.ok_or(fail)?;
        let name = get("CHAP_N").ok_or(fail)?;
        let resp = get("CHAP_R").and_then(|r| chap::decode_binary(r).ok()).ok_or(fail)?;
        if name != cred.user || !chap::verify(id, cred.secret.as_bytes(), &self.challenge, &resp) {
            return Err(fail);
        }
        match (get("CHAP_I"), get("CHAP_C")) {
            (None, None) => Ok(()),
            (Some(i), Some(c)) => {
                let mutual = mutual.ok_or(fail)?;
                let their_id = chap::parse_identifier(i).map_err(|_| fail)?;
                let their_challenge = chap::decode_binary(c).map_err(|_| fail)?;
                // RFC 7143 §12.1.3: refuse a reflected challenge and absurd lengths.
                if their_challenge == self.challenge || their_challenge.is_empty() || their_challenge.len() > 1024 {
                    return Err(fail);
                }
                let r = chap::response(their_id, mutual.secret.as_bytes(), &their_challenge);
                out.push(("CHAP_N".into(), mutual.user.clone()));
                out.push(("CHAP_R".into(), chap::encode_hex(&r)));
                Ok(())
            }
            _ => Err(fail),
        }
    }

    fn operational(&mut self, pairs: &[(String, String)], out: &mut Vec<(String, String)>) -> Result<(), Status> {
        if pairs.iter().any(|(k, _)| k.starts_with("CHAP_") || k == "AuthMethod") {
            return Err(login_status::INITIATOR_ERROR);
        }
        self.operational_keys(pairs, out)
    }

    fn operational_keys(&mut self, pairs: &[(String, String)], out: &mut Vec<(String, String)>) -> Result<(), Status> {
        for (k, v) in pairs {
            match k.as_str() {
                "InitiatorName" | "SessionType" | "TargetName" => {
                    if self.negotiated.contains(k) {
                        // Leading-only declarations may not change (RFC 7143 §6.1).
                        let same = match k.as_str() {
                            "InitiatorName" => self.initiator_name.as_deref() == Some(v.as_str()),
                            "SessionType" => self.session_type.to_string() == *v,
                            _ => self.target_auth().is_some_and(|t| t.iqn.eq_ignore_ascii_case(v)),
                        };
                        if !same {
                            return Err(login_status::INITIATOR_ERROR);
                        }
                    }
                    self.negotiated.insert(k.clone());
                    continue;
                }
                "InitiatorAlias" => {
                    self.initiator_alias = Some(v.clone());
                    continue;
                }
                _ => {}
            }
            if let Some(answer) = self.answer(k, v) {
                out.push((k.clone(), answer));
            }
        }
        Ok(())
    }

    /// The answer to one operational key (None for declarations that need none).
    fn answer(&mut self, k: &str, v: &str) -> Option<String> {
        if k == stics_link::LOGIN_KEY
            && self.session_type == SessionType::Normal
            && self.target_auth().is_some_and(|t| t.link)
        {
            return Some(match stics_link::negotiated(Some(v)) {
                Some(version) => version.to_string(),
                None => keys::REJECT.into(),
            });
        }
        let Some(def) = keys::lookup(k) else { return Some(keys::NOT_UNDERSTOOD.into()) };
        if self.session_type == SessionType::Discovery && def.normal_only {
            return Some(keys::IRRELEVANT.into());
        }
        if v == keys::NOT_UNDERSTOOD || v == keys::IRRELEVANT || v == keys::REJECT {
            return None;
        }
        match def.name {
            "SendTargets" => return Some(keys::IRRELEVANT.into()),
            "TargetAlias" | "TargetAddress" | "TargetPortalGroupTag" => return Some(keys::REJECT.into()),
            _ => {}
        }
        // A key may be negotiated once per login (RFC 7143 §6.2); a repeat gets Reject.
        if !self.negotiated.insert(def.name.to_owned()) {
            return Some(keys::REJECT.into());
        }
        let own = self.policy.own(def.name)?;
        if let Kind::DeclaredNumber(..) = def.kind {
            // The initiator declares what it can receive; the target declares its own once.
            if self.params.apply(def.name, v, true).is_err() {
                return Some(keys::REJECT.into());
            }
            if self.declared_mrdsl {
                return None;
            }
            self.declared_mrdsl = true;
            self.params.max_recv_data_segment_length = self.policy.limits.max_recv_data_segment_length;
            return Some(own);
        }
        match keys::respond(def, v, &own) {
            Ok(answer) => {
                if answer != keys::REJECT && self.params.apply(def.name, &answer, false).is_err() {
                    return Some(keys::REJECT.into());
                }
                Some(answer)
            }
            Err(_) => Some(keys::REJECT.into()),
        }
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::*;
    use stics_wire::Header;

    const IQN: &str = "iqn.2024-01.org.stics:t";

    fn policy(chap: bool, mutual: bool) -> Arc<Policy> {
        Arc::new(Policy {
            targets: vec![TargetAuth {
                iqn: IQN.into(),
                alias: Some("disk".into()),
                chap: chap.then(|| Credentials { user: "alice".into(), secret: "alice-secret-1".into() }),
                mutual_chap: mutual.then(|| Credentials { user: "tgt".into(), secret: "target-secret-2".into() }),
                initiators: vec![],
                link: false,
            }],
            discovery: DiscoveryAuth::default(),
            limits: Limits::default(),
            tpgt: 1,
        })
    }

    /// A policy whose discovery sessions need CHAP as `seeker` (and answer mutual CHAP as
    /// `portal`), in front of one target with CHAP as `alice`.
    fn discovery_policy() -> Arc<Policy> {
        let mut p = (*policy(true, false)).clone();
        p.discovery = DiscoveryAuth {
            chap: Some(Credentials { user: "seeker".into(), secret: "discovery-secret-3".into() }),
            mutual_chap: Some(Credentials { user: "portal".into(), secret: "portal-secret-4".into() }),
        };
        Arc::new(p)
    }

    const DISCOVERY: &str = "InitiatorName=iqn.2024-01.org.test:i\0SessionType=Discovery\0";

    fn req(csg: u8, nsg: u8, transit: bool) -> LoginRequest {
        LoginRequest {
            transit,
            csg,
            nsg,
            isid: [0x80, 0, 0, 0, 0, 1],
            itt: 7,
            cid: 1,
            cmd_sn: 10,
            ..Default::default()
        }
    }

    fn kv(p: &Pdu) -> Vec<(String, String)> {
        text::parse(&p.data).unwrap()
    }

    fn get(p: &Pdu, k: &str) -> Option<String> {
        kv(p).into_iter().find(|(n, _)| n == k).map(|(_, v)| v)
    }

    fn resp(p: &Pdu) -> LoginResponse {
        match p.header {
            Header::LoginResponse(h) => h,
            _ => panic!("not a login response"),
        }
    }

    fn continue_pdu(s: Step) -> Pdu {
        match s {
            Step::Continue(p) => p,
            other => panic!("expected Continue, got {other:?}"),
        }
    }

    fn fail_status(s: Step) -> (u8, u8) {
        match s {
            Step::Fail(p) => (resp(&p).status_class, resp(&p).status_detail),
            other => panic!("expected Fail, got {other:?}"),
        }
    }

    fn names(target: &str) -> String {
        format!("InitiatorName=iqn.2024-01.org.test:i\0SessionType=Normal\0TargetName={target}\0")
    }

    #[test]
    fn login_without_auth_goes_security_operational_full_feature() {
        let mut l = Login::new(policy(false, false), vec![1; 16], 1);
        let p = continue_pdu(l.step(&req(0, 1, true), format!("{}AuthMethod=None\0", names(IQN)).as_bytes()));
        let h = resp(&p);
        assert!(h.transit);
        assert_eq!((h.csg, h.nsg, h.status_class), (0, 1, 0));
        assert_eq!(get(&p, "AuthMethod").as_deref(), Some("None"));
        assert_eq!(get(&p, "TargetPortalGroupTag").as_deref(), Some("1"));
        assert_eq!(get(&p, "TargetAlias").as_deref(), Some("disk"));
        let ops = "HeaderDigest=CRC32C,None\0DataDigest=None\0MaxRecvDataSegmentLength=65536\0MaxBurstLength=262144\0\
                   FirstBurstLength=65536\0InitialR2T=No\0ImmediateData=Yes\0ErrorRecoveryLevel=2\0X-foo=bar\0MaxConnections=0\0";
        match l.step(&req(1, 3, true), ops.as_bytes()) {
            Step::Ready(p, out) => {
                assert_eq!(get(&p, "HeaderDigest").as_deref(), Some("CRC32C"));
                assert_eq!(get(&p, "DataDigest").as_deref(), Some("None"));
                assert_eq!(get(&p, "MaxRecvDataSegmentLength").as_deref(), Some("262144"));
                assert_eq!(get(&p, "MaxBurstLength").as_deref(), Some("262144"));
                assert_eq!(get(&p, "InitialR2T").as_deref(), Some("No"));
                assert_eq!(get(&p, "ErrorRecoveryLevel").as_deref(), Some("0"));
                assert_eq!(get(&p, "X-foo").as_deref(), Some("NotUnderstood"));
                assert_eq!(get(&p, "MaxConnections").as_deref(), Some("Reject"));
                assert!(resp(&p).transit);
                assert_eq!(resp(&p).nsg, 3);
                assert!(out.params.header_digest && !out.params.data_digest);
                assert_eq!(out.params.max_xmit_data_segment_length, 65536);
                assert_eq!(out.params.max_recv_data_segment_length, 262144);
                assert_eq!(out.params.first_burst_length, 65536);
                assert!(!out.params.initial_r2t);
                assert_eq!(out.exp_cmd_sn, 10);
                assert_eq!(out.target, Some(0));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_link_key_is_answered_only_by_a_target_that_takes_groups() {
        for link in [false, true] {
            let mut p = (*policy(false, false)).clone();
            if let Some(t) = p.targets.first_mut() {
                t.link = link;
            }
            let mut l = Login::new(Arc::new(p), vec![1; 16], 1);
            continue_pdu(l.step(&req(0, 1, true), format!("{}AuthMethod=None\0", names(IQN)).as_bytes()));
            let ops = format!("{}=1\0", stics_link::LOGIN_KEY);
            let Step::Ready(p, _) = l.step(&req(1, 3, true), ops.as_bytes()) else { panic!("login did not finish") };
            let want = if link { "1" } else { "NotUnderstood" };
            assert_eq!(get(&p, stics_link::LOGIN_KEY).as_deref(), Some(want), "link={link}");
        }
    }

    #[test]
    fn unknown_target_is_not_found_and_missing_names_are_missing_parameters() {
        let mut l = Login::new(policy(false, false), vec![1; 16], 1);
        assert_eq!(fail_status(l.step(&req(0, 1, true), names("iqn.2024-01.org.stics:nope").as_bytes())), (2, 3));
        let mut l = Login::new(policy(false, false), vec![1; 16], 1);
        assert_eq!(fail_status(l.step(&req(0, 1, true), b"SessionType=Normal\0")), (2, 7));
        let mut l = Login::new(policy(false, false), vec![1; 16], 1);
        assert_eq!(fail_status(l.step(&req(0, 1, true), b"InitiatorName=iqn.2024-01.a:b\0")), (2, 7));
    }

    #[test]
    fn discovery_session_needs_no_target_and_answers_irrelevant_to_normal_only_keys() {
        let mut l = Login::new(policy(true, false), vec![1; 16], 1);
        let p = l.step(&req(1, 3, true), b"InitiatorName=iqn.2024-01.a:b\0SessionType=Discovery\0InitialR2T=No\0");
        match p {
            Step::Ready(p, out) => {
                assert_eq!(get(&p, "InitialR2T").as_deref(), Some("Irrelevant"));
                assert_eq!(out.session_type, SessionType::Discovery);
                assert!(get(&p, "TargetPortalGroupTag").is_none());
            }
            other => panic!("{other:?}"),
        }
    }

    fn chap_to_challenge(l: &mut Login) -> (u8, Vec<u8>) {
        chap_to_challenge_as(l, &names(IQN))
    }

    /// Offers CHAP after the `leading` keys and asks for the challenge.
    fn chap_to_challenge_as(l: &mut Login, leading: &str) -> (u8, Vec<u8>) {
        let p = continue_pdu(l.step(&req(0, 1, true), format!("{leading}AuthMethod=CHAP,None\0").as_bytes()));
        assert_eq!(get(&p, "AuthMethod").as_deref(), Some("CHAP"));
        assert!(!resp(&p).transit, "no transit before authentication");
        let p = continue_pdu(l.step(&req(0, 1, false), b"CHAP_A=7,5\0"));
        assert_eq!(get(&p, "CHAP_A").as_deref(), Some("5"));
        let id: u8 = get(&p, "CHAP_I").unwrap().parse().unwrap();
        let c = chap::decode_binary(&get(&p, "CHAP_C").unwrap()).unwrap();
        (id, c)
    }

    #[test]
    fn one_way_chap_with_right_secret_passes() {
        let mut l = Login::new(policy(true, false), vec![9; 16], 42);
        let (id, c) = chap_to_challenge(&mut l);
        assert_eq!((id, c.clone()), (42, vec![9; 16]));
        let r = chap::encode_hex(&chap::response(id, b"alice-secret-1", &c));
        let p = continue_pdu(l.step(&req(0, 1, true), format!("CHAP_N=alice\0CHAP_R={r}\0").as_bytes()));
        assert!(resp(&p).transit);
        assert_eq!(resp(&p).nsg, 1);
    }

    #[test]
    fn chap_with_wrong_secret_or_user_is_an_authentication_failure() {
        for (user, secret) in [("alice", "wrong"), ("bob", "alice-secret-1")] {
            let mut l = Login::new(policy(true, false), vec![9; 16], 42);
            let (id, c) = chap_to_challenge(&mut l);
            let r = chap::encode_hex(&chap::response(id, secret.as_bytes(), &c));
            let s = l.step(&req(0, 1, true), format!("CHAP_N={user}\0CHAP_R={r}\0").as_bytes());
            assert_eq!(fail_status(s), (2, 1));
        }
    }

    #[test]
    fn chap_required_refuses_auth_none_and_skipping_security() {
        let mut l = Login::new(policy(true, false), vec![9; 16], 42);
        assert_eq!(
            fail_status(l.step(&req(0, 1, true), format!("{}AuthMethod=None\0", names(IQN)).as_bytes())),
            (2, 1)
        );
        let mut l = Login::new(policy(true, false), vec![9; 16], 42);
        assert_eq!(fail_status(l.step(&req(1, 3, true), names(IQN).as_bytes())), (2, 1));
    }

    #[test]
    fn mutual_chap_answers_the_initiators_challenge_and_refuses_reflection() {
        let mut l = Login::new(policy(true, true), vec![9; 16], 42);
        let (id, c) = chap_to_challenge(&mut l);
        let r = chap::encode_hex(&chap::response(id, b"alice-secret-1", &c));
        let p = continue_pdu(
            l.step(&req(0, 1, true), format!("CHAP_N=alice\0CHAP_R={r}\0CHAP_I=3\0CHAP_C=0x0102030405\0").as_bytes()),
        );
        assert_eq!(get(&p, "CHAP_N").as_deref(), Some("tgt"));
        let expect = chap::response(3, b"target-secret-2", &[1, 2, 3, 4, 5]);
        assert_eq!(chap::decode_binary(&get(&p, "CHAP_R").unwrap()).unwrap(), expect.to_vec());
        assert!(resp(&p).transit);

        let mut l = Login::new(policy(true, true), vec![9; 16], 42);
        let (id, c) = chap_to_challenge(&mut l);
        let r = chap::encode_hex(&chap::response(id, b"alice-secret-1", &c));
        let reflected = chap::encode_hex(&c);
        let s =
            l.step(&req(0, 1, true), format!("CHAP_N=alice\0CHAP_R={r}\0CHAP_I=3\0CHAP_C={reflected}\0").as_bytes());
        assert_eq!(fail_status(s), (2, 1));
    }

    #[test]
    fn mutual_chap_without_target_credentials_fails() {
        let mut l = Login::new(policy(true, false), vec![9; 16], 42);
        let (id, c) = chap_to_challenge(&mut l);
        let r = chap::encode_hex(&chap::response(id, b"alice-secret-1", &c));
        let s = l.step(&req(0, 1, true), format!("CHAP_N=alice\0CHAP_R={r}\0CHAP_I=3\0CHAP_C=0x01020304\0").as_bytes());
        assert_eq!(fail_status(s), (2, 1));
    }

    #[test]
    fn continued_text_is_answered_empty_until_the_last_pdu() {
        let mut l = Login::new(policy(false, false), vec![1; 16], 1);
        let all = format!("{}AuthMethod=None\0", names(IQN));
        let (a, b) = all.as_bytes().split_at(20);
        let mut r1 = req(0, 1, false);
        r1.cont = true;
        let p = continue_pdu(l.step(&r1, a));
        assert!(p.data.is_empty());
        let p = continue_pdu(l.step(&req(0, 1, true), b));
        assert_eq!(get(&p, "AuthMethod").as_deref(), Some("None"));
        assert!(resp(&p).transit);
    }

    #[test]
    fn bad_stage_transitions_and_versions_fail() {
        let mut l = Login::new(policy(false, false), vec![1; 16], 1);
        assert_eq!(fail_status(l.step(&req(0, 2, true), names(IQN).as_bytes())), (2, 0));
        let mut l = Login::new(policy(false, false), vec![1; 16], 1);
        let mut r = req(0, 1, true);
        r.version_min = 2;
        assert_eq!(fail_status(l.step(&r, names(IQN).as_bytes())), (2, 5));
        let mut l = Login::new(policy(false, false), vec![1; 16], 1);
        assert_eq!(fail_status(l.step(&req(3, 3, true), names(IQN).as_bytes())), (2, 0));
    }

    #[test]
    fn out_of_range_values_get_reject_and_repeated_keys_get_reject() {
        let mut l = Login::new(policy(false, false), vec![1; 16], 1);
        let p = continue_pdu(l.step(&req(1, 3, false), format!("{}MaxBurstLength=100\0", names(IQN)).as_bytes()));
        assert_eq!(get(&p, "MaxBurstLength").as_deref(), Some("Reject"));
        let p = continue_pdu(l.step(&req(1, 3, false), b"MaxRecvDataSegmentLength=8192\0ImmediateData=Yes\0"));
        assert_eq!(get(&p, "ImmediateData").as_deref(), Some("Yes"));
        let p = continue_pdu(l.step(&req(1, 3, false), b"ImmediateData=No\0"));
        assert_eq!(get(&p, "ImmediateData").as_deref(), Some("Reject"));
    }

    #[test]
    fn not_allowed_initiator_is_an_authorization_failure() {
        let mut p = (*policy(false, false)).clone();
        p.targets[0].initiators = vec!["iqn.2024-01.org.test:other".into()];
        let mut l = Login::new(Arc::new(p), vec![1; 16], 1);
        assert_eq!(fail_status(l.step(&req(0, 1, true), names(IQN).as_bytes())), (2, 2));
    }

    #[test]
    fn not_allowed_initiator_is_refused_before_chap_is_offered() {
        let mut p = (*policy(true, false)).clone();
        p.targets[0].initiators = vec!["iqn.2024-01.org.test:other".into()];
        let mut l = Login::new(Arc::new(p), vec![1; 16], 1);
        let s = l.step(&req(0, 1, true), format!("{}AuthMethod=CHAP,None\0", names(IQN)).as_bytes());
        assert_eq!(fail_status(s), login_status::AUTHORIZATION_FAILURE);
    }

    #[test]
    fn discovery_chap_refuses_auth_none_and_skipping_security() {
        let mut l = Login::new(discovery_policy(), vec![9; 16], 42);
        let s = l.step(&req(0, 1, true), format!("{DISCOVERY}AuthMethod=None\0").as_bytes());
        assert_eq!(fail_status(s), login_status::AUTHENTICATION_FAILURE);
        let mut l = Login::new(discovery_policy(), vec![9; 16], 42);
        assert_eq!(fail_status(l.step(&req(1, 3, true), DISCOVERY.as_bytes())), login_status::AUTHENTICATION_FAILURE);
    }

    /// Answers the discovery challenge as `user` with `secret` and goes to full feature phase.
    fn discovery_login(user: &str, secret: &str, extra: &str) -> (Login, Step) {
        let mut l = Login::new(discovery_policy(), vec![9; 16], 42);
        let (id, c) = chap_to_challenge_as(&mut l, DISCOVERY);
        let r = chap::encode_hex(&chap::response(id, secret.as_bytes(), &c));
        let step = l.step(&req(0, 3, true), format!("CHAP_N={user}\0CHAP_R={r}\0{extra}").as_bytes());
        (l, step)
    }

    #[test]
    fn discovery_chap_with_the_discovery_secret_passes_and_marks_the_session_authenticated() {
        let (_, step) = discovery_login("seeker", "discovery-secret-3", "");
        match step {
            Step::Ready(p, out) => {
                assert!(resp(&p).transit);
                assert_eq!(out.session_type, SessionType::Discovery);
                assert!(out.authenticated);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn discovery_chap_refuses_a_wrong_secret_and_a_targets_secret() {
        for (user, secret) in
            [("seeker", "not-the-secret-5"), ("alice", "alice-secret-1"), ("alice", "discovery-secret-3")]
        {
            let (_, step) = discovery_login(user, secret, "");
            assert_eq!(fail_status(step), login_status::AUTHENTICATION_FAILURE, "{user} {secret}");
        }
    }

    #[test]
    fn discovery_mutual_chap_answers_with_the_discovery_credentials() {
        let (_, step) = discovery_login("seeker", "discovery-secret-3", "CHAP_I=3\0CHAP_C=0x0102030405\0");
        let Step::Ready(p, out) = step else { panic!("{step:?}") };
        assert!(out.authenticated);
        assert_eq!(get(&p, "CHAP_N").as_deref(), Some("portal"));
        let expect = chap::response(3, b"portal-secret-4", &[1, 2, 3, 4, 5]);
        assert_eq!(chap::decode_binary(&get(&p, "CHAP_R").unwrap()).unwrap(), expect.to_vec());
    }

    #[test]
    fn open_discovery_answers_none_to_a_chap_offer_and_is_not_authenticated() {
        let mut l = Login::new(policy(true, false), vec![9; 16], 42);
        let p = continue_pdu(l.step(&req(0, 1, true), format!("{DISCOVERY}AuthMethod=CHAP,None\0").as_bytes()));
        assert_eq!(get(&p, "AuthMethod").as_deref(), Some("None"));
        match l.step(&req(1, 3, true), b"") {
            Step::Ready(_, out) => assert!(!out.authenticated),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_normal_chap_login_is_authenticated_and_one_without_chap_is_not() {
        let mut l = Login::new(policy(true, false), vec![9; 16], 42);
        let (id, c) = chap_to_challenge(&mut l);
        let r = chap::encode_hex(&chap::response(id, b"alice-secret-1", &c));
        match l.step(&req(0, 3, true), format!("CHAP_N=alice\0CHAP_R={r}\0").as_bytes()) {
            Step::Ready(_, out) => assert!(out.authenticated),
            other => panic!("{other:?}"),
        }
        let mut l = Login::new(policy(false, false), vec![9; 16], 42);
        match l.step(&req(1, 3, true), names(IQN).as_bytes()) {
            Step::Ready(_, out) => assert!(!out.authenticated),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn sendtargets_lists_only_targets_the_session_could_log_in_to() {
        let target = |name: &str, chap: bool, initiators: &[&str]| TargetAuth {
            iqn: format!("iqn.2024-01.org.stics:{name}"),
            alias: None,
            chap: chap.then(|| Credentials { user: "u".into(), secret: "target-secret-6".into() }),
            mutual_chap: None,
            initiators: initiators.iter().map(|i| (*i).to_owned()).collect(),
            link: false,
        };
        let p = Policy {
            targets: vec![
                target("open", false, &[]),
                target("acl", false, &["iqn.2024-01.org.test:Friend"]),
                target("chap", true, &[]),
                target("chap-acl", true, &["iqn.2024-01.org.test:friend"]),
            ],
            discovery: DiscoveryAuth::default(),
            limits: Limits::default(),
            tpgt: 1,
        };
        let listed = |initiator: &str, authenticated: bool| {
            let names =
                p.listed(initiator, authenticated).into_iter().map(|t| t.iqn.rsplit(':').next().unwrap_or_default());
            names.map(str::to_owned).collect::<Vec<_>>()
        };
        assert_eq!(listed("iqn.2024-01.org.test:stranger", false), ["open"]);
        assert_eq!(listed("iqn.2024-01.org.test:friend", false), ["open", "acl"]);
        assert_eq!(listed("iqn.2024-01.org.test:stranger", true), ["open", "chap"]);
        assert_eq!(listed("iqn.2024-01.org.test:FRIEND", true), ["open", "acl", "chap", "chap-acl"]);
    }
}

//! Text requests in full feature phase (RFC 7143 §11.10, §11.11, Appendix C): SendTargets
//! discovery and key negotiation, with continuation in both directions (C bit and TTT) so that
//! neither side ever sends a segment larger than the other accepts.

#![deny(clippy::unwrap_used, clippy::indexing_slicing)]

use bytes::Bytes;
use stics_wire::keys::{self, SessionType};
use stics_wire::pdu::{Pdu, TextRequest, TextResponse, RESERVED_TAG};
use stics_wire::text;

/// Largest request text (over all continuation PDUs) the target accepts.
pub const MAX_TEXT: usize = 64 * 1024;

/// One target as discovery reports it.
#[derive(Debug, Clone)]
pub struct Listing {
    pub iqn: String,
    /// `TargetAddress` values: `HOST:PORT,TPGT`.
    pub addresses: Vec<String>,
}

/// What the session knows that a text exchange needs.
#[derive(Debug, Clone)]
pub struct Context<'a> {
    pub session_type: SessionType,
    /// The target of a normal session.
    pub target: Option<&'a str>,
    /// Targets this initiator may see.
    pub visible: &'a [Listing],
    /// The initiator's MaxRecvDataSegmentLength.
    pub max_xmit: u32,
}

/// Why a text request cannot be answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    /// A TTT that names no pending response.
    #[error("unknown target transfer tag")]
    UnknownTtt,
    /// More text than [`MAX_TEXT`].
    #[error("text request too long")]
    TooLong,
}

/// The result of a text request.
#[derive(Debug)]
pub struct Answer {
    pub pdu: Pdu,
    /// A new MaxRecvDataSegmentLength the initiator declared.
    pub max_xmit: Option<u32>,
}

/// Text exchange state of one connection.
#[derive(Debug, Default)]
pub struct TextState {
    incoming: Vec<u8>,
    /// The TTT (and ITT) under which the initiator sends the rest of a continued request.
    more_in: Option<(u32, u32)>,
    /// The rest of a long response and the TTT that asks for it.
    outgoing: Option<(u32, u32, Bytes)>,
    next_ttt: u32,
}

impl TextState {
    fn ttt(&mut self) -> u32 {
        self.next_ttt = self.next_ttt.wrapping_add(1);
        if self.next_ttt == RESERVED_TAG {
            self.next_ttt = 1;
        }
        self.next_ttt
    }

    fn reset(&mut self) {
        self.incoming.clear();
        self.more_in = None;
        self.outgoing = None;
    }

    /// Answers one Text Request.
    pub fn request(&mut self, req: &TextRequest, data: &[u8], ctx: &Context<'_>) -> Result<Answer, TextError> {
        let base = TextResponse { lun: req.lun, itt: req.itt, ttt: RESERVED_TAG, final_: true, ..Default::default() };
        if req.ttt == RESERVED_TAG {
            // RFC 7143 §11.10.4: the reserved TTT starts a new request; whatever was under way,
            // half a request or half an answer, is dropped.
            self.reset();
        } else if self.more_in == Some((req.ttt, req.itt)) {
            // The initiator copies our TTT into each PDU that continues its request.
            self.more_in = None;
        } else {
            let Some((ttt, itt, rest)) = self.outgoing.take() else {
                self.reset();
                return Err(TextError::UnknownTtt);
            };
            if ttt != req.ttt || itt != req.itt {
                self.reset();
                return Err(TextError::UnknownTtt);
            }
            return Ok(Answer { pdu: self.chunk(base, rest, ctx.max_xmit), max_xmit: None });
        }
        if self.incoming.len() + data.len() > MAX_TEXT {
            self.reset();
            return Err(TextError::TooLong);
        }
        self.incoming.extend_from_slice(data);
        if req.cont {
            let mut h = base;
            h.final_ = false;
            h.ttt = self.ttt();
            self.more_in = Some((h.ttt, req.itt));
            return Ok(Answer { pdu: Pdu::new(h, Bytes::new()), max_xmit: None });
        }
        let all = std::mem::take(&mut self.incoming);
        let pairs = text::parse(&all).unwrap_or_default();
        let mut out: Vec<(String, String)> = Vec::new();
        let mut max_xmit = None;
        for (k, v) in &pairs {
            match k.as_str() {
                "SendTargets" => send_targets(v, ctx, &mut out),
                "MaxRecvDataSegmentLength" => match v.parse::<u32>() {
                    Ok(n) if (512..=16_777_215).contains(&n) => max_xmit = Some(n),
                    _ => out.push((k.clone(), keys::REJECT.into())),
                },
                _ => match keys::lookup(k) {
                    None => out.push((k.clone(), keys::NOT_UNDERSTOOD.into())),
                    Some(def) if def.normal_only && ctx.session_type == SessionType::Discovery => {
                        out.push((k.clone(), keys::IRRELEVANT.into()));
                    }
                    // Leading-only and login-only keys cannot change in full feature phase.
                    Some(_) => out.push((k.clone(), keys::REJECT.into())),
                },
            }
        }
        let body = text::encode(&out);
        let limit = max_xmit.unwrap_or(ctx.max_xmit);
        Ok(Answer { pdu: self.chunk(base, body, limit), max_xmit })
    }

    fn chunk(&mut self, mut h: TextResponse, body: Bytes, limit: u32) -> Pdu {
        let limit = limit.max(512) as usize;
        if body.len() <= limit {
            return Pdu::new(h, body);
        }
        let ttt = self.ttt();
        h.final_ = false;
        h.cont = true;
        h.ttt = ttt;
        self.outgoing = Some((ttt, h.itt, body.slice(limit..)));
        Pdu::new(h, body.slice(..limit))
    }
}

fn send_targets(v: &str, ctx: &Context<'_>, out: &mut Vec<(String, String)>) {
    let wanted: Vec<&Listing> = match (v, ctx.session_type) {
        ("All", SessionType::Discovery) => ctx.visible.iter().collect(),
        ("All" | "", SessionType::Normal) => {
            ctx.visible.iter().filter(|l| ctx.target.is_some_and(|t| t.eq_ignore_ascii_case(&l.iqn))).collect()
        }
        ("", SessionType::Discovery) => Vec::new(),
        (name, _) => ctx.visible.iter().filter(|l| l.iqn.eq_ignore_ascii_case(name)).collect(),
    };
    for l in wanted {
        out.push(("TargetName".into(), l.iqn.clone()));
        for a in &l.addresses {
            out.push(("TargetAddress".into(), a.clone()));
        }
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::*;

    fn listings() -> Vec<Listing> {
        vec![
            Listing { iqn: "iqn.2024-01.org.stics:a".into(), addresses: vec!["127.0.0.1:3260,1".into()] },
            Listing { iqn: "iqn.2024-01.org.stics:b".into(), addresses: vec!["127.0.0.1:3260,1".into()] },
        ]
    }

    fn req(data: &[u8]) -> (TextRequest, Vec<u8>) {
        (TextRequest { final_: true, itt: 4, ttt: RESERVED_TAG, ..Default::default() }, data.to_vec())
    }

    #[test]
    fn send_targets_all_lists_every_visible_target_in_discovery() {
        let l = listings();
        let ctx = Context { session_type: SessionType::Discovery, target: None, visible: &l, max_xmit: 8192 };
        let mut s = TextState::default();
        let (r, d) = req(b"SendTargets=All\0");
        let a = s.request(&r, &d, &ctx).unwrap();
        let kv = text::parse(&a.pdu.data).unwrap();
        assert_eq!(kv.len(), 4);
        assert_eq!(kv[0], ("TargetName".into(), "iqn.2024-01.org.stics:a".into()));
        assert_eq!(kv[1], ("TargetAddress".into(), "127.0.0.1:3260,1".into()));
    }

    #[test]
    fn send_targets_in_a_normal_session_reports_only_its_target() {
        let l = listings();
        let ctx = Context {
            session_type: SessionType::Normal,
            target: Some("iqn.2024-01.org.stics:b"),
            visible: &l,
            max_xmit: 8192,
        };
        let mut s = TextState::default();
        let (r, d) = req(b"SendTargets=All\0");
        let kv = text::parse(&s.request(&r, &d, &ctx).unwrap().pdu.data).unwrap();
        assert_eq!(kv.len(), 2);
        assert_eq!(kv[0].1, "iqn.2024-01.org.stics:b");
    }

    #[test]
    fn long_answers_continue_under_a_target_transfer_tag() {
        let l: Vec<Listing> = (0..100)
            .map(|i| Listing {
                iqn: format!("iqn.2024-01.org.stics:target-number-{i}"),
                addresses: vec!["127.0.0.1:3260,1".into()],
            })
            .collect();
        let ctx = Context { session_type: SessionType::Discovery, target: None, visible: &l, max_xmit: 512 };
        let mut s = TextState::default();
        let (r, d) = req(b"SendTargets=All\0");
        let mut a = s.request(&r, &d, &ctx).unwrap().pdu;
        let mut body = Vec::new();
        let mut rounds = 0;
        loop {
            let stics_wire::Header::TextResponse(h) = a.header else { panic!() };
            assert!(a.data.len() <= 512);
            body.extend_from_slice(&a.data);
            if h.final_ {
                break;
            }
            rounds += 1;
            let next = TextRequest { final_: true, itt: 4, ttt: h.ttt, ..Default::default() };
            a = s.request(&next, &[], &ctx).unwrap().pdu;
        }
        assert!(rounds > 5);
        assert_eq!(text::parse(&body).unwrap().len(), 200);
    }

    #[test]
    fn unknown_keys_are_not_understood_and_login_keys_rejected() {
        let l = listings();
        let ctx = Context {
            session_type: SessionType::Normal,
            target: Some("iqn.2024-01.org.stics:a"),
            visible: &l,
            max_xmit: 8192,
        };
        let mut s = TextState::default();
        let (r, d) = req(b"X-foo=1\0InitialR2T=No\0MaxRecvDataSegmentLength=4096\0");
        let a = s.request(&r, &d, &ctx).unwrap();
        let kv = text::parse(&a.pdu.data).unwrap();
        assert_eq!(kv, vec![("X-foo".into(), "NotUnderstood".into()), ("InitialR2T".into(), "Reject".into())]);
        assert_eq!(a.max_xmit, Some(4096));
    }

    #[test]
    fn a_request_continues_under_the_ttt_the_target_gave_back() {
        let l = listings();
        let ctx = Context { session_type: SessionType::Discovery, target: None, visible: &l, max_xmit: 8192 };
        let mut s = TextState::default();
        let first = TextRequest { cont: true, itt: 4, ttt: RESERVED_TAG, ..Default::default() };
        let a = s.request(&first, b"SendTar", &ctx).unwrap();
        let stics_wire::Header::TextResponse(h) = a.pdu.header else { panic!() };
        assert!(!h.final_ && h.ttt != RESERVED_TAG && a.pdu.data.is_empty());
        // RFC 7143 §11.10.4: the initiator copies that TTT into the PDU that continues.
        let rest = TextRequest { final_: true, itt: 4, ttt: h.ttt, ..Default::default() };
        let a = s.request(&rest, b"gets=All\0", &ctx).unwrap();
        assert_eq!(text::parse(&a.pdu.data).unwrap().len(), 4);
    }

    #[test]
    fn a_new_request_drops_half_a_request() {
        let l = listings();
        let ctx = Context { session_type: SessionType::Discovery, target: None, visible: &l, max_xmit: 8192 };
        let mut s = TextState::default();
        let first = TextRequest { cont: true, itt: 4, ttt: RESERVED_TAG, ..Default::default() };
        let ttt = s.request(&first, b"X-garbage=", &ctx).unwrap().pdu.header;
        let stics_wire::Header::TextResponse(h) = ttt else { panic!() };
        let (r, d) = req(b"SendTargets=All\0");
        let kv = text::parse(&s.request(&r, &d, &ctx).unwrap().pdu.data).unwrap();
        assert_eq!(kv.len(), 4, "the new request is answered alone");
        // The abandoned request's TTT names nothing now.
        let late = TextRequest { final_: true, itt: 4, ttt: h.ttt, ..Default::default() };
        assert_eq!(s.request(&late, b"", &ctx).unwrap_err(), TextError::UnknownTtt);
    }

    #[test]
    fn a_ttt_that_names_nothing_is_an_error() {
        let l = listings();
        let ctx = Context { session_type: SessionType::Discovery, target: None, visible: &l, max_xmit: 8192 };
        let mut s = TextState::default();
        let r = TextRequest { final_: true, itt: 4, ttt: 99, ..Default::default() };
        assert_eq!(s.request(&r, &[], &ctx).unwrap_err(), TextError::UnknownTtt);
    }

    #[test]
    fn naming_a_target_that_is_not_visible_reveals_nothing() {
        // The session sees only target a (b is hidden from it by its ACL or CHAP).
        let l = listings()[..1].to_vec();
        for (session_type, target) in
            [(SessionType::Discovery, None), (SessionType::Normal, Some("iqn.2024-01.org.stics:a"))]
        {
            let ctx = Context { session_type, target, visible: &l, max_xmit: 8192 };
            let mut s = TextState::default();
            let (r, d) = req(b"SendTargets=iqn.2024-01.org.stics:b\0");
            let a = s.request(&r, &d, &ctx).unwrap();
            assert!(a.pdu.data.is_empty(), "{session_type}: {:?}", a.pdu.data);
        }
    }

    #[test]
    fn send_targets_all_with_nothing_visible_is_an_empty_answer() {
        let ctx = Context { session_type: SessionType::Discovery, target: None, visible: &[], max_xmit: 8192 };
        let mut s = TextState::default();
        let (r, d) = req(b"SendTargets=All\0");
        let a = s.request(&r, &d, &ctx).unwrap();
        let stics_wire::Header::TextResponse(h) = a.pdu.header else { panic!() };
        assert!(h.final_ && a.pdu.data.is_empty());
    }
}

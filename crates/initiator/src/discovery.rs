//! SendTargets discovery (RFC 7143 §12.3, Appendix C): a discovery session that asks for every
//! target and its portals, then logs out.

#![deny(clippy::unwrap_used, clippy::indexing_slicing)]

use std::sync::Arc;

use bytes::Bytes;
use stics_wire::{logout, text, Digests, Header, LogoutRequest, Pdu, TextRequest, RESERVED_TAG};

use crate::conn;
use crate::counters::Counters;
use crate::driver::{random_isid, Config};
use crate::login::LoginConfig;
use crate::url::IscsiUrl;
use crate::Error;

/// A target as SendTargets reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetEntry {
    pub name: String,
    /// `address:port,tpgt` strings.
    pub addresses: Vec<String>,
}

/// Groups SendTargets text pairs into targets.
pub fn parse_send_targets(pairs: &[(String, String)]) -> Vec<TargetEntry> {
    let mut out: Vec<TargetEntry> = Vec::new();
    for (k, v) in pairs {
        match k.as_str() {
            "TargetName" => out.push(TargetEntry { name: v.clone(), addresses: Vec::new() }),
            "TargetAddress" => {
                if let Some(t) = out.last_mut() {
                    t.addresses.push(v.clone());
                }
            }
            _ => {}
        }
    }
    out
}

/// Lists the targets behind the portal of `url`.
pub async fn discover(url: &IscsiUrl, cfg: &Config, counters: Arc<Counters>) -> Result<Vec<TargetEntry>, Error> {
    let portal = url.portal();
    let lcfg = LoginConfig {
        initiator_name: cfg.initiator_name.clone(),
        target_name: None,
        isid: random_isid(0),
        tsih: 0,
        cid: 0,
        itt: 0,
        cmd_sn: 1,
        chap: url.chap.clone(),
        mutual_challenge: (rand::random(), rand::random()),
        offer: cfg.offer.clone(),
    };
    let (mut c, outcome) = conn::open(&portal, lcfg, counters.clone(), cfg.login_timeout, cfg.tls.as_ref()).await?;
    let digests = Digests { header: outcome.params.header_digest, data: outcome.params.data_digest };
    let mut cmd_sn = outcome.exp_cmd_sn;
    let mut exp_stat_sn = outcome.exp_stat_sn;
    let run = async {
        let mut collected = Vec::new();
        let mut req =
            TextRequest { final_: true, itt: 1, ttt: RESERVED_TAG, cmd_sn, exp_stat_sn, ..Default::default() };
        let mut data = text::encode(&[("SendTargets", "All")]);
        loop {
            conn::send(&mut c.writer, &Pdu::new(req, data.clone()), digests, &counters, &portal).await?;
            let resp = c.reader.next().await?;
            let Header::TextResponse(r) = resp.header else {
                return Err(Error::Protocol(format!("expected a Text Response, got {:?}", resp.header.opcode())));
            };
            exp_stat_sn = r.stat_sn.wrapping_add(1);
            collected.extend_from_slice(&resp.data);
            if r.final_ && !r.cont {
                break;
            }
            // More to come: an empty request with the target's transfer tag asks for it.
            cmd_sn = cmd_sn.wrapping_add(1);
            req = TextRequest { final_: true, itt: 1, ttt: r.ttt, cmd_sn, exp_stat_sn, ..Default::default() };
            data = Bytes::new();
        }
        cmd_sn = cmd_sn.wrapping_add(1);
        let pairs = text::parse(&collected).map_err(|e| Error::Protocol(e.to_string()))?;
        let lo = LogoutRequest { immediate: true, reason: logout::CLOSE_SESSION, itt: 2, cid: 0, cmd_sn, exp_stat_sn };
        conn::send(&mut c.writer, &Pdu::new(lo, Bytes::new()), digests, &counters, &portal).await?;
        let _ = c.reader.next().await;
        Ok(parse_send_targets(&pairs))
    };
    tokio::time::timeout(cfg.login_timeout * 2, run)
        .await
        .map_err(|_| Error::Timeout { addr: portal.clone(), during: "discovery" })?
}

#[cfg(test)]
#[expect(clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn send_targets_pairs_group_by_target() {
        let p = |k: &str, v: &str| (k.to_owned(), v.to_owned());
        let pairs = vec![
            p("TargetName", "iqn.a"),
            p("TargetAddress", "127.0.0.1:3260,1"),
            p("TargetAddress", "[::1]:3260,1"),
            p("TargetName", "iqn.b"),
        ];
        let t = parse_send_targets(&pairs);
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].addresses.len(), 2);
        assert!(t[1].addresses.is_empty());
    }
}

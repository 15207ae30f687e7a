//! A remote LUN of a stics SG as a [`GroupSink`]: a group goes as LINK WRITE pieces of at most
//! one command's transfer, queued together on the first write session (the SG stages them per
//! nexus), then LINK COMMIT; LINK STATUS reads what the SG holds. See the `stics-link` crate.

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use stics_block::{BlockError, GroupSink};
use stics_link::{cdb as link_cdb, group, status::Status};
use stics_sam::sense::{asc, key as sense_key};
use stics_sam::status;

use crate::core::{Data, Request};
use crate::driver::Session;
use crate::lun::{execute_retrying, Lun};
use crate::Error;

/// What the SG said of the link when the LUN was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkInfo {
    /// The link version both ends speak.
    pub version: u32,
    /// The largest encoded group the SG takes.
    pub max_group: u32,
    /// The SG's commit waits for pieces still on their way
    /// ([`stics_link::status::FEATURE_COMMIT_WAITS`]): the commit goes right behind them.
    pub commit_waits: bool,
    /// The SG takes groups strictly in sequence ([`stics_link::status::FEATURE_IN_ORDER`]): two
    /// may be out at once.
    pub in_order: bool,
}

/// Largest LINK STATUS answer read (32 bytes and 40 per source: about 1,600 sources).
const STATUS_ALLOC: u32 = 64 * 1024;

/// Times a group is sent again whole after a transient failure (a lost connection took the
/// pieces staged on its nexus, the SG was busy or reset) before the commit fails.
const ATTEMPTS: u32 = 20;

/// The SG's status, read with retries of transient statuses.
pub(crate) async fn read_status(s: &Session, lun: u64) -> Result<Status, Error> {
    let req = Request::new(lun, link_cdb::status(0, STATUS_ALLOC), Data::Read(STATUS_ALLOC));
    let out = execute_retrying(s, req, s.counters_ref()).await?;
    Status::decode(&out.data).map_err(|e| Error::Protocol(format!("LINK STATUS answer: {e}")))
}

/// What the SG's link support is, from the session's login and a LINK STATUS: `None` when the
/// target did not take the login key or this LUN takes no groups.
pub(crate) async fn probe(s: &Session, lun: u64) -> Option<LinkInfo> {
    let version = stics_link::negotiated(s.private_answer(stics_link::LOGIN_KEY).as_deref())?;
    match read_status(s, lun).await {
        Ok(st) => Some(LinkInfo {
            version,
            max_group: st.max_group,
            commit_waits: st.features & stics_link::status::FEATURE_COMMIT_WAITS != 0,
            in_order: st.features & stics_link::status::FEATURE_IN_ORDER != 0,
        }),
        Err(e) => {
            tracing::info!(lun, "the target speaks the link but this LUN takes no groups: {e}");
            None
        }
    }
}

/// True when a failed attempt may succeed when the whole group is sent again.
fn worth_again(e: &Error) -> bool {
    match e {
        Error::Scsi { status: status::BUSY | status::TASK_SET_FULL | status::TASK_ABORTED, .. } => true,
        Error::Scsi { status: status::CHECK_CONDITION, sense: Some(s), .. } => {
            matches!(s.key, sense_key::UNIT_ATTENTION | sense_key::NOT_READY | sense_key::ABORTED_COMMAND)
                || (s.key == sense_key::ILLEGAL_REQUEST && (s.asc, s.ascq) == asc::COMMAND_SEQUENCE_ERROR)
        }
        _ => false,
    }
}

/// What a failed commit means to the cache above.
fn commit_err(e: Error) -> BlockError {
    let text = e.to_string();
    match e {
        Error::Scsi { status: status::CHECK_CONDITION, sense: Some(s), .. } if s.key == sense_key::ILLEGAL_REQUEST => {
            if (s.asc, s.ascq) == asc::INVALID_COMMAND_OPERATION_CODE {
                BlockError::Unsupported("the target no longer takes groups")
            } else {
                BlockError::Rejected(text)
            }
        }
        other => Lun::io_err(0, other),
    }
}

impl Lun {
    /// One attempt: every piece queued at once, and the commit right behind them when the SG's
    /// commit waits for pieces on their way (one round trip in all), else once all arrived.
    async fn ship(&self, s: &Session, seq: u64, g: &Bytes) -> Result<(), Error> {
        let piece = (self.max_blocks as usize * self.geometry.block_size as usize).max(4096);
        let mut waits = Vec::with_capacity(g.len().div_ceil(piece));
        let mut off = 0usize;
        while off < g.len() {
            let end = (off + piece).min(g.len());
            let cdb = link_cdb::write(seq, off as u32);
            waits.push(s.submit(Request::new(self.lun, cdb, Data::Write(g.slice(off..end)))));
            off = end;
        }
        let commit = || Request::new(self.lun, link_cdb::commit(seq, g.len() as u32), Data::None);
        let early = self.link.is_some_and(|l| l.commit_waits).then(|| s.submit(commit()));
        let mut first_err = None;
        for w in waits {
            let failed = match w.await {
                Ok(out) if out.status == status::GOOD => None,
                Ok(out) => Some(Error::scsi(link_cdb::LINK_WRITE, &out)),
                Err(e) => Some(e),
            };
            first_err = first_err.or(failed);
        }
        // An early commit is waited for even after a refused piece (which fails it too, the
        // piece's status saying why): left behind, a commit sent again after a reconnection could
        // take the next attempt's pieces and leave that attempt's own commit waiting.
        let early = match early {
            Some(c) => Some(c.await),
            None => None,
        };
        if let Some(e) = first_err {
            return Err(e);
        }
        let out = match early {
            Some(out) => out?,
            None => s.execute(commit()).await?,
        };
        if out.status != status::GOOD {
            return Err(Error::scsi(link_cdb::LINK_COMMIT, &out));
        }
        Ok(())
    }
}

#[async_trait]
impl GroupSink for Lun {
    fn max_group(&self) -> u32 {
        self.link.map_or(0, |l| l.max_group)
    }

    fn groups_in_flight(&self) -> u32 {
        match self.link {
            Some(l) if l.in_order => stics_link::status::GROUPS_IN_FLIGHT,
            _ => 1,
        }
    }

    async fn commit(&self, g: Bytes) -> Result<(), BlockError> {
        let head = group::peek(&g).map_err(|e| BlockError::Rejected(format!("not a group: {e}")))?;
        let s = self.write_sessions().first().ok_or(BlockError::Unsupported("a LUN without sessions"))?;
        let mut attempt = 0u32;
        loop {
            let claims = self.claims.load(SeqCst);
            let e = match self.ship(s, head.seq, &g).await {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            attempt += 1;
            let conflict = matches!(e, Error::Scsi { status: status::RESERVATION_CONFLICT, .. });
            if conflict && self.claim_key.load(SeqCst) != 0 && attempt < ATTEMPTS {
                if self.reclaim(claims).await.map_err(commit_err)? {
                    continue;
                }
                return Err(commit_err(e));
            }
            if !worth_again(&e) || attempt >= ATTEMPTS {
                return Err(commit_err(e));
            }
            tracing::debug!(seq = head.seq, attempt, "sending group again: {e}");
            tokio::time::sleep(Duration::from_millis(u64::from(attempt.min(10)) * 10)).await;
        }
    }

    async fn tokens(&self, exchange: Bytes, new_connection: bool) -> Result<(), BlockError> {
        let s = self.write_sessions().first().ok_or(BlockError::Unsupported("a LUN without sessions"))?;
        let cdb = link_cdb::tokens(new_connection, exchange.len() as u32);
        execute_retrying(s, Request::new(self.lun, cdb, Data::Write(exchange)), s.counters_ref())
            .await
            .map_err(commit_err)?;
        Ok(())
    }

    async fn token_poll(&self, gateway: u64, from: u32, wait: Duration, max: usize) -> Result<Bytes, BlockError> {
        let s = self.write_sessions().first().ok_or(BlockError::Unsupported("a LUN without sessions"))?;
        let alloc = max.min(u32::MAX as usize) as u32;
        let wait_ms = wait.as_millis().min(u128::from(u16::MAX)) as u16;
        let req = Request::new(self.lun, link_cdb::poll(gateway, from, wait_ms), Data::Read(alloc));
        let out = execute_retrying(s, req, s.counters_ref()).await.map_err(commit_err)?;
        Ok(out.data)
    }

    async fn link_status(&self, fence: u64) -> Result<Bytes, BlockError> {
        let s = self.write_sessions().first().ok_or(BlockError::Unsupported("a LUN without sessions"))?;
        let req = Request::new(self.lun, link_cdb::status(fence, STATUS_ALLOC), Data::Read(STATUS_ALLOC));
        let out = execute_retrying(s, req, s.counters_ref()).await.map_err(commit_err)?;
        Ok(out.data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stics_sam::Sense;

    fn check(key: u8, code: (u8, u8)) -> Error {
        Error::Scsi { opcode: 0xc5, status: status::CHECK_CONDITION, sense: Some(Sense::of(key, code)) }
    }

    #[test]
    fn lost_pieces_and_busy_targets_send_the_group_again_and_refusals_do_not() {
        assert!(worth_again(&check(sense_key::ILLEGAL_REQUEST, asc::COMMAND_SEQUENCE_ERROR)));
        assert!(worth_again(&check(sense_key::UNIT_ATTENTION, asc::POWER_ON_RESET)));
        assert!(worth_again(&Error::Scsi { opcode: 0xc4, status: status::BUSY, sense: None }));
        assert!(!worth_again(&check(sense_key::ILLEGAL_REQUEST, asc::INVALID_FIELD_IN_PARAMETER_LIST)));
        assert!(matches!(
            commit_err(check(sense_key::ILLEGAL_REQUEST, asc::INVALID_FIELD_IN_PARAMETER_LIST)),
            BlockError::Rejected(_)
        ));
        assert!(matches!(
            commit_err(check(sense_key::ILLEGAL_REQUEST, asc::INVALID_COMMAND_OPERATION_CODE)),
            BlockError::Unsupported(_)
        ));
    }
}

//! The vendor-specific SCSI commands (operation codes C4h–C8h, SPC-4's vendor range) that carry
//! groups and coherence tokens over an iSCSI session: LINK WRITE puts a piece of an encoded group
//! at an offset, LINK COMMIT asks the SG to take the assembled group (durable when it answers
//! GOOD), LINK STATUS reads what the SG holds of each source; LINK TOKENS hands the SG a gateway's
//! token messages and LINK POLL reads the ones for it, waiting a little for some.

use crate::{field, u32_at, u64_at, LinkError};

/// LINK WRITE: data-out is bytes `offset..` of group `seq`'s encoding.
pub const LINK_WRITE: u8 = 0xc4;
/// LINK COMMIT: group `seq`, `len` bytes long, is whole; GOOD once it is durable on the SG. An SG
/// whose status has [`crate::status::FEATURE_COMMIT_WAITS`] waits for pieces still on their way,
/// so the commit may go right behind them.
pub const LINK_COMMIT: u8 = 0xc5;
/// LINK STATUS: data-in is a [`crate::status::Status`] of at most `alloc` bytes. A non-zero
/// `fence` ([`crate::fence_of`] a source) also fences that source: a commit of its groups sent
/// before this read and not yet taken is refused, so that a gateway that restarted never sees a
/// group of its previous run land after it read what the SG holds.
pub const LINK_STATUS: u8 = 0xc6;
/// LINK TOKENS: data-out is a token exchange ([`crate::token::encode_exchange`]: the gateway's
/// source and its messages), `len` bytes; `new_connection` when the gateway starts afresh
/// (restarted, or it saw a gap in LINK POLL's numbers): the SG says its unanswered revokes again.
pub const LINK_TOKENS: u8 = 0xc7;
/// LINK POLL: data-in is a poll answer ([`crate::token::encode_answer`]) for the gateway whose
/// source folds to `gateway` ([`crate::fence_of`]), as long as the command's transfer length
/// allows: its messages from number `from` on, every earlier one acknowledged (the SG forgets
/// them). The SG answers at once when it has messages no poll of the gateway was answered with,
/// else when one comes, or when `wait_ms` milliseconds have passed, then with what is unread:
/// an answer lost with a connection is read again by a poll with the same `from`, at the end of
/// its wait. A gateway may keep two polls waiting; news answers one of them.
pub const LINK_POLL: u8 = 0xc8;

/// A decoded link command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkCdb {
    Write { seq: u64, offset: u32 },
    Commit { seq: u64, len: u32 },
    Status { fence: u64, alloc: u32 },
    Tokens { new_connection: bool, len: u32 },
    Poll { gateway: u64, from: u32, wait_ms: u16 },
}

fn cdb(op: u8, a: u64, b: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op;
    c[2..10].copy_from_slice(&a.to_be_bytes());
    c[10..14].copy_from_slice(&b.to_be_bytes());
    c
}

/// LINK WRITE of group `seq` at `offset`.
pub fn write(seq: u64, offset: u32) -> [u8; 16] {
    cdb(LINK_WRITE, seq, offset)
}

/// LINK COMMIT of group `seq`, `len` bytes long.
pub fn commit(seq: u64, len: u32) -> [u8; 16] {
    cdb(LINK_COMMIT, seq, len)
}

/// LINK STATUS into `alloc` bytes, fencing `fence` (0: none).
pub fn status(fence: u64, alloc: u32) -> [u8; 16] {
    cdb(LINK_STATUS, fence, alloc)
}

/// LINK TOKENS of an exchange `len` bytes long.
pub fn tokens(new_connection: bool, len: u32) -> [u8; 16] {
    let mut c = cdb(LINK_TOKENS, 0, len);
    c[1] = u8::from(new_connection);
    c
}

/// LINK POLL for `gateway`'s messages from number `from` on, waiting up to `wait_ms`.
pub fn poll(gateway: u64, from: u32, wait_ms: u16) -> [u8; 16] {
    let mut c = cdb(LINK_POLL, gateway, from);
    c[14..16].copy_from_slice(&wait_ms.to_be_bytes());
    c
}

/// True for the link's operation codes.
pub fn is_link(opcode: u8) -> bool {
    matches!(opcode, LINK_WRITE | LINK_COMMIT | LINK_STATUS | LINK_TOKENS | LINK_POLL)
}

/// Decodes a link command (a 16-byte CDB whose operation code [`is_link`]).
pub fn decode(c: &[u8]) -> Result<LinkCdb, LinkError> {
    if c.len() < 16 {
        return Err(LinkError::Truncated { need: 16, got: c.len() });
    }
    let (a, b) = (u64_at(c, 2)?, u32_at(c, 10)?);
    match c.first().copied() {
        Some(LINK_WRITE) => Ok(LinkCdb::Write { seq: a, offset: b }),
        Some(LINK_COMMIT) => Ok(LinkCdb::Commit { seq: a, len: b }),
        Some(LINK_STATUS) => Ok(LinkCdb::Status { fence: a, alloc: b }),
        Some(LINK_TOKENS) => match c.get(1).copied() {
            Some(f @ (0 | 1)) if a == 0 => Ok(LinkCdb::Tokens { new_connection: f == 1, len: b }),
            _ => Err(field("LINK TOKENS", "reserved bits set")),
        },
        Some(LINK_POLL) => {
            let wait_ms = u16::from_be_bytes([c.get(14).copied().unwrap_or(0), c.get(15).copied().unwrap_or(0)]);
            Ok(LinkCdb::Poll { gateway: a, from: b, wait_ms })
        }
        other => Err(field("operation code", format!("{other:?} is no link command"))),
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn commands_round_trip_and_have_their_bytes_where_the_target_looks() {
        assert_eq!(decode(&write(7, 1 << 20)).unwrap(), LinkCdb::Write { seq: 7, offset: 1 << 20 });
        assert_eq!(decode(&commit(u64::MAX, 9)).unwrap(), LinkCdb::Commit { seq: u64::MAX, len: 9 });
        assert_eq!(decode(&status(9, 4096)).unwrap(), LinkCdb::Status { fence: 9, alloc: 4096 });
        assert_eq!(&commit(1, 2)[..], &[0xc5, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0]);
        assert!(decode(&[0xc4; 10]).is_err());
        assert!(decode(&[0x2a; 16]).is_err());
        assert_eq!(decode(&tokens(true, 80)).unwrap(), LinkCdb::Tokens { new_connection: true, len: 80 });
        assert_eq!(decode(&tokens(false, 0)).unwrap(), LinkCdb::Tokens { new_connection: false, len: 0 });
        assert_eq!(decode(&poll(7, 4096, 500)).unwrap(), LinkCdb::Poll { gateway: 7, from: 4096, wait_ms: 500 });
        assert_eq!(&poll(1, 2, 0x0102)[..], &[0xc8, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 1, 2]);
        let mut bad = tokens(false, 1);
        bad[1] = 4;
        assert!(decode(&bad).is_err());
        assert!(is_link(0xc6) && is_link(0xc8) && !is_link(0xc9));
    }
}

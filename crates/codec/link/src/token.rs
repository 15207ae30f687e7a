//! Coherence tokens between gateways and the SG that serves their shared LUN (seed 004 §3.4):
//! the messages both ways, in batches with a checksum. A token covers one segment (a run of
//! blocks of the LUN); shared-read lets a gateway cache the segment's blocks, exclusive-write
//! lets it write them and hold them dirty in its log.
//!
//! The paper's four messages (request, grant, revoke, release; upgrade and downgrade made of
//! them) with three beside them: `Done` ends an operation's claim to its place in line,
//! `Queued` tells a gateway that place (its ticket), and `Broken` tells a returning gateway that
//! an operator or its lease gave its token away. Every exclusive grant carries a generation no
//! earlier grant had: the SG refuses a write made under any other, which is what keeps a gateway
//! cut off from the SG from landing a write after its token moved on.
//!
//! Two more let a holder give a token up one round trip sooner, for an SG that announces them
//! ([`crate::status::FEATURE_RELEASE_AFTER`]): `ReleaseAfter` goes out beside the group that
//! ships the segment's writes and takes effect once the SG's journal holds the holder's epochs
//! through the one it names; `Hello`, in a gateway's first exchange of each start, names the
//! process, so that a late `ReleaseAfter` of a process that has since restarted is dropped.
//!
//! One more saves a reader a round trip, for an SG that announces it
//! ([`crate::status::FEATURE_GRANT_DATA`]): `Want` names the blocks an operation that asks for a
//! shared token will read, and the poll answer that carries the grant carries them too
//! ([`GrantData`], after the batch), as the SG held them when it answered.

use crate::{field, need, u32_at, u64_at, LinkError};

/// The magic of a batch.
pub const MAGIC: [u8; 4] = *b"STKN";
/// The version this build writes and reads.
pub const VERSION: u16 = 1;
/// Bytes before the first message.
pub const HEADER_LEN: usize = 16;
/// Bytes of one message.
pub const MSG_LEN: usize = 40;

/// What a token lets its holder do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// Shared-read: cache the segment's blocks; others may too.
    Shared,
    /// Exclusive-write: write them and hold them dirty; nobody else holds the segment.
    Exclusive,
}

impl Kind {
    /// True when a holder of `self` may do what `other` allows.
    pub fn covers(self, other: Kind) -> bool {
        self >= other
    }

    fn code(self) -> u8 {
        match self {
            Kind::Shared => 1,
            Kind::Exclusive => 2,
        }
    }

    fn from_code(c: u8) -> Option<Kind> {
        match c {
            1 => Some(Kind::Shared),
            2 => Some(Kind::Exclusive),
            _ => None,
        }
    }
}

/// One message. `op` is the gateway's number for one of its operations; `seg` a segment of the
/// LUN; `gen` the generation a token was granted under; `ticket` an operation's place in line at
/// the SG (smaller is older).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Msg {
    /// Gateway → SG: operation `op` needs `kind` on `seg` (an upgrade when it holds shared).
    Request { op: u64, seg: u64, kind: Kind },
    /// Gateway → SG: it gives up its token on `seg` granted under `gen`, keeping `keep` (a
    /// downgrade to shared) or nothing. An exclusive token's dirty data reached the SG first.
    Release { seg: u64, gen: u64, keep: Option<Kind> },
    /// Gateway → SG: operation `op` has all it asked for or gave up; its requests leave the line.
    Done { op: u64 },
    /// Gateway → SG: [`Msg::Release`], once the SG has committed the gateway's groups through
    /// epoch `after` (its writes to the segment are in them); from the process that said
    /// `Hello { nonce }` last.
    ReleaseAfter { seg: u64, gen: u64, keep: Option<Kind>, after: u64, nonce: u64 },
    /// Gateway → SG: this process is `nonce` (larger for each start); its first exchange says it.
    Hello { nonce: u64 },
    /// Gateway → SG: operation `op`, which asks for a shared token on `seg` beside this, will
    /// read `blocks` blocks of the segment from its block `first`: they may come with the grant.
    Want { op: u64, seg: u64, first: u32, blocks: u32 },
    /// SG → gateway: operation `op` waits, and its place in line is `ticket`.
    Queued { op: u64, ticket: u64 },
    /// SG → gateway: `kind` on `seg` for operation `op`, under generation `gen`.
    Grant { op: u64, seg: u64, kind: Kind, gen: u64, ticket: u64 },
    /// SG → gateway: give up the token on `seg` granted under `gen`, keeping `keep`, for the
    /// operation holding `ticket`.
    Revoke { seg: u64, gen: u64, keep: Option<Kind>, ticket: u64 },
    /// SG → gateway: its token on `seg` granted under `gen` was taken away while it did not
    /// answer; writes it made under it are refused and belong in quarantine.
    Broken { seg: u64, gen: u64 },
}

impl Msg {
    /// True for the messages a gateway sends.
    pub fn from_gateway(&self) -> bool {
        matches!(
            self,
            Msg::Request { .. }
                | Msg::Release { .. }
                | Msg::Done { .. }
                | Msg::ReleaseAfter { .. }
                | Msg::Hello { .. }
                | Msg::Want { .. }
        )
    }

    /// The segment it is about, if one.
    pub fn seg(&self) -> Option<u64> {
        match *self {
            Msg::Request { seg, .. }
            | Msg::Release { seg, .. }
            | Msg::ReleaseAfter { seg, .. }
            | Msg::Grant { seg, .. }
            | Msg::Revoke { seg, .. }
            | Msg::Broken { seg, .. }
            | Msg::Want { seg, .. } => Some(seg),
            Msg::Done { .. } | Msg::Queued { .. } | Msg::Hello { .. } => None,
        }
    }
}

/// A message's fields as they sit on the wire.
#[derive(Default)]
struct Raw {
    code: u8,
    kind: u8,
    keep: u8,
    op: u64,
    seg: u64,
    gen: u64,
    ticket: u64,
}

const REQUEST: u8 = 1;
const RELEASE: u8 = 2;
const DONE: u8 = 3;
const RELEASE_AFTER: u8 = 4;
const HELLO: u8 = 5;
const WANT: u8 = 6;
const QUEUED: u8 = 16;
const GRANT: u8 = 17;
const REVOKE: u8 = 18;
const BROKEN: u8 = 19;

fn keep_code(k: Option<Kind>) -> u8 {
    k.map_or(0, Kind::code)
}

fn raw(m: &Msg) -> Raw {
    match *m {
        Msg::Request { op, seg, kind } => Raw { code: REQUEST, kind: kind.code(), op, seg, ..Raw::default() },
        Msg::Release { seg, gen, keep } => Raw { code: RELEASE, keep: keep_code(keep), seg, gen, ..Raw::default() },
        Msg::Done { op } => Raw { code: DONE, op, ..Raw::default() },
        Msg::ReleaseAfter { seg, gen, keep, after, nonce } => {
            Raw { code: RELEASE_AFTER, keep: keep_code(keep), op: after, seg, gen, ticket: nonce, ..Raw::default() }
        }
        Msg::Hello { nonce } => Raw { code: HELLO, ticket: nonce, ..Raw::default() },
        Msg::Want { op, seg, first, blocks } => {
            Raw { code: WANT, op, seg, gen: u64::from(first), ticket: u64::from(blocks), ..Raw::default() }
        }
        Msg::Queued { op, ticket } => Raw { code: QUEUED, op, ticket, ..Raw::default() },
        Msg::Grant { op, seg, kind, gen, ticket } => {
            Raw { code: GRANT, kind: kind.code(), op, seg, gen, ticket, ..Raw::default() }
        }
        Msg::Revoke { seg, gen, keep, ticket } => {
            Raw { code: REVOKE, keep: keep_code(keep), seg, gen, ticket, ..Raw::default() }
        }
        Msg::Broken { seg, gen } => Raw { code: BROKEN, seg, gen, ..Raw::default() },
    }
}

/// Encodes a batch of messages.
pub fn encode(msgs: &[Msg]) -> Vec<u8> {
    let mut body = Vec::with_capacity(msgs.len() * MSG_LEN);
    for m in msgs {
        let r = raw(m);
        body.extend_from_slice(&[r.code, r.kind, r.keep, 0, 0, 0, 0, 0]);
        for v in [r.op, r.seg, r.gen, r.ticket] {
            body.extend_from_slice(&v.to_be_bytes());
        }
    }
    let mut b = Vec::with_capacity(HEADER_LEN + body.len());
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&VERSION.to_be_bytes());
    b.extend_from_slice(&[0, 0]);
    b.extend_from_slice(&(msgs.len() as u32).to_be_bytes());
    b.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
    b.extend_from_slice(&body);
    b
}

/// Decodes a batch of at most `max` messages; anything a writer never produces is an error.
pub fn decode(b: &[u8], max: usize) -> Result<Vec<Msg>, LinkError> {
    need(b, HEADER_LEN)?;
    if b.get(..4) != Some(&MAGIC[..]) {
        return Err(LinkError::Magic);
    }
    let version = u32_at(b, 4)? >> 16;
    if version != u32::from(VERSION) {
        return Err(LinkError::Version(version as u16));
    }
    if u32_at(b, 4)? & 0xffff != 0 {
        return Err(field("reserved", "not zero"));
    }
    let count = u32_at(b, 8)? as usize;
    if count > max {
        return Err(field("count", format!("{count} messages, at most {max} taken")));
    }
    let len = HEADER_LEN + count * MSG_LEN;
    need(b, len)?;
    if b.len() != len {
        return Err(field("length", format!("{} bytes for {count} messages", b.len())));
    }
    let body = b.get(HEADER_LEN..).unwrap_or_default();
    let (stored, computed) = (u32_at(b, 12)?, crc32c::crc32c(body));
    if stored != computed {
        return Err(LinkError::Checksum { what: "token batch", stored, computed });
    }
    (0..count).map(|i| one(body, i * MSG_LEN)).collect()
}

fn one(b: &[u8], at: usize) -> Result<Msg, LinkError> {
    let head = u64_at(b, at)?.to_be_bytes();
    let [code, kind, keep, pad @ ..] = head;
    if pad != [0; 5] {
        return Err(field("message", "reserved bytes not zero"));
    }
    let (op, seg, gen, ticket) = (u64_at(b, at + 8)?, u64_at(b, at + 16)?, u64_at(b, at + 24)?, u64_at(b, at + 32)?);
    let kind_of = |c: u8| Kind::from_code(c).ok_or_else(|| field("kind", format!("{c} is no token kind")));
    // A release or revoke leaves at most a shared token: keeping exclusive is no change.
    let keep_of = |c: u8| match c {
        0 => Ok(None),
        1 => Ok(Some(Kind::Shared)),
        _ => Err(field("keep", format!("{c} is not nothing or shared"))),
    };
    // Each message names which fields it uses; the others must be zero.
    let unused = |used: [bool; 6]| {
        let fields = [u64::from(kind), u64::from(keep), op, seg, gen, ticket];
        if fields.iter().zip(used).any(|(v, u)| !u && *v != 0) {
            return Err(field("message", format!("type {code} has a field it does not use set")));
        }
        Ok(())
    };
    let m = match code {
        REQUEST => {
            unused([true, false, true, true, false, false])?;
            Msg::Request { op, seg, kind: kind_of(kind)? }
        }
        RELEASE => {
            unused([false, true, false, true, true, false])?;
            Msg::Release { seg, gen, keep: keep_of(keep)? }
        }
        DONE => {
            unused([false, false, true, false, false, false])?;
            Msg::Done { op }
        }
        RELEASE_AFTER => {
            unused([false, true, true, true, true, true])?;
            Msg::ReleaseAfter { seg, gen, keep: keep_of(keep)?, after: op, nonce: ticket }
        }
        HELLO => {
            unused([false, false, false, false, false, true])?;
            Msg::Hello { nonce: ticket }
        }
        WANT => {
            unused([false, false, true, true, true, true])?;
            let first = u32::try_from(gen).map_err(|_| field("first", format!("{gen} is past any segment")))?;
            let blocks = match u32::try_from(ticket) {
                Ok(n) if n > 0 => n,
                _ => return Err(field("blocks", format!("{ticket} is no count of blocks to read"))),
            };
            Msg::Want { op, seg, first, blocks }
        }
        QUEUED => {
            unused([false, false, true, false, false, true])?;
            Msg::Queued { op, ticket }
        }
        GRANT => {
            unused([true, false, true, true, true, true])?;
            Msg::Grant { op, seg, kind: kind_of(kind)?, gen, ticket }
        }
        REVOKE => {
            unused([false, true, false, true, true, true])?;
            Msg::Revoke { seg, gen, keep: keep_of(keep)?, ticket }
        }
        BROKEN => {
            unused([false, false, false, true, true, false])?;
            Msg::Broken { seg, gen }
        }
        c => return Err(field("type", format!("{c} is no token message"))),
    };
    Ok(m)
}

/// Bytes of a gateway's source before its batch in an exchange.
pub const SOURCE_LEN: usize = 16;

/// A gateway's exchange (LINK TOKENS' data-out): its source (its log's UUID) and its messages.
pub fn encode_exchange(source: &[u8; 16], msgs: &[Msg]) -> Vec<u8> {
    let mut b = source.to_vec();
    b.extend_from_slice(&encode(msgs));
    b
}

/// Reads an exchange of at most `max` messages.
pub fn decode_exchange(b: &[u8], max: usize) -> Result<([u8; 16], Vec<Msg>), LinkError> {
    need(b, SOURCE_LEN)?;
    let (source, rest) = b.split_at(SOURCE_LEN);
    let mut s = [0u8; SOURCE_LEN];
    s.copy_from_slice(source);
    Ok((s, decode(rest, max)?))
}

/// Bytes of a poll answer before its batch: the number of its first message.
pub const ANSWER_LEN: usize = 4;

/// The longest prefix of `msgs` whose poll answer fits in `alloc` bytes.
pub fn fitting(msgs: usize, alloc: usize) -> usize {
    msgs.min(alloc.saturating_sub(ANSWER_LEN + HEADER_LEN) / MSG_LEN)
}

/// A poll answer (LINK POLL's data-in): the SG's number of its first message, then the batch.
/// The gateway numbers the next as `first + msgs.len()`; a `first` other than the `from` it
/// asked for means messages were lost (the SG restarted, or it gave up on a gateway that did
/// not poll), and the gateway starts again as after a lost connection.
pub fn encode_answer(first: u32, msgs: &[Msg]) -> Vec<u8> {
    let mut b = first.to_be_bytes().to_vec();
    b.extend_from_slice(&encode(msgs));
    b
}

/// Reads a poll answer of at most `max` messages.
pub fn decode_answer(b: &[u8], max: usize) -> Result<(u32, Vec<Msg>), LinkError> {
    need(b, ANSWER_LEN)?;
    let (first, rest) = b.split_at(ANSWER_LEN);
    Ok((u32_at(first, 0)?, decode(rest, max)?))
}

/// Blocks that go with a shared grant in a poll answer: `data` is the segment `seg`'s blocks from
/// its block `first` on, as the SG held them when it answered; `gen` is the grant's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantData {
    pub seg: u64,
    pub gen: u64,
    pub first: u32,
    pub data: Vec<u8>,
}

/// The magic of a poll answer's data, after its batch.
pub const DATA_MAGIC: [u8; 4] = *b"STKD";
/// Bytes of the data's header (magic, count, checksum of what follows).
pub const DATA_HEADER_LEN: usize = 12;
/// Bytes before each piece's blocks (segment, generation, first block, length).
pub const DATA_ITEM_LEN: usize = 24;

/// Bytes a poll answer of `msgs` messages takes before any data.
pub fn answer_len(msgs: usize) -> usize {
    ANSWER_LEN + HEADER_LEN + msgs * MSG_LEN
}

/// A poll answer with the blocks that go with its grants after the batch (none: the plain
/// answer, which an SG that does not announce [`crate::status::FEATURE_GRANT_DATA`] sends).
pub fn encode_answer_data(first: u32, msgs: &[Msg], data: &[GrantData]) -> Vec<u8> {
    let mut b = encode_answer(first, msgs);
    if data.is_empty() {
        return b;
    }
    let mut body = Vec::with_capacity(data.iter().map(|d| DATA_ITEM_LEN + d.data.len()).sum());
    for d in data {
        body.extend_from_slice(&d.seg.to_be_bytes());
        body.extend_from_slice(&d.gen.to_be_bytes());
        body.extend_from_slice(&d.first.to_be_bytes());
        body.extend_from_slice(&(d.data.len() as u32).to_be_bytes());
        body.extend_from_slice(&d.data);
    }
    b.extend_from_slice(&DATA_MAGIC);
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
    b.extend_from_slice(&body);
    b
}

/// Reads a poll answer of at most `max` messages and as many pieces of data, with the data after
/// its batch if there is any.
pub fn decode_answer_data(b: &[u8], max: usize) -> Result<(u32, Vec<Msg>, Vec<GrantData>), LinkError> {
    need(b, ANSWER_LEN + HEADER_LEN)?;
    let count = u32_at(b, ANSWER_LEN + 8)? as usize;
    if count > max {
        return Err(field("count", format!("{count} messages, at most {max} taken")));
    }
    let end = answer_len(count);
    need(b, end)?;
    let (head, rest) = b.split_at(end);
    let (first, msgs) = decode_answer(head, max)?;
    if rest.is_empty() {
        return Ok((first, msgs, Vec::new()));
    }
    need(rest, DATA_HEADER_LEN)?;
    if rest.get(..4) != Some(&DATA_MAGIC[..]) {
        return Err(field("data", "no data magic after the batch"));
    }
    let items = u32_at(rest, 4)? as usize;
    if items == 0 || items > max {
        return Err(field("data", format!("{items} pieces, 1 to {max} taken")));
    }
    let body = rest.get(DATA_HEADER_LEN..).unwrap_or_default();
    let (stored, computed) = (u32_at(rest, 8)?, crc32c::crc32c(body));
    if stored != computed {
        return Err(LinkError::Checksum { what: "grant data", stored, computed });
    }
    let mut data = Vec::with_capacity(items);
    let mut at = 0;
    for _ in 0..items {
        need(body, at + DATA_ITEM_LEN)?;
        let (seg, gen, first) = (u64_at(body, at)?, u64_at(body, at + 8)?, u32_at(body, at + 16)?);
        let len = u32_at(body, at + 20)? as usize;
        if len == 0 {
            return Err(field("data", "a piece of no blocks"));
        }
        at += DATA_ITEM_LEN;
        let bytes = body.get(at..at + len).ok_or(LinkError::Truncated { need: at + len, got: body.len() })?;
        data.push(GrantData { seg, gen, first, data: bytes.to_vec() });
        at += len;
    }
    if at != body.len() {
        return Err(field("data", format!("{} bytes after the last piece", body.len() - at)));
    }
    Ok((first, msgs, data))
}

#[cfg(test)]
#[expect(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn every_kind() -> Vec<Msg> {
        vec![
            Msg::Request { op: 1, seg: 2, kind: Kind::Exclusive },
            Msg::Release { seg: 3, gen: 4, keep: Some(Kind::Shared) },
            Msg::Release { seg: 3, gen: 4, keep: None },
            Msg::Done { op: 5 },
            Msg::ReleaseAfter { seg: 3, gen: 4, keep: None, after: 21, nonce: 22 },
            Msg::Hello { nonce: 23 },
            Msg::Queued { op: 6, ticket: 7 },
            Msg::Grant { op: 8, seg: 9, kind: Kind::Shared, gen: 10, ticket: 11 },
            Msg::Revoke { seg: 12, gen: 13, keep: None, ticket: 14 },
            Msg::Broken { seg: 15, gen: u64::MAX },
            Msg::Want { op: 16, seg: 17, first: 18, blocks: 19 },
        ]
    }

    #[test]
    fn a_batch_has_its_bytes_where_the_reader_looks() {
        let b = encode(&[Msg::Request { op: 1, seg: 0x0102, kind: Kind::Shared }]);
        let mut want = b"STKN\x00\x01\x00\x00\x00\x00\x00\x01".to_vec();
        let body: Vec<u8> =
            [&[1u8, 1, 0, 0, 0, 0, 0, 0][..], &1u64.to_be_bytes(), &0x0102u64.to_be_bytes(), &[0; 16]].concat();
        want.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
        want.extend_from_slice(&body);
        assert_eq!(b, want);
        assert_eq!(encode(&[]).len(), HEADER_LEN);
    }

    #[test]
    fn every_message_round_trips_and_says_who_sends_it() {
        let msgs = every_kind();
        assert_eq!(decode(&encode(&msgs), 64).unwrap(), msgs);
        let from: Vec<bool> = msgs.iter().map(Msg::from_gateway).collect();
        assert_eq!(from, [true, true, true, true, true, true, false, false, false, false, true]);
        assert!(Kind::Exclusive.covers(Kind::Shared) && !Kind::Shared.covers(Kind::Exclusive));
    }

    #[test]
    fn a_conditional_release_and_a_hello_have_their_fields_where_the_reader_looks() {
        let b = encode(&[Msg::ReleaseAfter { seg: 7, gen: 8, keep: Some(Kind::Shared), after: 9, nonce: 10 }]);
        let body: Vec<u8> = [
            &[4u8, 0, 1, 0, 0, 0, 0, 0][..],
            &9u64.to_be_bytes(),
            &7u64.to_be_bytes(),
            &8u64.to_be_bytes(),
            &10u64.to_be_bytes(),
        ]
        .concat();
        assert_eq!(&b[HEADER_LEN..], &body[..]);
        let b = encode(&[Msg::Hello { nonce: 0x0102 }]);
        let body: Vec<u8> = [&[5u8, 0, 0, 0, 0, 0, 0, 0][..], &[0; 24], &0x0102u64.to_be_bytes()].concat();
        assert_eq!(&b[HEADER_LEN..], &body[..]);
        // A hello with a segment set is no hello a writer makes.
        let mut b = b;
        b[HEADER_LEN + 23] = 1;
        assert!(matches!(decode(&resealed(b), 1), Err(LinkError::Field { field: "message", .. })));
    }

    #[test]
    fn a_want_has_its_fields_where_the_reader_looks_and_asks_for_some_blocks() {
        let b = encode(&[Msg::Want { op: 3, seg: 4, first: 5, blocks: 6 }]);
        let body: Vec<u8> = [
            &[6u8, 0, 0, 0, 0, 0, 0, 0][..],
            &3u64.to_be_bytes(),
            &4u64.to_be_bytes(),
            &5u64.to_be_bytes(),
            &6u64.to_be_bytes(),
        ]
        .concat();
        assert_eq!(&b[HEADER_LEN..], &body[..]);
        // No blocks, or a count or a first block past 32 bits, is no want a writer makes.
        for (at, v) in [(HEADER_LEN + 39, 0u8), (HEADER_LEN + 35, 1), (HEADER_LEN + 27, 1)] {
            let mut b = b.clone();
            b[at] = v;
            assert!(matches!(decode(&resealed(b), 1), Err(LinkError::Field { .. })));
        }
    }

    #[test]
    fn a_poll_answer_carries_grant_data_after_its_batch() {
        let msgs = [Msg::Grant { op: 1, seg: 2, kind: Kind::Shared, gen: 3, ticket: 4 }];
        let data = [
            GrantData { seg: 2, gen: 3, first: 7, data: vec![0xab; 5] },
            GrantData { seg: 9, gen: 10, first: 0, data: vec![1] },
        ];
        let b = encode_answer_data(77, &msgs, &data);
        let at = answer_len(1);
        assert_eq!(&b[..at], &encode_answer(77, &msgs)[..]);
        let body: Vec<u8> = [
            &2u64.to_be_bytes()[..],
            &3u64.to_be_bytes(),
            &7u32.to_be_bytes(),
            &5u32.to_be_bytes(),
            &[0xab; 5],
            &9u64.to_be_bytes(),
            &10u64.to_be_bytes(),
            &0u32.to_be_bytes(),
            &1u32.to_be_bytes(),
            &[1],
        ]
        .concat();
        assert_eq!(&b[at..at + 8], b"STKD\x00\x00\x00\x02");
        assert_eq!(&b[at + 8..at + 12], &crc32c::crc32c(&body).to_be_bytes());
        assert_eq!(&b[at + DATA_HEADER_LEN..], &body[..]);
        assert_eq!(decode_answer_data(&b, 8).unwrap(), (77, msgs.to_vec(), data.to_vec()));
        // No data: the plain answer, which both readers take.
        let plain = encode_answer_data(5, &msgs, &[]);
        assert_eq!(plain, encode_answer(5, &msgs));
        assert_eq!(decode_answer_data(&plain, 8).unwrap(), (5, msgs.to_vec(), vec![]));
        // The plain reader takes no data.
        assert!(decode_answer(&b, 8).is_err());
    }

    #[test]
    fn corrupt_grant_data_is_refused_with_what_is_wrong() {
        let msgs = [Msg::Done { op: 1 }];
        let good = encode_answer_data(1, &msgs, &[GrantData { seg: 1, gen: 2, first: 3, data: vec![4; 8] }]);
        let at = answer_len(1);
        let reseal = |mut b: Vec<u8>| {
            let crc = crc32c::crc32c(&b[at + DATA_HEADER_LEN..]);
            b[at + 8..at + 12].copy_from_slice(&crc.to_be_bytes());
            b
        };
        let mut b = good.clone();
        b[at] = b'X';
        assert!(matches!(decode_answer_data(&b, 8), Err(LinkError::Field { field: "data", .. })));
        let mut b = good.clone();
        b[at + DATA_HEADER_LEN + 30] ^= 1;
        assert!(matches!(decode_answer_data(&b, 8), Err(LinkError::Checksum { .. })));
        assert!(decode_answer_data(&good[..good.len() - 1], 8).is_err());
        assert!(decode_answer_data(&good[..at + 5], 8).is_err());
        let mut b = good.clone();
        b.push(0);
        assert!(decode_answer_data(&reseal(b), 8).is_err(), "bytes after the last piece");
        let mut b = good.clone();
        b[at + 7] = 9;
        assert!(
            matches!(decode_answer_data(&b, 8), Err(LinkError::Field { field: "data", .. })),
            "more pieces than taken"
        );
        let mut b = good.clone();
        b[at + 7] = 0;
        assert!(matches!(decode_answer_data(&b, 8), Err(LinkError::Field { field: "data", .. })), "none");
        let mut b = good.clone();
        b[at + DATA_HEADER_LEN + 23] = 0;
        assert!(decode_answer_data(&reseal(b), 8).is_err(), "a piece of no blocks");
        let mut b = good;
        b[at + DATA_HEADER_LEN + 23] = 200;
        assert!(matches!(decode_answer_data(&reseal(b), 8), Err(LinkError::Truncated { .. })));
    }

    #[test]
    fn corrupt_batches_are_refused_with_what_is_wrong() {
        let good = encode(&every_kind());
        assert!(matches!(decode(&good, 3), Err(LinkError::Field { field: "count", .. })));
        assert!(matches!(decode(&good[..20], 64), Err(LinkError::Truncated { .. })));
        let mut longer = good.clone();
        longer.push(0);
        assert!(matches!(decode(&longer, 64), Err(LinkError::Field { field: "length", .. })));
        let mut b = good.clone();
        b[0] = b'X';
        assert_eq!(decode(&b, 64), Err(LinkError::Magic));
        let mut b = good.clone();
        b[5] = 2;
        assert_eq!(decode(&b, 64), Err(LinkError::Version(2)));
        let mut b = good.clone();
        b[HEADER_LEN + 30] ^= 1;
        assert!(matches!(decode(&b, 64), Err(LinkError::Checksum { .. })));
    }

    /// Re-seals a batch whose body was changed, so that the message checks are what refuse it.
    fn resealed(mut b: Vec<u8>) -> Vec<u8> {
        let crc = crc32c::crc32c(&b[HEADER_LEN..]);
        b[12..16].copy_from_slice(&crc.to_be_bytes());
        b
    }

    #[test]
    fn a_message_no_writer_produces_is_refused() {
        let one = |m: Msg| encode(&[m]);
        let request = one(Msg::Request { op: 1, seg: 2, kind: Kind::Shared });
        let mut b = request.clone();
        b[HEADER_LEN] = 9;
        assert!(matches!(decode(&resealed(b), 1), Err(LinkError::Field { field: "type", .. })));
        let mut b = request.clone();
        b[HEADER_LEN + 1] = 3;
        assert!(matches!(decode(&resealed(b), 1), Err(LinkError::Field { field: "kind", .. })));
        let mut b = request.clone();
        b[HEADER_LEN + 39] = 1;
        assert!(matches!(decode(&resealed(b), 1), Err(LinkError::Field { field: "message", .. })));
        let mut b = request;
        b[HEADER_LEN + 5] = 1;
        assert!(matches!(decode(&resealed(b), 1), Err(LinkError::Field { field: "message", .. })));
        let mut b = one(Msg::Release { seg: 1, gen: 1, keep: None });
        b[HEADER_LEN + 2] = 2;
        assert!(matches!(decode(&resealed(b), 1), Err(LinkError::Field { field: "keep", .. })));
    }

    #[test]
    fn an_exchange_carries_its_source_and_a_poll_takes_what_fits() {
        let msgs = every_kind();
        let b = encode_exchange(&[9; 16], &msgs);
        assert_eq!(decode_exchange(&b, 64).unwrap(), ([9; 16], msgs.clone()));
        assert!(matches!(decode_exchange(&b[..10], 64), Err(LinkError::Truncated { .. })));
        assert_eq!(fitting(10, ANSWER_LEN + HEADER_LEN + 3 * MSG_LEN + 5), 3);
        assert_eq!(fitting(2, 1 << 20), 2);
        assert_eq!(fitting(2, 3), 0);
        let answer = encode_answer(77, &msgs[..2]);
        assert_eq!(&answer[..4], &[0, 0, 0, 77]);
        assert_eq!(decode_answer(&answer, 64).unwrap(), (77, msgs[..2].to_vec()));
        assert!(decode_answer(&answer[..3], 64).is_err());
    }

    fn any_kind() -> impl Strategy<Value = Kind> {
        prop_oneof![Just(Kind::Shared), Just(Kind::Exclusive)]
    }

    fn any_keep() -> impl Strategy<Value = Option<Kind>> {
        prop_oneof![Just(None), Just(Some(Kind::Shared))]
    }

    fn any_msg() -> impl Strategy<Value = Msg> {
        let n = any::<u64>;
        prop_oneof![
            (n(), n(), any_kind()).prop_map(|(op, seg, kind)| Msg::Request { op, seg, kind }),
            (n(), n(), any_keep()).prop_map(|(seg, gen, keep)| Msg::Release { seg, gen, keep }),
            n().prop_map(|op| Msg::Done { op }),
            (n(), n(), any_keep(), n(), n()).prop_map(|(seg, gen, keep, after, nonce)| Msg::ReleaseAfter {
                seg,
                gen,
                keep,
                after,
                nonce
            }),
            n().prop_map(|nonce| Msg::Hello { nonce }),
            (n(), n()).prop_map(|(op, ticket)| Msg::Queued { op, ticket }),
            (n(), n(), any_kind(), n(), n()).prop_map(|(op, seg, kind, gen, ticket)| Msg::Grant {
                op,
                seg,
                kind,
                gen,
                ticket
            }),
            (n(), n(), any_keep(), n()).prop_map(|(seg, gen, keep, ticket)| Msg::Revoke { seg, gen, keep, ticket }),
            (n(), n()).prop_map(|(seg, gen)| Msg::Broken { seg, gen }),
            (n(), n(), any::<u32>(), 1..=u32::MAX).prop_map(|(op, seg, first, blocks)| Msg::Want {
                op,
                seg,
                first,
                blocks
            }),
        ]
    }

    fn any_data() -> impl Strategy<Value = GrantData> {
        (any::<u64>(), any::<u64>(), any::<u32>(), proptest::collection::vec(any::<u8>(), 1..64))
            .prop_map(|(seg, gen, first, data)| GrantData { seg, gen, first, data })
    }

    proptest! {
        #[test]
        fn any_batch_round_trips(msgs in proptest::collection::vec(any_msg(), 0..40)) {
            prop_assert_eq!(decode(&encode(&msgs), 40).unwrap(), msgs);
        }

        #[test]
        fn any_answer_with_data_round_trips(
            first in any::<u32>(),
            msgs in proptest::collection::vec(any_msg(), 0..8),
            data in proptest::collection::vec(any_data(), 0..8),
        ) {
            let b = encode_answer_data(first, &msgs, &data);
            prop_assert_eq!(decode_answer_data(&b, 8).unwrap(), (first, msgs, data));
        }

        #[test]
        fn no_bytes_panic_the_decoder(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&b, 4);
            let _ = decode_answer_data(&b, 4);
        }
    }
}

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
            Msg::Request { .. } | Msg::Release { .. } | Msg::Done { .. } | Msg::ReleaseAfter { .. } | Msg::Hello { .. }
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
            | Msg::Broken { seg, .. } => Some(seg),
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
        assert_eq!(from, [true, true, true, true, true, true, false, false, false, false]);
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
        ]
    }

    proptest! {
        #[test]
        fn any_batch_round_trips(msgs in proptest::collection::vec(any_msg(), 0..40)) {
            prop_assert_eq!(decode(&encode(&msgs), 40).unwrap(), msgs);
        }

        #[test]
        fn no_bytes_panic_the_decoder(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&b, 4);
        }
    }
}

//! Framing: how long a PDU is on the wire, splitting a received frame into a [`Pdu`] with digest
//! checks, and turning a [`Pdu`] into wire bytes. Two steps, as in mini-redis: a cheap
//! [`check`] that says complete / incomplete / invalid, then [`parse`].

use bytes::{BufMut, Bytes, BytesMut};

use crate::digest;
use crate::pdu::{Bhs, Header, HeaderError, Pdu, BHS_LEN};

/// Which digests are in force on a connection (RFC 7143 §13.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

/// Why a buffer does not hold a PDU (yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// More bytes are needed; the whole frame is this long (48 until the BHS is in).
    #[error("incomplete PDU: {0} bytes needed")]
    Incomplete(usize),
    /// The data segment is longer than this side's MaxRecvDataSegmentLength allows.
    #[error("data segment of {len} bytes exceeds the limit of {max}")]
    TooLarge { len: u32, max: u32 },
}

/// Why a complete frame could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The frame is shorter than its own lengths say.
    #[error("truncated PDU")]
    Truncated,
    /// The header digest does not match: the lengths cannot be trusted (drop the connection).
    #[error("header digest mismatch: computed {computed:#010x}, received {received:#010x}")]
    HeaderDigest { computed: u32, received: u32 },
    /// The data digest does not match; the header is intact, so the PDU can be rejected.
    #[error("data digest mismatch on a {opcode:?} PDU")]
    DataDigest { bhs: Box<Bhs>, opcode: crate::pdu::Opcode },
    /// The header is not a PDU this codec knows.
    #[error("{source}")]
    Header {
        bhs: Box<Bhs>,
        #[source]
        source: HeaderError,
    },
}

/// Lengths read from a BHS: (TotalAHSLength in bytes, DataSegmentLength).
pub fn segment_lengths(bhs: &Bhs) -> (usize, u32) {
    let ahs = usize::from(bhs[4]) * 4;
    let dsl = u32::from_be_bytes([0, bhs[5], bhs[6], bhs[7]]);
    (ahs, dsl)
}

fn pad4(n: usize) -> usize {
    (4 - n % 4) % 4
}

/// Total wire length of the PDU whose BHS this is.
pub fn frame_len(bhs: &Bhs, digests: Digests) -> usize {
    let (ahs, dsl) = segment_lengths(bhs);
    let dsl = dsl as usize;
    let mut n = BHS_LEN + ahs;
    if digests.header {
        n += 4;
    }
    if dsl > 0 {
        n += dsl + pad4(dsl);
        if digests.data {
            n += 4;
        }
    }
    n
}

fn bhs_of(buf: &[u8]) -> Option<Bhs> {
    let mut b = [0u8; BHS_LEN];
    b.copy_from_slice(buf.get(..BHS_LEN)?);
    Some(b)
}

/// Says whether `buf` starts with a whole PDU and how long it is. `max_data` is the largest
/// data segment this side accepts (its declared MaxRecvDataSegmentLength, or the login limit).
pub fn check(buf: &[u8], digests: Digests, max_data: u32) -> Result<usize, FrameError> {
    let bhs = bhs_of(buf).ok_or(FrameError::Incomplete(BHS_LEN))?;
    let (_, dsl) = segment_lengths(&bhs);
    if dsl > max_data {
        return Err(FrameError::TooLarge { len: dsl, max: max_data });
    }
    let total = frame_len(&bhs, digests);
    if buf.len() < total {
        return Err(FrameError::Incomplete(total));
    }
    Ok(total)
}

fn digest_at(frame: &[u8], at: usize) -> Option<u32> {
    let b = frame.get(at..at + 4)?;
    Some(digest::from_wire([*b.first()?, *b.get(1)?, *b.get(2)?, *b.get(3)?]))
}

/// Decodes one whole frame (as sized by [`check`]), verifying digests. AHS and data are
/// zero-copy slices of `frame`; the data segment is returned without padding.
pub fn parse(frame: Bytes, digests: Digests) -> Result<Pdu, DecodeError> {
    let bhs = bhs_of(&frame).ok_or(DecodeError::Truncated)?;
    let (ahs_len, dsl) = segment_lengths(&bhs);
    let dsl = dsl as usize;
    if frame.len() < frame_len(&bhs, digests) {
        return Err(DecodeError::Truncated);
    }
    let mut at = BHS_LEN + ahs_len;
    if digests.header {
        let computed = digest::crc32c(&[frame.get(..at).ok_or(DecodeError::Truncated)?]);
        let received = digest_at(&frame, at).ok_or(DecodeError::Truncated)?;
        if computed != received {
            return Err(DecodeError::HeaderDigest { computed, received });
        }
        at += 4;
    }
    let header = Header::decode(&bhs).map_err(|source| DecodeError::Header { bhs: Box::new(bhs), source })?;
    let data = if dsl > 0 {
        let data = frame.slice(at..at + dsl);
        if digests.data {
            let padded = frame.get(at..at + dsl + pad4(dsl)).ok_or(DecodeError::Truncated)?;
            let received = digest_at(&frame, at + dsl + pad4(dsl)).ok_or(DecodeError::Truncated)?;
            if digest::crc32c(&[padded]) != received {
                return Err(DecodeError::DataDigest { bhs: Box::new(bhs), opcode: header.opcode() });
            }
        }
        data
    } else {
        Bytes::new()
    };
    Ok(Pdu { header, ahs: frame.slice(BHS_LEN..BHS_LEN + ahs_len), data })
}

/// Appends the bytes before the data segment (BHS, AHS, header digest) to `out`.
fn put_head(pdu: &Pdu, digests: Digests, out: &mut BytesMut) {
    let mut bhs = pdu.header.encode();
    let ahs_words = pdu.ahs.len().div_ceil(4).min(255);
    bhs[4] = ahs_words as u8;
    let dsl = (pdu.data.len() as u32).min(0x00ff_ffff);
    let dsl_bytes = dsl.to_be_bytes();
    bhs[5..8].copy_from_slice(&dsl_bytes[1..4]);
    let start = out.len();
    out.reserve(BHS_LEN + ahs_words * 4 + 4);
    out.put_slice(&bhs);
    out.put_slice(&pdu.ahs);
    out.put_bytes(0, ahs_words * 4 - pdu.ahs.len().min(ahs_words * 4));
    if digests.header {
        let crc = digest::crc32c(&[out.get(start..).unwrap_or_default()]);
        out.put_slice(&digest::to_wire(crc));
    }
}

/// Appends the bytes after the data segment (padding, data digest) to `out`.
fn put_tail(pdu: &Pdu, digests: Digests, out: &mut BytesMut) {
    if pdu.data.is_empty() {
        return;
    }
    let pad = pad4(pdu.data.len());
    out.put_bytes(0, pad);
    if digests.data {
        let pad_bytes = [0u8; 3];
        let crc = digest::crc32c(&[&pdu.data, pad_bytes.get(..pad).unwrap_or_default()]);
        out.put_slice(&digest::to_wire(crc));
    }
}

/// The bytes before the data segment (BHS, AHS, header digest) and after it (padding, data
/// digest), so that a sender can write `head`, `pdu.data`, `tail` without copying the data.
pub fn encode_parts(pdu: &Pdu, digests: Digests) -> (Bytes, Bytes) {
    let mut head = BytesMut::new();
    put_head(pdu, digests, &mut head);
    let mut tail = BytesMut::new();
    put_tail(pdu, digests, &mut tail);
    (head.freeze(), tail.freeze())
}

/// Appends the whole wire form of `pdu` to `out`.
pub fn encode(pdu: &Pdu, digests: Digests, out: &mut BytesMut) {
    out.reserve(BHS_LEN + 8 + pdu.ahs.len() + pdu.data.len() + 8);
    put_head(pdu, digests, out);
    out.put_slice(&pdu.data);
    put_tail(pdu, digests, out);
}

/// The wire form of many PDUs for one vectored write: headers, digests, padding and data
/// segments shorter than a threshold are packed into one buffer; longer data segments are
/// referenced where they are, without a copy.
#[derive(Debug)]
pub struct Batch {
    packed: BytesMut,
    parts: Vec<Part>,
    run_start: usize,
    copy_below: usize,
}

#[derive(Debug)]
enum Part {
    Packed(std::ops::Range<usize>),
    Data(Bytes),
}

impl Batch {
    /// An empty batch; data segments shorter than `copy_below` bytes are copied.
    pub fn new(copy_below: usize) -> Batch {
        Batch { packed: BytesMut::with_capacity(8192), parts: Vec::new(), run_start: 0, copy_below }
    }

    /// Appends one PDU.
    pub fn push(&mut self, pdu: &Pdu, digests: Digests) {
        put_head(pdu, digests, &mut self.packed);
        if pdu.data.len() < self.copy_below {
            self.packed.put_slice(&pdu.data);
        } else {
            if self.packed.len() > self.run_start {
                self.parts.push(Part::Packed(self.run_start..self.packed.len()));
            }
            self.parts.push(Part::Data(pdu.data.clone()));
            self.run_start = self.packed.len();
        }
        put_tail(pdu, digests, &mut self.packed);
    }

    /// The chunks to write, in order.
    pub fn finish(mut self) -> Vec<Bytes> {
        if self.packed.len() > self.run_start {
            self.parts.push(Part::Packed(self.run_start..self.packed.len()));
        }
        let packed = self.packed.freeze();
        self.parts
            .into_iter()
            .map(|p| match p {
                Part::Packed(r) => packed.slice(r),
                Part::Data(b) => b,
            })
            .collect()
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::*;
    use crate::pdu::*;
    use proptest::prelude::*;

    fn nop(data: &'static [u8]) -> Pdu {
        Pdu::new(
            NopOut { immediate: true, itt: 1, ttt: RESERVED_TAG, cmd_sn: 3, ..Default::default() },
            Bytes::from_static(data),
        )
    }

    #[test]
    fn data_segment_is_padded_to_four_bytes() {
        let mut out = BytesMut::new();
        encode(&nop(b"abcde"), Digests::default(), &mut out);
        assert_eq!(out.len(), 48 + 8);
        assert_eq!(&out[5..8], &[0, 0, 5]);
        assert_eq!(&out[53..56], &[0, 0, 0]);
        assert_eq!(check(&out, Digests::default(), 8192), Ok(56));
        let p = parse(out.freeze(), Digests::default()).unwrap();
        assert_eq!(&p.data[..], b"abcde");
    }

    #[test]
    fn check_reports_incomplete_then_complete() {
        let d = Digests { header: true, data: true };
        let mut out = BytesMut::new();
        encode(&nop(b"xyz"), d, &mut out);
        assert_eq!(out.len(), 48 + 4 + 4 + 4);
        assert_eq!(check(&out[..10], d, 8192), Err(FrameError::Incomplete(48)));
        assert_eq!(check(&out[..50], d, 8192), Err(FrameError::Incomplete(60)));
        assert_eq!(check(&out, d, 8192), Ok(60));
    }

    #[test]
    fn oversized_data_segment_is_refused_before_reading_it() {
        let mut b = [0u8; 48];
        b[5] = 0x10;
        assert_eq!(check(&b, Digests::default(), 8192), Err(FrameError::TooLarge { len: 0x100000, max: 8192 }));
    }

    #[test]
    fn corrupted_digests_are_detected() {
        let d = Digests { header: true, data: true };
        let mut out = BytesMut::new();
        encode(&nop(b"hello"), d, &mut out);
        let mut bad = out.clone();
        bad[2] ^= 1;
        assert!(matches!(parse(bad.freeze(), d), Err(DecodeError::HeaderDigest { .. })));
        let mut bad = out.clone();
        bad[53] ^= 1;
        assert!(matches!(parse(bad.freeze(), d), Err(DecodeError::DataDigest { .. })));
        assert!(parse(out.freeze(), d).is_ok());
    }

    #[test]
    fn ahs_is_carried_and_counted_in_words() {
        let mut p = nop(b"");
        p.ahs = Bytes::from_static(&[0, 8, 1, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
        let mut out = BytesMut::new();
        encode(&p, Digests::default(), &mut out);
        assert_eq!(out[4], 3);
        let q = parse(out.freeze(), Digests::default()).unwrap();
        assert_eq!(q.ahs, p.ahs);
    }

    proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400), hd: bool, dd: bool) {
            let d = Digests { header: hd, data: dd };
            if let Ok(n) = check(&bytes, d, 1 << 24) {
                let _ = parse(Bytes::copy_from_slice(&bytes[..n]), d);
            }
            let _ = parse(Bytes::from(bytes), d);
        }

        #[test]
        fn encode_then_parse_round_trips(raw in proptest::array::uniform32(any::<u8>()),
                                         op in proptest::sample::select(vec![0x00u8, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x10,
                                             0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x31, 0x32, 0x3f]),
                                         data in proptest::collection::vec(any::<u8>(), 0..100), hd: bool, dd: bool) {
            let mut bhs = [0u8; 48];
            bhs[0] = op;
            bhs[1..33].copy_from_slice(&raw);
            let h = Header::decode(&bhs).unwrap();
            // Decoding canonicalises reserved bits; one more round must be exact.
            let h = Header::decode(&h.encode()).unwrap();
            let pdu = Pdu::new(h, Bytes::from(data));
            let d = Digests { header: hd, data: dd };
            let mut out = BytesMut::new();
            encode(&pdu, d, &mut out);
            prop_assert_eq!(check(&out, d, 1 << 24), Ok(out.len()));
            prop_assert_eq!(parse(out.freeze(), d).unwrap(), pdu);
        }
    }

    #[test]
    fn batch_matches_the_codec_byte_for_byte() {
        for digests in [Digests::default(), Digests { header: true, data: true }] {
            let pdus = vec![
                Pdu::new(
                    DataIn { itt: 1, status_present: true, final_: true, stat_sn: 4, ..Default::default() },
                    Bytes::from(vec![3u8; 4097]),
                ),
                Pdu::new(ScsiResponse { itt: 2, stat_sn: 5, ..Default::default() }, Bytes::from(vec![1u8; 5])),
                Pdu::new(R2t { itt: 3, ..Default::default() }, Bytes::new()),
                Pdu::new(DataIn { itt: 4, ..Default::default() }, Bytes::from(vec![9u8; 1024])),
            ];
            let mut b = Batch::new(1024);
            let mut expect = BytesMut::new();
            for p in &pdus {
                encode(p, digests, &mut expect);
                b.push(p, digests);
            }
            let chunks = b.finish();
            assert!(chunks.iter().any(|c| c.len() == 4097), "large data is referenced, not copied");
            let got: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
            assert_eq!(got, expect.to_vec());
        }
    }
}

//! A pure codec for the netfilter queue netlink protocol (nfnetlink_queue): the configuration
//! requests, verdicts (single and batch) and the packet messages the kernel sends.
//!
//! Only what the emulator needs: bind a queue, copy the first bytes of each packet, read the
//! packet id, length and kernel timestamp, and answer with verdicts. No socket here; see
//! [`crate::sys`].

/// `NETLINK_NETFILTER` protocol number.
pub const NETLINK_NETFILTER: i32 = 12;
const NFNL_SUBSYS_QUEUE: u16 = 3;

const NFQNL_MSG_PACKET: u16 = 0;
const NFQNL_MSG_VERDICT: u16 = 1;
const NFQNL_MSG_CONFIG: u16 = 2;
const NFQNL_MSG_VERDICT_BATCH: u16 = 3;

const NFQA_CFG_CMD: u16 = 1;
const NFQA_CFG_PARAMS: u16 = 2;
const NFQA_CFG_QUEUE_MAXLEN: u16 = 3;
const NFQA_CFG_MASK: u16 = 4;
const NFQA_CFG_FLAGS: u16 = 5;

/// The packet is handed over as the stack holds it: a checksum left for offload stays so (and a
/// GSO packet would stay whole; the emulator switches segmentation offloads off, so none come).
const NFQA_CFG_F_GSO: u32 = 4;

const NFQNL_CFG_CMD_BIND: u8 = 1;
const NFQNL_CFG_CMD_UNBIND: u8 = 2;
const NFQNL_COPY_PACKET: u8 = 2;

const NFQA_PACKET_HDR: u16 = 1;
const NFQA_VERDICT_HDR: u16 = 2;
const NFQA_TIMESTAMP: u16 = 4;
const NFQA_PAYLOAD: u16 = 10;
const NFQA_CAP_LEN: u16 = 13;

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;

const NLMSG_HDRLEN: usize = 16;
const NFGEN_HDRLEN: usize = 4;
const NLA_TYPE_MASK: u16 = 0x3fff;

/// Netfilter verdicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Drop = 0,
    Accept = 1,
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Appends one nfnetlink message for `queue` with the given attributes to `buf`.
fn push_msg(buf: &mut Vec<u8>, msg_type: u16, flags: u16, seq: u32, queue: u16, attrs: &[(u16, &[u8])]) {
    let start = buf.len();
    let len = NLMSG_HDRLEN + NFGEN_HDRLEN + attrs.iter().map(|(_, v)| align4(4 + v.len())).sum::<usize>();
    buf.extend_from_slice(&(len as u32).to_ne_bytes());
    buf.extend_from_slice(&((NFNL_SUBSYS_QUEUE << 8) | msg_type).to_ne_bytes());
    buf.extend_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    // nfgenmsg: family AF_UNSPEC, version 0, the queue number in network order.
    buf.extend_from_slice(&[0, 0]);
    buf.extend_from_slice(&queue.to_be_bytes());
    for (ty, val) in attrs {
        buf.extend_from_slice(&((4 + val.len()) as u16).to_ne_bytes());
        buf.extend_from_slice(&ty.to_ne_bytes());
        buf.extend_from_slice(val);
        buf.resize(align4(buf.len()), 0);
    }
    debug_assert_eq!(buf.len() - start, len);
}

/// Binds this socket to `queue` (acknowledged).
pub fn bind(queue: u16, seq: u32) -> Vec<u8> {
    let mut b = Vec::new();
    push_msg(&mut b, NFQNL_MSG_CONFIG, NLM_F_ACK, seq, queue, &[(NFQA_CFG_CMD, &[NFQNL_CFG_CMD_BIND, 0, 0, 0])]);
    b
}

/// Unbinds `queue` (acknowledged).
pub fn unbind(queue: u16, seq: u32) -> Vec<u8> {
    let mut b = Vec::new();
    push_msg(&mut b, NFQNL_MSG_CONFIG, NLM_F_ACK, seq, queue, &[(NFQA_CFG_CMD, &[NFQNL_CFG_CMD_UNBIND, 0, 0, 0])]);
    b
}

/// Asks for the first `copy_range` bytes of each packet and a queue of up to `maxlen` packets.
///
/// The queue is also told not to complete offloaded checksums before queueing: without that
/// flag the kernel computes every packet's checksum in software (and unshares cloned TCP
/// headers) only so user space could read a payload it never looks at.
pub fn params(queue: u16, seq: u32, copy_range: u32, maxlen: u32) -> Vec<u8> {
    let mut p = copy_range.to_be_bytes().to_vec();
    p.push(NFQNL_COPY_PACKET);
    let mut b = Vec::new();
    push_msg(
        &mut b,
        NFQNL_MSG_CONFIG,
        NLM_F_ACK,
        seq,
        queue,
        &[
            (NFQA_CFG_PARAMS, &p),
            (NFQA_CFG_QUEUE_MAXLEN, &maxlen.to_be_bytes()),
            (NFQA_CFG_MASK, &NFQA_CFG_F_GSO.to_be_bytes()),
            (NFQA_CFG_FLAGS, &NFQA_CFG_F_GSO.to_be_bytes()),
        ],
    );
    b
}

/// Appends a verdict for packet `id`; with `batch`, for every queued packet up to and including
/// `id`.
pub fn push_verdict(buf: &mut Vec<u8>, queue: u16, id: u32, verdict: Verdict, batch: bool) {
    let mut hdr = [0u8; 8];
    hdr[..4].copy_from_slice(&(verdict as u32).to_be_bytes());
    hdr[4..].copy_from_slice(&id.to_be_bytes());
    let ty = if batch { NFQNL_MSG_VERDICT_BATCH } else { NFQNL_MSG_VERDICT };
    push_msg(buf, ty, 0, 0, queue, &[(NFQA_VERDICT_HDR, &hdr)]);
}

/// One message read from the socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Msg {
    /// A queued packet: its id, its length on the wire (IP bytes) and, when the kernel stamped
    /// it, when it arrived (`CLOCK_REALTIME` nanoseconds, to the microsecond).
    Packet { queue: u16, id: u32, len: u32, stamp_ns: Option<u64> },
    /// An acknowledgement (`errno` 0) or an error for the request with `seq`.
    Ack { seq: u32, errno: i32 },
    /// Anything else (ignored).
    Other,
}

/// Why a buffer could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

fn u16_ne(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_ne(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u32_be(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_be(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// `struct nfqnl_msg_packet_timestamp`: seconds and microseconds, both big-endian 64-bit.
fn parse_stamp(val: &[u8]) -> Result<u64, Malformed> {
    let bad = Malformed("bad timestamp");
    let (sec, usec) = (u64_be(val, 0).ok_or(bad.clone())?, u64_be(val, 8).ok_or(bad.clone())?);
    sec.checked_mul(1_000_000_000).and_then(|ns| ns.checked_add(usec.checked_mul(1_000)?)).ok_or(bad)
}

/// Parses every netlink message in a datagram, calling `f` for each.
pub fn parse(buf: &[u8], mut f: impl FnMut(Msg)) -> Result<(), Malformed> {
    let mut off = 0;
    while off + NLMSG_HDRLEN <= buf.len() {
        let len = u32_ne(buf, off).ok_or(Malformed("short header"))? as usize;
        let ty = u16_ne(buf, off + 4).ok_or(Malformed("short header"))?;
        let seq = u32_ne(buf, off + 8).ok_or(Malformed("short header"))?;
        if len < NLMSG_HDRLEN || off + len > buf.len() {
            return Err(Malformed("message length out of bounds"));
        }
        let body = &buf[off + NLMSG_HDRLEN..off + len];
        let msg = if ty == NLMSG_ERROR {
            let e = u32_ne(body, 0).ok_or(Malformed("short error message"))? as i32;
            Msg::Ack { seq, errno: -e }
        } else if ty == NLMSG_DONE {
            Msg::Other
        } else if ty == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET {
            parse_packet(body)?
        } else {
            Msg::Other
        };
        f(msg);
        off += align4(len);
    }
    Ok(())
}

fn parse_packet(body: &[u8]) -> Result<Msg, Malformed> {
    let queue = body.get(2..4).map(|b| u16::from_be_bytes([b[0], b[1]])).ok_or(Malformed("short nfgenmsg"))?;
    let mut off = NFGEN_HDRLEN;
    let (mut id, mut payload_len, mut cap_len, mut stamp_ns) = (None, None, None, None);
    while off + 4 <= body.len() {
        let alen = u16_ne(body, off).ok_or(Malformed("short attribute"))? as usize;
        let aty = u16_ne(body, off + 2).ok_or(Malformed("short attribute"))? & NLA_TYPE_MASK;
        if alen < 4 || off + alen > body.len() {
            return Err(Malformed("attribute length out of bounds"));
        }
        let val = &body[off + 4..off + alen];
        match aty {
            NFQA_PACKET_HDR => id = Some(u32_be(val, 0).ok_or(Malformed("short packet header"))?),
            NFQA_PAYLOAD => payload_len = Some(val.len() as u32),
            NFQA_TIMESTAMP => stamp_ns = Some(parse_stamp(val)?),
            NFQA_CAP_LEN => cap_len = Some(u32_be(val, 0).ok_or(Malformed("short cap_len"))?),
            _ => {}
        }
        off += align4(alen);
    }
    let id = id.ok_or(Malformed("packet without a header"))?;
    Ok(Msg::Packet { queue, id, len: cap_len.or(payload_len).unwrap_or(0), stamp_ns })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A packet message as the kernel builds it.
    fn kernel_packet(queue: u16, id: u32, payload: &[u8], cap_len: Option<u32>) -> Vec<u8> {
        kernel_packet_at(queue, id, payload, cap_len, None)
    }

    fn kernel_packet_at(
        queue: u16,
        id: u32,
        payload: &[u8],
        cap_len: Option<u32>,
        stamp: Option<(u64, u64)>,
    ) -> Vec<u8> {
        let mut hdr = id.to_be_bytes().to_vec();
        hdr.extend_from_slice(&0x0800u16.to_be_bytes());
        hdr.push(0); // hook
        let cap = cap_len.map(u32::to_be_bytes);
        let ts: Option<Vec<u8>> = stamp.map(|(s, us)| [s.to_be_bytes(), us.to_be_bytes()].concat());
        let mut attrs: Vec<(u16, &[u8])> = vec![(NFQA_PACKET_HDR, &hdr)];
        if let Some(t) = &ts {
            attrs.push((NFQA_TIMESTAMP, t));
        }
        attrs.push((NFQA_PAYLOAD, payload));
        if let Some(c) = &cap {
            attrs.push((NFQA_CAP_LEN, c));
        }
        let mut b = Vec::new();
        push_msg(&mut b, NFQNL_MSG_PACKET, 0, 0, queue, &attrs);
        b
    }

    #[test]
    fn verdict_matches_kernel_layout() {
        let mut b = Vec::new();
        push_verdict(&mut b, 1, 0x01020304, Verdict::Accept, true);
        assert_eq!(b.len(), 32);
        assert_eq!(u32::from_ne_bytes(b[0..4].try_into().unwrap()), 32);
        assert_eq!(u16::from_ne_bytes(b[4..6].try_into().unwrap()), 0x0303);
        assert_eq!(&b[16..20], &[0, 0, 0, 1]);
        assert_eq!(u16::from_ne_bytes(b[20..22].try_into().unwrap()), 12);
        assert_eq!(u16::from_ne_bytes(b[22..24].try_into().unwrap()), NFQA_VERDICT_HDR);
        assert_eq!(&b[24..32], &[0, 0, 0, 1, 1, 2, 3, 4]);
    }

    #[test]
    fn params_attribute_is_padded() {
        let b = params(0, 7, 64, 4096);
        // 16 + 4 + align4(4 + 5) + (4 + 4) + 2 * (4 + 4)
        assert_eq!(b.len(), 16 + 4 + 12 + 8 + 16);
        assert_eq!(&b[24..29], &[0, 0, 0, 64, NFQNL_COPY_PACKET]);
    }

    #[test]
    fn params_keep_offloaded_checksums_by_setting_the_gso_flag_under_its_mask() {
        let b = params(0, 7, 64, 4096);
        // Mask then flags, each a big-endian u32 attribute after the queue length.
        assert_eq!(u16::from_ne_bytes(b[42..44].try_into().unwrap()), NFQA_CFG_MASK);
        assert_eq!(&b[44..48], &NFQA_CFG_F_GSO.to_be_bytes());
        assert_eq!(u16::from_ne_bytes(b[50..52].try_into().unwrap()), NFQA_CFG_FLAGS);
        assert_eq!(&b[52..56], &NFQA_CFG_F_GSO.to_be_bytes());
    }

    #[test]
    fn kernel_timestamp_is_read_in_nanoseconds() {
        let b = kernel_packet_at(1, 5, &[0x45; 20], Some(1500), Some((1_700_000_000, 123_456)));
        let mut got = vec![];
        parse(&b, |m| got.push(m)).unwrap();
        let stamp_ns = Some(1_700_000_000_123_456_000);
        assert_eq!(got, vec![Msg::Packet { queue: 1, id: 5, len: 1500, stamp_ns }]);
    }

    #[test]
    fn short_or_overflowing_timestamp_is_an_error() {
        assert!(parse_stamp(&[0; 12]).is_err());
        assert!(parse_stamp(&[[0xff; 8], [0; 8]].concat()).is_err());
        assert_eq!(parse_stamp(&[[0; 8], 7u64.to_be_bytes()].concat()), Ok(7_000));
    }

    #[test]
    fn packet_length_comes_from_cap_len_when_truncated() {
        let b = kernel_packet(1, 42, &[0x45; 64], Some(1500));
        let mut got = vec![];
        parse(&b, |m| got.push(m)).unwrap();
        assert_eq!(got, vec![Msg::Packet { queue: 1, id: 42, len: 1500, stamp_ns: None }]);
    }

    #[test]
    fn short_packet_length_is_its_payload() {
        let b = kernel_packet(0, 7, &[0x45; 60], None);
        let mut got = vec![];
        parse(&b, |m| got.push(m)).unwrap();
        assert_eq!(got, vec![Msg::Packet { queue: 0, id: 7, len: 60, stamp_ns: None }]);
    }

    #[test]
    fn several_messages_in_one_datagram() {
        let mut b = kernel_packet(0, 1, &[1, 2, 3], None);
        b.extend(kernel_packet(0, 2, &[1, 2, 3, 4, 5], None));
        let mut ids = vec![];
        parse(&b, |m| {
            if let Msg::Packet { id, .. } = m {
                ids.push(id);
            }
        })
        .unwrap();
        assert_eq!(ids, vec![1, 2]);
    }

    #[test]
    fn ack_carries_errno() {
        let mut b = Vec::new();
        b.extend_from_slice(&36u32.to_ne_bytes());
        b.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
        b.extend_from_slice(&0u16.to_ne_bytes());
        b.extend_from_slice(&9u32.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        b.extend_from_slice(&(-1i32).to_ne_bytes());
        b.extend_from_slice(&[0u8; 16]);
        let mut got = vec![];
        parse(&b, |m| got.push(m)).unwrap();
        assert_eq!(got, vec![Msg::Ack { seq: 9, errno: 1 }]);
    }

    #[test]
    fn truncated_input_is_an_error_not_a_panic() {
        let b = kernel_packet(0, 1, &[0; 20], None);
        for cut in 1..b.len() {
            let _ = parse(&b[..cut], |_| {});
        }
        let mut bad = b.clone();
        bad[0..4].copy_from_slice(&1000u32.to_ne_bytes());
        assert!(parse(&bad, |_| {}).is_err());
    }
}

//! Turns the outcome of a SCSI command into the PDUs that carry it (RFC 7143 §11.4, §11.7):
//! Data-In PDUs no larger than the initiator's MaxRecvDataSegmentLength, sequences no longer
//! than MaxBurstLength, and status in the last Data-In when there is no sense data.
//! Sequence numbers (StatSN, ExpCmdSN, MaxCmdSN) are stamped later, by the connection's writer.

use bytes::Bytes;
use stics_scsi::{Residual, Response};
use stics_wire::pdu::{sense_segment, DataIn, Pdu, ScsiResponse, RESERVED_TAG};

/// Limits that shape Data-In.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// The initiator's MaxRecvDataSegmentLength.
    pub max_xmit: u32,
    /// MaxBurstLength.
    pub max_burst: u32,
}

fn residual_bits(r: Residual) -> (bool, bool, u32) {
    match r {
        Residual::None => (false, false, 0),
        Residual::Underflow(n) => (false, true, n),
        Residual::Overflow(n) => (true, false, n),
    }
}

/// Appends the PDUs answering command `itt` on LUN field `lun` to `out`. `r2ts` is how many
/// R2Ts the command caused (they count in ExpDataSN).
pub fn reply(itt: u32, lun: u64, resp: &Response, r2ts: u32, shape: Shape, out: &mut Vec<Pdu>) {
    let data: &Bytes = &resp.data_in;
    let (overflow, underflow, residual) = residual_bits(resp.residual);
    let collapse = resp.sense.is_none() && !data.is_empty();
    let seg = shape.max_xmit.max(512) as usize;
    let burst = shape.max_burst.max(512) as usize;
    let mut data_sn = 0u32;
    let mut at = 0usize;
    while at < data.len() {
        // Each PDU ends at the segment limit, the end of its burst, or the end of the data.
        let burst_end = (at / burst + 1) * burst;
        let end = (at + seg).min(burst_end).min(data.len());
        let last = end == data.len();
        let mut h = DataIn {
            final_: last || end == burst_end,
            lun,
            itt,
            ttt: RESERVED_TAG,
            data_sn,
            buffer_offset: at as u32,
            ..Default::default()
        };
        if last && collapse {
            h.status_present = true;
            h.status = resp.status;
            h.overflow = overflow;
            h.underflow = underflow;
            h.residual = residual;
        }
        out.push(Pdu::new(h, data.slice(at..end)));
        data_sn += 1;
        at = end;
    }
    if collapse {
        return;
    }
    let h = ScsiResponse {
        overflow,
        underflow,
        response: 0,
        status: resp.status,
        itt,
        exp_data_sn: data_sn + r2ts,
        residual,
        ..Default::default()
    };
    let sense = resp.sense.as_ref().map(|s| sense_segment(s)).unwrap_or_default();
    out.push(Pdu::new(h, sense));
}

#[cfg(test)]
mod tests {
    use super::*;
    use stics_wire::Header;

    fn resp(data: usize, sense: bool, residual: Residual) -> Response {
        Response {
            status: if sense { 2 } else { 0 },
            sense: sense.then(|| Bytes::from_static(&[0x70, 0, 5, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0, 0, 0, 0, 0])),
            data_in: Bytes::from(vec![1u8; data]),
            residual,
        }
    }

    fn data_ins(v: &[Pdu]) -> Vec<DataIn> {
        v.iter().filter_map(|p| if let Header::DataIn(h) = p.header { Some(h) } else { None }).collect()
    }

    #[test]
    fn read_status_rides_in_the_last_data_in() {
        let mut out = Vec::new();
        reply(3, 0, &resp(4096, false, Residual::None), 0, Shape { max_xmit: 262144, max_burst: 262144 }, &mut out);
        assert_eq!(out.len(), 1);
        let d = data_ins(&out)[0];
        assert!(d.final_ && d.status_present);
        assert_eq!(out[0].data.len(), 4096);
    }

    #[test]
    fn data_in_is_cut_at_max_recv_data_segment_length_and_max_burst() {
        let mut out = Vec::new();
        reply(
            3,
            0,
            &resp(20000, false, Residual::Underflow(480)),
            0,
            Shape { max_xmit: 4096, max_burst: 8192 },
            &mut out,
        );
        let d = data_ins(&out);
        let lens: Vec<usize> = out.iter().map(|p| p.data.len()).collect();
        assert_eq!(lens, vec![4096, 4096, 4096, 4096, 3616]);
        assert_eq!(d.iter().map(|h| h.data_sn).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
        assert_eq!(d.iter().map(|h| h.buffer_offset).collect::<Vec<_>>(), vec![0, 4096, 8192, 12288, 16384]);
        assert_eq!(d.iter().map(|h| h.final_).collect::<Vec<_>>(), vec![false, true, false, true, true]);
        let last = d[4];
        assert!(last.status_present && last.underflow && last.residual == 480);
        assert!(!d[3].status_present);
        assert_eq!(out.iter().map(|p| p.data.len()).sum::<usize>(), 20000);
    }

    #[test]
    fn sense_data_goes_in_a_scsi_response_after_the_data() {
        let mut out = Vec::new();
        reply(3, 0, &resp(512, true, Residual::None), 0, Shape { max_xmit: 8192, max_burst: 65536 }, &mut out);
        assert_eq!(out.len(), 2);
        assert!(!data_ins(&out)[0].status_present);
        match out[1].header {
            Header::ScsiResponse(h) => {
                assert_eq!(h.status, 2);
                assert_eq!(h.exp_data_sn, 1);
            }
            _ => panic!(),
        }
        assert_eq!(&out[1].data[..2], &[0, 18]);
    }

    #[test]
    fn no_data_gives_one_scsi_response_with_residual() {
        let mut out = Vec::new();
        reply(3, 0, &resp(0, false, Residual::Overflow(512)), 2, Shape { max_xmit: 8192, max_burst: 65536 }, &mut out);
        assert_eq!(out.len(), 1);
        match out[0].header {
            Header::ScsiResponse(h) => {
                assert!(h.overflow && !h.underflow);
                assert_eq!((h.residual, h.exp_data_sn), (512, 2));
            }
            _ => panic!(),
        }
        assert!(out[0].data.is_empty());
    }
}

//! A raw iSCSI initiator for tests: logs in with whatever keys a test gives, sends any PDU (or
//! bytes that are no PDU at all) and runs SCSI commands with immediate data, Data-Out and R2T.
//! It trusts nothing and asserts on what a conforming target must answer.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use stics_wire::frame::{self, Digests};
#[allow(clippy::wildcard_imports, reason = "a test client speaks every PDU and its constants")]
use stics_wire::pdu::*;
use stics_wire::text;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long [`Client::recv`] and [`Client::closed`] wait for the target.
pub const WAIT: Duration = Duration::from_secs(5);

/// `p` as it goes on the wire with `digests`.
pub fn encode(p: &Pdu, digests: Digests) -> BytesMut {
    let mut out = BytesMut::new();
    frame::encode(p, digests, &mut out);
    out
}

/// READ(10) of `blocks` blocks at `lba`.
pub fn read10_cdb(lba: u32, blocks: u16) -> [u8; 10] {
    rw10(0x28, lba, blocks)
}

/// WRITE(10) of `blocks` blocks at `lba` (stics_sam builds only the 16-byte forms the initiator
/// sends).
pub fn write10_cdb(lba: u32, blocks: u16) -> [u8; 10] {
    rw10(0x2a, lba, blocks)
}

fn rw10(opcode: u8, lba: u32, blocks: u16) -> [u8; 10] {
    let mut cdb = [opcode, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    cdb[2..6].copy_from_slice(&lba.to_be_bytes());
    cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
    cdb
}

/// The value of key `k` in negotiated pairs.
pub fn get<'a>(kv: &'a [(String, String)], k: &str) -> Option<&'a str> {
    kv.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
}

/// One connection to a target, with the session state a test needs to speak on it.
pub struct Client {
    s: TcpStream,
    buf: BytesMut,
    /// Digests in force (set by [`Client::login`] from the answers).
    pub digests: Digests,
    /// The CmdSN the next non-immediate command takes.
    pub cmd_sn: u32,
    itt: u32,
    /// The session's ISID; change it before logging in to open a second session.
    pub isid: [u8; 6],
    /// The target's MaxRecvDataSegmentLength, as declared at login.
    pub max_xmit: u32,
    /// InitiatorName and TargetName sent by [`Client::login`].
    pub initiator: String,
    pub target: String,
}

impl Client {
    pub async fn connect(addr: SocketAddr) -> Client {
        let s = TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        Client {
            s,
            buf: BytesMut::new(),
            digests: Digests::default(),
            cmd_sn: 1,
            itt: 0x100,
            isid: [0x80, 0, 0, 0, 0x12, 0x34],
            max_xmit: 8192,
            initiator: crate::INITIATOR.into(),
            target: crate::IQN.into(),
        }
    }

    pub async fn send(&mut self, p: Pdu) {
        let out = encode(&p, self.digests);
        self.send_raw(&out).await;
    }

    /// Writes bytes as they are: malformed PDUs, garbage, half a header.
    pub async fn send_raw(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).await.unwrap();
    }

    /// Like [`Client::send_raw`], but gives up after `limit` (a target that stopped reading)
    /// and returns whether everything was written.
    pub async fn try_send_raw(&mut self, bytes: &[u8], limit: Duration) -> bool {
        match tokio::time::timeout(limit, self.s.write_all(bytes)).await {
            Ok(r) => {
                r.unwrap();
                true
            }
            Err(_) => false,
        }
    }

    /// The next PDU, or None on EOF or after `wait`.
    pub async fn try_recv(&mut self, wait: Duration) -> Option<Pdu> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Ok(n) = frame::check(&self.buf, self.digests, 1 << 24) {
                return Some(frame::parse(self.buf.split_to(n).freeze(), self.digests).unwrap());
            }
            let r = tokio::time::timeout_at(deadline, self.s.read_buf(&mut self.buf)).await;
            match r {
                Ok(Ok(n)) if n > 0 => {}
                _ => return None,
            }
        }
    }

    /// The next PDU; panics if none comes within [`WAIT`].
    pub async fn recv(&mut self) -> Pdu {
        self.try_recv(WAIT).await.expect("a PDU from the target")
    }

    /// The next PDU's header; panics if none comes within [`WAIT`].
    pub async fn recv_header(&mut self) -> Header {
        self.recv().await.header
    }

    /// True once the target has closed the connection (anything it sends first is skipped);
    /// false if it is still open after [`WAIT`].
    pub async fn closed(&mut self) -> bool {
        let mut b = [0u8; 4096];
        loop {
            match tokio::time::timeout(WAIT, self.s.read(&mut b)).await {
                Ok(Ok(0) | Err(_)) => return true,
                Ok(Ok(_)) => {}
                Err(_) => return false,
            }
        }
    }

    /// Ends the connection with a reset (RST), as the kernel of a crashed peer would.
    pub fn reset(self) {
        let _ = self.s.set_zero_linger();
    }

    /// Connects, logs in with `ops` and clears the first unit attention: a session ready for
    /// commands.
    pub async fn session(addr: SocketAddr, ops: &[(&str, &str)]) -> Client {
        let mut c = Client::connect(addr).await;
        c.login(ops).await;
        c.clear_ua().await;
        c
    }

    pub fn next_itt(&mut self) -> u32 {
        self.itt += 1;
        self.itt
    }

    /// Sends one login request with `kv` and returns the response and its keys.
    pub async fn login_step(
        &mut self,
        csg: u8,
        nsg: u8,
        transit: bool,
        kv: &[(&str, String)],
    ) -> (LoginResponse, Vec<(String, String)>) {
        let h = LoginRequest {
            transit,
            csg,
            nsg,
            isid: self.isid,
            itt: 1,
            cid: 1,
            cmd_sn: self.cmd_sn,
            ..Default::default()
        };
        self.send(Pdu::new(h, text::encode(kv))).await;
        let p = self.recv().await;
        let Header::LoginResponse(r) = p.header else { panic!("expected a login response, got {:?}", p.header) };
        (r, text::parse(&p.data).unwrap())
    }

    /// Logs in without authentication, straight to operational negotiation with `ops`, and
    /// applies the answers (digests, segment length); returns them.
    pub async fn login(&mut self, ops: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut kv: Vec<(&str, String)> = vec![
            ("InitiatorName", self.initiator.clone()),
            ("SessionType", "Normal".into()),
            ("TargetName", self.target.clone()),
        ];
        kv.extend(ops.iter().map(|(k, v)| (*k, v.to_string())));
        let (r, answers) = self.login_step(1, 3, true, &kv).await;
        assert_eq!((r.status_class, r.status_detail), (0, 0), "login failed: {answers:?}");
        assert!(r.transit && r.tsih != 0);
        self.apply(&answers);
        answers
    }

    /// Puts negotiated answers into force.
    pub fn apply(&mut self, answers: &[(String, String)]) {
        for (k, v) in answers {
            match (k.as_str(), v.as_str()) {
                ("HeaderDigest", "CRC32C") => self.digests.header = true,
                ("DataDigest", "CRC32C") => self.digests.data = true,
                ("MaxRecvDataSegmentLength", n) => self.max_xmit = n.parse().unwrap(),
                _ => {}
            }
        }
    }

    /// A SCSI command header for `cdb` with a fresh ITT; a non-immediate one takes the next CmdSN.
    pub fn cmd(&mut self, cdb: &[u8], read: u32, write: u32, imm: bool) -> ScsiCommand {
        let mut c = [0u8; 16];
        c[..cdb.len()].copy_from_slice(cdb);
        let h = ScsiCommand {
            final_: true,
            read: read > 0,
            write: write > 0,
            attr: attr::SIMPLE,
            itt: self.next_itt(),
            expected_len: read.max(write),
            cmd_sn: self.cmd_sn,
            cdb: c,
            immediate: imm,
            ..Default::default()
        };
        if !imm {
            self.cmd_sn += 1;
        }
        h
    }

    /// Runs one command to completion: sends up to `immediate_len` bytes of `write` with it,
    /// answers R2Ts with Data-Out of at most `seg` bytes, collects Data-In. Returns (status,
    /// data, sense segment).
    pub async fn run(
        &mut self,
        cdb: &[u8],
        read: u32,
        write: &[u8],
        immediate_len: usize,
        seg: usize,
    ) -> (u8, Vec<u8>, Bytes) {
        let h = self.cmd(cdb, read, write.len() as u32, false);
        let imm = immediate_len.min(write.len());
        self.send(Pdu::new(h, Bytes::copy_from_slice(&write[..imm]))).await;
        let mut data = Vec::new();
        loop {
            let p = self.recv().await;
            match p.header {
                Header::R2t(r) => {
                    assert_eq!(r.itt, h.itt);
                    let (mut off, end) = (r.buffer_offset as usize, (r.buffer_offset + r.desired_len) as usize);
                    let mut sn = 0;
                    while off < end {
                        let n = seg.min(end - off);
                        let d = DataOut {
                            final_: off + n == end,
                            itt: h.itt,
                            ttt: r.ttt,
                            data_sn: sn,
                            buffer_offset: off as u32,
                            ..Default::default()
                        };
                        self.send(Pdu::new(d, Bytes::copy_from_slice(&write[off..off + n]))).await;
                        sn += 1;
                        off += n;
                    }
                }
                Header::DataIn(d) => {
                    assert_eq!(d.buffer_offset as usize, data.len());
                    data.extend_from_slice(&p.data);
                    if d.status_present {
                        return (d.status, data, Bytes::new());
                    }
                }
                Header::ScsiResponse(r) => return (r.status, data, p.data),
                // The target's keep-alive ping: answered, as initiators do.
                Header::NopIn(n) if n.itt == RESERVED_TAG => {
                    let pong = NopOut {
                        immediate: true,
                        itt: RESERVED_TAG,
                        ttt: n.ttt,
                        cmd_sn: self.cmd_sn,
                        ..Default::default()
                    };
                    self.send(Pdu::new(pong, Bytes::new())).await;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    /// Clears the unit attention every new session starts with.
    pub async fn clear_ua(&mut self) {
        for _ in 0..3 {
            if self.run(&[0u8; 6], 0, &[], 0, 0).await.0 == 0 {
                return;
            }
        }
        panic!("TEST UNIT READY never succeeded");
    }

    /// WRITE(10) of `data` (512-byte blocks) at `lba`; returns the status.
    pub async fn write10(&mut self, lba: u32, data: &[u8], immediate: usize, seg: usize) -> u8 {
        let blocks = (data.len() / 512) as u16;
        self.run(&write10_cdb(lba, blocks), 0, data, immediate, seg).await.0
    }

    /// READ(10) of `blocks` 512-byte blocks at `lba`; asserts GOOD status.
    pub async fn read10(&mut self, lba: u32, blocks: u16) -> Vec<u8> {
        let (status, data, _) = self.run(&read10_cdb(lba, blocks), u32::from(blocks) * 512, &[], 0, 0).await;
        assert_eq!(status, 0);
        data
    }

    /// Sends WRITE(10) of `blocks` blocks at `lba` without data and returns it with the R2T the
    /// target answers (the session must have negotiated InitialR2T=Yes, or send nothing
    /// unsolicited).
    pub async fn write10_awaiting_r2t(&mut self, lba: u32, blocks: u16) -> (ScsiCommand, R2t) {
        let h = self.cmd(&write10_cdb(lba, blocks), 0, u32::from(blocks) * 512, false);
        self.send(Pdu::new(h, Bytes::new())).await;
        let got = self.recv_header().await;
        let Header::R2t(r2t) = got else { panic!("expected an R2T, got {got:?}") };
        (h, r2t)
    }

    /// An immediate task management request; returns the response.
    pub async fn task_mgmt(
        &mut self,
        function: u8,
        lun: u64,
        referenced_tag: u32,
        ref_cmd_sn: u32,
    ) -> TaskMgmtResponse {
        let itt = self.next_itt();
        let tm = TaskMgmtRequest {
            immediate: true,
            function,
            lun: stics_wire::lun::encode(lun),
            itt,
            referenced_tag,
            cmd_sn: self.cmd_sn,
            ref_cmd_sn,
            ..Default::default()
        };
        self.send(Pdu::new(tm, Bytes::new())).await;
        let h = self.recv_header().await;
        let Header::TaskMgmtResponse(r) = h else { panic!("expected a task management response, got {h:?}") };
        assert_eq!(r.itt, itt);
        r
    }

    /// An immediate logout closing the session; returns the response.
    pub async fn logout(&mut self) -> LogoutResponse {
        let itt = self.next_itt();
        let req = LogoutRequest {
            immediate: true,
            reason: logout::CLOSE_SESSION,
            itt,
            cid: 1,
            cmd_sn: self.cmd_sn,
            ..Default::default()
        };
        self.send(Pdu::new(req, Bytes::new())).await;
        let h = self.recv_header().await;
        let Header::LogoutResponse(r) = h else { panic!("expected a logout response, got {h:?}") };
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peers::InProcess;

    #[tokio::test]
    async fn logs_in_writes_with_r2t_reads_back_and_logs_out() {
        let t = InProcess::mem(crate::IQN, 1 << 20).await;
        let mut c = Client::connect(t.addr).await;
        let a = c.login(&[("InitialR2T", "Yes"), ("ImmediateData", "No"), ("HeaderDigest", "CRC32C")]).await;
        assert_eq!(get(&a, "HeaderDigest"), Some("CRC32C"));
        assert!(c.digests.header);
        c.clear_ua().await;
        let data = crate::pattern::ramp(1, 4096);
        assert_eq!(c.write10(8, &data, 0, 1024).await, 0);
        assert_eq!(c.read10(8, 8).await, data);
        let r = c.task_mgmt(tmf::LOGICAL_UNIT_RESET, 0, RESERVED_TAG, 0).await;
        assert_eq!(r.response, tmf::FUNCTION_COMPLETE);
        assert_eq!(c.logout().await.response, logout::SUCCESS);
        assert!(c.closed().await);
        t.stop().await;
    }

    #[tokio::test]
    async fn raw_garbage_makes_the_target_close() {
        let t = InProcess::mem(crate::IQN, 1 << 20).await;
        let mut c = Client::connect(t.addr).await;
        c.send_raw(&[0xff; 100]).await;
        assert!(c.closed().await);
        assert!(c.try_recv(Duration::from_millis(10)).await.is_none());
    }
}

//! Drives the target's full-feature session core with sequences of frames, completions, resets,
//! aborts and clock ticks, and checks the protocol's invariants after every step.
//!
//! The input is a session configuration, then a list of operations: raw bytes or typed PDUs
//! (framed on one byte stream exactly as the connection driver splits it), command
//! completions, reset completions, aborts from other sessions and clock ticks. Typed PDUs
//! answer the R2Ts and pings the core sent, so the fuzzer reaches deep states quickly.
#![no_main]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use stics_scsi::{Command, Direction, Residual, Response, TmfResult};
use stics_target::datain::Shape;
use stics_target::dataout::Burst;
use stics_target::core::{stamp, Action, CloseReason, Event, SessionConfig, SessionCore};
use stics_target::textreq::{Listing, TextError};
use stics_wire::frame::{self, Digests, FrameError};
use stics_wire::keys::SessionType;
use stics_wire::lun as wire_lun;
use stics_wire::pdu::{
    DataOut, Header, LogoutRequest, NopOut, Pdu, ScsiCommand, TaskMgmtRequest, TextRequest, BHS_LEN, RESERVED_TAG,
};
use stics_wire::serial;

/// Operations per input: enough for long sequences, few enough to keep runs fast.
const MAX_OPS: usize = 200;
/// Largest data segment a typed PDU carries and largest read a completion returns.
const MAX_DATA: usize = 64 * 1024;
const TARGET: &str = "iqn.2024-01.org.fuzz:target";

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(mut h) = Harness::new(&mut u) else { return };
    for _ in 0..MAX_OPS {
        if u.is_empty() {
            break;
        }
        if h.op(&mut u).is_err() {
            break;
        }
    }
    h.drain();
});

/// Set `STICS_FUZZ_TRACE=1` to print every frame and action when reproducing an input.
fn tracing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("STICS_FUZZ_TRACE").is_some())
}

/// The byte written at `offset` of the write data of task `itt`: lets the harness check that
/// a command's data reaches the device in order and whole.
fn pattern(itt: u32, offset: u32) -> u8 {
    (offset as u8) ^ ((offset >> 8) as u8).rotate_left(3) ^ (itt as u8).wrapping_mul(29) ^ 0x5a
}

fn patterned(itt: u32, offset: u32, len: usize) -> Bytes {
    (0..len).map(|i| pattern(itt, offset.wrapping_add(i as u32))).collect::<Vec<u8>>().into()
}

fn status_bearing(h: &Header) -> Option<u32> {
    match h {
        Header::ScsiResponse(r) => Some(r.itt),
        Header::DataIn(d) if d.status_present => Some(d.itt),
        _ => None,
    }
}

/// What caused the actions being checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Frame,
    /// A completion of `itt`; `running` if the harness knew it as executing.
    Completion {
        itt: u32,
        running: bool,
    },
    ResetDone {
        itt: u32,
        pending: bool,
    },
    AbortRequest(Option<u64>),
    Tick,
}

/// A command the core asked the driver to execute.
#[derive(Debug)]
struct Running {
    /// The task number the core gave it.
    task: u64,
    command: Command,
    /// R2Ts the core sent for it, when the harness can know (`None` after an abort by LUN).
    r2ts: Option<u32>,
}

/// What the harness knows of a write command it sent, to send unsolicited data for it.
#[derive(Debug, Clone, Copy)]
struct SentWrite {
    edtl: u32,
    next_offset: u32,
    data_sn: u32,
    lun: u64,
}

struct Harness {
    core: SessionCore,
    depth: u32,
    digests: Digests,
    burst: Burst,
    max_xmit: u32,
    max_recv: u32,
    max_command_bytes: u32,
    cid: u16,
    discovery: bool,
    /// Complete resets at once, as the driver does.
    sync_resets: bool,
    now: Instant,
    stream: BytesMut,
    /// The stream holds bytes of a raw operation: frames cut from it have unknown content.
    raw_in_stream: bool,
    /// The stream stopped (an oversized PDU): the driver closes the connection.
    stream_dead: bool,
    closed: Option<CloseReason>,
    stat_sn: u32,
    prev_exp: u32,
    prev_max: u32,
    next_sn: u32,
    next_itt: u32,
    running: BTreeMap<u32, Running>,
    /// Execution order of the running commands (oldest first).
    order: Vec<u32>,
    /// Every ITT executed so far, for completions of tasks that are gone.
    executed: Vec<u32>,
    resets: BTreeSet<u32>,
    /// R2Ts sent and not yet answered by the harness.
    r2ts: Vec<stics_wire::pdu::R2t>,
    /// Last R2TSN seen per ITT and R2T count of the task's current incarnation.
    r2t_count: HashMap<u32, Option<u32>>,
    /// R2TSN and end offset of the last R2T per ITT.
    r2t_last: HashMap<u32, (u32, u32)>,
    writes: BTreeMap<u32, SentWrite>,
    last_ping_ttt: Option<u32>,
    last_text: Option<(u32, u32)>,
    /// The text request being fed continues the last unfinished text exchange.
    text_follows: bool,
    /// A text request carried a key=value: MaxRecvDataSegmentLength may have changed.
    text_keys: bool,
    /// SCSI commands sent per ITT less the statuses that answered them.
    unanswered: HashMap<u32, u32>,
    /// Only typed PDUs carried write data, so its content can be checked.
    data_checkable: bool,
}

impl Harness {
    fn new(u: &mut Unstructured<'_>) -> Result<Harness> {
        let discovery = u.ratio(1, 8)?;
        let digests = Digests { header: u.ratio(1, 4)?, data: u.ratio(1, 4)? };
        let exp_cmd_sn = match u.choose_index(4)? {
            0 => u32::MAX - u32::from(u.int_in_range(0u8..=8)?),
            1 => u.arbitrary()?,
            _ => u32::from(u.int_in_range(0u8..=8)?),
        };
        let depth = u.int_in_range(0u32..=8)?;
        let max_burst = *u.choose(&[512u32, 1024, 4096, 8192, 65536])?;
        let first_burst = (*u.choose(&[512u32, 1024, 4096, 8192, 65536])?).min(max_burst);
        let burst = Burst {
            initial_r2t: u.arbitrary()?,
            immediate_data: u.arbitrary()?,
            first_burst,
            max_burst,
            max_outstanding_r2t: u.int_in_range(1u32..=4)?,
        };
        let max_xmit = *u.choose(&[512u32, 1024, 4096, 8192, 65536])?;
        let max_recv = *u.choose(&[512u32, 4096, 8192, 65536])?;
        let write_buffer = *u.choose(&[0u64, 4096, 65536, 1 << 20])?;
        let max_command_bytes = *u.choose(&[512u32, 8192, 65536, 1 << 20])?;
        let lun_count = if discovery { 0 } else { u.int_in_range(1usize..=3)? };
        let cid = u.int_in_range(0u16..=2)?;
        let nop_interval = match u.int_in_range(0u8..=30)? {
            0 => None,
            s => Some(Duration::from_secs(u64::from(s))),
        };
        let nop_timeout = Duration::from_secs(u64::from(u.int_in_range(0u8..=30)?));
        let sync_resets = u.arbitrary()?;
        let listings = vec![
            Listing { iqn: TARGET.into(), addresses: vec!["127.0.0.1:3260,1".into()] },
            Listing { iqn: "iqn.2024-01.org.fuzz:other".into(), addresses: vec![] },
        ];
        let cfg = SessionConfig {
            session_type: if discovery { SessionType::Discovery } else { SessionType::Normal },
            cid,
            exp_cmd_sn,
            queue_depth: depth,
            digests,
            burst,
            write_buffer,
            max_command_bytes,
            shape: Shape { max_xmit, max_burst },
            lun_count,
            target: (!discovery).then(|| TARGET.to_string()),
            listings,
            nop_interval,
            nop_timeout,
        };
        if tracing() {
            eprintln!("{cfg:?}\nsync_resets {sync_resets} max_recv {max_recv}");
        }
        let now = Instant::now();
        let core = SessionCore::new(cfg, now);
        let (prev_exp, prev_max) = (core.exp_cmd_sn(), core.max_cmd_sn());
        Ok(Harness {
            core,
            depth: depth.max(1),
            digests,
            burst,
            max_xmit,
            max_recv,
            max_command_bytes,
            cid,
            discovery,
            sync_resets,
            now,
            stream: BytesMut::new(),
            raw_in_stream: false,
            stream_dead: false,
            closed: None,
            stat_sn: 1,
            prev_exp,
            prev_max,
            next_sn: exp_cmd_sn,
            next_itt: 0x100,
            running: BTreeMap::new(),
            order: Vec::new(),
            executed: Vec::new(),
            resets: BTreeSet::new(),
            r2ts: Vec::new(),
            r2t_count: HashMap::new(),
            r2t_last: HashMap::new(),
            writes: BTreeMap::new(),
            last_ping_ttt: None,
            last_text: None,
            text_keys: false,
            text_follows: false,
            unanswered: HashMap::new(),
            data_checkable: true,
        })
    }

    /// Frames and ticks reach the core only while the driver's reader would still run.
    fn reading(&self) -> bool {
        !self.stream_dead && self.closed.is_none()
    }

    fn op(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        match u.choose_index(16)? {
            0 => self.raw(u),
            1 | 2 => self.scsi_command(u),
            3 => self.answer_r2t(u),
            4 => self.unsolicited(u),
            5 => self.data_out(u),
            6 => self.task_mgmt(u),
            7 => self.nop(u),
            8 => self.text(u),
            9 => self.logout(u),
            10 | 11 => self.complete(u),
            12 => self.reset_done(u),
            13 => {
                let lun = match u.choose_index(3)? {
                    0 => None,
                    1 => Some(u64::from(u.int_in_range(0u8..=3)?)),
                    _ => Some(u.arbitrary()?),
                };
                self.abort_request(lun);
                Ok(())
            }
            _ => {
                let ms = match u.choose_index(3)? {
                    0 => u64::from(u.int_in_range(0u16..=2000)?),
                    1 => u64::from(u.int_in_range(0u32..=60_000)?),
                    _ => u64::from(u.arbitrary::<u32>()?),
                };
                self.tick(Duration::from_millis(ms));
                Ok(())
            }
        }
    }

    // ---- choosing fields -------------------------------------------------------------------

    fn cmd_sn(&mut self, u: &mut Unstructured<'_>, immediate: bool) -> Result<u32> {
        Ok(match u.choose_index(7)? {
            0 | 1 => {
                let sn = self.next_sn;
                if !immediate {
                    self.next_sn = sn.wrapping_add(1);
                }
                sn
            }
            2 => self.core.exp_cmd_sn(),
            3 => self.core.max_cmd_sn(),
            4 => self.core.max_cmd_sn().wrapping_add(1),
            5 => self.core.exp_cmd_sn().wrapping_add_signed(i32::from(u.arbitrary::<i8>()?)),
            _ => u.arbitrary()?,
        })
    }

    fn itt(&mut self, u: &mut Unstructured<'_>) -> Result<u32> {
        Ok(match u.choose_index(6)? {
            0 | 1 => {
                self.next_itt = self.next_itt.wrapping_add(1);
                self.next_itt
            }
            2 => u32::from(u.int_in_range(0u8..=7)?),
            3 => self.known_itt(u)?,
            4 => RESERVED_TAG,
            _ => u.arbitrary()?,
        })
    }

    /// An ITT the core knows: running, waiting for data, or resetting.
    fn known_itt(&mut self, u: &mut Unstructured<'_>) -> Result<u32> {
        let mut known: Vec<u32> = self.running.keys().copied().collect();
        known.extend(self.writes.keys().copied());
        known.extend(self.resets.iter().copied());
        if known.is_empty() {
            return u.arbitrary();
        }
        Ok(*u.choose(&known)?)
    }

    fn lun(&mut self, u: &mut Unstructured<'_>) -> Result<u64> {
        Ok(match u.choose_index(6)? {
            0..=3 => wire_lun::encode(u64::from(u.int_in_range(0u8..=3)?)),
            4 => wire_lun::encode(u.int_in_range(0u64..=0x3fff)?),
            _ => u.arbitrary()?,
        })
    }

    fn data_len(&self, u: &mut Unstructured<'_>, max: usize) -> Result<usize> {
        let cap = max.min(self.max_recv as usize);
        Ok(match u.choose_index(4)? {
            0 => 0,
            1 => u.int_in_range(0..=cap.min(64))?,
            2 => cap,
            _ => u.int_in_range(0..=cap)?,
        })
    }

    // ---- frames -----------------------------------------------------------------------------

    /// Appends bytes to the connection's stream and hands every whole frame to the core, as
    /// the driver's read loop does.
    fn push(&mut self, bytes: &[u8]) {
        if self.stream_dead {
            return;
        }
        if self.closed.is_some() {
            // The driver reads no more; the core must take nothing either after a logout.
            if self.closed == Some(CloseReason::Logout) {
                self.after_logout(bytes);
            }
            return;
        }
        self.stream.extend_from_slice(bytes);
        self.core.on_received(self.now);
        while self.reading() {
            match frame::check(&self.stream, self.digests, self.max_recv) {
                Ok(n) => {
                    let f = self.stream.split_to(n).freeze();
                    self.note_frame(&f);
                    if tracing() {
                        eprintln!("frame {:?}", frame::parse(f.clone(), self.digests).map(|p| p.header));
                    }
                    let actions = self.core.on_frame(f);
                    self.check(Step::Frame, actions);
                }
                Err(FrameError::Incomplete(_)) => break,
                Err(FrameError::TooLarge { .. }) => {
                    self.stream_dead = true;
                    break;
                }
            }
        }
    }

    /// Frames that decode are offered to the core after a logout; it must ignore them.
    fn after_logout(&mut self, bytes: &[u8]) {
        if let Ok(n) = frame::check(bytes, self.digests, self.max_recv) {
            let f = Bytes::copy_from_slice(&bytes[..n]);
            if let Ok(pdu) = frame::parse(f.clone(), self.digests) {
                let actions = self.core.on_pdu(pdu, f);
                assert!(actions.is_empty(), "actions after a logout: {actions:?}");
            }
        }
    }

    /// What the harness learns from a frame it feeds (before the core sees it).
    fn note_frame(&mut self, f: &Bytes) {
        if self.raw_in_stream {
            // Write data of unknown content may reach a command now.
            if f.first().is_some_and(|b| matches!(b & 0x3f, 0x01 | 0x05)) {
                self.data_checkable = false;
            }
            self.raw_in_stream = !self.stream.is_empty();
        }
        let Ok(pdu) = frame::parse(f.clone(), self.digests) else { return };
        match pdu.header {
            Header::TextRequest(_) if pdu.data.contains(&b'=') => self.text_keys = true,
            Header::ScsiCommand(h) => *self.unanswered.entry(h.itt).or_insert(0) += 1,
            _ => {}
        }
    }

    fn send(&mut self, pdu: &Pdu) {
        let mut raw = BytesMut::new();
        frame::encode(pdu, self.digests, &mut raw);
        self.push(&raw);
    }

    fn raw(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let fix = u.arbitrary::<bool>()?;
        let len = u.int_in_range(0usize..=512)?;
        let mut bytes = u.bytes(len)?.to_vec();
        if fix {
            fix_digests(&mut bytes, self.digests);
        }
        self.raw_in_stream |= !bytes.is_empty();
        self.push(&bytes);
        Ok(())
    }

    fn scsi_command(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let immediate = u.ratio(1, 6)?;
        let (read, write) = match u.choose_index(5)? {
            0 => (false, false),
            1 | 2 => (false, true),
            3 => (true, false),
            _ => (true, true),
        };
        let itt = self.itt(u)?;
        let lun = self.lun(u)?;
        let edtl = match u.choose_index(5)? {
            0 => 0,
            1 => 512 * u32::from(u.int_in_range(1u8..=16)?),
            2 => u.int_in_range(1u32..=(MAX_DATA as u32))?,
            3 => self.max_command_bytes.wrapping_add(u.int_in_range(0u32..=1)?),
            _ => u.arbitrary()?,
        };
        let imm_len = if write && u.arbitrary()? {
            let want = (edtl as usize).min(self.burst.first_burst as usize);
            match u.choose_index(3)? {
                0 => want.min(self.max_recv as usize),
                _ => self.data_len(u, MAX_DATA)?,
            }
        } else {
            0
        };
        let final_ = match u.choose_index(4)? {
            0 => false,
            1 => !write || self.burst.initial_r2t || imm_len as u32 >= edtl.min(self.burst.first_burst),
            _ => true,
        };
        let cmd_sn = self.cmd_sn(u, immediate)?;
        let mut cdb = [0u8; 16];
        cdb[0] = match (read, write) {
            (true, false) => 0x28,
            (false, true) => 0x2a,
            _ => u.arbitrary()?,
        };
        u.fill_buffer(&mut cdb[1..])?;
        let h = ScsiCommand {
            immediate,
            final_,
            read,
            write,
            attr: u.int_in_range(0u8..=7)?,
            lun,
            itt,
            expected_len: edtl,
            cmd_sn,
            exp_stat_sn: self.stat_sn,
            cdb,
        };
        let ahs = if u.ratio(1, 8)? {
            let n = u.int_in_range(0usize..=40)?;
            let mut a = vec![0u8; 4 + n];
            a[..2].copy_from_slice(&((n + 1) as u16).to_be_bytes());
            a[2] = if u.ratio(3, 4)? { 1 } else { u.arbitrary()? };
            u.fill_buffer(&mut a[4..])?;
            Bytes::from(a)
        } else {
            Bytes::new()
        };
        if write && !self.writes.contains_key(&itt) {
            let w = SentWrite { edtl, next_offset: imm_len as u32, data_sn: 0, lun };
            self.writes.insert(itt, w);
        }
        let pdu = Pdu { header: h.into(), ahs, data: patterned(itt, 0, imm_len) };
        self.send(&pdu);
        Ok(())
    }

    /// Answers an R2T the core sent with the Data-Out sequence it asked for, in one or more
    /// PDUs, sometimes with one field spoiled.
    fn answer_r2t(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        if self.r2ts.is_empty() {
            return Ok(());
        }
        let i = u.choose_index(self.r2ts.len())?;
        let r = if u.ratio(7, 8)? { self.r2ts.remove(i) } else { self.r2ts[i] };
        let pieces = u32::from(u.int_in_range(1u8..=4)?).max(r.desired_len.div_ceil(self.max_recv));
        let spoil = if u.ratio(1, 8)? { u.int_in_range(1u8..=5)? } else { 0 };
        let step = r.desired_len.div_ceil(pieces).max(1);
        let mut at = 0u32;
        let mut data_sn = 0u32;
        while at < r.desired_len || (r.desired_len == 0 && data_sn == 0) {
            let len = step.min(r.desired_len - at);
            let last = at + len >= r.desired_len;
            let mut h = DataOut {
                final_: last,
                lun: r.lun,
                itt: r.itt,
                ttt: r.ttt,
                exp_stat_sn: self.stat_sn,
                data_sn,
                buffer_offset: r.buffer_offset + at,
            };
            let mut len = len as usize;
            if last {
                match spoil {
                    1 => h.data_sn += 1,
                    2 => h.buffer_offset += 1,
                    3 => h.final_ = false,
                    4 => h.ttt = h.ttt.wrapping_add(1),
                    5 => len += 1,
                    _ => {}
                }
            }
            let data = patterned(r.itt, h.buffer_offset, len);
            self.send(&Pdu::new(h, data));
            at += step.min(r.desired_len - at);
            data_sn += 1;
            if r.desired_len == 0 {
                break;
            }
        }
        Ok(())
    }

    /// Unsolicited Data-Out for a write the harness sent.
    fn unsolicited(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        if self.writes.is_empty() {
            return Ok(());
        }
        let keys: Vec<u32> = self.writes.keys().copied().collect();
        let itt = *u.choose(&keys)?;
        let Some(w) = self.writes.get(&itt).copied() else { return Ok(()) };
        let limit = w.edtl.min(self.burst.first_burst);
        let want = limit.saturating_sub(w.next_offset) as usize;
        let len = match u.choose_index(3)? {
            0 => want.min(self.max_recv as usize),
            _ => self.data_len(u, want.max(1))?,
        };
        let end = w.next_offset.saturating_add(len as u32);
        let final_ = if u.ratio(7, 8)? { end >= limit } else { u.arbitrary()? };
        let h = DataOut {
            final_,
            lun: w.lun,
            itt,
            ttt: RESERVED_TAG,
            exp_stat_sn: self.stat_sn,
            data_sn: w.data_sn,
            buffer_offset: w.next_offset,
        };
        if let Some(w) = self.writes.get_mut(&itt) {
            w.next_offset = end;
            w.data_sn += 1;
        }
        self.send(&Pdu::new(h, patterned(itt, h.buffer_offset, len)));
        Ok(())
    }

    /// A Data-Out with fields of the fuzzer's choosing.
    fn data_out(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let itt = self.itt(u)?;
        let ttt = match u.choose_index(3)? {
            0 => RESERVED_TAG,
            1 => self.r2ts.iter().find(|r| r.itt == itt).map_or(1, |r| r.ttt),
            _ => u.arbitrary()?,
        };
        let buffer_offset = match u.choose_index(3)? {
            0 => self.r2ts.iter().find(|r| r.itt == itt).map_or(0, |r| r.buffer_offset),
            1 => 512 * u32::from(u.arbitrary::<u8>()?),
            _ => u.arbitrary()?,
        };
        let h = DataOut {
            final_: u.arbitrary()?,
            lun: self.lun(u)?,
            itt,
            ttt,
            exp_stat_sn: self.stat_sn,
            data_sn: u32::from(u.int_in_range(0u8..=3)?),
            buffer_offset,
        };
        let len = self.data_len(u, MAX_DATA)?;
        self.send(&Pdu::new(h, patterned(itt, buffer_offset, len)));
        Ok(())
    }

    fn task_mgmt(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let function = match u.choose_index(10)? {
            0 | 1 => 1,
            n @ 2..=8 => n as u8,
            _ => u.arbitrary::<u8>()? & 0x7f,
        };
        let immediate = u.ratio(3, 4)?;
        let referenced_tag = if u.ratio(3, 4)? { self.known_itt(u)? } else { self.itt(u)? };
        let lun = self.lun(u)?;
        let itt = self.itt(u)?;
        let cmd_sn = self.cmd_sn(u, immediate)?;
        let h = TaskMgmtRequest {
            immediate,
            function: function | 0x80,
            lun,
            itt,
            referenced_tag,
            cmd_sn,
            exp_stat_sn: self.stat_sn,
            ref_cmd_sn: u.arbitrary()?,
            exp_data_sn: 0,
        };
        self.send(&Pdu::new(h, Bytes::new()));
        Ok(())
    }

    fn nop(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let (itt, ttt) = match u.choose_index(3)? {
            // The answer to the core's ping.
            0 => (RESERVED_TAG, self.last_ping_ttt.unwrap_or(1)),
            _ => (self.itt(u)?, RESERVED_TAG),
        };
        let immediate = u.arbitrary()?;
        let cmd_sn = self.cmd_sn(u, immediate)?;
        let h = NopOut { immediate, lun: self.lun(u)?, itt, ttt, cmd_sn, exp_stat_sn: self.stat_sn };
        let len = self.data_len(u, MAX_DATA)?;
        self.send(&Pdu::new(h, Bytes::from(vec![0xa5; len])));
        Ok(())
    }

    fn text(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let (itt, ttt, follows) = match (u.choose_index(3)?, self.last_text) {
            (0, Some((itt, ttt))) => (itt, ttt, true),
            (1, _) => (self.itt(u)?, u.arbitrary()?, false),
            _ => (self.itt(u)?, RESERVED_TAG, false),
        };
        let body: Vec<u8> = match u.choose_index(8)? {
            0 | 1 => b"SendTargets=All\0".to_vec(),
            2 => b"SendTargets=\0".to_vec(),
            3 => format!("SendTargets={TARGET}\0").into_bytes(),
            4 => format!("MaxRecvDataSegmentLength={}\0", u.int_in_range(0u32..=70_000)?).into_bytes(),
            5 => b"HeaderDigest=None\0X-org.fuzz=1\0".to_vec(),
            6 => Vec::new(),
            _ => {
                let n = self.data_len(u, 2048)?;
                u.bytes(n)?.to_vec()
            }
        };
        let cont = u.ratio(1, 6)?;
        let immediate = u.ratio(3, 4)?;
        let cmd_sn = self.cmd_sn(u, immediate)?;
        let h = TextRequest { immediate, final_: !cont, cont, lun: 0, itt, ttt, cmd_sn, exp_stat_sn: self.stat_sn };
        let body = &body[..body.len().min(self.max_recv as usize)];
        // A request that carries the TTT of the target's last unfinished Text Response
        // continues that exchange (RFC 7143 §11.10.4), whichever side has more to say.
        self.text_follows = follows && immediate && self.stream.is_empty();
        self.send(&Pdu::new(h, Bytes::copy_from_slice(body)));
        self.text_follows = false;
        Ok(())
    }

    fn logout(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let reason = match u.choose_index(6)? {
            0 | 1 => 0,
            2 | 3 => 1,
            4 => 2,
            _ => u.arbitrary::<u8>()? & 0x7f,
        };
        let cid = if u.ratio(3, 4)? { self.cid } else { u.arbitrary()? };
        let immediate = u.ratio(3, 4)?;
        let itt = self.itt(u)?;
        let cmd_sn = self.cmd_sn(u, immediate)?;
        let h = LogoutRequest { immediate, reason: reason | 0x80, itt, cid, cmd_sn, exp_stat_sn: self.stat_sn };
        self.send(&Pdu::new(h, Bytes::new()));
        Ok(())
    }

    // ---- driver-side events -----------------------------------------------------------------

    fn complete(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let itt = match u.choose_index(8)? {
            0 if !self.executed.is_empty() => *u.choose(&self.executed)?,
            1 => u.arbitrary()?,
            _ if !self.order.is_empty() => {
                // Mostly the oldest: SCSI commands tend to finish in order.
                let i = if u.ratio(2, 3)? { 0 } else { u.choose_index(self.order.len())? };
                self.order[i]
            }
            _ => return Ok(()),
        };
        let (expected, reads) = self.running.get(&itt).map_or((512, true), |r| {
            (r.command.expected_len, matches!(r.command.direction, Direction::Read | Direction::Bidi))
        });
        let status = *u.choose(&[0u8, 0, 0, 2, 2, 8, 0x18, 0x28])?;
        let sense = (status == 2 || u.ratio(1, 16)?)
            .then(|| Bytes::from_static(&[0x70, 0, 5, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0, 0, 0, 0, 0]));
        let cap = (expected as usize).min(MAX_DATA);
        let len = if !reads || status != 0 && u.arbitrary()? {
            0
        } else if u.ratio(3, 4)? {
            cap
        } else {
            u.int_in_range(0..=cap)?
        };
        let residual = match u.choose_index(4)? {
            0 => Residual::None,
            1 => Residual::Overflow(u.arbitrary()?),
            _ if (len as u32) < expected => Residual::Underflow(expected - len as u32),
            _ => Residual::None,
        };
        let resp = Response { status, sense, data_in: Bytes::from(vec![0x3c; len]), residual };
        let running = self.running.remove(&itt);
        self.order.retain(|&i| i != itt);
        // Sometimes a stale task number: the core must not answer with it.
        let task = match &running {
            Some(r) if u.ratio(15, 16)? => r.task,
            Some(r) => {
                let stale = r.task.wrapping_sub(1);
                assert!(self.core.on_command_done(itt, stale, &resp).is_empty(), "a stale task number was answered");
                r.task
            }
            None => u.arbitrary()?,
        };
        let actions = self.core.on_command_done(itt, task, &resp);
        assert!(!self.core.is_running(itt), "command {itt:#x} still running after its completion");
        self.check_completion(itt, running.as_ref(), &resp, &actions);
        self.check(Step::Completion { itt, running: running.is_some() }, actions);
        Ok(())
    }

    fn reset_done(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let itt = match self.resets.iter().copied().collect::<Vec<_>>() {
            v if !v.is_empty() && u.ratio(7, 8)? => *u.choose(&v)?,
            _ => u.arbitrary()?,
        };
        let result = *u.choose(&[
            TmfResult::Complete,
            TmfResult::Complete,
            TmfResult::LunDoesNotExist,
            TmfResult::NotSupported,
            TmfResult::Rejected,
        ])?;
        self.finish_reset(itt, result);
        Ok(())
    }

    fn finish_reset(&mut self, itt: u32, result: TmfResult) {
        let pending = self.resets.remove(&itt);
        let actions = self.core.on_reset_done(itt, result);
        self.check(Step::ResetDone { itt, pending }, actions);
    }

    fn abort_request(&mut self, lun: Option<u64>) {
        let actions = self.core.on_abort_request(lun);
        let aborted: BTreeSet<u32> =
            actions.iter().filter_map(|a| if let Action::Abort(i) = a { Some(*i) } else { None }).collect();
        let want: BTreeSet<u32> = self
            .running
            .iter()
            .filter(|(_, r)| lun.is_none_or(|l| r.command.lun == l && l != u64::MAX))
            .map(|(i, _)| *i)
            .collect();
        assert_eq!(aborted, want, "an abort of LUN {lun:?} must end exactly the running tasks on it");
        self.check(Step::AbortRequest(lun), actions);
        // Pending writes on the LUN ended silently (some after R2Ts sent in this very step, as
        // the budget they free admits others): the R2T counts of ITTs are unknown now.
        for c in self.r2t_count.values_mut() {
            *c = None;
        }
    }

    fn tick(&mut self, d: Duration) {
        self.now += d;
        if !self.reading() {
            return;
        }
        let actions = self.core.on_tick(self.now);
        self.check(Step::Tick, actions);
        if self.closed.is_none() {
            // The driver sleeps until the deadline: one in the past would make it spin.
            let d = self.core.deadline();
            assert!(d.is_none_or(|d| d > self.now), "a deadline not after the tick that set it");
        }
    }

    /// Ends every task: what is left must give every command slot back.
    fn drain(&mut self) {
        self.abort_request(None);
        assert!(self.running.is_empty());
        let resets: Vec<u32> = self.resets.iter().copied().collect();
        for itt in resets {
            self.finish_reset(itt, TmfResult::Complete);
        }
        let window = self.core.max_cmd_sn().wrapping_sub(self.core.exp_cmd_sn()).wrapping_add(1);
        assert_eq!(
            window,
            self.depth,
            "with no task left the window must be the whole queue depth (ExpCmdSN {}, MaxCmdSN {})",
            self.core.exp_cmd_sn(),
            self.core.max_cmd_sn()
        );
    }

    // ---- invariants -------------------------------------------------------------------------

    fn check_completion(&self, itt: u32, running: Option<&Running>, resp: &Response, actions: &[Action]) {
        let Some(r) = running else {
            assert!(actions.is_empty(), "a completion of {itt:#x}, which is not running, gave {actions:?}");
            return;
        };
        let mut data = Vec::new();
        let mut data_ins = 0u32;
        let mut statuses = 0;
        for a in actions {
            let Action::Send(p) = a else { panic!("a completion gave {a:?}") };
            match p.header {
                Header::DataIn(d) => {
                    assert_eq!(d.itt, itt);
                    assert_eq!(d.data_sn, data_ins, "DataSN out of sequence");
                    assert_eq!(d.buffer_offset as usize, data.len(), "Data-In offsets not contiguous");
                    assert!(!p.data.is_empty(), "an empty Data-In");
                    assert!(statuses == 0, "Data-In after the status");
                    data.extend_from_slice(&p.data);
                    data_ins += 1;
                    if d.status_present {
                        assert!(d.final_, "status in a Data-In without F");
                        assert_eq!(d.status, resp.status);
                        statuses += 1;
                    }
                }
                Header::ScsiResponse(s) => {
                    assert_eq!(s.itt, itt);
                    assert_eq!(s.status, resp.status);
                    if let Some(n) = r.r2ts {
                        assert_eq!(s.exp_data_sn, data_ins + n, "ExpDataSN counts Data-In and R2T PDUs");
                    }
                    statuses += 1;
                }
                ref h => panic!("a completion sent {h:?}"),
            }
        }
        assert_eq!(statuses, 1, "a completion must give exactly one status: {actions:?}");
        assert_eq!(data, resp.data_in, "Data-In must carry the read data whole and in order");
    }

    fn check(&mut self, step: Step, actions: Vec<Action>) {
        if tracing() {
            eprintln!("  {step:?} -> exp {} max {}", self.core.exp_cmd_sn(), self.core.max_cmd_sn());
            for a in &actions {
                match a {
                    Action::Send(p) => eprintln!("    Send {:?} +{}", p.header, p.data.len()),
                    Action::Execute { itt, command, .. } => eprintln!(
                        "    Execute {itt:#x} {:?} len {} data {}",
                        command.direction,
                        command.expected_len,
                        command.data_out.len()
                    ),
                    a => eprintln!("    {a:?}"),
                }
            }
        }
        if let Some(i) = actions.iter().position(|a| matches!(a, Action::Close(_))) {
            assert_eq!(i + 1, actions.len(), "actions after a Close: {actions:?}");
        }
        for a in actions {
            match a {
                Action::Send(p) => self.check_send(step, p),
                Action::Execute { itt, task, command } => {
                    assert_eq!(step, Step::Frame, "Execute only follows a frame");
                    assert!(self.closed.is_none(), "Execute after Close");
                    assert!(!self.running.contains_key(&itt), "Execute of {itt:#x}, which is already running");
                    assert!(!self.discovery, "Execute in a discovery session");
                    self.check_command(itt, &command);
                    // The task's R2Ts are over.
                    self.r2ts.retain(|r| r.itt != itt);
                    self.writes.remove(&itt);
                    let r2ts = self.r2t_count.remove(&itt).unwrap_or(Some(0));
                    if let (Some(n), Some((_, end))) = (r2ts, self.r2t_last.get(&itt)) {
                        if n > 0 {
                            assert!(*end <= command.expected_len, "R2Ts asked beyond the expected length");
                        }
                    }
                    self.running.insert(itt, Running { task, command, r2ts });
                    self.order.push(itt);
                    if self.executed.len() < 64 && !self.executed.contains(&itt) {
                        self.executed.push(itt);
                    }
                }
                Action::Abort(itt) => {
                    assert!(self.running.remove(&itt).is_some(), "Abort of {itt:#x}, which is not running");
                    self.order.retain(|&i| i != itt);
                }
                Action::AbortOtherSessions(_) => {
                    assert_eq!(step, Step::Frame);
                    assert!(self.closed.is_none(), "AbortOtherSessions after Close");
                }
                Action::Reset { itt, .. } => {
                    assert_eq!(step, Step::Frame, "Reset only follows a frame");
                    assert!(self.closed.is_none(), "Reset after Close");
                    assert!(!self.discovery, "a reset in a discovery session");
                    // Any task on the LUN may have ended silently.
                    for c in self.r2t_count.values_mut() {
                        *c = None;
                    }
                    assert!(self.resets.insert(itt), "a second reset under the ITT {itt:#x} of one still pending");
                }
                Action::DropTargetSessions => {
                    assert!(matches!(step, Step::ResetDone { pending: true, .. }));
                }
                Action::Close(reason) => {
                    assert!(self.closed.is_none(), "a second Close");
                    assert!(matches!(step, Step::Frame | Step::Tick), "Close after {step:?}");
                    self.closed = Some(reason);
                }
                Action::Log(Event::TextRefused(e)) => {
                    assert!(
                        !(self.text_follows && step == Step::Frame && e == TextError::UnknownTtt),
                        "a text request with the TTT of the last Text Response was refused"
                    );
                    self.last_text = None;
                }
                Action::Log(_) => {}
            }
        }
        let (exp, max) = (self.core.exp_cmd_sn(), self.core.max_cmd_sn());
        let window = max.wrapping_sub(exp).wrapping_add(1);
        assert!(window <= self.depth, "window of {window} commands beyond the queue depth {}", self.depth);
        assert!(serial::le(self.prev_exp, exp), "ExpCmdSN went back from {} to {exp}", self.prev_exp);
        assert!(serial::le(self.prev_max, max), "MaxCmdSN went back from {} to {max}", self.prev_max);
        (self.prev_exp, self.prev_max) = (exp, max);
        for itt in self.running.keys() {
            assert!(self.core.is_running(*itt), "the core forgot running command {itt:#x}");
        }
        if self.sync_resets {
            // As the driver does: the device resets at once and the core answers.
            let resets: Vec<u32> = self.resets.iter().copied().collect();
            for itt in resets {
                self.finish_reset(itt, TmfResult::Complete);
            }
        }
    }

    fn check_send(&mut self, step: Step, mut p: Pdu) {
        let h = &p.header;
        assert!(!h.opcode().from_initiator(), "the target sent an initiator PDU: {h:?}");
        if let Some(itt) = status_bearing(h) {
            // Each command ends with at most one status (an initiator may reuse an ITT).
            let n = self.unanswered.entry(itt).or_insert(0);
            assert!(*n > 0, "more statuses for {itt:#x} than commands sent with that ITT");
            *n -= 1;
            if !matches!(step, Step::Completion { itt: i, .. } if i == itt) {
                assert!(!self.running.contains_key(&itt), "a status for running command {itt:#x} after {step:?}");
            }
            self.writes.remove(&itt);
            self.r2ts.retain(|r| r.itt != itt);
            self.r2t_count.remove(&itt);
        }
        let bound = if self.text_keys { 0x00ff_ffff } else { self.max_xmit.max(512) };
        assert!(p.data.len() <= bound as usize, "a data segment of {} bytes beyond {bound}", p.data.len());
        match p.header {
            Header::DataIn(d) => {
                if !matches!(step, Step::Completion { .. }) {
                    assert!(!self.running.contains_key(&d.itt), "Data-In for running command {:#x}", d.itt);
                }
            }
            Header::R2t(r) => {
                assert!(r.desired_len > 0, "an R2T for no data");
                assert!(r.desired_len <= self.burst.max_burst, "an R2T beyond MaxBurstLength");
                assert!(r.ttt != RESERVED_TAG, "an R2T with the reserved TTT");
                assert!(!self.running.contains_key(&r.itt), "an R2T for running command {:#x}", r.itt);
                let end = u64::from(r.buffer_offset) + u64::from(r.desired_len);
                assert!(end <= u64::from(self.max_command_bytes), "an R2T beyond max_command_bytes");
                assert!(!self.discovery);
                // A task's R2Ts ask for consecutive ranges under consecutive R2TSNs; every task
                // starts again at R2TSN 0, so an R2T after the first follows the last one seen.
                if r.r2t_sn != 0 {
                    let last = self.r2t_last.get(&r.itt).copied();
                    assert_eq!(last, Some((r.r2t_sn - 1, r.buffer_offset)), "R2T out of sequence: {r:?}");
                }
                self.r2t_last.insert(r.itt, (r.r2t_sn, r.buffer_offset + r.desired_len));
                let count = self.r2t_count.entry(r.itt).or_insert(Some(0));
                *count = match *count {
                    Some(n) if r.r2t_sn == n => Some(n + 1),
                    // A new task with a reused ITT starts again at 0.
                    _ if r.r2t_sn == 0 => Some(1),
                    _ => None,
                };
                self.r2ts.push(r);
            }
            Header::NopIn(n) if n.itt == RESERVED_TAG => {
                assert_eq!(step, Step::Tick, "a ping outside a tick");
                assert!(n.ttt != RESERVED_TAG, "a ping that wants no answer");
                self.last_ping_ttt = Some(n.ttt);
            }
            Header::NopIn(_) => assert_eq!(step, Step::Frame, "a NOP-In echo without a NOP-Out"),
            Header::TextResponse(t) => {
                assert_eq!(step, Step::Frame);
                assert_eq!(t.final_, t.ttt == RESERVED_TAG, "a Text Response with F and TTT at odds: {t:?}");
                self.last_text = (!t.final_).then_some((t.itt, t.ttt));
            }
            Header::Reject(_) => {
                assert_eq!(step, Step::Frame, "a Reject without a frame");
                self.last_text = None;
                assert!(p.data.len() <= BHS_LEN);
            }
            Header::TaskMgmtResponse(t) => {
                if let Step::ResetDone { itt, .. } = step {
                    assert_eq!(t.itt, itt);
                } else {
                    assert_eq!(step, Step::Frame);
                }
                // An abort may have ended write tasks silently: R2T counts are unknown now.
                for c in self.r2t_count.values_mut() {
                    *c = None;
                }
            }
            Header::LogoutResponse(_) => assert_eq!(step, Step::Frame),
            _ => {}
        }
        // What the writer does: stamp, encode; the initiator must be able to parse it back.
        let (exp, max) = (self.core.exp_cmd_sn(), self.core.max_cmd_sn());
        stamp(&mut p.header, &mut self.stat_sn, exp, max);
        let mut raw = BytesMut::new();
        frame::encode(&p, self.digests, &mut raw);
        let n = frame::check(&raw, self.digests, 0x00ff_ffff).expect("an encoded PDU is a whole frame");
        assert_eq!(n, raw.len(), "frame length of an encoded PDU");
        let back = frame::parse(raw.freeze(), self.digests).expect("an encoded PDU parses");
        assert_eq!(back, p, "a PDU changed through encode and parse");
    }

    fn check_command(&self, itt: u32, c: &Command) {
        match c.direction {
            Direction::Write | Direction::Bidi if c.expected_len > 0 => {
                assert_eq!(c.data_out.len(), c.expected_len as usize, "a write runs with all its data");
                assert!(c.expected_len <= self.max_command_bytes, "a write beyond max_command_bytes ran");
                if self.data_checkable {
                    for (i, b) in c.data_out.iter().enumerate() {
                        assert_eq!(*b, pattern(itt, i as u32), "write data of {itt:#x} garbled at {i}");
                    }
                }
            }
            _ => assert!(c.data_out.is_empty(), "data for a command without write data"),
        }
        assert!(c.cdb.len() >= 16);
    }
}

/// Recomputes the header and data digests of every whole frame in `bytes`.
fn fix_digests(bytes: &mut [u8], d: Digests) {
    let mut at = 0;
    while let Some(rest) = bytes.get_mut(at..) {
        let Ok(n) = frame::check(rest, d, u32::MAX) else { return };
        let (ahs, dsl) = frame::segment_lengths(rest[..BHS_LEN].try_into().expect("a BHS"));
        let mut p = BHS_LEN + ahs;
        if d.header {
            let crc = stics_wire::digest::crc32c(&[&rest[..p]]);
            rest[p..p + 4].copy_from_slice(&stics_wire::digest::to_wire(crc));
            p += 4;
        }
        let dsl = dsl as usize;
        if d.data && dsl > 0 {
            let padded = dsl.div_ceil(4) * 4;
            let crc = stics_wire::digest::crc32c(&[&rest[p..p + padded]]);
            rest[p + padded..p + padded + 4].copy_from_slice(&stics_wire::digest::to_wire(crc));
        }
        at += n;
    }
}

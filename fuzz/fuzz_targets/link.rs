//! Fuzzes the link's decoders (a group, a link command, an SG status, a token batch, a poll
//! answer with the blocks of its grants): no panic, a group that parses decodes its data within
//! the bound it was read with, and a token batch or poll answer that parses encodes to the same
//! bytes. Random bytes rarely pass a magic and two CRC32Cs, so
//! the first byte chooses to take the input as it is, or as a group (version 1, or version 2 with
//! token generations) whose magic, version and checksums are made right, which sends the fuzzer
//! into the table checks.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stics_link::{cdb, group, status, token};

const MAX_RAW: u64 = 1 << 20;

/// Sets the magic, version and both checksums of a group in `b`, as far as its tables say
/// (version 2, with a table of token generations, when `fenced`).
fn fix_up(b: &mut [u8], fenced: bool) {
    let header = if fenced { 96 } else { 88 };
    if b.len() < header {
        return;
    }
    b[..8].copy_from_slice(b"STICSGRP");
    b[8..10].copy_from_slice(&(if fenced { 2u16 } else { 1 }).to_be_bytes());
    let extents = u32::from_be_bytes([b[60], b[61], b[62], b[63]]) as usize % 64;
    let chunks = u32::from_be_bytes([b[80], b[81], b[82], b[83]]) as usize % 8;
    b[60..64].copy_from_slice(&(extents as u32).to_be_bytes());
    b[80..84].copy_from_slice(&(chunks as u32).to_be_bytes());
    let fences = if fenced { u32::from_be_bytes([b[92], b[93], b[94], b[95]]) as usize % 64 } else { 0 };
    if fenced {
        b[92..96].copy_from_slice(&(fences as u32).to_be_bytes());
    }
    let tables = header + extents * 16 + chunks * 12 + fences * 16;
    if b.len() < tables {
        return;
    }
    let payload_len = (b.len() - tables) as u64;
    b[72..80].copy_from_slice(&payload_len.to_be_bytes());
    let payload = crc32c::crc32c(&b[tables..]);
    b[84..88].copy_from_slice(&payload.to_be_bytes());
    b[12..16].fill(0);
    let crc = crc32c::crc32c(&b[..tables]);
    b[12..16].copy_from_slice(&crc.to_be_bytes());
}

fuzz_target!(|data: &[u8]| {
    let Some((&choice, rest)) = data.split_first() else { return };
    let mut b = rest.to_vec();
    if choice % 3 != 0 {
        fix_up(&mut b, choice % 3 == 2);
    }
    if let Ok(v) = group::parse(&b, MAX_RAW) {
        if let Ok(raw) = v.data() {
            assert_eq!(raw.len() as u64, v.raw_len);
        }
    }
    let _ = cdb::decode(rest);
    let _ = status::Status::decode(rest);
    if let Ok(msgs) = token::decode(rest, 64) {
        assert_eq!(token::encode(&msgs), rest);
    }
    if let Ok((first, msgs)) = token::decode_answer(rest, 64) {
        assert_eq!(token::encode_answer(first, &msgs), rest);
    }
    if let Ok((first, msgs, data)) = token::decode_answer_data(rest, 64) {
        assert_eq!(token::encode_answer_data(first, &msgs, &data), rest);
    }
});

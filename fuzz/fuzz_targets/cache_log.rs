//! Fuzzes the write log's superblock and record decoders: no panic, and whatever decodes
//! re-encodes to the same value (a decoder that accepts more than the encoder writes would let
//! corrupt metadata through). Random bytes rarely pass a magic and a CRC32C, so the first byte
//! chooses to take the input as it is, or as a superblock or record whose magic, version and
//! checksum are made right, which sends the fuzzer into the field checks behind them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stics_cache::format::{RecordHeader, Superblock, LOG_BLOCK};

/// Sets the magic and version, then the CRC32C at bytes 12..16 over the rest (as the encoders do).
fn fix_up(b: &mut [u8], magic: &[u8; 8], len: usize) {
    b[..8].copy_from_slice(magic);
    b[8..10].copy_from_slice(&1u16.to_le_bytes());
    b[12..16].fill(0);
    let crc = crc32c::crc32c(&b[..len]);
    b[12..16].copy_from_slice(&crc.to_le_bytes());
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let mut buf = rest.to_vec();
    match mode % 3 {
        1 => {
            buf.resize(LOG_BLOCK as usize, 0);
            fix_up(&mut buf, b"STICSSUP", LOG_BLOCK as usize);
        }
        2 => {
            if buf.len() < 64 {
                buf.resize(64, 0);
            }
            // Keep the entry count small enough that the header fits the input.
            let n = (buf.len() - 64) / 40;
            buf[52..56].copy_from_slice(&(n as u32).to_le_bytes());
            let len = RecordHeader::header_len(n) as usize;
            buf.resize(len.max(buf.len()), 0);
            fix_up(&mut buf, b"STICSREC", len);
        }
        _ => {}
    }
    if let Ok(s) = Superblock::decode(&buf) {
        let again = s.encode();
        assert_eq!(Superblock::decode(&again).as_ref(), Ok(&s));
    }
    let _ = Superblock::choose(&buf, buf.get(LOG_BLOCK as usize..).unwrap_or(&[]));
    let _ = RecordHeader::header_len_from_prefix(&buf);
    if let Ok(h) = RecordHeader::decode(&buf) {
        let again = h.encode();
        assert_eq!(RecordHeader::decode(&again).as_ref(), Ok(&h));
        for i in 0..h.entries.len() {
            let _ = h.check_extent(i, &buf);
        }
    }
});

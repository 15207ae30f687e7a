//! Fuzzes the write log's superblock and record decoders: no panic, and whatever decodes
//! re-encodes to the same bytes (a decoder that accepts more than the encoder writes would let
//! corrupt metadata through).
#![no_main]

use libfuzzer_sys::fuzz_target;
use stics_cache::format::{RecordHeader, Superblock};

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = Superblock::decode(data) {
        let again = s.encode();
        assert_eq!(Superblock::decode(&again).as_ref(), Ok(&s));
    }
    let _ = Superblock::choose(data, data.get(4096..).unwrap_or(&[]));
    let _ = RecordHeader::header_len_from_prefix(data);
    if let Ok(h) = RecordHeader::decode(data) {
        let again = h.encode();
        assert_eq!(RecordHeader::decode(&again).as_ref(), Ok(&h));
        for i in 0..h.entries.len() {
            let _ = h.check_extent(i, data);
        }
    }
});

//! Fuzzes the SG journal's on-disk decoders (a superblock, a record header, a tokens record):
//! no panic, no allocation past what the bytes can hold, and a tokens record that decodes
//! encodes to the same bytes. The first byte chooses which decoder takes the rest.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stics_journal::format::{RecordHeader, Superblock, TokenRecord};

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else { return };
    match which % 3 {
        0 => {
            let _ = Superblock::decode(rest);
        }
        1 => {
            let _ = RecordHeader::decode(rest);
        }
        _ => {
            // Random bytes rarely start with the magic and version: give them both.
            let mut b = b"STICSJTK\x01\x00".to_vec();
            b.extend_from_slice(rest);
            if let Ok(r) = TokenRecord::decode(&b) {
                assert_eq!(r.encode(), b, "a tokens record re-encodes to its bytes");
            }
        }
    }
});

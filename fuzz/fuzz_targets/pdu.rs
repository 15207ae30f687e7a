//! Frames and decodes arbitrary bytes as iSCSI PDUs, with and without digests.
#![no_main]

use bytes::Bytes;
use stics_wire::{check, parse, Digests};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    for (header, data_digest) in [(false, false), (true, true)] {
        let d = Digests { header, data: data_digest };
        if let Ok(n) = check(data, d, 1 << 24) {
            if let Some(frame) = data.get(..n) {
                let _ = parse(Bytes::copy_from_slice(frame), d);
            }
        }
    }
});

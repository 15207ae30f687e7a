//! Parses arbitrary bytes as a block trace in each format and as one told from its first line;
//! every request a parser yields must be one a replay can place.
#![no_main]

use stics_bench::trace::{Filter, Format, Parser};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    for format in [Format::Msr, Format::Blkparse] {
        for q in Parser::new(data, format, Filter::default()).flatten() {
            assert!(q.at >= 0.0 && q.at.is_finite(), "{q:?}");
            assert!(q.offset.checked_add(q.len).is_some(), "{q:?}");
        }
    }
    if let Ok(p) = Parser::detect(data, Filter { disk: Some(0), action: 'D' }) {
        p.for_each(drop);
    }
});

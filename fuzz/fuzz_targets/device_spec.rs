//! Parses arbitrary text as a device spec (what `--lun`, a config file's `luns` and `stics mount`
//! take, `rbd:` and `iscsi://` queries included); a spec that parses prints as text that parses
//! to a spec printing the same way.
#![no_main]

use stics_stack::DeviceSpec;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(spec) = text.parse::<DeviceSpec>() {
        let printed = spec.to_string();
        let _ = spec.redacted().to_string();
        if let Ok(again) = printed.parse::<DeviceSpec>() {
            assert_eq!(again.to_string(), printed, "printing is stable once parsed back");
        }
    }
});

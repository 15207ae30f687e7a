//! Parses arbitrary bytes as login text and runs every pair through the negotiation rules.
#![no_main]

use stics_wire::keys;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(pairs) = stics_wire::text::parse(data) {
        let mut params = keys::Params::default();
        for (k, v) in &pairs {
            if let Some(def) = keys::lookup(k) {
                let _ = keys::respond(def, v, def.default);
                let _ = keys::resolve(def, def.default, v);
            }
            let _ = params.apply(k, v, true);
        }
        params.finish();
    }
});

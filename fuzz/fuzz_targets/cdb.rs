//! Fuzzes the CDB decoder, then runs the same bytes as a command against a small memory LU.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use stics_block::MemDev;
use stics_scsi::{Command, Device, Direction, LogicalUnit, LuConfig, Nexus, TaskAttr};

struct Env {
    rt: tokio::runtime::Runtime,
    dev: Device,
    nexus: Nexus,
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let lu = LogicalUnit::new(Arc::new(MemDev::new(512, 256)), LuConfig::default());
        let nexus = Nexus {
            id: 1,
            initiator_name: "iqn.2024-01.org.fuzz:init".into(),
            isid: [0x80, 0, 0, 0, 0, 1],
            target_name: "iqn.2024-01.org.fuzz:target".into(),
            tpgt: 1,
        };
        Env { rt, dev: Device::new(vec![Arc::new(lu)]), nexus }
    })
}

fuzz_target!(|data: &[u8]| {
    let _ = stics_sam::decode_cdb(data);
    // Layout: 16 CDB bytes, 2 bytes of expected length, the rest is data-out.
    if data.len() >= 18 {
        let e = env();
        let expected_len = u32::from(u16::from_be_bytes([data[16], data[17]]));
        let cmd = Command {
            lun: u64::from(data[15] & 1),
            cdb: bytes::Bytes::copy_from_slice(&data[..16]),
            expected_len,
            direction: Direction::Bidi,
            data_out: bytes::Bytes::copy_from_slice(&data[18..]),
            attr: TaskAttr::Simple,
        };
        let r = e.rt.block_on(e.dev.execute(&e.nexus, cmd));
        assert!(r.data_in.len() <= expected_len as usize);
    }
});

//! Operation codes (SPC-4 annex E, SBC-3), their service actions, and the page codes commands
//! name: what a CDB's first bytes mean.

pub const TEST_UNIT_READY: u8 = 0x00;
pub const REQUEST_SENSE: u8 = 0x03;
pub const READ_6: u8 = 0x08;
pub const WRITE_6: u8 = 0x0a;
pub const INQUIRY: u8 = 0x12;
pub const MODE_SELECT_6: u8 = 0x15;
pub const RESERVE_6: u8 = 0x16;
pub const RELEASE_6: u8 = 0x17;
pub const MODE_SENSE_6: u8 = 0x1a;
pub const START_STOP_UNIT: u8 = 0x1b;
pub const RECEIVE_DIAGNOSTIC: u8 = 0x1c;
pub const SEND_DIAGNOSTIC: u8 = 0x1d;
pub const PREVENT_ALLOW: u8 = 0x1e;
pub const READ_CAPACITY_10: u8 = 0x25;
pub const READ_10: u8 = 0x28;
pub const WRITE_10: u8 = 0x2a;
pub const WRITE_VERIFY_10: u8 = 0x2e;
pub const VERIFY_10: u8 = 0x2f;
pub const PRE_FETCH_10: u8 = 0x34;
pub const SYNC_CACHE_10: u8 = 0x35;
pub const READ_DEFECT_DATA_10: u8 = 0x37;
pub const WRITE_SAME_10: u8 = 0x41;
pub const UNMAP: u8 = 0x42;
pub const LOG_SENSE: u8 = 0x4d;
pub const MODE_SELECT_10: u8 = 0x55;
pub const RESERVE_10: u8 = 0x56;
pub const RELEASE_10: u8 = 0x57;
pub const MODE_SENSE_10: u8 = 0x5a;
pub const PR_IN: u8 = 0x5e;
pub const PR_OUT: u8 = 0x5f;
pub const READ_16: u8 = 0x88;
pub const COMPARE_AND_WRITE: u8 = 0x89;
pub const WRITE_16: u8 = 0x8a;
pub const ORWRITE_16: u8 = 0x8b;
pub const WRITE_VERIFY_16: u8 = 0x8e;
pub const VERIFY_16: u8 = 0x8f;
pub const PRE_FETCH_16: u8 = 0x90;
pub const SYNC_CACHE_16: u8 = 0x91;
pub const WRITE_SAME_16: u8 = 0x93;
pub const SERVICE_ACTION_IN_16: u8 = 0x9e;
pub const REPORT_LUNS: u8 = 0xa0;
pub const MAINTENANCE_IN: u8 = 0xa3;
pub const READ_12: u8 = 0xa8;
pub const WRITE_12: u8 = 0xaa;
pub const WRITE_VERIFY_12: u8 = 0xae;
pub const VERIFY_12: u8 = 0xaf;
pub const READ_DEFECT_DATA_12: u8 = 0xb7;

/// SERVICE ACTION IN(16) service actions.
pub const SA_READ_CAPACITY_16: u8 = 0x10;
pub const SA_GET_LBA_STATUS: u8 = 0x12;
/// MAINTENANCE IN service actions.
pub const SA_REPORT_SUPPORTED_OPCODES: u8 = 0x0c;
pub const SA_REPORT_SUPPORTED_TMFS: u8 = 0x0d;

/// PERSISTENT RESERVE IN service actions (SPC-4 6.15.1).
pub mod pr_in {
    pub const READ_KEYS: u8 = 0;
    pub const READ_RESERVATION: u8 = 1;
    pub const REPORT_CAPABILITIES: u8 = 2;
    pub const READ_FULL_STATUS: u8 = 3;
}

/// PERSISTENT RESERVE OUT service actions (SPC-4 6.16.1).
pub mod pr_out {
    pub const REGISTER: u8 = 0;
    pub const RESERVE: u8 = 1;
    pub const RELEASE: u8 = 2;
    pub const CLEAR: u8 = 3;
    pub const PREEMPT: u8 = 4;
    pub const PREEMPT_AND_ABORT: u8 = 5;
    pub const REGISTER_AND_IGNORE: u8 = 6;
}

/// Persistent reservation types (SPC-4 table 208).
pub mod pr_type {
    pub const WRITE_EXCLUSIVE: u8 = 1;
    pub const EXCLUSIVE_ACCESS: u8 = 3;
    pub const WRITE_EXCLUSIVE_RO: u8 = 5;
    pub const EXCLUSIVE_ACCESS_RO: u8 = 6;
    pub const WRITE_EXCLUSIVE_AR: u8 = 7;
    pub const EXCLUSIVE_ACCESS_AR: u8 = 8;
}

/// Vital product data page codes (SPC-4 7.8, SBC-3 6.6).
pub mod vpd {
    /// Supported VPD Pages.
    pub const SUPPORTED_PAGES: u8 = 0x00;
    /// Unit Serial Number.
    pub const UNIT_SERIAL_NUMBER: u8 = 0x80;
    /// Device Identification.
    pub const DEVICE_IDENTIFICATION: u8 = 0x83;
    /// Extended INQUIRY Data (which task attributes the unit honours).
    pub const EXTENDED_INQUIRY_DATA: u8 = 0x86;
    /// Block Limits.
    pub const BLOCK_LIMITS: u8 = 0xb0;
    /// Block Device Characteristics.
    pub const BLOCK_DEVICE_CHARACTERISTICS: u8 = 0xb1;
    /// Logical Block Provisioning.
    pub const LOGICAL_BLOCK_PROVISIONING: u8 = 0xb2;
}

/// Mode page codes (SPC-4 7.5, SBC-3 6.5).
pub mod mode_page {
    /// Read-Write Error Recovery.
    pub const READ_WRITE_ERROR_RECOVERY: u8 = 0x01;
    /// Disconnect-Reconnect.
    pub const DISCONNECT_RECONNECT: u8 = 0x02;
    /// Caching (WCE lives in byte 2).
    pub const CACHING: u8 = 0x08;
    /// Control.
    pub const CONTROL: u8 = 0x0a;
    /// Informational Exceptions Control.
    pub const INFORMATIONAL_EXCEPTIONS: u8 = 0x1c;
    /// All pages (MODE SENSE only).
    pub const ALL: u8 = 0x3f;
}

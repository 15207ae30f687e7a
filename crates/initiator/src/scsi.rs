//! What a finished SCSI command hands back to the initiator. The SCSI facts it reads and
//! writes (CDB builders, reply parsers, sense data, status codes) live in [`stics_sam`].

#![deny(clippy::unwrap_used, clippy::indexing_slicing)]

use bytes::Bytes;
use stics_sam::sense::{asc, key};
use stics_sam::status;

pub use stics_sam::data::device_type_name;
pub use stics_sam::Sense;

/// A finished SCSI command as the target reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScsiOutcome {
    pub status: u8,
    /// Data read (cut to what the target sent when it reported an underflow).
    pub data: Bytes,
    pub sense: Option<Bytes>,
}

impl ScsiOutcome {
    /// Parsed sense data, if any.
    pub fn sense(&self) -> Option<Sense> {
        self.sense.as_deref().and_then(Sense::parse)
    }

    /// A UNIT ATTENTION of a power on, reset or bus device reset (ASC 29h, any ASCQ): the
    /// target may have lost what sat in its volatile cache.
    pub fn is_reset_attention(&self) -> bool {
        self.unit_attention().is_some_and(|s| s.asc == asc::POWER_ON_RESET.0)
    }

    /// A UNIT ATTENTION saying that another I_T nexus preempted this one's reservation or
    /// registration (RESERVATIONS PREEMPTED, REGISTRATIONS PREEMPTED).
    pub fn is_preemption(&self) -> bool {
        self.unit_attention().is_some_and(|s| {
            let code = (s.asc, s.ascq);
            code == asc::RESERVATIONS_PREEMPTED || code == asc::REGISTRATIONS_PREEMPTED
        })
    }

    fn unit_attention(&self) -> Option<Sense> {
        if self.status != status::CHECK_CONDITION {
            return None;
        }
        self.sense().filter(|s| s.key == key::UNIT_ATTENTION)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fixed-format sense bytes as a target sends them.
    fn outcome(status: u8, key: u8, asc: u8, ascq: u8) -> ScsiOutcome {
        let sense = vec![0x70, 0, key, 0, 0, 0, 0, 10, 0, 0, 0, 0, asc, ascq, 0, 0, 0, 0];
        ScsiOutcome { status, data: Bytes::new(), sense: Some(Bytes::from(sense)) }
    }

    #[test]
    fn a_power_on_or_reset_unit_attention_of_any_ascq_is_a_reset() {
        for ascq in [0x00, 0x01, 0x02, 0x03, 0x07] {
            assert!(outcome(0x02, 0x06, 0x29, ascq).is_reset_attention(), "29h/{ascq:02x}h");
        }
        assert!(!outcome(0x02, 0x06, 0x2a, 0x01).is_reset_attention(), "mode parameters changed");
        assert!(!outcome(0x02, 0x02, 0x29, 0x00).is_reset_attention(), "not a unit attention");
        assert!(!outcome(0x00, 0x06, 0x29, 0x00).is_reset_attention(), "GOOD carries no attention");
        let none = ScsiOutcome { status: 0x02, data: Bytes::new(), sense: None };
        assert!(!none.is_reset_attention());
    }

    #[test]
    fn reservations_or_registrations_preempted_is_a_preemption() {
        assert!(outcome(0x02, 0x06, 0x2a, 0x03).is_preemption());
        assert!(outcome(0x02, 0x06, 0x2a, 0x05).is_preemption());
        assert!(!outcome(0x02, 0x06, 0x2a, 0x04).is_preemption(), "reservations released");
        assert!(!outcome(0x02, 0x06, 0x29, 0x00).is_preemption());
    }
}

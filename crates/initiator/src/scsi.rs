//! What a finished SCSI command hands back to the initiator. The SCSI facts it reads and
//! writes (CDB builders, reply parsers, sense data, status codes) live in [`stics_sam`].

use bytes::Bytes;

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
}

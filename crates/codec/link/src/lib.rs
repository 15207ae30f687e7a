//! The link between a stics gateway (HG) and a stics storage gateway (SG), as pure codecs: a
//! group of whole epochs ([`group`]: last write wins per block, neighbours coalesced, the data
//! compressed in chunks and checksummed), the SCSI commands that carry groups over an iSCSI
//! session ([`cdb`]), the SG's status answer ([`status`]) and the login key both ends offer.
//!
//! A gateway offers [`LOGIN_KEY`] at login; a stics target that serves groups answers with the
//! version it speaks, any other target answers NotUnderstood (RFC 7143 §6.2), and the gateway
//! then destages with plain writes and flushes as before.
//!
//! **Architecture Invariant:** no I/O, no clock; every length a peer sends is checked against
//! the bytes present and the caller's bounds before anything is allocated from it.

#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::indexing_slicing)]

pub mod cdb;
pub mod group;
pub mod status;
pub mod token;

/// The private login key (RFC 7143 §13: `X-` keys are vendor-specific) a gateway offers.
pub const LOGIN_KEY: &str = "X-org.stics.link";

/// The link version this build speaks.
pub const LINK_VERSION: u32 = 1;

/// The fence a source's status reads carry ([`cdb::status`]): its UUID folded to 64 bits,
/// never 0.
pub fn fence_of(source: &[u8; 16]) -> u64 {
    let (a, b) = source.split_at(8);
    let word = |x: &[u8]| x.iter().fold(0u64, |w, byte| (w << 8) | u64::from(*byte));
    (word(a) ^ word(b)).max(1)
}

/// What the far side answered to [`LOGIN_KEY`]: the version both speak, if it speaks one.
pub fn negotiated(answer: Option<&str>) -> Option<u32> {
    let v: u32 = answer?.trim().parse().ok()?;
    (v >= 1).then_some(v.min(LINK_VERSION))
}

/// Why bytes are not a valid group, command or status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// Fewer bytes than the structure needs.
    #[error("truncated: {need} bytes needed, {got} present")]
    Truncated { need: usize, got: usize },
    /// Not a stics group.
    #[error("bad magic")]
    Magic,
    /// Written by a version this build does not read.
    #[error("link format version {0} is not supported (this build reads version 1)")]
    Version(u16),
    /// A checksum does not match: torn or corrupt.
    #[error("{what} checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum { what: &'static str, stored: u32, computed: u32 },
    /// A field holds a value no writer produces, or one past the reader's bounds.
    #[error("field {field} is invalid: {why}")]
    Field { field: &'static str, why: String },
    /// A chunk does not decompress to what its table says.
    #[error("chunk {chunk} does not decompress: {why}")]
    Compression { chunk: usize, why: String },
}

pub(crate) fn field(field: &'static str, why: impl Into<String>) -> LinkError {
    LinkError::Field { field, why: why.into() }
}

pub(crate) fn need(b: &[u8], n: usize) -> Result<(), LinkError> {
    if b.len() < n {
        return Err(LinkError::Truncated { need: n, got: b.len() });
    }
    Ok(())
}

/// A big-endian integer of `N` bytes at `at`, if present.
pub(crate) fn be<const N: usize>(b: &[u8], at: usize) -> Result<[u8; N], LinkError> {
    let s = b.get(at..at + N).ok_or(LinkError::Truncated { need: at + N, got: b.len() })?;
    let mut out = [0u8; N];
    out.copy_from_slice(s);
    Ok(out)
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> Result<u32, LinkError> {
    be(b, at).map(u32::from_be_bytes)
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> Result<u64, LinkError> {
    be(b, at).map(u64::from_be_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_both_speak_is_the_lower_and_anything_else_is_none() {
        assert_eq!(negotiated(Some("1")), Some(1));
        assert_eq!(negotiated(Some("7")), Some(1));
        assert_eq!(negotiated(Some("NotUnderstood")), None);
        assert_eq!(negotiated(Some("0")), None);
        assert_eq!(negotiated(None), None);
    }
}

//! CHAP with MD5 (RFC 1994, as iSCSI uses it in RFC 7143 §12.1.3): responses and the
//! hex/base64 encodings of binary values.

use base64::Engine;

/// CHAP_A value for MD5, the only algorithm iSCSI requires.
pub const ALGORITHM_MD5: &str = "5";

/// A CHAP value that could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChapError {
    /// Not `0x` hex or `0b` base64.
    #[error("binary value must start with 0x (hex) or 0b (base64)")]
    Encoding,
    /// Bad digits for the encoding.
    #[error("malformed binary value")]
    Digits,
    /// An identifier that is not a number 0..=255.
    #[error("CHAP_I must be a number from 0 to 255")]
    Identifier,
}

/// The CHAP response: MD5(identifier ‖ secret ‖ challenge).
pub fn response(id: u8, secret: &[u8], challenge: &[u8]) -> [u8; 16] {
    use md5::{Digest, Md5};
    let mut h = Md5::new();
    h.update([id]);
    h.update(secret);
    h.update(challenge);
    h.finalize().into()
}

/// Compares a received response with the expected one in constant time.
pub fn verify(id: u8, secret: &[u8], challenge: &[u8], received: &[u8]) -> bool {
    let expected = response(id, secret, challenge);
    received.len() == expected.len() && received.iter().zip(expected.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// Encodes bytes as `0x` followed by hex digits.
pub fn encode_hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(2 + bytes.len() * 2);
    s.push_str("0x");
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Decodes a `0x` hex or `0b` base64 value.
pub fn decode_binary(s: &str) -> Result<Vec<u8>, ChapError> {
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        if hex.is_empty() {
            return Err(ChapError::Digits);
        }
        // An odd number of digits has an implied leading zero.
        let padded = if hex.len() % 2 == 1 { format!("0{hex}") } else { hex.to_owned() };
        let digits = padded.as_bytes();
        digits
            .chunks(2)
            .map(|p| {
                let s = std::str::from_utf8(p).map_err(|_| ChapError::Digits)?;
                u8::from_str_radix(s, 16).map_err(|_| ChapError::Digits)
            })
            .collect()
    } else if let Some(b64) = s.strip_prefix("0b").or_else(|| s.strip_prefix("0B")) {
        base64::engine::general_purpose::STANDARD.decode(b64).map_err(|_| ChapError::Digits)
    } else {
        Err(ChapError::Encoding)
    }
}

/// Parses CHAP_I.
pub fn parse_identifier(s: &str) -> Result<u8, ChapError> {
    let v = if let Some(h) = s.strip_prefix("0x") { u32::from_str_radix(h, 16) } else { s.parse::<u32>() };
    v.ok().and_then(|v| u8::try_from(v).ok()).ok_or(ChapError::Identifier)
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    /// RFC 1321 test suite value, to pin the MD5 input order (id, secret, challenge).
    #[test]
    fn response_is_md5_of_id_secret_challenge() {
        // MD5("abc") = 900150983cd24fb0d6963f7d28e17f72; id 'a', secret "b", challenge "c".
        let r = response(b'a', b"b", b"c");
        assert_eq!(encode_hex(&r), "0x900150983cd24fb0d6963f7d28e17f72");
        assert!(verify(b'a', b"b", b"c", &r));
        assert!(!verify(b'a', b"x", b"c", &r));
        assert!(!verify(b'a', b"b", b"c", &r[..15]));
    }

    #[test]
    fn binary_encodings() {
        assert_eq!(decode_binary("0x0a0B").unwrap(), vec![10, 11]);
        assert_eq!(decode_binary("0xabc").unwrap(), vec![0x0a, 0xbc]);
        assert_eq!(decode_binary("0bAQID").unwrap(), vec![1, 2, 3]);
        assert_eq!(decode_binary("abc"), Err(ChapError::Encoding));
        assert_eq!(decode_binary("0xzz"), Err(ChapError::Digits));
        assert_eq!(parse_identifier("17").unwrap(), 17);
        assert!(parse_identifier("256").is_err());
    }
}

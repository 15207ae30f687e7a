//! Text key=value pairs of Login and Text PDUs (RFC 7143 §6.1): NUL-terminated UTF-8 strings.

use bytes::Bytes;

/// Longest key name RFC 7143 §6.1 allows.
pub const MAX_KEY_LEN: usize = 63;
/// Longest value accepted (the RFC's limit for the longest binary values, §6.1).
pub const MAX_VALUE_LEN: usize = 8192;

/// A text segment that is not a list of key=value pairs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    /// A pair without `=`.
    #[error("text pair without '=' at byte {0}")]
    MissingEquals(usize),
    /// An empty key, or one longer than 63 bytes, or with characters outside the RFC's set.
    #[error("bad key name at byte {0}")]
    BadKey(usize),
    /// A value longer than the limit.
    #[error("value of key {0:?} too long")]
    ValueTooLong(String),
    /// Bytes that are not UTF-8.
    #[error("text is not UTF-8 at byte {0}")]
    NotUtf8(usize),
}

fn key_char_ok(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+' | '@' | '_' | '#')
}

/// Parses a text data segment. Empty strings between NULs (padding) are ignored; a final pair
/// without its NUL is accepted, since the data segment length bounds it.
pub fn parse(data: &[u8]) -> Result<Vec<(String, String)>, TextError> {
    let mut out = Vec::new();
    let mut at = 0usize;
    for chunk in data.split(|&b| b == 0) {
        let start = at;
        at += chunk.len() + 1;
        if chunk.is_empty() {
            continue;
        }
        let s = std::str::from_utf8(chunk).map_err(|e| TextError::NotUtf8(start + e.valid_up_to()))?;
        let (k, v) = s.split_once('=').ok_or(TextError::MissingEquals(start))?;
        if k.is_empty() || k.len() > MAX_KEY_LEN || !k.chars().all(key_char_ok) {
            return Err(TextError::BadKey(start));
        }
        if v.len() > MAX_VALUE_LEN {
            return Err(TextError::ValueTooLong(k.to_owned()));
        }
        out.push((k.to_owned(), v.to_owned()));
    }
    Ok(out)
}

/// Encodes pairs as `key=value\0...`.
pub fn encode<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> Bytes {
    let mut v = Vec::new();
    for (k, val) in pairs {
        v.extend_from_slice(k.as_ref().as_bytes());
        v.push(b'=');
        v.extend_from_slice(val.as_ref().as_bytes());
        v.push(0);
    }
    Bytes::from(v)
}

#[cfg(test)]
#[expect(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_login_keys() {
        let pairs =
            parse(b"InitiatorName=iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test\0SessionType=Normal\0\0\0")
                .unwrap();
        assert_eq!(pairs.len(), 2);
        assert_eq!(pairs[1], ("SessionType".into(), "Normal".into()));
    }

    #[test]
    fn value_may_contain_equals_and_be_empty() {
        assert_eq!(parse(b"X-a=b=c\0Y=\0").unwrap(), vec![("X-a".into(), "b=c".into()), ("Y".into(), String::new())]);
    }

    #[test]
    fn malformed_text_is_refused() {
        assert_eq!(parse(b"NoEquals\0"), Err(TextError::MissingEquals(0)));
        assert_eq!(parse(b"=v\0"), Err(TextError::BadKey(0)));
        assert_eq!(parse(b"A=1\0\xff=2\0"), Err(TextError::NotUtf8(4)));
        let long = format!("{}=1\0", "K".repeat(64));
        assert_eq!(parse(long.as_bytes()), Err(TextError::BadKey(0)));
    }

    #[test]
    fn encode_parse_round_trip() {
        let pairs = vec![("HeaderDigest".to_string(), "CRC32C,None".to_string())];
        assert_eq!(parse(&encode(&pairs)).unwrap(), pairs);
    }

    proptest! {
        #[test]
        fn parse_never_panics(data in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse(&data);
        }
    }
}

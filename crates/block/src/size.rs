//! Sizes as people write them on command lines and in configuration files: `1GiB`, `64M`, `4096`.

/// Default logical block size.
pub const DEFAULT_BLOCK_SIZE: u32 = 512;

/// A size that does not parse or is not a multiple of the block size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad size {0:?}: use bytes or a suffix K, M, G, T (KiB, MiB, GiB, TiB), a whole number of 512-byte blocks")]
pub struct SizeError(pub String);

/// Parses `1GiB`, `64M`, `4096`, `1.5G` (binary units) into bytes, a positive multiple of
/// [`DEFAULT_BLOCK_SIZE`].
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let err = || SizeError(s.to_owned());
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(err()),
    };
    let v: f64 = num.parse().map_err(|_| err())?;
    let bytes = v * mult as f64;
    if !(bytes.is_finite() && bytes >= 1.0 && bytes < 2f64.powi(63)) {
        return Err(err());
    }
    let bytes = bytes as u64;
    if !bytes.is_multiple_of(u64::from(DEFAULT_BLOCK_SIZE)) {
        return Err(err());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("4096"), Ok(4096));
        for bad in ["12", "", "-1G", "1Q", "0"] {
            assert_eq!(parse_size(bad), Err(SizeError(bad.into())), "{bad}");
        }
    }
}

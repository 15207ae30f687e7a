//! Sizes as people write them on command lines and in configuration files: `1GiB`, `64M`, `4096`.

/// Default logical block size.
pub const DEFAULT_BLOCK_SIZE: u32 = 512;

/// A size that does not parse or is not a multiple of the block size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "bad size {0:?}: use bytes or a suffix: k, M, G, T or KiB, MiB, GiB, TiB (binary), kB, MB, GB, TB (decimal); \
     a whole number of 512-byte blocks"
)]
pub struct SizeError(pub String);

/// Parses a size as every stics subcommand reads it (`stics_units`: `1GiB`, `64M`, `1.5G` binary,
/// `1GB` decimal) into bytes, a positive multiple of [`DEFAULT_BLOCK_SIZE`].
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let err = || SizeError(s.to_owned());
    let bytes = stics_units::parse_size(s).map_err(|_| err())?;
    if bytes == 0 || bytes >= 1 << 63 || !bytes.is_multiple_of(u64::from(DEFAULT_BLOCK_SIZE)) {
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

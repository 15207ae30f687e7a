//! LUN specifications as the command line writes them: `mem:SIZE`, `null:SIZE`, `file:PATH[:SIZE]`.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use crate::{BlockDev, FileDev, MemDev, NullDev};

/// Default logical block size.
pub const DEFAULT_BLOCK_SIZE: u32 = 512;

/// A parsed LUN specification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DevSpec {
    /// RAM, `size` bytes.
    Mem { size: u64 },
    /// Reads zeros, drops writes.
    Null { size: u64 },
    /// A file (created at `size` if missing) or a block-device node.
    File { path: PathBuf, size: Option<u64> },
}

/// Why a LUN specification was refused.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The text is not of the form `KIND:ARGS`.
    #[error("bad LUN spec {0:?}: expected mem:SIZE, null:SIZE or file:PATH[:SIZE]")]
    Syntax(String),
    /// A size that does not parse or is not a multiple of the block size.
    #[error(
        "bad size {0:?}: use bytes or a suffix K, M, G, T (KiB, MiB, GiB, TiB), a whole number of 512-byte blocks"
    )]
    Size(String),
    /// The backing file could not be opened.
    #[error("cannot open {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Parses `1GiB`, `64M`, `4096`, `1.5G` (binary) or `1GB` (decimal) as every stics subcommand reads
/// sizes (`stics_units`); a LUN is also a whole number of 512-byte blocks.
pub fn parse_size(s: &str) -> Result<u64, SpecError> {
    let err = || SpecError::Size(s.to_owned());
    let bytes = stics_units::parse_size(s).map_err(|_| err())?;
    if bytes == 0 || bytes >= 1 << 63 || !bytes.is_multiple_of(u64::from(DEFAULT_BLOCK_SIZE)) {
        return Err(err());
    }
    Ok(bytes)
}

impl FromStr for DevSpec {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Self, SpecError> {
        let (kind, rest) = s.split_once(':').ok_or_else(|| SpecError::Syntax(s.to_owned()))?;
        match kind {
            "mem" => Ok(DevSpec::Mem { size: parse_size(rest)? }),
            "null" => Ok(DevSpec::Null { size: parse_size(rest)? }),
            "file" => {
                if rest.is_empty() {
                    return Err(SpecError::Syntax(s.to_owned()));
                }
                // A trailing `:SIZE` is a size only if it parses as one, so paths may hold ':'.
                if let Some((path, size)) = rest.rsplit_once(':') {
                    if let Ok(size) = parse_size(size) {
                        return Ok(DevSpec::File { path: path.into(), size: Some(size) });
                    }
                }
                Ok(DevSpec::File { path: rest.into(), size: None })
            }
            _ => Err(SpecError::Syntax(s.to_owned())),
        }
    }
}

/// Opens the device a spec names.
pub fn open(spec: &DevSpec) -> Result<Arc<dyn BlockDev>, SpecError> {
    let bs = DEFAULT_BLOCK_SIZE;
    Ok(match spec {
        DevSpec::Mem { size } => Arc::new(MemDev::new(bs, size / u64::from(bs))),
        DevSpec::Null { size } => Arc::new(NullDev::new(bs, size / u64::from(bs))),
        DevSpec::File { path, size } => {
            Arc::new(FileDev::open(path, *size, bs).map_err(|source| SpecError::Open { path: path.clone(), source })?)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs() {
        assert_eq!("mem:1GiB".parse::<DevSpec>().unwrap(), DevSpec::Mem { size: 1 << 30 });
        assert_eq!("null:64M".parse::<DevSpec>().unwrap(), DevSpec::Null { size: 64 << 20 });
        assert_eq!(
            "file:/tmp/a.img:1G".parse::<DevSpec>().unwrap(),
            DevSpec::File { path: "/tmp/a.img".into(), size: Some(1 << 30) }
        );
        assert_eq!(
            "file:/dev/loop0".parse::<DevSpec>().unwrap(),
            DevSpec::File { path: "/dev/loop0".into(), size: None }
        );
        assert!("mem:12".parse::<DevSpec>().is_err());
        assert!("mem:".parse::<DevSpec>().is_err());
        assert!("disk:1G".parse::<DevSpec>().is_err());
        assert!("mem:-1G".parse::<DevSpec>().is_err());
        assert!("mem:1Q".parse::<DevSpec>().is_err());
    }
}

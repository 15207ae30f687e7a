//! Turning a [`DeviceSpec`] into a running device: the one place that calls every backend's
//! constructor.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use stics_block::{BlockDev, FileDev, MemDev, NullDev};
use stics_initiator::{Lun, LunOptions};

use crate::spec::{valid_block_size, DeviceSpec, IscsiOptions};

/// What opening needs beyond the spec, and what it opened that needs closing.
///
/// Opening runs on the caller's tokio runtime: remote sessions spawn their tasks there.
#[derive(Debug, Default)]
pub struct OpenContext {
    /// How remote LUNs are reached: the initiator's name, digests, timers and recovery policy,
    /// sessions per LUN, largest transfer. A spec's own options override these.
    pub initiator: LunOptions,
    remote: Mutex<Vec<Arc<Lun>>>,
}

impl OpenContext {
    /// A context whose remote LUNs are opened with `initiator`.
    pub fn new(initiator: LunOptions) -> OpenContext {
        OpenContext { initiator, remote: Mutex::new(Vec::new()) }
    }

    fn remote(&self) -> MutexGuard<'_, Vec<Arc<Lun>>> {
        self.remote.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every remote LUN opened through this context, in the order opened: for session parameters
    /// and counters.
    pub fn remote_luns(&self) -> Vec<Arc<Lun>> {
        self.remote().clone()
    }

    /// Logs out of every remote LUN opened through this context; their I/O fails afterwards.
    pub async fn close(&self) {
        let luns = std::mem::take(&mut *self.remote());
        for lun in luns {
            lun.close().await;
        }
    }
}

/// Why a device could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The backing file or device node could not be opened or created.
    #[error("cannot open {path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The remote LUN could not be logged in to or is not a disk (`url` without secrets).
    #[error("cannot open {url}: {source}")]
    Iscsi {
        url: String,
        #[source]
        source: stics_initiator::Error,
    },
    /// A spec built in code with a geometry no parsed spec has.
    #[error("{0}: size must be a positive whole number of 512-, 1024-, 2048- or 4096-byte blocks")]
    Geometry(String),
}

/// Blocks of `size` bytes, when the geometry is one a parsed spec could have.
fn blocks(spec: &DeviceSpec, size: u64, block_size: u32) -> Result<u64, OpenError> {
    if valid_block_size(block_size) && size > 0 && size.is_multiple_of(u64::from(block_size)) {
        Ok(size / u64::from(block_size))
    } else {
        Err(OpenError::Geometry(spec.redacted().to_string()))
    }
}

/// Opens the device `spec` names, and every device under it.
pub async fn open(spec: &DeviceSpec, ctx: &OpenContext) -> Result<Arc<dyn BlockDev>, OpenError> {
    Ok(match spec {
        DeviceSpec::Mem { size, block_size } => Arc::new(MemDev::new(*block_size, blocks(spec, *size, *block_size)?)),
        DeviceSpec::Null { size, block_size } => Arc::new(NullDev::new(*block_size, blocks(spec, *size, *block_size)?)),
        DeviceSpec::File { path, size, block_size } => {
            if let Some(size) = size {
                blocks(spec, *size, *block_size)?;
            } else if !valid_block_size(*block_size) {
                return Err(OpenError::Geometry(spec.redacted().to_string()));
            }
            let file = FileDev::open(path, *size, *block_size)
                .map_err(|source| OpenError::File { path: path.clone(), source })?;
            Arc::new(file)
        }
        DeviceSpec::Iscsi { url, options } => {
            let IscsiOptions { sessions, digests } = options;
            let mut opts = ctx.initiator.clone();
            if let Some(n) = sessions {
                opts.sessions = *n;
            }
            if let Some(d) = digests {
                opts.config.offer.header_digest = *d;
                opts.config.offer.data_digest = *d;
            }
            let lun =
                Lun::open(url, &opts).await.map_err(|source| OpenError::Iscsi { url: url.to_string(), source })?;
            let lun = Arc::new(lun);
            ctx.remote().push(Arc::clone(&lun));
            lun
        }
        // A wrapper opens its inner spec with `Box::pin(open(inner, ctx)).await` (the future
        // is recursive), then builds itself around the device it got.
        DeviceSpec::Layer(layer) => match *layer {},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn open_text(text: &str) -> Result<Arc<dyn BlockDev>, OpenError> {
        open(&text.parse().unwrap(), &OpenContext::default()).await
    }

    #[tokio::test]
    async fn backends_get_the_geometry_of_their_spec() {
        let g = open_text("mem:1MiB").await.unwrap().geometry();
        assert_eq!((g.block_size, g.num_blocks), (512, 2048));
        let g = open_text("mem:1MiB:4096").await.unwrap().geometry();
        assert_eq!((g.block_size, g.num_blocks), (4096, 256));
        let g = open_text("null:1G:2048").await.unwrap().geometry();
        assert_eq!((g.block_size, g.num_blocks), (2048, 1 << 19));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lun.img");
        let g = open_text(&format!("file:{}:1M:4096", path.display())).await.unwrap().geometry();
        assert_eq!((g.block_size, g.num_blocks), (4096, 256));
        // Without a size, the file's length counts.
        let g = open_text(&format!("file:{}::1024", path.display())).await.unwrap().geometry();
        assert_eq!((g.block_size, g.num_blocks), (1024, 1024));
        let g = open_text(&format!("file:{}", path.display())).await.unwrap().geometry();
        assert_eq!((g.block_size, g.num_blocks), (512, 2048));
    }

    #[tokio::test]
    async fn failures_name_the_device() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.img");
        let e = open_text(&format!("file:{}", missing.display())).await.err().unwrap();
        assert!(e.to_string().contains("missing.img"), "{e}");
        let e = open(&DeviceSpec::Mem { size: 1000, block_size: 512 }, &OpenContext::default()).await.err().unwrap();
        assert!(matches!(e, OpenError::Geometry(_)), "{e}");
        let e = open(&DeviceSpec::Null { size: 4096, block_size: 3000 }, &OpenContext::default()).await.err().unwrap();
        assert!(e.to_string().contains("null:4KiB:3000"), "{e}");
    }

    #[tokio::test]
    async fn an_unreachable_target_is_an_error_without_secrets() {
        // Port 1 on loopback refuses connections at once.
        let ctx = OpenContext::default();
        let e = open(&"iscsi://u%hush@127.0.0.1:1/iqn.2024-01.org.x:y/0".parse().unwrap(), &ctx).await.err().unwrap();
        assert!(matches!(e, OpenError::Iscsi { .. }), "{e}");
        assert!(e.to_string().contains("127.0.0.1:1"), "{e}");
        assert!(!e.to_string().contains("hush"), "{e}");
        assert!(ctx.remote_luns().is_empty());
    }
}

//! Byte-range I/O on a block device at any alignment: what an exporter that speaks bytes (a
//! FUSE file, an NBD server) needs on top of whole-block reads and writes.

use bytes::{Bytes, BytesMut};
use tokio::sync::RwLock;

use crate::{BlockDev, BlockError};

/// Reads `len` bytes at byte offset `off`, any alignment.
pub async fn read_at(dev: &dyn BlockDev, off: u64, len: usize) -> Result<Bytes, BlockError> {
    let bs = u64::from(dev.geometry().block_size);
    if len == 0 {
        return Ok(Bytes::new());
    }
    let first = off / bs;
    let last = (off + len as u64 - 1) / bs;
    let blocks = u32::try_from(last - first + 1).map_err(|_| BlockError::Unsupported("read larger than 4 G blocks"))?;
    let data = dev.read(first, blocks).await?;
    let skip = (off - first * bs) as usize;
    Ok(data.slice(skip..skip + len))
}

/// Writes `data` at byte offset `off`, any alignment; partial blocks are read, merged and
/// written back under the exclusive side of `lock`.
pub async fn write_at(
    dev: &dyn BlockDev,
    lock: &RwLock<()>,
    off: u64,
    data: Bytes,
    fua: bool,
) -> Result<bool, BlockError> {
    let bs = u64::from(dev.geometry().block_size);
    if data.is_empty() {
        return Ok(false);
    }
    if off.is_multiple_of(bs) && (data.len() as u64).is_multiple_of(bs) {
        let _g = lock.read().await;
        dev.write(off / bs, data, fua).await?;
        return Ok(false);
    }
    let _g = lock.write().await;
    let first = off / bs;
    let last = (off + data.len() as u64 - 1) / bs;
    let blocks =
        u32::try_from(last - first + 1).map_err(|_| BlockError::Unsupported("write larger than 4 G blocks"))?;
    let old = dev.read(first, blocks).await?;
    let mut buf = BytesMut::from(&old[..]);
    let skip = (off - first * bs) as usize;
    buf[skip..skip + data.len()].copy_from_slice(&data);
    dev.write(first, buf.freeze(), fua).await?;
    Ok(true)
}

/// Zeros `len` bytes at byte offset `off`: partial blocks at either end by read-modify-write,
/// whole blocks by [`BlockDev::discard`] when `punch` allows it and the device supports it (its
/// discarded blocks read as zeros), otherwise by [`BlockDev::write_zeros`].
pub async fn zero_at(dev: &dyn BlockDev, lock: &RwLock<()>, off: u64, len: u64, punch: bool) -> Result<(), BlockError> {
    let bs = u64::from(dev.geometry().block_size);
    let end = off + len;
    let first_whole = off.div_ceil(bs) * bs;
    let last_whole = end / bs * bs;
    if first_whole >= last_whole {
        // No whole block inside: one partial write covers it.
        write_at(dev, lock, off, Bytes::from(vec![0u8; len as usize]), false).await?;
        return Ok(());
    }
    if off < first_whole {
        write_at(dev, lock, off, Bytes::from(vec![0u8; (first_whole - off) as usize]), false).await?;
    }
    if last_whole < end {
        write_at(dev, lock, last_whole, Bytes::from(vec![0u8; (end - last_whole) as usize]), false).await?;
    }
    let _g = lock.read().await;
    let (lba, blocks) = (first_whole / bs, (last_whole - first_whole) / bs);
    if punch && dev.supports_discard() {
        dev.discard(lba, blocks).await
    } else {
        dev.write_zeros(lba, blocks).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::MemDev;

    fn dev() -> Arc<dyn BlockDev> {
        Arc::new(MemDev::new(512, 64))
    }

    #[tokio::test]
    async fn unaligned_writes_merge_with_neighbouring_bytes() {
        let d = dev();
        let lock = RwLock::new(());
        d.write(0, Bytes::from(vec![0xaa; 2048]), false).await.unwrap();
        let rmw = write_at(&*d, &lock, 500, Bytes::from(vec![1u8; 30]), false).await.unwrap();
        assert!(rmw);
        let b = read_at(&*d, 490, 50).await.unwrap();
        assert_eq!(&b[..10], &[0xaa; 10]);
        assert_eq!(&b[10..40], &[1u8; 30]);
        assert_eq!(&b[40..], &[0xaa; 10]);
        assert!(!write_at(&*d, &lock, 1024, Bytes::from(vec![2u8; 512]), false).await.unwrap());
        assert_eq!(&read_at(&*d, 1023, 2).await.unwrap()[..], &[0xaa, 2]);
    }

    #[tokio::test]
    async fn zeroing_keeps_the_bytes_around_the_range() {
        for punch in [false, true] {
            let d = dev();
            let lock = RwLock::new(());
            d.write(0, Bytes::from(vec![0xaa; 64 * 512]), false).await.unwrap();
            zero_at(&*d, &lock, 700, 3000, punch).await.unwrap();
            let b = read_at(&*d, 0, 64 * 512).await.unwrap();
            assert!(b[..700].iter().all(|&x| x == 0xaa));
            assert!(b[700..3700].iter().all(|&x| x == 0));
            assert!(b[3700..].iter().all(|&x| x == 0xaa));
            // Inside one block.
            zero_at(&*d, &lock, 5000, 10, punch).await.unwrap();
            let b = read_at(&*d, 4990, 30).await.unwrap();
            assert_eq!(&b[..10], &[0xaa; 10]);
            assert_eq!(&b[10..20], &[0; 10]);
            assert_eq!(&b[20..], &[0xaa; 10]);
        }
    }

    #[tokio::test]
    async fn reads_past_the_end_are_refused_by_the_device() {
        let d = dev();
        assert!(read_at(&*d, 64 * 512 - 1, 2).await.is_err());
        assert_eq!(read_at(&*d, 100, 0).await.unwrap().len(), 0);
    }
}

//! The log's writers: group commit (everything waiting in RAM in one record, one write and one
//! flush), the superblock's checkpoint, and formatting a new log. A failed write is retried with
//! the same bytes at the same place: a copy elsewhere, or under a new sequence number or
//! generation, could end recovery's scan early or leave only a superblock that points at reused
//! space.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{complete, lock, report, Inner, LogDev};
use crate::core::RecordWrite;
use crate::format::{Checkpoint, RemoteBinding, Superblock, LOG_BLOCK, RING_START};
use crate::{CacheError, ConfigError};

/// Formats a new log on `log`, bound to `remote`.
pub(crate) async fn format(log: &LogDev, device_bytes: u64, remote: RemoteBinding) -> Result<Superblock, CacheError> {
    let log_uuid: [u8; 16] = rand::random();
    let mut sb = Superblock {
        log_uuid,
        generation: 1,
        log_bytes: device_bytes,
        remote,
        checkpoint: Checkpoint { head_offset: RING_START, head_seq: 1, destaged_epoch: 0 },
    };
    if device_bytes < RING_START + LOG_BLOCK {
        return Err(CacheError::Config(ConfigError::LogTooSmall { ring: 0, need: RING_START + LOG_BLOCK }));
    }
    // Both copies, so that no copy of an earlier log can win.
    for _ in 0..2 {
        sb.generation += 1;
        log.write(sb.copy_offset(), Bytes::from(sb.encode())).await.map_err(CacheError::Log)?;
    }
    log.0.flush().await.map_err(CacheError::Log)?;
    tracing::info!(bytes = device_bytes, "formatted a new write log");
    Ok(sb)
}

/// Writes `bytes` at `offset` and flushes the log, until both succeed: each failure goes to the
/// core's health, and the next attempt waits for its backoff.
async fn write_until_durable(inner: &Inner, offset: u64, bytes: Bytes, what: &str) {
    loop {
        let r = async {
            inner.log.write(offset, bytes.clone()).await?;
            inner.log.0.flush().await
        }
        .await;
        match r {
            Ok(()) => {
                lock(&inner.core).log_ok(Instant::now());
                report(inner);
                return;
            }
            Err(e) => {
                let wait = lock(&inner.core).log_failed(format!("{what} at byte {offset}: {e}"), Instant::now());
                report(inner);
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Group commit: everything waiting in RAM goes to the log in one write and one flush. When the
/// cache stops, it ends once nothing acknowledged is left in RAM.
pub(crate) async fn log_writer(inner: Arc<Inner>) {
    loop {
        let notified = inner.logger.notified();
        let record = lock(&inner.core).next_record();
        let Some(RecordWrite { seq, offset, bytes }) = record else {
            if inner.stopping.load(Ordering::Acquire) {
                return;
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
            continue;
        };
        write_until_durable(&inner, offset, Bytes::from(bytes), "log record").await;
        let done = lock(&inner.core).record_durable(seq);
        complete(&inner, done);
        inner.destager.notify_one();
        inner.space.notify_waiters();
    }
}

/// Makes the core's newest checkpoint durable in the superblock copy its generation names, if it
/// moved; then the core may reuse the space before its head. One at a time, each taking the
/// checkpoint only once it is its turn: a higher generation must never carry an older
/// checkpoint, or recovery would start from a head whose space was already reused. True when
/// one was written.
pub(crate) async fn persist_checkpoint(inner: &Inner) -> bool {
    let _turn = inner.checkpointing.lock().await;
    let Some(cp) = lock(&inner.core).take_checkpoint() else { return false };
    let (offset, bytes) = {
        let mut sb = lock(&inner.superblock);
        sb.generation += 1;
        sb.checkpoint = cp;
        (sb.copy_offset(), sb.encode())
    };
    write_until_durable(inner, offset, Bytes::from(bytes), "superblock").await;
    lock(&inner.core).checkpoint_durable(cp);
    true
}

//! Destage's driver: carries out what the core's destage hands out (writes, zeroings, flushes,
//! read-backs), many in flight, on the remote's ordered queue when it has one, and books each
//! answer with the remote's reset count and the time; after progress, the checkpoint.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use stics_block::{BlockError, OrderedQueue};
use tokio::task::JoinSet;

use super::log_writer::persist_checkpoint;
use super::{complete, lock, report, Inner};
use crate::core::{DestageIo, GroupPlan, Piece, Probe, SgHolds};

/// What a destage task reports.
enum Ended {
    /// A write or zeroing.
    Io(u64, Result<(), BlockError>),
    /// The flush after an epoch, and when it was sent.
    Sync(u64, Result<(), BlockError>, Instant),
    /// A read-back of the remote: which versions it holds.
    Probe(Result<Vec<bool>, BlockError>),
    /// A group shipped to the SG: its number, its encoded size and when it was sent.
    Group(u64, Result<u64, BlockError>, Instant),
    /// The SG's status of this log.
    Status(Result<SgHolds, BlockError>),
}

/// Destage: epochs in order, many remote writes in flight, a flush of the remote at the end of
/// each, a durable checkpoint after it. On an ordered remote the flush is a barrier queued right
/// behind the epoch's writes, and the next epoch's writes right behind it.
pub(crate) async fn destager(inner: Arc<Inner>) {
    let mut running: JoinSet<Ended> = JoinSet::new();
    let ordered = lock(&inner.core).layout().ordered_remote;
    loop {
        if inner.halted.load(Ordering::Acquire) {
            running.abort_all();
            return;
        }
        let notified = inner.destager.notified();
        tokio::pin!(notified);
        if let (true, Some(q), true) = (ordered, inner.remote.ordered_queue(), running.is_empty()) {
            // Cheap unless the session was reinstated or the claim was refused: then the claim
            // is made again first. Only with nothing in flight: after a lost connection the
            // queue refuses new commands until this, so that none lands before the failures of
            // those queued earlier have been seen.
            let prepared = tokio::time::timeout(inner.cfg.answer_timeout, q.prepare()).await;
            let failed = match prepared {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e),
                // Still reconnecting: the remote counts unreachable meanwhile.
                Err(_) => Some(BlockError::Unreachable(format!(
                    "no answer from the remote for {} s while claiming it again",
                    inner.cfg.answer_timeout.as_secs()
                ))),
            };
            if let Some(e) = failed {
                let wait = {
                    let mut c = lock(&inner.core);
                    c.remote_failed(&e, None, Instant::now());
                    c.retry_at().map_or(Duration::ZERO, |t| t.saturating_duration_since(Instant::now()))
                };
                report(&inner);
                tracing::debug!("remote not ready for destage: {e}");
                tokio::time::sleep(wait.max(Duration::from_millis(10))).await;
                continue;
            }
        }
        let ios = lock(&inner.core).next_destage(inner.remote.resets(), Instant::now());
        let mut progressed = !ios.is_empty();
        match inner.remote.ordered_queue() {
            Some(q) if ordered => queue_in_order(&inner, q, ios, &mut running).await,
            _ => {
                for io in ios {
                    spawn_destage(&inner, io, &mut running);
                }
            }
        }
        // Collect what finished; wait a while for the first if nothing else can happen (not for
        // ever: a remote that stops answering must still be noticed below). While a drain or a
        // settle waits, new work ends the wait too: a group may go behind the one out.
        let mut woke = false;
        loop {
            let joined = if progressed {
                running.try_join_next()
            } else {
                let until = tokio::time::Instant::now() + Duration::from_millis(500);
                loop {
                    tokio::select! {
                        j = running.join_next() => break j,
                        () = notified.as_mut() => {
                            woke = true;
                            notified.set(inner.destager.notified());
                            if lock(&inner.core).hurried() {
                                break None;
                            }
                        }
                        () = tokio::time::sleep_until(until) => break None,
                    }
                }
            };
            let Some(joined) = joined else { break };
            progressed = true;
            let Ok(ended) = joined else { continue };
            destage_ended(&inner, ended).await;
        }
        lock(&inner.core).check_answers(Instant::now());
        report(&inner);
        if !progressed && !woke {
            // Idle, or holding back after a failure: until the backoff ends or new work comes.
            let wait = lock(&inner.core)
                .retry_at()
                .map_or(Duration::from_millis(100), |t| t.saturating_duration_since(Instant::now()));
            let _ = tokio::time::timeout(wait.min(Duration::from_millis(100)), notified).await;
        }
    }
}

/// Reads a destage write's sources: RAM and log slots.
async fn sources(inner: &Inner, pieces: Vec<Piece>) -> Result<Bytes, BlockError> {
    let bs = inner.geometry.block_size as usize;
    if let [Piece::Ram(b)] = pieces.as_slice() {
        return Ok(b.clone());
    }
    let mut out = BytesMut::new();
    for p in pieces {
        match p {
            Piece::Ram(b) => out.extend_from_slice(&b),
            Piece::Log { offset, blocks } => {
                let slots = inner.log.read(offset, blocks as usize * bs).await?;
                out.extend_from_slice(&slots);
            }
            Piece::Zero { blocks } => out.resize(out.len() + blocks as usize * bs, 0),
            Piece::Remote { .. } => {
                return Err(BlockError::Unsupported("a destage write sourced from the remote"));
            }
        }
    }
    Ok(out.freeze())
}

/// Runs destage operations each in its own task (a remote that does not keep order: the core
/// hands out a flush only once the epoch's writes completed).
fn spawn_destage(inner: &Arc<Inner>, io: DestageIo, running: &mut JoinSet<Ended>) {
    let inner = Arc::clone(inner);
    match io {
        DestageIo::Write { id, lba, sources: from, .. } => {
            running.spawn(async move {
                let r = async {
                    let data = sources(&inner, from).await?;
                    let (len, started) = (data.len() as u64, Instant::now());
                    inner.remote.write(lba, data, false).await?;
                    lock(&inner.counters).remote_write(len, started.elapsed());
                    Ok(())
                }
                .await;
                Ended::Io(id, r)
            });
        }
        DestageIo::Zero { id, lba, blocks, discard } => {
            running.spawn(async move {
                let remote = &inner.remote;
                let r = if discard && remote.supports_discard() {
                    remote.discard(lba, u64::from(blocks)).await
                } else {
                    remote.write_zeros(lba, u64::from(blocks)).await
                };
                Ended::Io(id, r)
            });
        }
        DestageIo::Sync { epoch, .. } => {
            running.spawn(async move {
                let started = Instant::now();
                Ended::Sync(epoch, inner.remote.flush().await, started)
            });
        }
        DestageIo::Probe(probe) => {
            running.spawn(async move { Ended::Probe(run_probe(inner, probe).await) });
        }
        DestageIo::Group(plan) => {
            tracing::trace!(
                seq = plan.seq,
                first_epoch = plan.first_epoch,
                last_epoch = plan.last_epoch,
                bytes = plan.raw_bytes,
                "shipping a group"
            );
            running.spawn(async move {
                let (seq, started) = (plan.seq, Instant::now());
                Ended::Group(seq, ship_group(&inner, plan).await, started)
            });
        }
        DestageIo::GroupStatus => {
            running.spawn(async move { Ended::Status(sg_status(&inner).await) });
        }
    }
}

/// Encodes a group (the same bytes again when it is sent again) and commits it on the SG;
/// returns its encoded size.
async fn ship_group(inner: &Arc<Inner>, plan: GroupPlan) -> Result<u64, BlockError> {
    let plan_seq = plan.seq;
    let sink = inner.remote.group_sink().ok_or(BlockError::Unsupported("the remote no longer takes groups"))?;
    let kept = lock(&inner.group_bytes).iter().find(|(seq, _)| *seq == plan.seq).map(|(_, b)| b.clone());
    let bytes = match kept {
        Some(b) => b,
        None => {
            let data = sources(inner, plan.sources.clone()).await?;
            let head = stics_link::group::GroupHead {
                source: lock(&inner.core).log_uuid,
                seq: plan.seq,
                first_epoch: plan.first_epoch,
                last_epoch: plan.last_epoch,
                block_size: inner.geometry.block_size,
            };
            let level = inner.cfg.group_level;
            let fences =
                inner.fencer.as_ref().map(|f| fences(f.as_ref(), &plan.extents, head.block_size)).transpose()?;
            // Compression is CPU work of tens of milliseconds for a large group: off the runtime.
            let encoded = tokio::task::spawn_blocking(move || {
                stics_link::group::encode_fenced(&head, &plan.extents, &data, level, fences.as_ref())
            })
            .await
            .map_err(|e| BlockError::Io { lba: 0, source: std::io::Error::other(e) })?
            .map_err(|e| BlockError::Rejected(format!("encoding a group: {e}")))?;
            let b = Bytes::from(encoded);
            let mut kept = lock(&inner.group_bytes);
            // The groups out: a newer number than all of them starts a new run of groups.
            kept.retain(|(seq, _)| *seq < plan.seq);
            kept.push((plan.seq, b.clone()));
            if kept.len() > stics_link::status::GROUPS_IN_FLIGHT as usize {
                kept.remove(0);
            }
            b
        }
    };
    let len = bytes.len() as u64;
    sink.commit(bytes).await?;
    lock(&inner.group_bytes).retain(|(seq, _)| *seq > plan_seq);
    lock(&inner.counters).remote_write_bytes += len;
    Ok(len)
}

/// The generation of the exclusive token each segment a group writes is held under. A segment
/// without one was written under a token this gateway no longer holds: the group cannot land.
fn fences(
    f: &dyn crate::driver::Fencer,
    extents: &[stics_link::group::Extent],
    block_size: u32,
) -> Result<stics_link::group::Fences, BlockError> {
    let segment_bytes = f.segment_bytes();
    let mut gens = Vec::new();
    let mut lost = Vec::new();
    for seg in stics_link::group::segments_touched(extents, block_size, segment_bytes) {
        match f.exclusive(seg) {
            Some(gen) => gens.push((seg, gen)),
            None => lost.push(seg),
        }
    }
    if lost.is_empty() {
        return Ok(stics_link::group::Fences { segment_bytes, gens });
    }
    let known = f.known();
    if known {
        for &seg in &lost {
            f.lost(seg);
        }
    }
    Err(BlockError::Rejected(format!(
        "a group writes segments {lost:?}, on which this gateway holds no exclusive token{}",
        if known { ": their writes go to quarantine" } else { " yet (it is learning its tokens)" }
    )))
}

/// What the SG holds of this log.
async fn sg_status(inner: &Arc<Inner>) -> Result<SgHolds, BlockError> {
    let sink = inner.remote.group_sink().ok_or(BlockError::Unsupported("the remote no longer takes groups"))?;
    let me = lock(&inner.core).log_uuid;
    let raw = sink.link_status(stics_link::fence_of(&me)).await?;
    let st = stics_link::status::Status::decode(&raw)
        .map_err(|e| BlockError::Io { lba: 0, source: std::io::Error::other(format!("the SG's status: {e}")) })?;
    Ok(st.of(&me).map_or_else(SgHolds::default, |s| SgHolds {
        committed_seq: s.committed_seq,
        committed_epoch: s.committed_epoch,
    }))
}

/// Queues destage operations on an ordered remote, in the order the core gave them. If the data
/// of one cannot be read from the log, it and everything after it fail unsent: nothing may
/// overtake it.
async fn queue_in_order(inner: &Arc<Inner>, q: &dyn OrderedQueue, ios: Vec<DestageIo>, running: &mut JoinSet<Ended>) {
    let mut ios = ios.into_iter();
    while let Some(io) = ios.next() {
        let failed = match io {
            DestageIo::Write { id, lba, sources: from, .. } => match sources(inner, from).await {
                Ok(data) => {
                    let len = data.len() as u64;
                    let (fut, started) = (q.queue_write(lba, data), Instant::now());
                    let inner = Arc::clone(inner);
                    running.spawn(async move {
                        let r = fut.await;
                        if r.is_ok() {
                            lock(&inner.counters).remote_write(len, started.elapsed());
                        }
                        Ended::Io(id, r)
                    });
                    None
                }
                Err(e) => {
                    tracing::error!("destage could not read the log: {e}");
                    lock(&inner.core).destage_failed(id, &e, Instant::now());
                    Some(e)
                }
            },
            DestageIo::Zero { id, lba, blocks, discard } => {
                let fut = q.queue_zeros(lba, u64::from(blocks), discard && inner.remote.supports_discard());
                running.spawn(async move { Ended::Io(id, fut.await) });
                None
            }
            DestageIo::Sync { epoch, .. } => {
                let (fut, started) = (q.queue_barrier(), Instant::now());
                running.spawn(async move { Ended::Sync(epoch, fut.await, started) });
                None
            }
            // Nothing else is in flight while one of these is.
            io @ (DestageIo::Probe(_) | DestageIo::Group(_) | DestageIo::GroupStatus) => {
                spawn_destage(inner, io, running);
                None
            }
        };
        if let Some(e) = failed {
            let mut c = lock(&inner.core);
            let now = Instant::now();
            for io in ios.by_ref() {
                match io {
                    DestageIo::Write { id, .. } | DestageIo::Zero { id, .. } => c.destage_failed(id, &e, now),
                    DestageIo::Sync { epoch, .. } => c.sync_failed(epoch, &e, now),
                    DestageIo::Probe(_) => c.probe_failed(&e, now),
                    DestageIo::Group(p) => c.group_failed(p.seq, &e, now),
                    DestageIo::GroupStatus => c.group_status_failed(&e, now),
                }
            }
        }
    }
}

/// Reads back the blocks of a [`Probe`] from the remote (many reads in flight: recovery should
/// not pay a round trip per block) and says for each version whether the remote holds it. A
/// zeroing or a discard is held where the remote reads zeros: a remote that unmaps reads
/// unmapped blocks as zeros, and anything else there means the discard never reached it.
async fn run_probe(inner: Arc<Inner>, probe: Probe) -> Result<Vec<bool>, BlockError> {
    let bs = inner.geometry.block_size as usize;
    let per_read = (inner.cfg.destage_io_bytes / bs as u64).clamp(1, u64::from(u32::MAX)) as u32;
    let mut held: HashMap<u64, Bytes> = HashMap::new();
    let mut reads: JoinSet<Result<(u64, Bytes), BlockError>> = JoinSet::new();
    let mut runs = probe.runs(per_read).into_iter();
    loop {
        while reads.len() < inner.cfg.destage_inflight.max(1) {
            let Some((lba, n)) = runs.next() else { break };
            let inner = Arc::clone(&inner);
            reads.spawn(async move { Ok((lba, inner.remote.read(lba, n).await?)) });
        }
        let Some(joined) = reads.join_next().await else { break };
        let (lba, data) = joined.map_err(|e| BlockError::Io { lba: 0, source: std::io::Error::other(e) })??;
        for (i, block) in data.chunks_exact(bs).enumerate() {
            held.insert(lba + i as u64, data.slice(i * bs..i * bs + block.len()));
        }
    }
    let mut out = Vec::with_capacity(probe.versions.len());
    for v in probe.versions {
        let Some(there) = held.get(&v.lba) else {
            out.push(false);
            continue;
        };
        let same = match v.source {
            Piece::Log { offset, .. } => inner.log.read(offset, bs).await?.as_ref() == there.as_ref(),
            _ => there.iter().all(|x| *x == 0),
        };
        out.push(same);
    }
    Ok(out)
}

/// Books a finished destage operation; after progress, makes the new checkpoint durable.
async fn destage_ended(inner: &Arc<Inner>, ended: Ended) {
    let now = Instant::now();
    let moved = match ended {
        Ended::Io(id, Ok(())) => lock(&inner.core).destage_done(id, now),
        Ended::Io(id, Err(e)) => {
            tracing::debug!("destage write failed: {e}");
            lock(&inner.counters).destage_retries += 1;
            lock(&inner.core).destage_failed(id, &e, now);
            false
        }
        Ended::Sync(epoch, Ok(()), started) => {
            lock(&inner.counters).remote_sync(started.elapsed());
            // A flush answered after the remote was reset proves nothing: the core sends the
            // epoch again.
            let resets = inner.remote.resets();
            lock(&inner.core).synced(epoch, resets, now)
        }
        Ended::Sync(epoch, Err(e), _) => {
            tracing::debug!(epoch, "remote flush failed: {e}");
            lock(&inner.counters).destage_retries += 1;
            lock(&inner.core).sync_failed(epoch, &e, now);
            false
        }
        Ended::Probe(Ok(matches)) => {
            lock(&inner.core).probed(&matches, now);
            tracing::info!("read back what the remote holds of the epochs in flight; destage resumes");
            false
        }
        Ended::Probe(Err(e)) => {
            tracing::debug!("reading back the remote failed: {e}");
            lock(&inner.counters).destage_retries += 1;
            lock(&inner.core).probe_failed(&e, now);
            false
        }
        Ended::Group(seq, Ok(encoded), started) => {
            tracing::trace!(seq, ms = started.elapsed().as_secs_f64() * 1e3, "group committed on the SG");
            lock(&inner.core).group_committed(seq, encoded, started.elapsed(), now)
        }
        Ended::Group(seq, Err(e), _) => {
            tracing::debug!(seq, "shipping a group failed: {e}");
            if matches!(e, BlockError::Rejected(_)) {
                tracing::warn!(seq, "the SG refused a group: {e}");
                lock(&inner.group_bytes).clear();
            }
            lock(&inner.counters).destage_retries += 1;
            lock(&inner.core).group_failed(seq, &e, now);
            false
        }
        Ended::Status(Ok(holds)) => {
            tracing::info!(
                committed_seq = holds.committed_seq,
                committed_epoch = holds.committed_epoch,
                "read what the SG holds of this log"
            );
            lock(&inner.core).group_status(holds, now)
        }
        Ended::Status(Err(e)) => {
            tracing::debug!("reading the SG's status failed: {e}");
            lock(&inner.counters).destage_retries += 1;
            lock(&inner.core).group_status_failed(&e, now);
            false
        }
    };
    if moved {
        let acks = lock(&inner.core).take_acks();
        complete(inner, acks);
        persist_checkpoint(inner).await;
        tracing::trace!("checkpoint durable");
        inner.space.notify_waiters();
        inner.freed.notify_waiters();
    }
}

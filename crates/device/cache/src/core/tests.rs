use std::time::{Duration, Instant};

use bytes::Bytes;
use stics_block::BlockError;

use super::*;
use crate::config::{Config, Layout, Mode};
use crate::format::{Checkpoint, RING_START};
use crate::readcache::Policy;

fn cfg(mode: Mode) -> Config {
    Config {
        mode,
        ram_bytes: 1 << 20,
        max_record_bytes: 1 << 20,
        destage_io_bytes: 4096,
        destage_inflight: 4,
        deep_destage_from: 0.0,
        epoch_max_writes: 1000,
        epoch_max_bytes: 8 << 20,
        read_cache_bytes: 64 * 512,
        read_cache_policy: Policy::Lru,
        read_ahead_bytes: 64 * 512,
        ..Config::default()
    }
}

fn layout(ordered: bool) -> Layout {
    Layout {
        block_size: 512,
        num_blocks: 1024,
        ring_start: RING_START,
        ring_end: RING_START + (64 << 20),
        ordered_remote: ordered,
        max_group: None,
        groups_in_flight: 1,
    }
}

fn cp() -> Checkpoint {
    Checkpoint { head_offset: RING_START, head_seq: 1, destaged_epoch: 0 }
}

fn core(mode: Mode) -> Core {
    Core::new(cfg(mode), layout(false), [1; 16], cp())
}

fn ordered(mode: Mode) -> Core {
    let mut c = cfg(mode);
    c.destage_inflight = 16;
    Core::new(c, layout(true), [1; 16], cp())
}

fn blocks(n: usize, fill: u8) -> Bytes {
    Bytes::from(vec![fill; n * 512])
}

fn now() -> Instant {
    Instant::now()
}

fn io_error() -> BlockError {
    BlockError::Io { lba: 0, source: std::io::Error::other("injected") }
}

/// Writes the pending record and reports it durable; returns the acknowledged tickets.
fn log_all(c: &mut Core) -> Vec<Ticket> {
    let mut acked = Vec::new();
    while let Some(r) = c.next_record() {
        acked.extend(c.record_durable(r.seq));
    }
    acked
}

/// Runs destage of one epoch to its SYNCHRONIZE CACHE; returns the writes (lba, blocks).
fn destage_epoch(c: &mut Core) -> (Vec<(u64, u32)>, Option<u64>) {
    let mut writes = Vec::new();
    let mut sync = None;
    for _ in 0..100 {
        let ios = c.next_destage(0, now());
        if ios.is_empty() {
            break;
        }
        for io in ios {
            match io {
                DestageIo::Write { id, lba, blocks, .. } | DestageIo::Zero { id, lba, blocks, .. } => {
                    writes.push((lba, blocks));
                    c.destage_done(id, now());
                }
                DestageIo::Sync { epoch, .. } => sync = Some(epoch),
                other => panic!("nothing but plain destage on a fresh log: {other:?}"),
            }
        }
        if sync.is_some() {
            break;
        }
    }
    (writes, sync)
}

/// Destages and synchronises everything, making each checkpoint durable.
fn drain(c: &mut Core) {
    for _ in 0..1000 {
        log_all(c);
        let (_, sync) = destage_epoch(c);
        if let Some(e) = sync {
            c.synced(e, 0, now());
        }
        if let Some(cp) = c.take_checkpoint() {
            c.checkpoint_durable(cp);
        }
        if c.is_clean() {
            return;
        }
    }
    panic!("did not drain");
}

#[test]
fn a_block_overwritten_within_an_epoch_crosses_to_the_remote_once() {
    let mut c = core(Mode::Immediate);
    for i in 0..10 {
        assert_eq!(c.write(7, blocks(1, i), false), Ok(Submitted::Done));
    }
    log_all(&mut c);
    let (writes, sync) = destage_epoch(&mut c);
    assert_eq!(writes, vec![(7, 1)]);
    assert_eq!(sync, Some(1));
    assert_eq!(c.stats().blocks_absorbed, 9);
}

#[test]
fn immediate_mode_acknowledges_at_once_and_a_flush_waits_for_the_log() {
    let mut c = core(Mode::Immediate);
    assert_eq!(c.write(0, blocks(2, 1), false), Ok(Submitted::Done));
    let Submitted::Wait(t) = c.flush() else { panic!("a flush with a write in RAM must wait") };
    assert_eq!(log_all(&mut c), vec![t]);
    assert_eq!(c.flush(), Submitted::Done);
}

#[test]
fn fua_waits_for_the_log_even_in_immediate_mode() {
    let mut c = core(Mode::Immediate);
    let Ok(Submitted::Wait(t)) = c.write(0, blocks(1, 1), true) else { panic!("FUA must wait") };
    assert_eq!(log_all(&mut c), vec![t]);
}

#[test]
fn log_mode_acknowledges_when_the_record_is_durable() {
    let mut c = core(Mode::Log);
    let Ok(Submitted::Wait(a)) = c.write(0, blocks(1, 1), false) else { panic!("log mode waits") };
    let Ok(Submitted::Wait(b)) = c.write(1, blocks(1, 2), false) else { panic!("log mode waits") };
    let r = c.next_record().expect("a record");
    assert!(c.next_record().is_none(), "one record in flight at a time");
    assert_eq!(c.record_durable(r.seq), vec![a, b]);
}

#[test]
fn in_log_mode_a_write_after_an_acknowledgement_starts_a_new_epoch() {
    let mut c = core(Mode::Log);
    c.write(0, blocks(1, 1), false).expect("write");
    c.write(1, blocks(1, 1), false).expect("write");
    assert_eq!(c.epochs().0, 1);
    log_all(&mut c);
    c.write(2, blocks(1, 1), false).expect("write");
    assert_eq!(c.epochs().0, 2, "the host may have issued this write because the others completed");
}

#[test]
fn in_log_mode_fua_writes_share_an_epoch_until_one_is_acknowledged() {
    // A target with WCE=0 sends every write with FUA; all are durable once acknowledged.
    let mut c = core(Mode::Log);
    c.write(0, blocks(1, 1), true).expect("write");
    c.write(1, blocks(1, 1), true).expect("write");
    assert_eq!(c.epochs().0, 1);
    log_all(&mut c);
    c.write(2, blocks(1, 1), true).expect("write");
    assert_eq!(c.epochs().0, 2);
    // In `immediate` mode a FUA write is what makes earlier writes durable: it ends its epoch.
    let mut c = core(Mode::Immediate);
    c.write(0, blocks(1, 1), true).expect("write");
    c.write(1, blocks(1, 1), false).expect("write");
    assert_eq!(c.epochs().0, 2);
}

#[test]
fn destage_coalesces_neighbours_up_to_the_io_limit_and_never_mixes_epochs() {
    let mut c = core(Mode::Immediate);
    c.write(10, blocks(3, 1), false).expect("write");
    c.write(13, blocks(10, 1), false).expect("write");
    c.write(40, blocks(1, 1), false).expect("write");
    c.flush();
    c.write(14, blocks(1, 2), false).expect("write");
    log_all(&mut c);
    let (writes, sync) = destage_epoch(&mut c);
    // 13 neighbouring blocks in 8-block (4 KiB) writes, then the lone block; not block 14's
    // second version, which belongs to the next epoch.
    assert_eq!(writes, vec![(10, 8), (18, 5), (40, 1)]);
    assert_eq!(sync, Some(1));
}

#[test]
fn the_next_epoch_is_destaged_only_after_the_checkpoint_is_durable() {
    let mut c = core(Mode::Immediate);
    c.write(0, blocks(1, 1), false).expect("write");
    c.flush();
    c.write(1, blocks(1, 2), false).expect("write");
    log_all(&mut c);
    let (_, sync) = destage_epoch(&mut c);
    assert!(c.synced(sync.expect("sync"), 0, now()));
    assert!(c.next_destage(0, now()).is_empty(), "epoch 2 must wait for the checkpoint naming epoch 1");
    let cp = c.take_checkpoint().expect("checkpoint moved");
    assert_eq!(cp.destaged_epoch, 1);
    c.checkpoint_durable(cp);
    let (writes, _) = destage_epoch(&mut c);
    assert_eq!(writes, vec![(1, 1)]);
}

#[test]
fn reads_merge_ram_log_zeros_and_remote_in_block_order() {
    // Without a read cache, logged blocks are read from their slots.
    let mut c = Core::new(Config { read_cache_bytes: 0, ..cfg(Mode::Immediate) }, layout(false), [1; 16], cp());
    c.write(2, blocks(2, 1), false).expect("write");
    log_all(&mut c);
    c.write(4, blocks(1, 2), false).expect("write");
    c.zero(5, 2, true).expect("zero");
    let plan = c.read(0, 8).expect("plan");
    assert_eq!(plan.pieces.len(), 5);
    assert_eq!(plan.pieces[0], Piece::Remote { lba: 0, blocks: 2 });
    assert!(matches!(plan.pieces[1], Piece::Log { blocks: 2, .. }));
    assert!(matches!(&plan.pieces[2], Piece::Ram(b) if b.len() == 512));
    assert_eq!(plan.pieces[3], Piece::Zero { blocks: 2 });
    assert_eq!(plan.pieces[4], Piece::Remote { lba: 7, blocks: 1 });
    assert_eq!(plan.pinned.len(), 1);
    c.unpin(&plan.pinned);
}

#[test]
fn remote_data_is_cached_unless_a_destage_raced_it() {
    let mut c = core(Mode::Immediate);
    let plan = c.read(0, 4).expect("plan");
    assert_eq!(plan.pieces, vec![Piece::Remote { lba: 0, blocks: 4 }]);
    c.finish_read(plan.generation, &[(0, blocks(4, 7))]);
    let again = c.read(0, 4).expect("plan");
    assert!(again.pieces.iter().all(|p| matches!(p, Piece::Ram(b) if b[0] == 7)));
    // A read planned, then block 9 written and destaged, then the stale data arrives.
    let stale = c.read(8, 2).expect("plan");
    c.write(9, blocks(1, 1), false).expect("write");
    log_all(&mut c);
    let (_, sync) = destage_epoch(&mut c);
    assert!(c.synced(sync.expect("sync"), 0, now()));
    c.finish_read(stale.generation, &[(8, blocks(2, 0))]);
    // Block 9 reads as the write (the read cache's copy of it), not the stale remote data.
    assert!(matches!(&c.read(9, 1).expect("plan").pieces[..], [Piece::Ram(b)] if b[..] == blocks(1, 1)[..]));
    // Block 8 was not written: its data is good and cached.
    assert!(matches!(&c.read(8, 1).expect("plan").pieces[..], [Piece::Ram(b)] if b[0] == 0));
}

#[test]
fn a_logged_write_is_read_from_dram_before_and_after_destage() {
    for mode in [Mode::Log, Mode::Immediate] {
        let mut c = core(mode);
        c.write(2, blocks(3, 4), false).expect("write");
        log_all(&mut c);
        let plan = c.read(0, 6).expect("plan");
        assert_eq!(plan.pieces.len(), 5, "{mode:?}: {:?}", plan.pieces);
        assert!(plan.pieces[1..4].iter().all(|p| matches!(p, Piece::Ram(b) if b[..] == blocks(1, 4)[..])));
        assert!(plan.pinned.is_empty(), "{mode:?}: no log slot is read");
        c.unpin(&plan.pinned);
        drain(&mut c);
        let plan = c.read(2, 3).expect("plan");
        assert!(plan.pieces.iter().all(|p| matches!(p, Piece::Ram(b) if b[..] == blocks(1, 4)[..])), "{mode:?}");
        assert!(!plan.has_remote(), "{mode:?}: destaged blocks stay in DRAM");
    }
}

#[test]
fn only_the_newest_write_of_a_block_enters_the_read_cache() {
    let mut c = core(Mode::Immediate);
    c.write(7, blocks(2, 1), false).expect("write");
    c.write(8, blocks(1, 2), false).expect("write");
    log_all(&mut c);
    drain(&mut c);
    let plan = c.read(7, 2).expect("plan");
    assert!(matches!(&plan.pieces[..], [Piece::Ram(a), Piece::Ram(b)] if a[0] == 1 && b[0] == 2), "{:?}", plan.pieces);
    // A write whose record becomes durable after a newer write to the block came in.
    c.write(20, blocks(1, 5), false).expect("write");
    let first = c.next_record().expect("a record");
    c.write(20, blocks(1, 6), false).expect("write");
    c.record_durable(first.seq);
    assert!(matches!(&c.read(20, 1).expect("plan").pieces[..], [Piece::Ram(b)] if b[0] == 6));
    drain(&mut c);
    assert!(matches!(&c.read(20, 1).expect("plan").pieces[..], [Piece::Ram(b)] if b[0] == 6));
}

#[test]
fn a_zeroed_or_forgotten_block_loses_its_copy_and_an_evicted_one_is_read_from_its_slot() {
    let mut c = core(Mode::Log);
    c.write(30, blocks(2, 3), false).expect("write");
    log_all(&mut c);
    c.zero(30, 1, false).expect("zero");
    c.forget(31, 1).expect("forget");
    log_all(&mut c);
    let plan = c.read(30, 2).expect("plan");
    assert_eq!(plan.pieces, vec![Piece::Zero { blocks: 1 }, Piece::Remote { lba: 31, blocks: 1 }]);
    // More writes than the read cache holds (64 blocks): the first ones are read from the log.
    c.write(100, blocks(96, 8), false).expect("write");
    log_all(&mut c);
    let plan = c.read(100, 96).expect("plan");
    assert!(matches!(plan.pieces[0], Piece::Log { blocks: 32, .. }), "{:?}", &plan.pieces[..2]);
    assert!(plan.pieces[1..].iter().all(|p| matches!(p, Piece::Ram(b) if b[0] == 8)));
    assert_eq!(plan.pinned.len(), 1);
    c.unpin(&plan.pinned);
}

#[test]
fn read_ahead_is_kept_while_destage_retires_other_blocks() {
    // The gateway's read-ahead was dropped whole whenever any epoch reached the remote, so
    // sequential reads during destage each paid a round trip.
    let mut c = core(Mode::Immediate);
    c.read(100, 2).expect("plan");
    let plan = c.read(102, 2).expect("plan");
    let (from, n) = plan.prefetch.expect("a sequential reader reads ahead");
    c.finish_read(plan.generation, &[(102, blocks(2, 3))]);
    // Destage puts unrelated blocks on the remote while the read-ahead is on its way.
    c.write(900, blocks(4, 1), false).expect("write");
    drain(&mut c);
    c.finish_read(plan.generation, &[(from, blocks(n as usize, 5))]);
    let next = c.read(104, 2).expect("plan");
    assert!(next.pieces.iter().all(|p| matches!(p, Piece::Ram(_))), "read-ahead hit: {:?}", next.pieces);
}

#[test]
fn the_read_cache_keeps_copies_not_slices_of_the_remote_buffer() {
    let mut c = core(Mode::Immediate);
    let plan = c.read(0, 4).expect("plan");
    let big = blocks(4, 9);
    c.finish_read(plan.generation, &[(0, big.clone())]);
    let Piece::Ram(b) = &c.read(1, 1).expect("plan").pieces[0] else { panic!("a hit") };
    let range = big.as_ptr() as usize..big.as_ptr() as usize + big.len();
    assert!(!range.contains(&(b.as_ptr() as usize)), "a cached block must not pin the remote's buffer");
}

#[test]
fn sequential_reads_grow_a_read_ahead_window_and_random_reads_stop_it() {
    let mut c = core(Mode::Immediate);
    assert_eq!(c.read(100, 2).expect("plan").prefetch, None);
    assert_eq!(c.read(102, 2).expect("plan").prefetch, Some((104, 8)));
    // The window doubles (16, then 32) and read-ahead keeps at least half of it ahead.
    assert_eq!(c.read(104, 2).expect("plan").prefetch, Some((112, 10)));
    assert_eq!(c.read(106, 2).expect("plan").prefetch, Some((122, 18)));
    assert_eq!(c.read(108, 2).expect("plan").prefetch, Some((140, 34)));
    assert_eq!(c.read(110, 2).expect("plan").prefetch, None, "a full window is already ahead");
    assert_eq!(c.read(500, 2).expect("plan").prefetch, None);
    assert_eq!(c.read(502, 2).expect("plan").prefetch, Some((504, 8)));
}

#[test]
fn out_of_range_and_misaligned_requests_are_refused() {
    let mut c = core(Mode::Log);
    assert!(matches!(c.write(1024, blocks(1, 0), false), Err(CoreError::OutOfRange { .. })));
    assert!(matches!(c.write(0, Bytes::from(vec![0; 100]), false), Err(CoreError::Misaligned { .. })));
    assert!(matches!(c.read(1000, 100), Err(CoreError::OutOfRange { .. })));
    assert!(matches!(c.zero(u64::MAX, 2, false), Err(CoreError::OutOfRange { .. })));
}

#[test]
fn a_discard_of_a_whole_terabyte_lun_is_a_few_runs_in_the_index_and_one_remote_command() {
    let mut big = layout(false);
    big.num_blocks = (1u64 << 40) / 512;
    let mut c = Core::new(cfg(Mode::Log), big, [1; 16], cp());
    c.write(12345, blocks(8, 1), false).expect("write");
    c.zero(0, big.num_blocks, true).expect("discard");
    assert_eq!(c.dirty_blocks(), big.num_blocks);
    assert!(c.index_extents() <= 4, "{} runs", c.index_extents());
    log_all(&mut c);
    let mut zeroings = Vec::new();
    for _ in 0..10 {
        for io in c.next_destage(0, now()) {
            match io {
                DestageIo::Write { id, .. } => {
                    c.destage_done(id, now());
                }
                DestageIo::Zero { id, lba, blocks, discard } => {
                    zeroings.push((lba, blocks, discard));
                    c.destage_done(id, now());
                }
                DestageIo::Sync { epoch, .. } => {
                    c.synced(epoch, 0, now());
                }
                other => panic!("no {other:?}"),
            }
        }
        if let Some(cp) = c.take_checkpoint() {
            c.checkpoint_durable(cp);
        }
    }
    // 2^31 blocks: one discard.
    assert_eq!(zeroings, vec![(0, 1 << 31, true)]);
    assert!(c.is_clean());
}

fn probe(versions: &[(u64, u64)]) -> Probe {
    let mut epochs: Vec<u64> = versions.iter().map(|v| v.1).collect();
    epochs.sort_unstable();
    epochs.dedup();
    Probe {
        epochs,
        versions: versions
            .iter()
            .map(|&(lba, epoch)| ProbeVersion { lba, epoch, source: Piece::Zero { blocks: 1 } })
            .collect(),
    }
}

#[test]
fn the_remote_is_found_after_the_newest_epoch_it_holds_whole() {
    // Epoch 1 writes block 10; epoch 2 blocks 10 and 11; epoch 3 blocks 11 and 12.
    let p = probe(&[(10, 1), (10, 2), (11, 2), (11, 3), (12, 3)]);
    // All of epoch 2 and block 11 of epoch 3.
    assert_eq!(reached_epoch(0, &p, &[false, true, false, true, false]), 2);
    // Everything.
    assert_eq!(reached_epoch(0, &p, &[false, true, false, true, true]), 3);
    // Nothing: block 10 holds neither epoch 1's nor epoch 2's version.
    assert_eq!(reached_epoch(0, &p, &[false, false, false, false, false]), 0);
    // Epoch 1 and part of epoch 2.
    assert_eq!(reached_epoch(0, &p, &[true, false, true, false, false]), 1);
    // Epoch 3's block 12 without epoch 2's block 10: no state after epoch 1 explains it.
    assert_eq!(reached_epoch(0, &p, &[true, false, false, false, true]), 1);
}

/// Five single-write epochs in `log` mode, pipelined on an ordered remote.
fn five_pipelined() -> (Core, Vec<DestageIo>) {
    let mut c = ordered(Mode::Log);
    for i in 0..5u64 {
        c.write(i, blocks(1, i as u8 + 1), false).expect("write");
        log_all(&mut c);
    }
    c.hurry(true);
    let ios = c.next_destage(0, now());
    let syncs = ios.iter().filter(|io| matches!(io, DestageIo::Sync { barrier: true, .. })).count();
    assert_eq!(syncs, 5, "five single-write epochs are pipelined: {ios:?}");
    (c, ios)
}

#[test]
fn after_a_failure_with_many_epochs_sent_destage_reads_back_then_resends_one_epoch_alone() {
    let (mut c, ios) = five_pipelined();
    let t = now();
    for io in &ios {
        match io {
            DestageIo::Write { id, .. } => c.destage_failed(*id, &BlockError::Unreachable("cut".into()), t),
            DestageIo::Sync { epoch, .. } => c.sync_failed(*epoch, &BlockError::Unreachable("cut".into()), t),
            _ => {}
        }
    }
    assert_eq!(c.health().state(), State::Degraded);
    assert!(c.next_destage(0, t).is_empty(), "nothing goes out before the backoff");
    let later = t + Duration::from_secs(10);
    let ios = c.next_destage(0, later);
    let [DestageIo::Probe(p)] = ios.as_slice() else { panic!("a probe first: {ios:?}") };
    assert_eq!(p.epochs, vec![1, 2, 3, 4, 5]);
    assert!(c.next_destage(0, later).is_empty(), "nothing else while the probe is out");
    // The remote got epochs 1 and 2: epoch 2 goes again, alone, its flush after its write.
    c.probed(&[true, true, false, false, false], later);
    let ios = c.next_destage(0, later);
    let [DestageIo::Write { id, lba: 1, .. }] = ios.as_slice() else { panic!("epoch 2 alone: {ios:?}") };
    c.destage_done(*id, later);
    let ios = c.next_destage(0, later);
    assert_eq!(ios, vec![DestageIo::Sync { epoch: 2, barrier: false }], "the flush once the write completed");
    assert!(c.synced(2, 0, later));
    assert_eq!(c.health().state(), State::Healthy, "progress ends the failure");
    let cp = c.take_checkpoint().expect("checkpoint");
    c.checkpoint_durable(cp);
    // Then the pipeline again: epochs 3 to 5 at once.
    let ios = c.next_destage(0, later);
    assert_eq!(ios.iter().filter(|io| matches!(io, DestageIo::Sync { barrier: true, .. })).count(), 3, "{ios:?}");
}

#[test]
fn a_flush_answered_after_the_remote_was_reset_does_not_retire_the_epoch() {
    // A SYNCHRONIZE CACHE reissued after a reconnect, or retried past a power-on unit
    // attention, answers GOOD for writes the remote lost with its volatile cache.
    let mut c = core(Mode::Immediate);
    c.write(3, blocks(2, 1), false).expect("write");
    c.write(40, blocks(1, 1), false).expect("write");
    log_all(&mut c);
    let ios = c.next_destage(7, now());
    assert_eq!(ios.len(), 2);
    for io in &ios {
        if let DestageIo::Write { id, .. } = io {
            c.destage_done(*id, now());
        }
    }
    let sync = c.next_destage(7, now());
    assert_eq!(sync, vec![DestageIo::Sync { epoch: 1, barrier: false }]);
    assert!(!c.synced(1, 8, now()), "the remote was reset since the epoch began");
    assert_eq!(c.epochs().1, 0);
    let again: Vec<(u64, u32)> = c
        .next_destage(8, now())
        .iter()
        .filter_map(|io| if let DestageIo::Write { lba, blocks, .. } = io { Some((*lba, *blocks)) } else { None })
        .collect();
    assert_eq!(again, vec![(3, 2), (40, 1)], "every write of the epoch goes again");
    assert_eq!(c.stats().epochs_resent, 1);
}

#[test]
fn a_failed_flush_sends_the_whole_epoch_again() {
    let mut c = core(Mode::Immediate);
    c.write(3, blocks(2, 1), false).expect("write");
    log_all(&mut c);
    let ios = c.next_destage(0, now());
    let [DestageIo::Write { id, .. }] = ios.as_slice() else { panic!("{ios:?}") };
    c.destage_done(*id, now());
    assert_eq!(c.next_destage(0, now()), vec![DestageIo::Sync { epoch: 1, barrier: false }]);
    c.sync_failed(1, &io_error(), now());
    assert_eq!(c.health().state(), State::Stalled);
    let later = now() + Duration::from_secs(60);
    let ios = c.next_destage(0, later);
    assert!(matches!(ios.as_slice(), [DestageIo::Write { lba: 3, blocks: 2, .. }]), "{ios:?}");
}

#[test]
fn a_failed_write_alone_is_retried_after_a_pause_on_an_unordered_remote() {
    let mut c = core(Mode::Immediate);
    c.write(3, blocks(2, 1), false).expect("write");
    c.write(40, blocks(1, 1), false).expect("write");
    log_all(&mut c);
    let t = now();
    let ios = c.next_destage(0, t);
    let ids: Vec<u64> =
        ios.iter().filter_map(|io| if let DestageIo::Write { id, .. } = io { Some(*id) } else { None }).collect();
    c.destage_done(ids[0], t);
    c.destage_failed(ids[1], &BlockError::NoSpace("pool full".into()), t);
    let f = c.health().failure().cloned().expect("a failure");
    assert_eq!((f.kind, f.lba), (ErrorKind::NoSpace, Some(40)));
    assert!(c.next_destage(0, t).is_empty(), "not at once");
    let ios = c.next_destage(0, t + Duration::from_secs(6));
    assert!(matches!(ios.as_slice(), [DestageIo::Write { lba: 40, .. }]), "{ios:?}");
}

#[test]
fn a_host_write_that_finds_the_log_full_ends_once_the_remote_failed_for_longer_than_the_bound() {
    let mut conf = cfg(Mode::Log);
    conf.full_timeout = Duration::from_secs(30);
    conf.index_bytes = 4 * crate::config::EXTENT_COST;
    let mut c = Core::new(conf, layout(false), [1; 16], cp());
    for i in 0..4 {
        c.write(i * 10, blocks(1, 1), false).expect("write");
    }
    log_all(&mut c);
    let t = now();
    assert!(matches!(c.admit(512, t), Admit::Full), "the index is full");
    let ios = c.next_destage(0, t);
    let DestageIo::Write { id, .. } = &ios[0] else { panic!("{ios:?}") };
    c.destage_failed(*id, &BlockError::NoSpace("pool full".into()), t);
    assert!(matches!(c.admit(512, t + Duration::from_secs(29)), Admit::Full));
    let Admit::Refuse(e) = c.admit(512, t + Duration::from_secs(31)) else { panic!("refused past the bound") };
    assert!(matches!(e, BlockError::NoSpace(_)), "{e}");
    assert!(e.to_string().contains("pool full"), "{e}");
}

#[test]
fn write_through_with_nothing_dirty_goes_to_the_remote_and_drops_the_cached_block() {
    let mut c = core(Mode::WriteThrough);
    let plan = c.read(5, 1).expect("plan");
    c.finish_read(plan.generation, &[(5, blocks(1, 1))]);
    assert!(matches!(&c.read(5, 1).expect("plan").pieces[..], [Piece::Ram(_)]), "cached");
    assert_eq!(c.write(5, blocks(1, 2), false), Ok(Submitted::Remote));
    assert_eq!(c.read(5, 1).expect("plan").pieces, vec![Piece::Remote { lba: 5, blocks: 1 }], "dropped at once");
    // A read races the write: planned before it completed, its (old) data arrives after.
    let racing = c.read(5, 1).expect("plan");
    c.direct_done(5, 1);
    c.finish_read(racing.generation, &[(5, blocks(1, 1))]);
    assert_eq!(c.read(5, 1).expect("plan").pieces, vec![Piece::Remote { lba: 5, blocks: 1 }], "not cached");
    assert_eq!(c.flush(), Submitted::Remote);
    assert!(c.is_clean());
}

#[test]
fn write_through_over_a_log_with_dirty_data_goes_through_it_and_waits_for_destage() {
    let mut c = core(Mode::Log);
    c.write(5, blocks(1, 1), false).expect("write");
    log_all(&mut c);
    // Restarted in write-through mode over that log.
    c.cfg.mode = Mode::WriteThrough;
    let Ok(Submitted::Wait(t)) = c.write(5, blocks(1, 2), false) else { panic!("waits for destage") };
    let plan = c.read(5, 1).expect("plan");
    assert!(matches!(&plan.pieces[..], [Piece::Ram(b)] if b[0] == 2), "reads see the newest write");
    c.unpin(&plan.pinned);
    assert!(log_all(&mut c).is_empty(), "durable in the log is not enough");
    let mut acked = Vec::new();
    for _ in 0..10 {
        let (_, sync) = destage_epoch(&mut c);
        if let Some(e) = sync {
            c.synced(e, 0, now());
        }
        if let Some(cp) = c.take_checkpoint() {
            c.checkpoint_durable(cp);
        }
        acked.extend(c.take_acks());
    }
    assert_eq!(acked, vec![t]);
    assert!(c.is_clean());
    assert_eq!(c.write(5, blocks(1, 3), false), Ok(Submitted::Remote), "clean again: direct");
}

#[test]
fn a_log_too_small_for_two_epochs_is_refused() {
    let mut small = layout(false);
    small.ring_end = RING_START + (1 << 20);
    assert!(matches!(cfg(Mode::Log).validate(&small), Err(crate::config::ConfigError::LogTooSmall { .. })));
    assert_eq!(cfg(Mode::Log).validate(&layout(false)), Ok(()));
}

/// A core in front of a stics SG that takes groups of up to `max_group` bytes.
fn sg_core(mode: Mode, max_group: u32) -> Core {
    let mut l = layout(true);
    l.max_group = Some(max_group);
    Core::new(cfg(mode), l, [1; 16], cp())
}

/// The next destage operations, expecting exactly one.
fn one_io(c: &mut Core, at: Instant) -> DestageIo {
    let mut ios = c.next_destage(0, at);
    assert_eq!(ios.len(), 1, "{ios:?}");
    ios.remove(0)
}

fn group_of(io: DestageIo) -> crate::core::GroupPlan {
    match io {
        DestageIo::Group(p) => p,
        other => panic!("expected a group, got {other:?}"),
    }
}

#[test]
fn epochs_merge_into_one_group_last_write_wins_and_retire_when_the_sg_took_it() {
    let mut c = sg_core(Mode::Log, 1 << 20);
    let t = now();
    assert_eq!(one_io(&mut c, t), DestageIo::GroupStatus, "the SG's status comes first");
    assert!(!c.group_status(crate::core::SgHolds::default(), t));
    c.write(0, blocks(4, 1), false).unwrap();
    c.flush();
    c.write(2, blocks(4, 2), false).unwrap();
    c.flush();
    c.zero(100, 8, true).unwrap();
    c.write(6, blocks(1, 3), false).unwrap();
    log_all(&mut c);
    let g = group_of(one_io(&mut c, t));
    assert_eq!((g.seq, g.first_epoch), (1, 1));
    assert!(g.last_epoch >= 3, "every durable epoch in one group: {g:?}");
    let kinds: Vec<_> = g.extents.iter().map(|x| (x.lba, x.blocks, x.kind)).collect();
    use stics_link::group::ExtentKind::{Data, Discard};
    assert_eq!(kinds, vec![(0, 7, Data), (100, 8, Discard)], "neighbours coalesced");
    assert_eq!(g.raw_bytes, 7 * 512);
    assert_eq!(g.absorbed_blocks, 2, "blocks 2 and 3 were written twice");
    assert!(c.next_destage(0, t).is_empty(), "one group in flight at a time");
    assert!(c.group_committed(1, 900, Duration::from_millis(20), t));
    assert!(c.is_clean() || c.dirty_blocks() == 0);
    let s = c.group_stats();
    assert_eq!((s.groups, s.bytes_merged, s.bytes_shipped), (1, 7 * 512, 900));
    assert_eq!(s.bytes_before_merge, 9 * 512);
}

#[test]
fn a_failed_group_goes_again_with_its_number_and_epochs_and_a_refused_one_after_the_status() {
    let mut c = sg_core(Mode::Log, 1 << 20);
    let t = now();
    one_io(&mut c, t);
    c.group_status(crate::core::SgHolds { committed_seq: 41, committed_epoch: 0 }, t);
    c.write(0, blocks(2, 1), false).unwrap();
    log_all(&mut c);
    let first = group_of(one_io(&mut c, t));
    assert_eq!(first.seq, 42, "numbers go on from the SG's");
    c.write(10, blocks(2, 2), false).unwrap();
    log_all(&mut c);
    c.group_failed(42, &BlockError::Unreachable("cut".into()), t);
    let later = t + Duration::from_secs(10);
    let again = group_of(one_io(&mut c, later));
    assert_eq!(again, first, "the same group, not one grown since");
    c.group_failed(42, &BlockError::Rejected("used number".into()), later);
    let t2 = later + Duration::from_secs(10);
    assert_eq!(one_io(&mut c, t2), DestageIo::GroupStatus);
    // The SG had taken it under that number after all.
    assert!(c.group_status(crate::core::SgHolds { committed_seq: 42, committed_epoch: first.last_epoch }, t2));
    let next = group_of(one_io(&mut c, t2));
    assert_eq!((next.seq, next.first_epoch), (43, first.last_epoch + 1));
}

/// A core in front of an SG that takes groups in sequence, two out at once, its status read.
fn pipelined_core(t: Instant) -> Core {
    let mut l = layout(true);
    l.max_group = Some(1 << 20);
    l.groups_in_flight = 2;
    let mut c = Core::new(cfg(Mode::Log), l, [1; 16], cp());
    assert_eq!(one_io(&mut c, t), DestageIo::GroupStatus);
    c.group_status(crate::core::SgHolds::default(), t);
    c
}

#[test]
fn while_a_settle_waits_the_next_group_leaves_before_the_last_is_answered_and_its_answer_retires_both() {
    let t = now();
    let mut c = pipelined_core(t);
    c.write(0, blocks(2, 1), false).unwrap();
    log_all(&mut c);
    let g1 = group_of(one_io(&mut c, t));
    c.write(10, blocks(2, 2), false).unwrap();
    log_all(&mut c);
    assert!(c.next_destage(0, t).is_empty(), "one out at a time while nothing waits for destage");
    c.hurry(true);
    let g2 = group_of(one_io(&mut c, t));
    assert_eq!((g2.seq, g2.first_epoch), (g1.seq + 1, g1.last_epoch + 1), "the next epochs, the next number");
    c.write(20, blocks(2, 3), false).unwrap();
    log_all(&mut c);
    assert!(c.next_destage(0, t).is_empty(), "two out at most");
    // The second's answer comes first: the SG takes a source's groups in sequence.
    assert!(c.group_committed(g2.seq, 100, Duration::from_millis(20), t));
    assert_eq!(c.group_stats().groups, 2, "both are on the SG");
    assert!(!c.group_committed(g1.seq, 100, Duration::from_millis(20), t), "the first's late answer retires nothing");
    assert_eq!(c.group_stats().bytes_shipped, 200);
    let g3 = group_of(one_io(&mut c, t));
    assert_eq!((g3.seq, g3.first_epoch), (g2.seq + 1, g2.last_epoch + 1));
    c.hurry(false);
}

#[test]
fn when_the_first_of_two_groups_fails_both_go_again_in_order_once_neither_is_out() {
    let t = now();
    let mut c = pipelined_core(t);
    c.hurry(true);
    c.write(0, blocks(2, 1), false).unwrap();
    log_all(&mut c);
    let g1 = group_of(one_io(&mut c, t));
    c.write(10, blocks(2, 2), false).unwrap();
    log_all(&mut c);
    let g2 = group_of(one_io(&mut c, t));
    c.group_failed(g1.seq, &BlockError::Unreachable("cut".into()), t);
    let later = t + Duration::from_secs(10);
    assert!(c.next_destage(0, later).is_empty(), "nothing goes while the second is out");
    // The SG refused the second: its predecessor never came.
    c.group_failed(g2.seq, &BlockError::Rejected("came before".into()), later);
    let again = c.next_destage(0, later + Duration::from_secs(10));
    assert_eq!(again, vec![DestageIo::Group(g1.clone()), DestageIo::Group(g2.clone())], "the first failure decides");
    // This time the first is refused and the second lost: the status is read, and what the SG
    // holds is planned afresh.
    let t2 = later + Duration::from_secs(20);
    c.group_failed(g2.seq, &BlockError::Unreachable("cut".into()), t2);
    c.group_failed(g1.seq, &BlockError::Rejected("used number".into()), t2);
    let t3 = t2 + Duration::from_secs(10);
    assert_eq!(one_io(&mut c, t3), DestageIo::GroupStatus);
    assert!(c.group_status(crate::core::SgHolds { committed_seq: g1.seq, committed_epoch: g1.last_epoch }, t3));
    let next = group_of(one_io(&mut c, t3));
    assert_eq!((next.seq, next.first_epoch), (g1.seq + 1, g1.last_epoch + 1), "group 2 planned afresh");
    c.hurry(false);
}

#[test]
fn a_remote_that_refuses_groups_gets_plain_destage() {
    let mut c = sg_core(Mode::Log, 1 << 20);
    let t = now();
    one_io(&mut c, t);
    c.group_status(crate::core::SgHolds::default(), t);
    c.write(0, blocks(2, 1), false).unwrap();
    log_all(&mut c);
    let g = group_of(one_io(&mut c, t));
    c.group_failed(g.seq, &BlockError::Unsupported("no link"), t);
    // Decided at the next look, once no group is out: plain writes go in the same look.
    let later = t + Duration::from_secs(10);
    let ios = c.next_destage(0, later);
    assert!(!c.groups_on());
    assert!(c.take_changes().iter().any(|ch| matches!(ch, crate::core::Change::GroupsOff { .. })));
    assert!(matches!(ios.first(), Some(DestageIo::Write { lba: 0, blocks: 2, .. })), "{ios:?}");
}

#[test]
fn a_fenced_cache_never_turns_to_plain_writes_whatever_the_sg_answers() {
    let mut c = sg_core(Mode::Log, 1 << 20);
    c.groups_only();
    let mut t = now();
    one_io(&mut c, t);
    c.group_status(crate::core::SgHolds::default(), t);
    c.write(0, blocks(2, 1), false).unwrap();
    log_all(&mut c);
    for err in [
        BlockError::Rejected("fenced".into()),
        BlockError::Rejected("fenced".into()),
        BlockError::Rejected("fenced".into()),
        BlockError::Unsupported("no link"),
    ] {
        let g = group_of(one_io(&mut c, t));
        c.group_failed(g.seq, &err, t);
        assert!(c.groups_on(), "{err}");
        t += Duration::from_secs(10);
        assert_eq!(one_io(&mut c, t), DestageIo::GroupStatus, "the status again, then the group");
        c.group_status(crate::core::SgHolds::default(), t);
    }
    assert!(!c.take_changes().iter().any(|ch| matches!(ch, crate::core::Change::GroupsOff { .. })));
    let ios = c.next_destage(0, t);
    assert!(ios.iter().all(|io| matches!(io, DestageIo::Group(_))), "{ios:?}");
}

#[test]
fn a_fenced_cache_ships_an_epoch_past_its_group_cap_as_a_group_not_as_plain_writes() {
    let mut c = sg_core(Mode::Log, 4096);
    c.groups_only();
    let t = now();
    one_io(&mut c, t);
    c.group_status(crate::core::SgHolds::default(), t);
    c.write(0, blocks(16, 1), false).unwrap();
    c.flush();
    log_all(&mut c);
    let g = group_of(one_io(&mut c, t));
    assert_eq!(g.extents.iter().map(|e| u64::from(e.blocks)).sum::<u64>(), 16);
}

#[test]
fn an_epoch_too_large_for_a_group_goes_as_plain_writes_and_groups_follow() {
    let mut c = sg_core(Mode::Log, 4096);
    let t = now();
    one_io(&mut c, t);
    c.group_status(crate::core::SgHolds::default(), t);
    c.write(0, blocks(16, 1), false).unwrap();
    c.flush();
    log_all(&mut c);
    let (writes, sync) = destage_epoch(&mut c);
    assert_eq!(writes.iter().map(|(_, n)| u64::from(*n)).sum::<u64>(), 16, "{writes:?}");
    assert!(c.synced(sync.expect("a flush after the plain writes"), 0, t));
    let cp = c.take_checkpoint().unwrap();
    c.checkpoint_durable(cp);
    c.write(40, blocks(1, 2), false).unwrap();
    log_all(&mut c);
    let g = group_of(one_io(&mut c, t));
    assert_eq!((g.seq, g.first_epoch), (1, 2));
    assert_eq!(c.group_stats().plain_epochs, 1);
}

#[test]
fn the_sgs_status_after_a_restart_retires_what_it_holds_and_the_lag_bounds_writes() {
    let mut cfg = cfg(Mode::Log);
    cfg.max_lag = Some(Duration::from_secs(2));
    let mut l = layout(true);
    l.max_group = Some(1 << 20);
    let mut c = Core::new(cfg, l, [1; 16], cp());
    let t = now();
    assert!(matches!(c.admit(4096, t), crate::core::Admit::Now));
    c.write(0, blocks(1, 1), false).unwrap();
    c.flush();
    c.write(1, blocks(1, 2), false).unwrap();
    log_all(&mut c);
    let late = t + Duration::from_secs(3);
    assert!(c.lag(late) >= Duration::from_secs(3));
    assert!(matches!(c.admit(4096, late), crate::core::Admit::Full), "past the lag, writes wait");
    assert_eq!(one_io(&mut c, late), DestageIo::GroupStatus);
    // The SG holds epoch 1 already (a group of the previous run).
    assert!(c.group_status(crate::core::SgHolds { committed_seq: 7, committed_epoch: 1 }, late));
    assert_eq!(c.epochs().1, 1);
    let g = group_of(one_io(&mut c, late));
    assert_eq!((g.seq, g.first_epoch), (8, 2));
    c.group_committed(8, 600, Duration::from_millis(100), late);
    assert_eq!(c.lag(late), Duration::ZERO);
    assert!(matches!(c.admit(4096, late), crate::core::Admit::Now));
}

#[test]
fn a_terabyte_discard_is_one_extent_of_one_group() {
    let mut big = layout(true);
    big.num_blocks = (1u64 << 40) / 512;
    big.max_group = Some(1 << 20);
    let mut c = Core::new(cfg(Mode::Log), big, [1; 16], cp());
    let t = now();
    one_io(&mut c, t);
    c.group_status(crate::core::SgHolds::default(), t);
    c.zero(0, big.num_blocks, true).unwrap();
    log_all(&mut c);
    let g = group_of(one_io(&mut c, t));
    assert_eq!(g.extents.len(), 1);
    assert_eq!(u64::from(g.extents[0].blocks), big.num_blocks);
    assert!(g.raw_bytes == 0 && g.sources.is_empty());
}

/// A host that writes 32 KiB at a random place each millisecond it is let in (32 MiB/s),
/// flushing every fourth write, over a log that takes everything at once.
struct FastHost {
    rng: u64,
    writes: u64,
}

impl Default for FastHost {
    fn default() -> Self {
        FastHost { rng: 0x2545_f491_4f6c_dd1d, writes: 0 }
    }
}

impl FastHost {
    /// One millisecond at `t` over a LUN of `num_blocks` blocks.
    fn step(&mut self, c: &mut Core, t: Instant, num_blocks: u64) {
        if !matches!(c.admit(32 << 10, t), Admit::Full | Admit::Refuse(_)) {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            c.write((self.rng % (num_blocks / 64)) * 64, blocks(64, (self.writes % 251) as u8), false).unwrap();
            self.writes += 1;
            if self.writes.is_multiple_of(4) {
                c.flush();
            }
        }
        log_all(c);
        if let Some(cp) = c.take_checkpoint() {
            c.checkpoint_durable(cp);
        }
    }
}

#[test]
fn max_lag_holds_when_the_link_is_the_bottleneck() {
    // A host that writes eight times faster than the link ships, against a 2 s bound: the age
    // of the oldest write alone would let the host fill the log first and the lag grow for as
    // long as that takes to ship.
    let max_lag = Duration::from_secs(2);
    let link = 4.0 * 1024.0 * 1024.0; // bytes per second
    let mut cfg = cfg(Mode::Log);
    cfg.max_lag = Some(max_lag);
    let mut l = layout(true);
    l.num_blocks = 1 << 20;
    l.max_group = Some(64 << 20);
    let mut c = Core::new(cfg, l, [1; 16], cp());
    let start = now();
    let step = Duration::from_millis(1);
    let mut host = FastHost::default();
    let mut out: Option<(GroupPlan, u64, Instant, Instant)> = None;
    let (mut worst, mut shipped) = (Duration::ZERO, 0u64);
    let secs = 30;
    for i in 0..secs * 1000 {
        let t = start + step * i;
        host.step(&mut c, t, l.num_blocks);
        if let Some((plan, encoded, sent, done)) = out.take() {
            if t >= done {
                c.group_committed(plan.seq, encoded, done - sent, t);
                shipped += encoded;
            } else {
                out = Some((plan, encoded, sent, done));
            }
        }
        if out.is_none() {
            for io in c.next_destage(0, t) {
                match io {
                    DestageIo::GroupStatus => {
                        c.group_status(crate::core::SgHolds::default(), t);
                    }
                    DestageIo::Group(plan) => {
                        let encoded = plan.raw_bytes + 1024;
                        let done = t + Duration::from_secs_f64(encoded as f64 / link);
                        out = Some((plan, encoded, t, done));
                    }
                    other => panic!("groups only: {other:?}"),
                }
            }
        }
        worst = worst.max(c.lag(t));
    }
    assert!(worst <= max_lag, "the lag reached {worst:?} under a bound of {max_lag:?}");
    let busy = shipped as f64 / (link * f64::from(secs));
    assert!(busy > 0.6, "the link was busy {:.0} % of the time", busy * 100.0);
    assert_eq!(c.newest_data, data_blocks(c.newest.iter()), "the count kept matches one made afresh");
}

/// A core in `immediate` mode with eight scattered writes logged (eight destage writes, four in
/// flight at most), destage giving way from `deep` on, and `index_bytes` of index.
fn loaded_for_reads(deep: f64, index_bytes: u64) -> Core {
    let cfg = Config { deep_destage_from: deep, index_bytes, ..cfg(Mode::Immediate) };
    let mut c = Core::new(cfg, layout(false), [1; 16], cp());
    for i in 0..8 {
        c.write(100 + 10 * i, blocks(1, 1), false).expect("write");
    }
    log_all(&mut c);
    c
}

fn destage_writes(ios: &[DestageIo]) -> usize {
    ios.iter().filter(|io| matches!(io, DestageIo::Write { .. })).count()
}

#[test]
fn while_the_log_has_room_destage_sends_nothing_new_in_front_of_reads_of_the_remote() {
    let mut c = loaded_for_reads(0.5, 64 << 20);
    assert!(c.log_fill() < 0.25, "the log has room");
    let t0 = now();
    let read = c.read(0, 4).expect("plan");
    assert!(read.has_remote());
    assert!(c.next_destage(0, t0).is_empty(), "a read waits for the remote");
    c.finish_read(read.generation, &[(0, blocks(4, 0))]);
    let later = t0 + destage::READS_RECENT / 2;
    assert!(c.next_destage(0, later).is_empty(), "a read went to the remote a moment ago");
    // No read for a while: the whole pipeline again.
    assert_eq!(destage_writes(&c.next_destage(0, t0 + destage::READS_RECENT)), 4);
    // A drain does not give way.
    let mut d = loaded_for_reads(0.5, 64 << 20);
    let _read = d.read(0, 4).expect("plan");
    d.hurry(true);
    assert_eq!(destage_writes(&d.next_destage(0, t0)), 4);
}

#[test]
fn past_half_the_deep_fill_destage_keeps_one_write_in_flight_in_front_of_reads() {
    // The log a little past half of `deep_destage_from`.
    let fill = loaded_for_reads(0.5, 64 << 20).log_fill();
    let mut c = loaded_for_reads(fill * 1.5, 64 << 20);
    let t0 = now();
    let read = c.read(0, 4).expect("plan");
    assert!(read.has_remote());
    for step in 0..3 {
        let ios = c.next_destage(0, t0);
        assert_eq!(destage_writes(&ios), 1, "step {step}");
        assert!(c.next_destage(0, t0).is_empty(), "one in flight already");
        let Some(DestageIo::Write { id, .. }) = ios.into_iter().next() else { panic!("a write") };
        c.destage_done(id, t0);
        if step == 0 {
            c.finish_read(read.generation, &[(0, blocks(4, 0))]);
        }
    }
    assert_eq!(destage_writes(&c.next_destage(0, t0 + destage::READS_RECENT)), 4);
}

#[test]
fn a_dirty_index_filling_up_keeps_destage_moving_in_front_of_reads() {
    // Host writes wait when the index is full, and only destage empties it: reads must not
    // hold destage while the index fills, even with the log nearly empty. Sixteen extents (the
    // eight writes and their epoch's) in room for forty: past half of the deep fill.
    let mut c = loaded_for_reads(0.5, 40 * crate::config::EXTENT_COST);
    assert!(c.log_fill() < 0.25, "the log has room");
    let extents = c.index_extents();
    assert!((10..20).contains(&extents), "the index is past an eighth full, not a quarter: {extents}");
    let _read = c.read(0, 4).expect("plan");
    assert_eq!(destage_writes(&c.next_destage(0, now())), 1);
}

#[test]
fn below_an_eighth_of_the_log_destage_sends_one_write_in_front_of_reads_once_one_waited_half_a_minute() {
    let cfg = Config { deep_destage_from: 0.5, ..cfg(Mode::Immediate) };
    let mut c = Core::new(cfg, layout(false), [1; 16], cp());
    let t0 = now();
    assert!(matches!(c.admit(8 * 512, t0), Admit::Now));
    for i in 0..8 {
        c.write(100 + 10 * i, blocks(1, 1), false).expect("write");
    }
    log_all(&mut c);
    let read = c.read(0, 4).expect("plan");
    assert!(read.has_remote());
    assert!(c.next_destage(0, t0).is_empty(), "the log has room and a read waits");
    let late = t0 + destage::HOLD_MAX;
    assert!(c.read.waiting(), "reads still go to the remote");
    let ios = c.next_destage(0, late);
    assert_eq!(destage_writes(&ios), 1, "half a minute on, one write goes in front of the reads");
    assert!(c.next_destage(0, late).is_empty(), "one at a time");
}

#[test]
fn max_lag_holds_on_a_plain_remote_slower_than_the_host() {
    // A remote that is not an SG (tgt, a disk) and takes writes one at a time eight times
    // slower than the host writes: the bound holds by the backlog plain destage moves in half
    // of it, as it does for groups. On an ordered remote many epochs are out at once and
    // retire in bursts, which must not pass for speed.
    for ordered in [false, true] {
        let (worst, busy, rate) = plain_remote_under_max_lag(ordered);
        assert!(worst <= Duration::from_secs(2), "ordered {ordered}: the lag reached {worst:?} under a bound of 2 s");
        assert!(busy > 0.6, "ordered {ordered}: the remote was busy {:.0} % of the time", busy * 100.0);
        let link = 4.0 * 1024.0 * 1024.0;
        assert!(rate.is_some_and(|r| r > 0.5 * link && r < 1.5 * link), "ordered {ordered}: rate {rate:?}");
    }
}

/// Thirty seconds of a host writing 32 MiB/s to a remote that takes 4 MiB/s, under a 2 s lag
/// bound: the largest lag, the share of the time the remote was busy and the rate measured.
fn plain_remote_under_max_lag(ordered: bool) -> (Duration, f64, Option<f64>) {
    let max_lag = Duration::from_secs(2);
    let link = 4.0 * 1024.0 * 1024.0; // bytes per second
    let mut cfg = cfg(Mode::Log);
    cfg.max_lag = Some(max_lag);
    let mut l = layout(ordered);
    l.num_blocks = 1 << 20;
    let mut c = Core::new(cfg, l, [1; 16], cp());
    let start = now();
    let step = Duration::from_millis(1);
    let mut host = FastHost::default();
    // Answers the remote owes: when, and to what (a write's id, or an epoch's flush).
    let mut owed: std::collections::VecDeque<(Instant, Result<u64, u64>)> = std::collections::VecDeque::new();
    let mut free_at = start;
    let (mut worst, mut moved) = (Duration::ZERO, 0u64);
    let secs = 30;
    for i in 0..secs * 1000 {
        let t = start + step * i;
        host.step(&mut c, t, l.num_blocks);
        while owed.front().is_some_and(|(at, _)| *at <= t) {
            match owed.pop_front().map(|(_, what)| what) {
                Some(Ok(id)) => {
                    c.destage_done(id, t);
                }
                Some(Err(epoch)) => {
                    c.synced(epoch, 0, t);
                }
                None => {}
            }
        }
        for io in c.next_destage(0, t) {
            free_at = free_at.max(t);
            match io {
                DestageIo::Write { id, blocks, .. } => {
                    let bytes = u64::from(blocks) * 512;
                    free_at += Duration::from_secs_f64(bytes as f64 / link);
                    moved += bytes;
                    owed.push_back((free_at, Ok(id)));
                }
                DestageIo::Sync { epoch, .. } => owed.push_back((free_at, Err(epoch))),
                other => panic!("plain destage only: {other:?}"),
            }
        }
        worst = worst.max(c.lag(t));
    }
    (worst, moved as f64 / (link * f64::from(secs)), c.destage.rate)
}

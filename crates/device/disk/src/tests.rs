use std::time::Duration;

use proptest::prelude::*;
use stics_block::MemDev;

use super::*;

fn mem(bytes: u64) -> Arc<dyn BlockDev> {
    Arc::new(MemDev::new(512, bytes / 512))
}

#[test]
fn presets_are_named_as_specs_name_them_and_unknown_ones_say_which_are_known() {
    for p in Preset::ALL {
        assert_eq!(p.name().parse::<Preset>(), Ok(p));
        assert_eq!(p.to_string(), p.name());
    }
    assert_eq!("O7N3200".parse::<Preset>(), Ok(Preset::O7n3200));
    let e = "st31000".parse::<Preset>().unwrap_err();
    assert_eq!(e.to_string(), "unknown disk model \"st31000\" (known: o7n3200, as010a1, 91366u4, dnes, ddys, raid5)");
}

#[test]
fn presets_carry_the_seeds_numbers() {
    let o = Preset::O7n3200.config();
    assert_eq!((o.mechanics.rpm, o.mechanics.transfer, o.buffer), (10_000.0, 29.8e6, 0));
    assert_eq!(o.mechanics.avg_seek, Duration::from_micros(4900));
    // Seed 004 prints the rotational latency: half a revolution.
    assert_eq!(o.mechanics.revolution() / 2, Duration::from_millis(3));
    let a = Preset::As010a1.config();
    assert!((a.mechanics.revolution().as_secs_f64() / 2.0 - 4.17e-3).abs() < 0.01e-3);
    assert_eq!((a.mechanics.avg_seek, a.buffer), (Duration::from_micros(8500), 2 << 20));
    // Seed 000: sequential 8 KB writes to the DDYS take 0.24 ms.
    let d = Preset::Ddys.config();
    assert!((d.expected(Access::SeqWrite, 8192).as_secs_f64() - 0.24e-3).abs() < 0.01e-3);
    let r = Preset::Raid5.config();
    assert_eq!((r.buffer, r.array), (128 << 20, Some(Array { disks: 8, chunk: 16 << 10 })));
    assert_eq!(r.mechanics, d.mechanics);
}

#[test]
fn explicit_parameters_override_a_preset() {
    let o = Overrides {
        rpm: Some(15_000.0),
        seek: Some(Duration::from_millis(3)),
        transfer: Some(100e6),
        buffer: Some(0),
        queue: Some(Queue::Elevator),
    };
    let c = Preset::As010a1.config().with(&o);
    assert_eq!(c.mechanics.rpm, 15_000.0);
    assert_eq!(c.mechanics.avg_seek, Duration::from_millis(3));
    assert_eq!(c.mechanics.track_seek, Duration::from_micros(300));
    assert_eq!((c.mechanics.transfer, c.buffer, c.queue), (100e6, 0, Queue::Elevator));
    assert!(!c.model(1 << 30).unwrap().volatile());
    let e = Preset::Raid5.config().with(&Overrides { queue: Some(Queue::Elevator), ..Overrides::default() });
    assert!(e.model(1 << 30).unwrap_err().to_string().contains("queue=elevator"));
    let e = Preset::Ddys.config().with(&Overrides { rpm: Some(0.0), ..Overrides::default() });
    assert_eq!(e.model(1 << 30).unwrap_err(), DiskError::Invalid("rpm must be positive, not 0".into()));
}

#[tokio::test]
async fn the_wrapper_keeps_the_data_and_passes_the_rest_through() {
    let inner = mem(64 << 20);
    let d = DiskDev::new(Arc::clone(&inner), &Preset::O7n3200.config()).unwrap();
    assert_eq!(d.geometry(), inner.geometry());
    assert_eq!(d.supports_discard(), inner.supports_discard());
    assert_eq!(d.device_id(), inner.device_id());
    assert!(!d.volatile_cache(), "the O7N3200 has no buffer");
    let data = Bytes::from((0..8192u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    d.write(1000, data.clone(), false).await.unwrap();
    assert_eq!(d.read(1000, 16).await.unwrap(), data);
    assert_eq!(inner.read(1000, 16).await.unwrap(), data);
    assert!(matches!(d.read(64 << 11, 1).await, Err(BlockError::OutOfRange { .. })));
    let b = DiskDev::new(mem(64 << 20), &Preset::Ddys.config()).unwrap();
    assert!(b.volatile_cache(), "the DDYS's write cache is on");
}

#[tokio::test]
async fn requests_complete_no_sooner_than_the_model_says() {
    let c = Preset::O7n3200.config();
    let d = DiskDev::new(mem(256 << 20), &c).unwrap();
    // Reads across the disk: each pays at least the overhead and a track-to-track seek.
    let t = std::time::Instant::now();
    for i in 0..10u64 {
        d.read(((i * 7919) % 500) * 1024, 16).await.unwrap();
    }
    let floor = (c.mechanics.overhead + c.mechanics.track_seek) * 10;
    assert!(t.elapsed() >= floor, "{:?} < {floor:?}", t.elapsed());
    // A FLUSH on a buffered disk waits for what the buffer holds to reach the medium.
    let c = Preset::As010a1.config();
    let d = DiskDev::new(mem(256 << 20), &c).unwrap();
    for i in 0..16u64 {
        d.write(((i * 7919) % 500) * 1024, Bytes::from(vec![1u8; 8192]), false).await.unwrap();
    }
    let t = std::time::Instant::now();
    d.flush().await.unwrap();
    // At least the last write's own seek and transfer are still to come after the acknowledgements.
    let floor = c.mechanics.track_seek + c.mechanics.transfer_time(8192);
    assert!(t.elapsed() >= floor, "{:?} < {floor:?}", t.elapsed());
}

/// One request of the property test: read, write (with FUA or not) or flush, its offset in
/// 8 KiB slots, its length in slots and the time since the previous one.
#[derive(Debug, Clone)]
enum Op {
    Read(u64, u64, u64),
    Write(u64, u64, bool, u64),
    Flush(u64),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        4 => (0u64..4096, 1u64..8, 0u64..20_000).prop_map(|(s, n, gap)| Op::Read(s, n, gap)),
        6 => (0u64..4096, 1u64..8, any::<bool>(), 0u64..20_000).prop_map(|(s, n, f, gap)| Op::Write(s, n, f, gap)),
        1 => (0u64..20_000).prop_map(Op::Flush),
    ];
    proptest::collection::vec(op, 1..200)
}

fn config() -> impl Strategy<Value = Config> {
    (0usize..6, prop_oneof![Just(0u64), Just(64 << 10), Just(1 << 20)], any::<bool>()).prop_map(
        |(p, buffer, elevator)| {
            let preset = Preset::ALL[p];
            let queue = if elevator && preset != Preset::Raid5 { Queue::Elevator } else { Queue::Fifo };
            preset.config().with(&Overrides { buffer: Some(buffer), queue: Some(queue), ..Overrides::default() })
        },
    )
}

proptest! {
    #[test]
    fn completions_never_go_backwards_and_a_flush_follows_every_earlier_write(c in config(), ops in ops()) {
        let mut m = c.model(4096 * 8192).unwrap();
        let mut now = Duration::ZERO;
        let (mut last_write, mut last_flush) = (Duration::ZERO, Duration::ZERO);
        // A single disk serves what goes to its medium directly in arrival order.
        let single = c.array.is_none();
        let mut last_direct = Duration::ZERO;
        for op in ops {
            let (gap, done) = match op {
                Op::Read(s, n, gap) => {
                    now += Duration::from_micros(gap);
                    let done = m.read(now, s * 8192, n.min(4096 - s) * 8192);
                    prop_assert!(!single || done >= last_direct, "read done at {done:?} before {last_direct:?}");
                    last_direct = done;
                    (gap, done)
                }
                Op::Write(s, n, fua, gap) => {
                    now += Duration::from_micros(gap);
                    let done = m.write(now, s * 8192, n.min(4096 - s) * 8192, fua);
                    last_write = last_write.max(done);
                    if fua || c.buffer == 0 {
                        prop_assert!(!single || done >= last_direct, "write done at {done:?} before {last_direct:?}");
                        last_direct = done;
                    }
                    (gap, done)
                }
                Op::Flush(gap) => {
                    now += Duration::from_micros(gap);
                    let done = m.flush(now);
                    prop_assert!(done >= last_write, "flush at {done:?} before a write done at {last_write:?}");
                    prop_assert!(done >= last_flush, "flush at {done:?} before the previous flush at {last_flush:?}");
                    last_flush = done;
                    (gap, done)
                }
            };
            let _ = gap;
            prop_assert!(done >= now, "completed at {done:?}, before arriving at {now:?}");
        }
    }

    #[test]
    fn a_flush_completes_after_every_write_reaches_the_medium(c in config(), ops in ops()) {
        // Once a flush is done the buffer holds nothing, so a flush right after it costs nothing.
        let mut m = c.model(4096 * 8192).unwrap();
        let mut now = Duration::ZERO;
        for op in &ops {
            match *op {
                Op::Read(s, n, gap) => { now += Duration::from_micros(gap); m.read(now, s * 8192, n.min(4096 - s) * 8192); }
                Op::Write(s, n, fua, gap) => { now += Duration::from_micros(gap); m.write(now, s * 8192, n.min(4096 - s) * 8192, fua); }
                Op::Flush(gap) => { now += Duration::from_micros(gap); m.flush(now); }
            }
        }
        let f = m.flush(now);
        prop_assert_eq!(m.flush(f), f, "a second flush finds the buffer empty");
        if let Model::Disk(d) = &m {
            prop_assert_eq!(d.buffered(f), 0);
        }
    }
}

/// Found by the property test: a FLUSH that arrives while an unbuffered write is still on its way
/// to the medium waits for it (the queue is FIFO), even though the disk has no buffer to empty.
#[test]
fn a_flush_waits_for_a_write_still_in_service() {
    let mut m = Preset::O7n3200.config().model(4096 * 8192).unwrap();
    let write = m.write(Duration::ZERO, 112 * 8192, 3 * 8192, false);
    assert!(write > Duration::ZERO);
    assert_eq!(m.flush(Duration::ZERO), write);
}

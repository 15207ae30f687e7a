//! Which zstd level a group should be compressed at: for each level, the ratio and the
//! single-core encode rate of 16 MiB groups of PostMark-like text, machine code, zero-heavy
//! file-system metadata and random data, and what that gives end to end on a 100 Mbit/s and a
//! 1 Gbit/s link when a group is encoded and then sent (the gateway ships one group at a time).
//!
//! `cargo run --release -p stics-link --example levels`

use std::time::Instant;

use stics_link::group::{encode, Extent, ExtentKind, GroupHead};

const GROUP: usize = 16 << 20;
const LEVELS: [i32; 6] = [-5, -1, 1, 3, 6, 9];
const LINKS: [(&str, f64); 2] = [("100 Mbit/s", 100e6 / 8.0), ("1 Gbit/s", 1e9 / 8.0)];

/// A xorshift stream: reproducible data without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// PostMark fills its files from a buffer of random lower-case letters.
fn letters(rng: &mut Rng) -> Vec<u8> {
    (0..GROUP).map(|_| b'a' + (rng.next() % 26) as u8).collect()
}

/// Executables and libraries of this machine, as a real binary corpus.
fn binaries() -> Vec<u8> {
    let mut out = Vec::with_capacity(GROUP);
    let mut dirs = vec![std::path::PathBuf::from("/usr/bin"), std::path::PathBuf::from("/usr/lib")];
    while let Some(d) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        entries.sort();
        for p in entries {
            if out.len() >= GROUP {
                out.truncate(GROUP);
                return out;
            }
            if p.is_dir() && !p.is_symlink() {
                dirs.push(p);
            } else if let Ok(b) = std::fs::read(&p) {
                out.extend_from_slice(&b[..b.len().min(1 << 20)]);
            }
        }
    }
    out.resize(GROUP, 0);
    out
}

/// Inode tables and bitmaps: mostly zeros, a few fields set per 256-byte record.
fn metadata(rng: &mut Rng) -> Vec<u8> {
    let mut out = vec![0u8; GROUP];
    for rec in out.chunks_mut(256) {
        for b in rec.iter_mut().take(rng.next() as usize % 48) {
            *b = rng.next() as u8;
        }
    }
    out
}

fn random(rng: &mut Rng) -> Vec<u8> {
    let mut out = vec![0u8; GROUP];
    for c in out.chunks_mut(8) {
        let v = rng.next().to_le_bytes();
        c.copy_from_slice(&v[..c.len()]);
    }
    out
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut rng = Rng(0x5eed_1234_abcd_ef01);
    let corpora = [
        ("PostMark text", letters(&mut rng)),
        ("binaries", binaries()),
        ("fs metadata", metadata(&mut rng)),
        ("random", random(&mut rng)),
    ];
    let head = GroupHead { source: [7; 16], seq: 1, first_epoch: 1, last_epoch: 1, block_size: 4096 };
    let blocks = u32::try_from(GROUP / 4096)?;
    let extents = [Extent { lba: 0, blocks, kind: ExtentKind::Data }];
    println!("| data | level | shipped/raw | encode MB/s (1 core) | {} MB/s | {} MB/s |", LINKS[0].0, LINKS[1].0);
    println!("|---|---|---|---|---|---|");
    for (name, data) in &corpora {
        for level in LEVELS {
            // Best of three: the machine is shared.
            let mut best = f64::MAX;
            let mut len = 0;
            for _ in 0..3 {
                let t = Instant::now();
                len = encode(&head, &extents, data, level)?.len();
                best = best.min(t.elapsed().as_secs_f64());
            }
            let raw = data.len() as f64;
            let ends: Vec<String> =
                LINKS.iter().map(|(_, rate)| format!("{:.1}", raw / (best + len as f64 / rate) / 1e6)).collect();
            println!(
                "| {name} | {level} | {:.3} | {:.0} | {} | {} |",
                len as f64 / raw,
                raw / best / 1e6,
                ends[0],
                ends[1]
            );
        }
    }
    Ok(())
}

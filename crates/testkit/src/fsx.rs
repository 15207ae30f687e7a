//! File system exercise in the manner of fsx: random writes, reads, truncations, reopens and
//! syncs on one file through a file system under test, each checked against a model of what the
//! file must hold. A seed makes a run repeatable; the report names the operation that failed and
//! the ones before it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One operation of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Write {
        off: u64,
        len: usize,
    },
    Read {
        off: u64,
        len: usize,
    },
    Truncate {
        size: u64,
    },
    /// Close the file, open it again and check its size (close-to-open on a network file system).
    Reopen,
    Fsync,
    /// Appends through a handle opened with O_APPEND.
    Append {
        len: usize,
    },
}

/// How a run goes.
#[derive(Debug, Clone)]
pub struct Plan {
    pub seed: u64,
    pub ops: usize,
    /// The largest file the run makes.
    pub max_size: u64,
    /// The longest single write or read.
    pub max_len: usize,
}

/// Where a run found the file system wrong: the operation, its number, what differed, and the
/// last operations before it.
#[derive(Debug, thiserror::Error)]
#[error("fsx seed {seed}, op {n} ({op:?}): {what}; before it: {before:?}")]
pub struct Failure {
    pub seed: u64,
    pub n: usize,
    pub op: Op,
    pub what: String,
    pub before: Vec<Op>,
}

/// Runs `plan` on a new file at `path` (removed first if there) and checks every read and size
/// against the model; the operations done, in order, when all agreed.
pub fn run(path: &Path, plan: &Plan) -> Result<Vec<Op>, Failure> {
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let mut model: Vec<u8> = Vec::new();
    let mut done: Vec<Op> = Vec::new();
    let fail = |n: usize, op: &Op, what: String, done: &[Op]| Failure {
        seed: plan.seed,
        n,
        op: op.clone(),
        what,
        before: done[done.len().saturating_sub(8)..].to_vec(),
    };
    let _ = std::fs::remove_file(path);
    let open = || OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path);
    let mut f = open().map_err(|e| fail(0, &Op::Reopen, format!("open: {e}"), &[]))?;
    for n in 0..plan.ops {
        let op = next_op(&mut rng, plan, model.len() as u64);
        let io = |e: std::io::Error| format!("{e}");
        match &op {
            Op::Write { off, len } => {
                let data: Vec<u8> = (0..*len).map(|_| rng.gen()).collect();
                f.write_all_at(&data, *off).map_err(|e| fail(n, &op, io(e), &done))?;
                let end = *off as usize + len;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[*off as usize..end].copy_from_slice(&data);
            }
            Op::Read { off, len } => {
                let mut got = vec![0u8; *len];
                let k = read_full_at(&f, &mut got, *off).map_err(|e| fail(n, &op, io(e), &done))?;
                let want = model.get(*off as usize..).map_or(&[][..], |t| &t[..t.len().min(*len)]);
                if k != want.len() {
                    return Err(fail(n, &op, format!("read {k} bytes where the file holds {}", want.len()), &done));
                }
                if let Some(i) = got[..k].iter().zip(want).position(|(a, b)| a != b) {
                    return Err(fail(
                        n,
                        &op,
                        format!("byte {} is {:#04x}, should be {:#04x}", *off as usize + i, got[i], want[i]),
                        &done,
                    ));
                }
            }
            Op::Truncate { size } => {
                f.set_len(*size).map_err(|e| fail(n, &op, io(e), &done))?;
                model.resize(*size as usize, 0);
            }
            Op::Reopen => {
                drop(f);
                f = open().map_err(|e| fail(n, &op, io(e), &done))?;
            }
            Op::Fsync => f.sync_all().map_err(|e| fail(n, &op, io(e), &done))?,
            Op::Append { len } => {
                let data: Vec<u8> = (0..*len).map(|_| rng.gen()).collect();
                let mut a = OpenOptions::new().append(true).open(path).map_err(|e| fail(n, &op, io(e), &done))?;
                a.write_all(&data).map_err(|e| fail(n, &op, io(e), &done))?;
                drop(a);
                model.extend_from_slice(&data);
            }
        }
        let size = f.metadata().map_err(|e| fail(n, &op, format!("fstat: {e}"), &done))?.len();
        if size != model.len() as u64 {
            return Err(fail(n, &op, format!("size {size}, should be {}", model.len()), &done));
        }
        done.push(op);
    }
    // The whole file, read back through a fresh handle.
    let op = Op::Reopen;
    drop(f);
    let mut all = Vec::new();
    File::open(path)
        .and_then(|mut f| {
            f.seek(SeekFrom::Start(0))?;
            f.read_to_end(&mut all)
        })
        .map_err(|e| fail(plan.ops, &op, format!("read back: {e}"), &done))?;
    if all != model {
        let i = all.iter().zip(&model).position(|(a, b)| a != b).unwrap_or(all.len().min(model.len()));
        return Err(fail(
            plan.ops,
            &op,
            format!("read back: {} bytes, should be {}; first difference at byte {i}", all.len(), model.len()),
            &done,
        ));
    }
    Ok(done)
}

fn read_full_at(f: &File, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
    let mut k = 0;
    while k < buf.len() {
        match f.read_at(&mut buf[k..], off + k as u64)? {
            0 => break,
            n => k += n,
        }
    }
    Ok(k)
}

/// Mostly writes and reads, often unaligned and across the end of the file, with truncations
/// both ways, reopens, syncs and appends between them.
fn next_op(rng: &mut StdRng, plan: &Plan, size: u64) -> Op {
    let len = |rng: &mut StdRng| {
        // Small and odd as often as large and block-sized.
        if rng.gen_bool(0.5) {
            rng.gen_range(1..=plan.max_len.min(700))
        } else {
            rng.gen_range(1..=plan.max_len)
        }
    };
    match rng.gen_range(0..100) {
        0..=39 => {
            let len = len(rng);
            let off = rng.gen_range(0..=plan.max_size.saturating_sub(len as u64));
            Op::Write { off, len }
        }
        40..=79 => {
            let len = len(rng);
            let off = rng.gen_range(0..=size + 1000);
            Op::Read { off, len }
        }
        80..=87 => Op::Truncate { size: rng.gen_range(0..=plan.max_size) },
        88..=92 => Op::Reopen,
        93..=95 => Op::Fsync,
        _ => {
            let len = len(rng).min(plan.max_size.saturating_sub(size) as usize);
            if len == 0 {
                Op::Fsync
            } else {
                Op::Append { len }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_file_system_passes_and_a_run_repeats_from_its_seed() {
        let d = tempfile::tempdir().unwrap();
        let plan = Plan { seed: 7, ops: 400, max_size: 300_000, max_len: 70_000 };
        let a = run(&d.path().join("f"), &plan).unwrap();
        let b = run(&d.path().join("f"), &plan).unwrap();
        assert_eq!(a, b);
        for kind in [0, 1, 2, 3, 4, 5] {
            assert!(
                a.iter().any(|op| matches!(
                    (kind, op),
                    (0, Op::Write { .. })
                        | (1, Op::Read { .. })
                        | (2, Op::Truncate { .. })
                        | (3, Op::Reopen)
                        | (4, Op::Fsync)
                        | (5, Op::Append { .. })
                )),
                "kind {kind} never ran"
            );
        }
    }
}

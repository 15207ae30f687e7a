//! The NFS path `stics bench nfs` compares block access with: nfs-ganesha exporting ext4 from a
//! `stics wan` storage namespace, `stics nfs-mount` in the host namespace, and what a user of a
//! file system may expect of the client (its data, NFS's close-to-open consistency, its caches
//! and its counts).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use stics_testkit::fsx::{self, Plan};
use stics_testkit::netns::Wan;
use stics_testkit::nfs::{Client, Server};
use stics_testkit::proc::{one_at_a_time, run_ok};

const BIN: &str = env!("CARGO_BIN_EXE_stics");

fn setup(dir: &Path) -> (Wan, Server) {
    let wan = Wan::up(Path::new(BIN), "nfs", &["--delay", "0ms"]);
    let server = Server::start(&wan, dir, 512 << 20);
    (wan, server)
}

#[test]
fn files_written_through_the_client_read_back_as_written_under_random_operations() {
    let _one = one_at_a_time();
    let d = tempfile::tempdir().unwrap();
    let (wan, server) = setup(d.path());
    let c = Client::mount(Path::new(BIN), &wan, "host", &server.url, &d.path().join("mnt"), &[]);
    // Large operations cross rsize/wsize chunks and read-ahead; small ones stay inside a page.
    let plans = [
        Plan { seed: 1, ops: 1500, max_size: 4 << 20, max_len: 600_000 },
        Plan { seed: 2, ops: 3000, max_size: 40_000, max_len: 9000 },
        Plan { seed: 3, ops: 1500, max_size: 2 << 20, max_len: 130_000 },
    ];
    for p in &plans {
        let f = c.dir.join(format!("fsx{}", p.seed));
        if let Err(e) = fsx::run(&f, p) {
            panic!("{e}\nserver log:\n{}", server.log());
        }
    }
    assert!(c.count("commit") > 0, "fsync and close commit unstable writes: {}", c.counts());
    // What the client wrote reached the server: a second client, with nothing cached, reads the
    // same bytes.
    let c2 = Client::mount(Path::new(BIN), &wan, "host", &server.url, &d.path().join("mnt2"), &[]);
    for p in &plans {
        let name = format!("fsx{}", p.seed);
        let a = std::fs::read(c.dir.join(&name)).unwrap();
        let b = std::fs::read(c2.dir.join(&name)).unwrap();
        assert!(a == b, "{name}: the second client reads {} bytes that differ from the first's {}", b.len(), a.len());
    }
    c2.unmount();
    c.unmount();
}

#[test]
fn a_source_tree_unpacks_lists_compares_equal_and_removes_cleanly() {
    let _one = one_at_a_time();
    let d = tempfile::tempdir().unwrap();
    // A tree with what a source tarball holds: nested directories, empty and large files,
    // symbolic links (relative, dangling) and a hard link.
    let src = d.path().join("src");
    std::fs::create_dir_all(src.join("a/b/c")).unwrap();
    std::fs::create_dir_all(src.join("empty")).unwrap();
    for i in 0..60u32 {
        let body: Vec<u8> = (0..i * 997).map(|k| (k * 31 + i) as u8).collect();
        std::fs::write(src.join(["a", "a/b", "a/b/c"][i as usize % 3]).join(format!("f{i}.c")), body).unwrap();
    }
    std::fs::write(src.join("big"), vec![7u8; 3 << 20]).unwrap();
    std::os::unix::fs::symlink("a/b/f1.c", src.join("link")).unwrap();
    std::os::unix::fs::symlink("nowhere", src.join("dangling")).unwrap();
    std::fs::hard_link(src.join("big"), src.join("big.hard")).unwrap();
    let tar = d.path().join("src.tar");
    run_ok(Command::new("tar").arg("-C").arg(&src).arg("-cf").arg(&tar).arg("."));

    let (wan, server) = setup(d.path());
    let c = Client::mount(Path::new(BIN), &wan, "host", &server.url, &d.path().join("mnt"), &[]);
    let tree = c.dir.join("tree");
    std::fs::create_dir(&tree).unwrap();
    run_ok(Command::new("tar").arg("-C").arg(&tree).arg("-xf").arg(&tar));
    run_ok(Command::new("diff").arg("-r").arg("--no-dereference").arg(&src).arg(&tree));
    assert_eq!(std::fs::read_link(tree.join("dangling")).unwrap(), Path::new("nowhere"));
    let meta = std::fs::metadata(tree.join("big.hard")).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::nlink(&meta), 2, "the hard link is one file");
    let listing = run_ok(Command::new("ls").arg("-lR").arg(&tree));
    assert!(listing.contains("f59.c") && listing.contains("link -> a/b/f1.c"), "{listing}");
    // Renames over an existing file and across directories.
    std::fs::rename(tree.join("a/f0.c"), tree.join("a/b/c/f2.c")).unwrap();
    assert!(!tree.join("a/f0.c").exists());
    assert_eq!(std::fs::read(tree.join("a/b/c/f2.c")).unwrap().len(), 0);
    assert_eq!(std::fs::remove_dir(tree.join("a")).unwrap_err().raw_os_error(), Some(libc::ENOTEMPTY));
    run_ok(Command::new("rm").arg("-rf").arg(&tree));
    assert!(!tree.exists());
    assert_eq!(std::fs::read_dir(&c.dir).unwrap().count(), usize::from(c.dir.join("lost+found").exists()));
    c.unmount();
}

#[test]
fn a_second_client_sees_what_the_first_closed_on_its_next_open() {
    let _one = one_at_a_time();
    let d = tempfile::tempdir().unwrap();
    let (wan, server) = setup(d.path());
    let a = Client::mount(Path::new(BIN), &wan, "host", &server.url, &d.path().join("a"), &[]);
    let b = Client::mount(Path::new(BIN), &wan, "host", &server.url, &d.path().join("b"), &[]);
    let (fa, fb) = (a.dir.join("shared"), b.dir.join("shared"));
    std::fs::write(&fa, vec![1u8; 100_000]).unwrap();
    assert_eq!(std::fs::read(&fb).unwrap(), vec![1u8; 100_000]);
    // B has the file cached; A rewrites it in place, same size, and closes: B's next open asks
    // the server, sees the change and reads the new bytes, however fresh its cached attributes.
    for round in 2..6u8 {
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(&fa, vec![round; 100_000]).unwrap();
        assert_eq!(std::fs::read(&fb).unwrap(), vec![round; 100_000], "round {round}");
    }
    // A file A creates is there for B once B's cached view of the directory is checked.
    std::fs::write(a.dir.join("new"), b"x").unwrap();
    assert_eq!(std::fs::read(b.dir.join("new")).unwrap(), b"x");
    b.unmount();
    a.unmount();
}

#[test]
fn the_client_answers_from_its_caches_and_counts_what_it_sends() {
    let _one = one_at_a_time();
    let d = tempfile::tempdir().unwrap();
    let (wan, server) = setup(d.path());
    let c = Client::mount(
        Path::new(BIN),
        &wan,
        "host",
        &server.url,
        &d.path().join("mnt"),
        &["--rsize", "65536", "--wsize", "65536"],
    );
    let f = c.dir.join("one-mib");
    std::fs::write(&f, vec![5u8; 1 << 20]).unwrap();
    let writes = c.count("write");
    assert!((16..=20).contains(&writes), "1 MiB in WRITEs of 64 KiB: {}", c.counts());
    // Attributes are trusted for acregmin (3 s): a second stat right after the first sends none.
    std::fs::metadata(&f).unwrap();
    let g0 = c.count("getattr");
    for _ in 0..5 {
        std::fs::metadata(&f).unwrap();
    }
    assert_eq!(c.count("getattr"), g0, "stats within acregmin come from the cache");
    // A cold read of the file costs about 1 MiB / rsize READs; a warm one none.
    c.drop_caches();
    let r0 = c.counts();
    assert_eq!(std::fs::read(&f).unwrap(), vec![5u8; 1 << 20]);
    let r1 = c.counts();
    let reads = r1["read"].as_u64().unwrap() - r0["read"].as_u64().unwrap();
    assert!((16..=20).contains(&reads), "READs for 1 MiB at rsize 64 KiB: {reads}; {r1}");
    assert!(r1["bytes_read"].as_u64().unwrap() - r0["bytes_read"].as_u64().unwrap() >= 1 << 20);
    assert!(r1["lookup"].as_u64().unwrap() > r0["lookup"].as_u64().unwrap(), "a cold path is looked up");
    assert_eq!(std::fs::read(&f).unwrap(), vec![5u8; 1 << 20]);
    assert_eq!(c.count("read"), r1["read"].as_u64().unwrap(), "a warm read sends no READ");
    // A cold random read asks for its own page only, as Linux's does (no read-ahead off the
    // sequential path).
    c.drop_caches();
    let r2 = c.counts();
    let mut page = [0u8; 4096];
    std::os::unix::fs::FileExt::read_exact_at(&std::fs::File::open(&f).unwrap(), &mut page, 300 * 1024).unwrap();
    assert_eq!(page, [5u8; 4096]);
    let r3 = c.counts();
    let delta = |k: &str| r3[k].as_u64().unwrap() - r2[k].as_u64().unwrap();
    assert_eq!((delta("read"), delta("bytes_read")), (1, 4096), "{r3}");
    // Written without fsync and unmounted: the data is on the server all the same.
    std::fs::write(c.dir.join("late"), vec![9u8; 300_000]).unwrap();
    c.unmount();
    let c2 = Client::mount(Path::new(BIN), &wan, "host", &server.url, &d.path().join("mnt2"), &[]);
    assert_eq!(std::fs::read(c2.dir.join("late")).unwrap(), vec![9u8; 300_000]);
    c2.unmount();
}

#[test]
fn writes_the_server_had_not_committed_when_it_restarted_are_sent_again() {
    let _one = one_at_a_time();
    let d = tempfile::tempdir().unwrap();
    let (wan, mut server) = setup(d.path());
    let c = Client::mount(Path::new(BIN), &wan, "host", &server.url, &d.path().join("mnt"), &[]);
    let body: Vec<u8> = (0..3u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let f = c.dir.join("unstable");
    let mut file = std::fs::File::create(&f).unwrap();
    std::io::Write::write_all(&mut file, &body).unwrap();
    let writes = c.count("write");
    assert!(writes > 0, "full chunks go out before the close: {}", c.counts());
    // A new server instance: its verifier differs, so what the first took as unstable is sent
    // again before the close's COMMIT may succeed.
    server.restart(&wan);
    // The first call on the dead connection fails and the next reconnects (a soft mount's way);
    // a close that fails with EIO is retried as an application would.
    let closed = std::thread::spawn(move || {
        for _ in 0..5 {
            if file.sync_all().is_ok() {
                return Ok(());
            }
        }
        file.sync_all()
    })
    .join()
    .unwrap();
    closed.unwrap_or_else(|e| panic!("fsync after the server restarted: {e}\n{}", server.log()));
    assert!(c.count("write") >= writes + 3, "the unstable writes went again: {}", c.counts());
    let c2 = Client::mount(Path::new(BIN), &wan, "host", &server.url, &d.path().join("mnt2"), &[]);
    assert!(std::fs::read(c2.dir.join("unstable")).unwrap() == body, "the file on the restarted server");
    c2.unmount();
    c.unmount();
}

#[test]
fn a_mount_of_a_server_that_is_not_there_fails_with_a_clear_error() {
    let d = tempfile::tempdir().unwrap();
    let mnt = d.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    // Nothing listens on this loopback port.
    let port = stics_testkit::net::free_port();
    let out = Command::new(BIN)
        .args(["nfs-mount", &format!("nfs://127.0.0.1:{port}/export"), "--mount-port", &port.to_string()])
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("mounting nfs://127.0.0.1") && err.to_lowercase().contains("refused"), "{err}");
    let out = Command::new(BIN).args(["nfs-mount", "iscsi://127.0.0.1/x"]).arg(&mnt).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an nfs:// URL"));
}

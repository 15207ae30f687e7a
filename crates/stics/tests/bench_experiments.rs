//! What `stics bench` does around its experiments: an interrupted run cleans up after itself, the
//! full-size PostMark slices merge into one table, and a read cache policy reaches its gateways.
//! The experiments themselves run whole in `bench_all.rs`.

use std::process::Command;

use serde_json::Value;

fn rows(v: &Value, section: usize) -> Vec<Value> {
    v["sections"][section]["rows"].as_array().cloned().unwrap_or_default()
}

fn positive(row: &Value, key: &str) -> f64 {
    let x = row[key].as_f64().unwrap_or(f64::NAN);
    assert!(x > 0.0, "{key} of {row}");
    x
}

/// PIDs whose parent is `parent`, with their start times (so that a PID that came round again is
/// not taken for the same process).
fn children_of(parent: u32) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{name}/stat")) else { continue };
        let f: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split_whitespace().collect();
        if f[1] == parent.to_string() {
            out.push((name, f[19].to_owned()));
        }
    }
    out
}

fn still_running(pid: &str, start: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let f: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split_whitespace().collect();
        f[19] == start && f[0] != "Z"
    })
}

#[test]
fn an_interrupted_run_stops_its_processes_and_leaves_no_mount_namespace_or_scratch() {
    let _serial = stics_testkit::proc::one_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let err_file = logs.path().join("stderr");
    let mut child = stics_testkit::proc::spawn(
        Command::new(env!("CARGO_BIN_EXE_stics"))
            .args(["bench", "packets", "--quick", "--reps", "1", "--no-calls"])
            .env("TMPDIR", tmp.path()),
        Some(&err_file),
    );
    let pid = child.pid();
    let under_tmp = || {
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
        mounts.lines().filter(|l| l.contains(&*tmp.path().to_string_lossy())).map(str::to_owned).collect::<Vec<_>>()
    };
    // Interrupt it with PostMark running on ext4 over the export, through the WAN.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    while !under_tmp().iter().any(|l| l.contains(" ext4 ")) {
        assert!(child.alive(), "stics bench ended before PostMark started");
        assert!(std::time::Instant::now() < deadline, "no ext4 mounted after 180 s");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let kids = children_of(pid);
    assert!(kids.len() >= 2, "target, gateway or export, and PostMark: {kids:?}");
    assert!(child.signal(libc::SIGINT));
    let status = child.wait_exit(std::time::Duration::from_secs(60));
    let stderr = std::fs::read_to_string(&err_file).unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(130), "(none: still running 60 s after SIGINT) {stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    for (p, start) in &kids {
        assert!(!still_running(p, start), "child {p} survived: {stderr}");
    }
    assert_eq!(under_tmp(), Vec::<String>::new());
    let netns = String::from_utf8(Command::new("ip").args(["netns", "list"]).output().unwrap().stdout).unwrap();
    assert!(!netns.contains(&format!("sbpk{pid}-")), "{netns}");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "scratch left behind: {left:?}");
}

#[test]
fn postmark_merges_the_committed_full_size_slices_into_one_table_and_figure() {
    let full = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/reproduction/full");
    let mut slices: Vec<String> = std::fs::read_dir(&full)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("postmark-"))
        .map(|p| p.display().to_string())
        .collect();
    slices.sort();
    assert!(slices.len() >= 2, "{slices:?}");
    let out = tempfile::tempdir().unwrap();
    let png = out.path().join("merged.png");
    let run = Command::new(env!("CARGO_BIN_EXE_stics"))
        .args(["bench", "postmark", "--json", "--merge", &slices.join(","), "--plot"])
        .arg(&png)
        .output()
        .expect("run stics bench");
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let v: Value = serde_json::from_slice(&run.stdout).expect("a JSON report");
    let rows = rows(&v, 0);
    assert_eq!(rows.len(), slices.len(), "one row per slice");
    for r in &rows {
        assert_eq!(r["fsck"], "clean", "{r}");
        positive(r, "plain");
    }
    // Ordered by rate (100mbit before 1gbit, the default --rates), then pool, then block.
    let rates: Vec<&str> = rows.iter().map(|r| r["rate"].as_str().unwrap()).collect();
    assert!(rates.windows(2).all(|w| !(w[0] == "1gbit" && w[1] == "100mbit")), "{rates:?}");
    assert!(std::fs::metadata(&png).unwrap().len() > 10_000, "a drawn figure");
    // A folder given twice is refused, by name.
    let twice = format!("{},{}", slices[0], slices[0]);
    let run =
        Command::new(env!("CARGO_BIN_EXE_stics")).args(["bench", "postmark", "--merge", &twice]).output().unwrap();
    assert!(!run.status.success());
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(err.contains(&format!("{} is given twice: merge each folder once", slices[0])), "{err}");
}

/// A file system unmounted here while another mount namespace has it lives on in that one, its
/// writes still coming: the bench waits for it to go and, while it stays, names who holds it,
/// rather than letting e2fsck read a file system in use (which it once reported unclean).
#[test]
fn an_ext4_another_mount_namespace_still_has_is_named_not_checked() {
    use std::time::Duration;
    use stics_bench::exp::fs::released;
    let dir = tempfile::tempdir().unwrap();
    let (img, fs) = (dir.path().join("img"), dir.path().join("fs"));
    std::fs::create_dir(&fs).unwrap();
    let ok = |c: &mut Command| assert!(c.status().unwrap().success(), "{c:?}");
    ok(Command::new("truncate").args(["-s", "64M"]).arg(&img));
    ok(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&img));
    ok(Command::new("mount").args(["-o", "loop"]).arg(&img).arg(&fs));
    std::fs::write(fs.join("a"), b"written while two namespaces have it").unwrap();
    let mut holder = Command::new("unshare").args(["-m", "--propagation", "private", "sleep", "120"]).spawn().unwrap();
    let ours = std::fs::read_link("/proc/self/ns/mnt").unwrap();
    let theirs = || std::fs::read_link(format!("/proc/{}/ns/mnt", holder.id())).ok();
    while theirs().is_none_or(|ns| ns == ours) {
        std::thread::sleep(Duration::from_millis(20));
    }
    ok(Command::new("umount").arg(&fs));
    let err = released(&img, Duration::from_secs(1)).expect_err("the file system lives on").to_string();
    assert!(err.contains("still loop-mounted") && err.contains(&format!("{} (sleep)", holder.id())), "{err}");
    holder.kill().unwrap();
    holder.wait().unwrap();
    released(&img, Duration::from_secs(30)).expect("gone with the namespace that had it");
    let fsck = Command::new("e2fsck").arg("-fn").arg(&img).output().unwrap();
    assert!(fsck.status.success(), "{}", String::from_utf8_lossy(&fsck.stdout));
}

/// `--read-cache-policy` reaches the gateways the bench starts (the commands it keeps say so and
/// the caption names the policy); a policy the gateway does not know is refused before anything
/// starts.
#[test]
fn a_read_cache_policy_reaches_the_gateways_and_an_unknown_one_is_refused() {
    let _serial = stics_testkit::proc::one_at_a_time();
    let out = tempfile::tempdir().unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_stics"))
        .args(["bench", "postmark", "--quick", "--reps", "1", "--paths", "immediate", "--read-cache-policy", "lru"])
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("run stics bench");
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let commands = std::fs::read_to_string(out.path().join("postmark/commands.txt")).unwrap();
    let gateways: Vec<&str> = commands.lines().filter(|l| l.contains(" gateway ")).collect();
    assert!(!gateways.is_empty(), "{commands}");
    for g in &gateways {
        assert!(g.contains("--policy lru"), "{g}");
    }
    let report = std::fs::read_to_string(out.path().join("postmark/report.md")).unwrap();
    assert!(report.contains("the gateway's read cache LRU"), "{report}");

    let run = Command::new(env!("CARGO_BIN_EXE_stics"))
        .args(["bench", "postmark", "--quick", "--read-cache-policy", "fifo"])
        .output()
        .unwrap();
    assert!(!run.status.success());
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(err.contains("fifo") && err.contains("s3fifo") && err.contains("lru"), "{err}");
}

//! The invariants ARCHITECTURE.md names, checked: the layers' dependency directions and the test
//! kit as a dev-dependency only (from `cargo metadata`), `unsafe` forbidden in every library but
//! those that call the kernel or C, and the parsers of peer and disk bytes denying unwrap and
//! indexing.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// The layers of ARCHITECTURE.md, lowest first; the binary and the test kit sit on top.
/// `transport` (TLS under both protocol peers) knows no block device.
/// The peers that speak iSCSI (`initiator`, `serve`) know only block devices and sit beneath
/// `compose`, which builds devices from text and serves configuration files over them.
const LAYERS: [&str; 7] = ["codec", "transport", "device", "initiator", "serve", "compose", "tools"];

/// The layer of a crate from its manifest's folder under `crates/`.
fn layer(manifest: &Path) -> usize {
    let rel = manifest.strip_prefix(root().join("crates")).unwrap();
    let first = rel.components().next().unwrap().as_os_str().to_str().unwrap();
    LAYERS.iter().position(|l| *l == first).unwrap_or(LAYERS.len())
}

/// The workspace's packages as `cargo metadata` lists them.
fn metadata() -> serde_json::Value {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn each_crate_depends_only_on_its_own_layer_or_those_beneath_and_the_test_kit_only_in_tests() {
    let m = metadata();
    let packages = m["packages"].as_array().unwrap();
    let manifest_of = |name: &str| -> PathBuf {
        let p = packages.iter().find(|p| p["name"] == name).unwrap();
        PathBuf::from(p["manifest_path"].as_str().unwrap())
    };
    let mut checked = 0;
    for p in packages {
        let name = p["name"].as_str().unwrap();
        let own = layer(Path::new(p["manifest_path"].as_str().unwrap()));
        for d in p["dependencies"].as_array().unwrap() {
            if d["path"].is_null() || !d["kind"].is_null() {
                continue;
            }
            let dep = d["name"].as_str().unwrap();
            assert_ne!(dep, "stics-testkit", "{name} depends on the test kit outside its tests");
            let theirs = layer(&manifest_of(dep));
            assert!(
                theirs <= own,
                "{name} (layer {}) depends on {dep} (layer {}), a layer above it",
                LAYERS.get(own).unwrap_or(&"top"),
                LAYERS.get(theirs).unwrap_or(&"top")
            );
            checked += 1;
        }
    }
    assert!(checked > 30, "only {checked} dependencies seen");
}

#[test]
fn no_crate_under_serve_or_initiator_depends_on_compose() {
    let m = metadata();
    let packages = m["packages"].as_array().unwrap();
    let folder = |name: &str| -> Option<usize> {
        let p = packages.iter().find(|p| p["name"] == name)?;
        Some(layer(Path::new(p["manifest_path"].as_str()?)))
    };
    let compose = LAYERS.iter().position(|l| *l == "compose").unwrap();
    let mut peers = 0;
    for p in packages {
        let own = layer(Path::new(p["manifest_path"].as_str().unwrap()));
        if !matches!(LAYERS.get(own), Some(&("serve" | "initiator"))) {
            continue;
        }
        peers += 1;
        // Dev-dependencies too: the peers' tests stand on the test kit, not on composition.
        for d in p["dependencies"].as_array().unwrap().iter().filter(|d| d["path"].is_string()) {
            let dep = d["name"].as_str().unwrap();
            assert_ne!(folder(dep), Some(compose), "{} depends on {dep}, under compose/", p["name"]);
        }
    }
    assert!(peers >= 3, "stics-scsi, stics-target and stics-initiator: {peers} seen");
}

/// Libraries that call the kernel or C and so may not forbid `unsafe`.
const UNSAFE_ALLOWED: [&str; 6] = [
    "crates/device/block",
    "crates/device/rbd",
    "crates/compose/fuse",
    "crates/tools/wan",
    "crates/tools/bench",
    "crates/tools/procs",
];

#[test]
fn every_library_but_those_that_call_the_kernel_or_c_forbids_unsafe() {
    let root = root();
    // crates/FOLDER/CRATE/src/lib.rs and crates/CRATE/src/lib.rs.
    let mut libs = Vec::new();
    collect(&root.join("crates"), 2, &mut libs);
    libs.sort();
    assert!(libs.len() >= 19, "{libs:?}");
    for lib in libs {
        let krate = lib.parent().unwrap().parent().unwrap().strip_prefix(&root).unwrap().to_str().unwrap().to_owned();
        let text = std::fs::read_to_string(&lib).unwrap();
        if !UNSAFE_ALLOWED.contains(&krate.as_str()) {
            assert!(text.contains("#![forbid(unsafe_code)]"), "{krate} does not forbid unsafe code");
        }
    }
}

/// Every `src/lib.rs` under `dir`, `depth` folders down at most.
fn collect(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let lib = dir.join("src/lib.rs");
    if lib.is_file() {
        out.push(lib);
    }
    if depth == 0 {
        return;
    }
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.path().is_dir() && e.file_name() != "src" && e.file_name() != "tests" {
            collect(&e.path(), depth - 1, out);
        }
    }
}

/// The parsers of bytes a peer, a disk or a file controls.
const PARSERS: [&str; 18] = [
    "crates/codec/sam/src/lib.rs",
    "crates/codec/wire/src/lib.rs",
    "crates/codec/link/src/lib.rs",
    "crates/device/cache/src/format.rs",
    "crates/device/cache/src/scan.rs",
    "crates/device/journal/src/format.rs",
    "crates/initiator/src/conn.rs",
    "crates/initiator/src/core.rs",
    "crates/initiator/src/discovery.rs",
    "crates/initiator/src/login.rs",
    "crates/initiator/src/scsi.rs",
    "crates/serve/iscsi-target/src/core.rs",
    "crates/serve/iscsi-target/src/dataout.rs",
    "crates/serve/iscsi-target/src/login.rs",
    "crates/serve/iscsi-target/src/textreq.rs",
    "crates/tools/bench/src/cu.rs",
    "crates/tools/bench/src/machine.rs",
    "crates/tools/bench/src/trace.rs",
];

#[test]
fn the_parsers_of_peer_and_disk_bytes_deny_unwrap_and_indexing() {
    let root = root();
    for f in PARSERS {
        let text = std::fs::read_to_string(root.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(
            text.contains("#![deny(clippy::unwrap_used, clippy::indexing_slicing)]"),
            "{f} does not deny unwrap and indexing"
        );
    }
}

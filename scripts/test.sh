#!/usr/bin/env bash
# Runs every test of stics: unit and property tests, and the process-level tests that use real
# peers (libiscsi's iscsi-test-cu, tgt, qemu-img, qemu-storage-daemon, ext4 and PostMark, network
# namespaces, a Ceph cluster). Needs root (FUSE, loop mounts, namespaces); installs missing
# Debian packages first.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -f $HOME/.cargo/env ]] && source "$HOME/.cargo/env"
bash scripts/deps.sh
cargo test --workspace --no-fail-fast "$@"
# The RBD tests: the build with librbd, each test on a throwaway Ceph cluster of its own. A
# cluster that does not start fails them; they never skip.
cargo test --no-fail-fast -p stics-rbd --features rbd "$@"
cargo test --no-fail-fast -p stics --features rbd --test rbd --test bench_rbd --test gateway rbd "$@"

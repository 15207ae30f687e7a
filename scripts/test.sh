#!/usr/bin/env bash
# Runs every test of stics: unit and property tests, and the process-level tests that use real
# peers (libiscsi's iscsi-test-cu, tgt, qemu-img, qemu-storage-daemon, ext4 and PostMark, network
# namespaces, a Ceph cluster). Needs root (FUSE, loop mounts, namespaces); installs missing
# Debian packages first.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -f $HOME/.cargo/env ]] && source "$HOME/.cargo/env"
bash scripts/deps.sh
# Everything, with the `rbd` feature: the RBD tests run on throwaway Ceph clusters
# (scripts/ceph-cluster.sh) and fail, never skip, when a cluster does not start.
cargo test --workspace --no-fail-fast --features stics/rbd,stics-rbd/rbd "$@"
# The device stack once more as the default build has it: an rbd: spec is refused, saying how to
# get a build that serves it.
cargo test --no-fail-fast -p stics-stack "$@"

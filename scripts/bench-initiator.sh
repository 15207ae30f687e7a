#!/usr/bin/env bash
# The stics initiator against libiscsi on one tgt LUN: ext4 + PostMark over `stics mount` and over
# qemu-storage-daemon's FUSE export, write + fsync latency at depth 1 (fio), and 4 KiB random reads
# through the initiator at depths 1 and 32 against tgt, stics target and stics target across
# `stics wan`: a thin caller of `stics bench initiator` (see its --help; --reps N, --out DIR,
# --quick). Needs root (FUSE, loop mounts, namespaces).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
exec "$(stics_bin)" bench initiator "$@"

#!/usr/bin/env bash
# Interoperability of `stics target` (and tgt beside it) with peers nobody here wrote: libiscsi's
# iscsi-ls, iscsi-inq and iscsi-readcapacity16, qemu-img convert to and from the LUN, and ext4 +
# PostMark over qemu-storage-daemon's FUSE export, checked with e2fsck. A thin caller of
# `stics bench interop` (see its --help); needs root (FUSE and loop mounts).
#
#   scripts/interop.sh [--target stics|tgt|both] [--keep DIR] [--out DIR]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
exec "$(stics_bin)" bench interop "$@"

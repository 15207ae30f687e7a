#!/usr/bin/env bash
# libiscsi's conformance suite against stics target and tgt in one run, counted strictly:
# a thin caller of `stics bench conformance` (see its --help). Exit status non-zero if stics
# fails any test, or has fewer than tgt + 20 real passes.
#
#   scripts/conformance.sh [--stics-only] [--lun SPEC] [--keep DIR] [--out DIR]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
exec "$(stics_bin)" bench conformance "$@"

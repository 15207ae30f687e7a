#!/usr/bin/env bash
# stics target against tgt, side by side in one run, with qemu-img bench as the client: a thin
# caller of `stics bench target` (see its --help; --reps N, --out DIR, --quick).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
exec "$(stics_bin)" bench target "$@"

#!/usr/bin/env bash
# The WAN emulator against its promises (delay, rate, loss against Mathis' model) and its own
# overhead against a plain veth pair: a thin caller of `stics bench wan` (see its --help;
# --quick, --mathis-secs N, --out DIR). Exit status non-zero if a promise is not kept.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
exec "$(stics_bin)" bench wan "$@"

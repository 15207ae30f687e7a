#!/usr/bin/env bash
# The STICS gateway against plain iSCSI across `stics wan`, each comparison side by side in one
# run: a thin caller of `stics bench` (see `stics bench <experiment> --help`):
#  1. PostMark on ext4 -o sync, plain iSCSI against the gateway's log and immediate modes, at 8 ms
#     one way: seconds, WAN packets and bytes, bytes the host wrote (`stics bench packets`);
#  2. blocking 8 KiB sequential and random reads and writes against one-way delay, plain and
#     through the gateway (`stics bench delay`);
#  3. random writes past the log's size, log against write-through mode (destage stalls), and
#     the restart on a full log after SIGKILL with the WAN cut (`stics bench gateway`);
#  4. seed 004's EMC-tel-like open-loop trace, plain against log and immediate (`stics bench trace`).
# Arguments go to each experiment: --quick, --reps N, --out DIR, --keep DIR.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
stics=$(stics_bin)
"$stics" bench packets --delay 8ms --no-calls "$@"
"$stics" bench delay "$@"
"$stics" bench gateway "$@"
"$stics" bench trace "$@"

#!/bin/bash
# Twentieth session: the device queue in order of value, in one call (stages start only while there is
# time left: LIMIT seconds, default 540). Each stage is a mode of steps 84-86's scripts.
#   bench/probe/s20_gpu.sh [LIMIT]
export PYTHONUNBUFFERED=1
LIMIT=${1:-540}
T0=$(date +%s); left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
stage() { local need=$1; shift; if [ "$(left)" -lt "$need" ]; then echo "=== skipped (time): $*"; return; fi; bash "$@"; }
stage 150 bench/probe/cluster85_gpu.sh test
stage 200 bench/probe/cluster85_gpu.sh ab
stage 60 bench/probe/cluster85_gpu.sh ncu
stage 120 bench/probe/epi86_gpu.sh ab
stage 100 bench/probe/ncu84_gpu.sh fold
echo "=== s20 done at $(( $(date +%s) - T0 )) s"

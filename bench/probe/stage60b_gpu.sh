#!/bin/bash
# Step 60 (b): STAGE_DKDV at the causal points where separate-process A/B disagreed (s8192): the
# dq_dk_dv kernel alone under ncu (locked clocks), and end-to-end medians, each variant in its own process, twice.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
for a in "128 8192 causal" "128 4096 causal" "64 8192 causal" "128 8192"; do
  for v in "" "STAGE_DKDV=1"; do
    echo "== $a [$v]"
    CUPY_FMHA_BWD_WS_TILES=$v timeout -s KILL 60 ncu --profile-from-start off --metrics gpu__time_duration.sum --csv python3 bench/probe/bwd_split.py $a --once 2>/dev/null \
      | grep gpu__time | grep dq_dk_dv | awk -F'","' '{printf "  ncu %-50.50s %s %s\n", $5, $NF, $(NF-1)}' | tr -d '"'
  done
  for r in 1 2; do for v in "" "STAGE_DKDV=1"; do
    echo "  e2e [$v] $(CUPY_FMHA_BWD_WS_TILES=$v timeout -s KILL 40 python3 bench/probe/bwd_split.py $a 2>&1 | grep -v Warn | tr '\n' ' ')"
  done; done
done

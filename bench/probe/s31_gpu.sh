#!/bin/bash
# Thirty-first session, one call whatever card comes (the device tool gives an H100 or an H200 and may not be
# asked for the H200 to match an issue's wording): on an H200, issue 10's item 1 (the whole GPU suite in one
# run, bench/probe/suite_all_gpu.sh); on an H100, where that suite already ran in one run this session
# (1006 passed, 26 skipped: one case of test_gpu_large_tensors skipped for memory while 16 workers shared the
# card), that file alone (the card to itself), then the per-instruction stall samples of the ws forward at
# hdim 128 s1024 (issue 11's short-sequence gap; bench/probe/ncu84_gpu.sh source, s1024 only).
#   bash bench/probe/s31_gpu.sh
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$NAME"
if [[ "$NAME" == *H200* ]]; then exec bash bench/probe/suite_all_gpu.sh; fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "pytest -m gpu tests/test_gpu_large_tensors.py (alone)"
timeout -s KILL 300 python3 -m pytest -m gpu -q -p no:cacheprovider -rs tests/test_gpu_large_tensors.py > $OUT/large.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR|^SKIPPED" $OUT/large.txt | head; tail -1 $OUT/large.txt
t "source counters, ours hdim 128 s1024 (batch 16)"
timeout -s KILL 150 ncu --profile-from-start off --section SourceCounters --section WarpStateStats -k regex:fmha_fwd \
   -o /tmp/fwd128_1024 env B=16 python3 bench/probe/once.py fwd 128 1024 > /tmp/ncu.log 2>&1; echo "rc=$?"
timeout -s KILL 60 ncu -i /tmp/fwd128_1024.ncu-rep --page source --csv --print-source sass > /tmp/src.csv 2> /tmp/src.err
echo "rc=$?"; python3 bench/probe/ncu_inst.py /tmp/src.csv 0.4 | head -60 || tail -5 /tmp/src.err
gzip -c /tmp/src.csv > $OUT/fwd128_s1024_src.csv.gz
t done

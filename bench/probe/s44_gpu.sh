#!/bin/bash
# Forty-fourth session's probe: per-instruction warp-stall samples (ncu SourceCounters) of one forward call,
# at issue 11's misses (s31_gpu.sh's `src1024` runs the first part here). Parts:
#   src1024   hdim 128, s1024, B=16 (FlashAttention's grid; row 132)
#   src64c    hdim 64, causal, s1024, B=16 (issue 11's largest miss: 0.83x cuDNN on the H100)
#   srcdrop   hdim 128 with dropout 0.1, s4096, B=4 (1.44x the plain forward on the H100; row 116 called it
#             issue-bound, never sampled per instruction on the ws kernel's current build)
#   srcdrop64 hdim 64 with dropout, s4096, B=4 (1.67x)
# Each leaves $OUT/<part>_src.csv.gz (read with bench/probe/ncu_inst.py) and prints the instructions holding
# at least 0.4% of the samples.   bash bench/probe/s44_gpu.sh [parts]   (default: the last three)
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
C=${CUPY_CACHE_DIR:-$HOME/.cupy/kernel_cache}; mkdir -p $C
[ -f .kcache/kcache.tar.xz ] && tar xJf .kcache/kcache.tar.xz -C $C
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
[ $# -eq 0 ] && set -- src64c srcdrop srcdrop64
for part in "$@"; do
  case $part in
    src1024) B=16; args="fwd 128 1024";;
    src64c) B=16; args="fwd 64 1024 causal";;
    srcdrop) B=4; args="fwd 128 4096 dropout";;
    srcdrop64) B=4; args="fwd 64 4096 dropout";;
    *) echo "unknown part $part"; continue;;
  esac
  t "$part: B=$B once.py $args"
  timeout -s KILL 150 ncu --profile-from-start off --section SourceCounters --section WarpStateStats -k regex:fmha_fwd \
    -o /tmp/$part env B=$B python3 bench/probe/once.py $args > /tmp/$part.log 2>&1; echo "rc=$?"; tail -2 /tmp/$part.log
  timeout -s KILL 60 ncu -i /tmp/$part.ncu-rep --page source --csv --print-source sass > /tmp/$part.csv 2> /tmp/$part.err
  echo "rc=$?"; python3 bench/probe/ncu_inst.py /tmp/$part.csv 0.4 | head -25 || tail -5 /tmp/$part.err
  gzip -c /tmp/$part.csv > $OUT/${part}_src.csv.gz
done
t done

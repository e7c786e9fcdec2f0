#!/bin/bash
# Thirtieth session (issue 11): is the forward at seqlen 1024 paying for K / V re-read from HBM?
# Row 109 measured PERSIST=16 (one CTA per (batch, head): 256 CTAs of 8 row blocks at s1024,
# 132 heads' K / V live at once, 66 MB) 1.51x slower than PERSIST=4 (66 heads, 33 MB), with the same
# row blocks per SM. cuDNN's forward runs a grid of 132 CTAs (step 84). DRAM bytes read and the L2
# hit rate, ours under PERSIST 0 / 4 / 16 (LINEAR=132 too, step 110, since removed) and cuDNN's, bf16 hdim 128 b16 h16 s1024 (and causal).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
MET="--metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,launch__grid_size,lts__t_sectors_srcunit_tex_op_read.sum"
one() { local tag=$1; shift; echo "== $tag"
  timeout -s KILL 120 ncu --profile-from-start off $MET "$@" 2>&1 | grep -E "^\s+(gpu__|dram__|lts__|launch__)|==ERR" ; }
for c in "" causal; do
  for p in PERSIST=0 PERSIST=4 PERSIST=16; do B=16 CUPY_FMHA_FWD_WS_TILES=$p one "ours $p $c" python3 bench/probe/once.py fwd 128 1024 $c; done
  B=16 one "cudnn $c" -k regex:"fprop|fmha|flash" python3 bench/probe/once_torch.py fwd 128 1024 cudnn $c
done
B=2 one "ours s8192 default" python3 bench/probe/once.py fwd 128 8192

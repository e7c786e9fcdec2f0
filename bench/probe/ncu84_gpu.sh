#!/bin/bash
# Step 84 (issue 11; twentieth session): the first Nsight Compute look at the ws forward, and at
# cuDNN's forward kernel beside it. Why: at hdim 128 s8192 the forward's key-block loop runs 1.425 us
# per 128 x 128 block at 1,980 MHz (timeline, step 79): 2,821 cycles against 2,048 of tensor work at
# peak (73%), while cuDNN's whole forward reaches 0.87x of the dense-matmul ceiling. So the loop, not
# the per-row-block overhead, is most of the gap there; what holds it (tensor pipe, shared-memory
# bandwidth of the SS S GEMM beside the TMA writes, MUFU, the turns) is unmeasured.
#   bench/probe/ncu84_gpu.sh ncu     (digests: ours hdim 128 s8192 and causal, cuDNN's; ours hdim 64)
#   bench/probe/ncu84_gpu.sh source  (per-instruction stall samples of ours at hdim 128 s8192)
# (its `vec` part, O_VEC's A/B, ran in the twentieth session; O_VEC was removed in the twenty-second)
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
SEC="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section InstructionStats"
MET="--metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed_pipe_xu.sum,sm__cycles_elapsed.avg,smsp__cycles_active.avg,sm__inst_executed_pipe_uniform.sum,lts__t_bytes.sum.per_second,lts__throughput.avg.pct_of_peak_sustained_elapsed,gpc__cycles_elapsed.avg.per_second"
n=0
run() { local tag=$1 kern=$2; shift 2; n=$((n+1)); t "ncu $tag: $*"
  timeout -s KILL 150 ncu --profile-from-start off $SEC $MET --csv --page raw -k regex:"$kern" "$@" > $OUT/ncu84_$n.csv 2> $OUT/ncu84_$n.err
  echo "rc=$?"; python3 bench/probe/ncu_digest.py $OUT/ncu84_$n.csv || tail -5 $OUT/ncu84_$n.err; }
for what in "$@"; do
if [ "$what" = ncu ]; then
  run ours-128 fmha_fwd python3 bench/probe/once.py fwd 128 8192
  run cudnn-128 . python3 bench/probe/once_torch.py fwd 128 8192 cudnn
  run ours-64 fmha_fwd python3 bench/probe/once.py fwd 64 8192
fi
if [ "$what" = source ]; then  # (FlashAttention's grid, batch 16384 / s: at s1024 the epilogue's share is 8x s8192's)
for s in 8192 1024; do
  t "source counters, ours hdim 128 s$s"
  timeout -s KILL 150 ncu --profile-from-start off --section SourceCounters --section WarpStateStats -k regex:fmha_fwd \
     -o /tmp/fwd128_$s env B=$((16384 / s)) python3 bench/probe/once.py fwd 128 $s > /tmp/ncu.log 2>&1; echo "rc=$?"
  timeout -s KILL 60 ncu -i /tmp/fwd128_$s.ncu-rep --page source --csv --print-source sass > /tmp/src.csv 2> /tmp/src.err
  echo "rc=$?"; python3 bench/probe/ncu_inst.py /tmp/src.csv 0.4 || tail -5 /tmp/src.err
  gzip -c /tmp/src.csv > $OUT/fwd128_s${s}_src.csv.gz
done
fi
if [ "$what" = fold ]; then  # the folded softmax at hdim 128 (step 37's in-process A/B was within its noise)
  t "ab FOLD=1 at hdim 128"
  timeout -s KILL 200 python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_FWD_WS_TILES=FOLD=1 --rounds 2 --tag fold84 --out $OUT -- \
     --hdim 128 --seqlen 1024,4096,8192 --dtype bf16 --causal both --mode fwd 2>&1 | grep -v '^\$' | tail -12
fi
done
t done

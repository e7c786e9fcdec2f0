"""Host (Python) time per attention_forward / attention_backward call against the GPU time, at a
short problem where the host could starve the GPU: fp16, batch 16, 16 heads, seqlen 1024.

Each case runs ``--repeats`` timed loops of ``--calls`` calls (after a warm-up) and reports the
minimum and the median over the loops of the host time per call (the time the Python calls take
to return, the GPU still busy) and of host+GPU time per call. The minimum is the figure to
compare between trees: scheduling noise on the host only ever adds time.

Loops are short (20 calls, 3 to 5 launches each) so that the launch queue never fills: the GPU
takes longer per call than the host here, and once the driver's queue is full a launch waits
for the GPU, which turns "host time" into GPU time. How soon the queue fills depends on the size
of the kernel parameters (the warp-specialized backward passes four 128-byte tensor maps), so
long loops compared kernels, not host code (200-call loops: 150 against 282 us per call on the
H200 for the same Python, bench/NOTES.md step 23).

    python bench/probe/host_overhead.py [--json out.json]

``bench/probe/host_ab.py`` runs this script under two source trees, alternating.
"""

import argparse
import json
import statistics
import time

import cupy as cp

import cupy_fmha


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    rows = []
    for d in (64, 128):
        for causal in (False, True):
            q = cp.random.standard_normal((16, 1024, 16, d), dtype=cp.float32).astype(cp.float16)
            do = cp.random.standard_normal(q.shape, dtype=cp.float32).astype(cp.float16)
            o, lse = cupy_fmha.attention_forward(q, q, q, causal=causal)
            for name, fn in (("fwd", lambda: cupy_fmha.attention_forward(q, q, q, causal=causal)),
                             ("bwd", lambda: cupy_fmha.attention_backward(do, q, q, q, o, lse, causal=causal))):
                for _ in range(10):
                    fn()
                cp.cuda.Device().synchronize()
                host, total = [], []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    for _ in range(args.calls):
                        fn()
                    t1 = time.perf_counter()
                    cp.cuda.Device().synchronize()
                    t2 = time.perf_counter()
                    host.append(1e6 * (t1 - t0) / args.calls)
                    total.append(1e6 * (t2 - t0) / args.calls)
                row = dict(hdim=d, causal=causal, mode=name, host_min_us=min(host),
                           host_median_us=statistics.median(host), total_min_us=min(total),
                           total_median_us=statistics.median(total))
                rows.append(row)
                print(f"d{d} causal={causal} {name}: host {row['host_min_us']:.0f} us/call "
                      f"(median {row['host_median_us']:.0f}), host+GPU {row['total_min_us']:.0f} us/call",
                      flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

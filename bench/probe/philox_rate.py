"""Philox-4x32-10 throughput probe (bench/NOTES.md step 48; the dropout generator has 7 rounds since
step 73, so its calls cost about 0.7 of what this measures): how many calls per second the H200
sustains when nothing else runs, with C independent chains per thread, against the calls the
dropout forward needs (one call per query row and 16 keys since bench/NOTES.md step 68:
batch * heads * seqlen_q * seqlen_k / 16; 8 keys before it).

    python bench/probe/philox_rate.py [--calls-needed 67108864]

The round arithmetic is the one of kernels/philox.cuh (one __umulhi and one multiply per word pair).
"""
import argparse

import cupy as cp

SRC = r"""
extern "C" __global__ void rate(unsigned* sink, int iters, unsigned k0s, unsigned k1s) {
    unsigned acc = 0;
    const unsigned tid = blockIdx.x * blockDim.x + threadIdx.x;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int ch = 0; ch < C; ++ch) {
            unsigned c0 = it * C + ch, c1 = tid, c2 = 7u, c3 = 9u, k0 = k0s, k1 = k1s;
#pragma unroll
            for (int r = 0; r < 10; ++r) {
                if (r > 0) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
                const unsigned lo0 = 0xD2511F53u * c0, hi0 = __umulhi(0xD2511F53u, c0);
                const unsigned lo1 = 0xCD9E8D57u * c2, hi1 = __umulhi(0xCD9E8D57u, c2);
                const unsigned n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
                c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
            }
            acc ^= c0 ^ c1 ^ c2 ^ c3;
        }
    }
    if (acc == 0x12345678u) sink[0] = acc;
}
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls-needed", type=float, default=4 * 16 * 4096 * 4096 / 16)
    a = ap.parse_args()
    sink = cp.zeros(1, cp.uint32)
    ev0, ev1 = cp.cuda.Event(), cp.cuda.Event()
    for c in (1, 2, 4, 8):
        k = cp.RawModule(code=SRC, options=(f"-DC={c}",)).get_function("rate")
        for threads, per_sm in ((128, 2), (256, 2), (256, 4), (384, 1), (512, 2)):
            grid, iters = 132 * per_sm, 4096 // c
            k((grid,), (threads,), (sink, cp.int32(iters), cp.uint32(1), cp.uint32(2)))
            best = 1e9
            for _ in range(5):
                ev0.record(); k((grid,), (threads,), (sink, cp.int32(iters), cp.uint32(1), cp.uint32(2))); ev1.record()
                ev1.synchronize()
                best = min(best, cp.cuda.get_elapsed_time(ev0, ev1))
            calls = grid * threads * iters * c
            rate = calls / best / 1e-3
            print(f"chains {c} threads {threads} x {per_sm}/SM: {rate / 1e9:7.2f} G calls/s, "
                  f"{rate / 132 / 1.755e9:6.2f} calls/clk/SM, dropout-forward needs {a.calls_needed / rate * 1e3:6.3f} ms")


if __name__ == "__main__":
    main()

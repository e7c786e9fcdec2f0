"""wgmma issue-rate probe: how many bf16 FLOP per clock one SM sustains for back-to-back wgmma
m64nNk16 with both operands in shared memory (SS) or A from registers (RS), for N = 32..256 and
1-3 warpgroups issuing at once (bench/NOTES.md step 34: is an N = 64 SS wgmma bound by the
shared-memory read rate?).

    python bench/probe/wgmma_rate.py [--iters 2000] [--json out.json]

Each warpgroup chains 4 wgmmas (K = 64, one 128-byte-swizzled slab, K-major) per commit group and
keeps one group in flight (wait_group 1), on one accumulator, for `iters` groups; the SM's rate is
the warpgroups' FLOP over the slowest warpgroup's clock64 span. 132 CTAs, one per SM. The operand
values are ones (the products are not checked; this is a rate probe).
"""
import argparse
import json

import cupy as cp
import numpy as np

SRC = r"""
extern "C" __global__ void __launch_bounds__(NWG * 128, 1) rate(long long* clk, float* sink, int iters) {
    extern __shared__ __align__(1024) unsigned char smraw[];
    unsigned char* sm = smraw + ((1024u - ((unsigned)__cvta_generic_to_shared(smraw) & 1023u)) & 1023u);
    for (int i = threadIdx.x; i < (64 + N) * 64; i += blockDim.x) ((unsigned short*)sm)[i] = 0x3f80;  // bf16 1.0
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const unsigned a_addr = (unsigned)__cvta_generic_to_shared(sm), b_addr = a_addr + 64 * 128;
    const unsigned long long hi = (1ull << 62) | ((unsigned long long)(1024 >> 4) << 32) | ((unsigned long long)1 << 16);
    const unsigned long long da = hi | ((a_addr & 0x3FFFF) >> 4), db = hi | ((b_addr & 0x3FFFF) >> 4);
    float d[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
    unsigned a0 = 0x3f803f80u, a1 = a0, a2 = a0, a3 = a0;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    long long t0 = clock64();
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const unsigned long long dak = da + 2 * k, dbk = db + 2 * k;  // +32 bytes per K step
            WGMMA
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    long long t1 = clock64();
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) s += d[i];
    if (threadIdx.x % 128 == 0) clk[blockIdx.x * NWG + threadIdx.x / 128] = t1 - t0;
    if (s == 12345.f) sink[0] = s;
}
"""


def wgmma_asm(n: int, rs: bool) -> str:
    regs = ",".join(f"%{i}" for i in range(n // 2))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(n // 2))
    j = n // 2
    if rs:
        a = f"{{%{j},%{j + 1},%{j + 2},%{j + 3}}}"
        ins = '"r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(dbk), "r"(iters)'
        b = f"%{j + 4}"
        tail = "p, 1, 1, 0"
    else:
        a, b = f"%{j}", f"%{j + 1}"
        ins = '"l"(dak), "l"(dbk), "r"(iters)'
        tail = "p, 1, 1, 0, 0"
    return (f'asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{j + (5 if rs else 2)}, 0;\\n'
            f'wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {{{regs}}}, {a}, {b}, {tail};\\n}}\\n"'
            f" : {outs} : {ins});")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--json")
    args = ap.parse_args()
    nsm = cp.cuda.Device().attributes["MultiProcessorCount"]
    rows = []
    print(f"{'mode':4} {'N':>4} {'WGs':>3} {'FLOP/clk/SM':>12} {'of 4096':>8}")
    for rs in (False, True):
        for n in (32, 64, 128, 256):
            for nwg in (1, 2, 3):
                src = SRC.replace("WGMMA", wgmma_asm(n, rs))
                mod = cp.RawModule(code=src, options=("-std=c++17", "-arch=sm_90a", f"-DN={n}", f"-DNWG={nwg}"))
                f = mod.get_function("rate")
                smem = (64 + n) * 128 + 1024
                f.max_dynamic_shared_size_bytes = smem
                clk = cp.zeros(nsm * nwg, dtype=cp.int64)
                sink = cp.zeros(1, dtype=cp.float32)
                for _ in range(2):  # the first launch warms up
                    f((nsm,), (128 * nwg,), (clk, sink, np.int32(args.iters)), shared_mem=smem)
                cp.cuda.Device().synchronize()
                cyc = clk.get().reshape(nsm, nwg).max(axis=1)
                flop = nwg * args.iters * 4 * 2 * 64 * n * 16
                r = float(np.median(flop / cyc))
                rows.append(dict(mode="rs" if rs else "ss", n=n, nwg=nwg, flop_per_clk=r))
                print(f"{'RS' if rs else 'SS':4} {n:4} {nwg:3} {r:12.0f} {r / 4096:8.2f}")
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()

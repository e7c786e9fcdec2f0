"""Where the wide ws backward's query-block loop spends its time (the TIMING build of
fmha_bwd_dq_dk_dv_sm90_ws_wide: thread 0 of each MMA warpgroup sums the clock64 cycles of each phase
of every query block into the module's `fmha_wide_timeline`), FlashAttention's grid, bf16, bshd.
Issue 10's hdim-256 backward is at 0.84-0.89x cuDNN with the tensor pipe busy 37% of the time
(bench/NOTES.md step 75's ncu); this splits a block's time between the stage's wait, GEMM0/2, P and
dS, barrier 1, GEMM1/3/4, barrier 2 and the dQ staging, per warpgroup, against the block's tensor
work at the SM's peak rate (4096 bf16 FLOP per cycle).

    python3 bench/probe/wide_timeline.py SEQLEN [causal] [TILES]   (TILES: more CUPY_FMHA_BWD_WS_WIDE_TILES entries, e.g. DQ_WRITER=0)

`report` takes the raw rows, so it runs on made-up ones without a GPU.
"""
import os
import sys

import numpy as np

PHASES = ("stage wait", "GEMM0/2", "P and dS", "barrier 1", "GEMM1/3/4", "barrier 2", "dQ staging")
WORDS = 8 + 2 * len(PHASES)  # the kernel's WT_WORDS


def report(a: np.ndarray, mhz: float, hdim: int = 256, out=print) -> dict:
    """Print the phase sums of the rows ``a`` (int64, one per CTA that ran) at an SM clock of ``mhz``;
    returns the per-block cycles of each phase (median over CTAs, warpgroup 0)."""
    g0, g1, smid, nblk, c_in, c_kv, c_loop, c_out = (a[:, i] for i in range(8))
    ph = a[:, 8:].reshape(len(a), 2, len(PHASES)).astype(float)
    ok = nblk > 0
    per = ph[ok] / nblk[ok, None, None]  # cycles per query block
    ideal = 5 * 2 * 64 * 64 * hdim / 4096  # five GEMMs of 64 x 64 x hdim at 4096 FLOP per cycle
    loop = (c_loop - c_kv)[ok] / nblk[ok]
    out(f"{ok.sum()} CTAs with query blocks (median {int(np.median(nblk[ok]))}); clock {mhz:.0f} MHz; "
        f"per query block: loop {np.median(loop):.0f} cycles ({np.median(loop) / mhz:.2f} us), "
        f"tensor work at peak {ideal:.0f} ({ideal / np.median(loop):.0%} of the loop)")
    res = {}
    for w in range(2):
        cells = []
        for i, name in enumerate(PHASES):
            v = float(np.median(per[:, w, i]))
            res[(w, name)] = v
            cells.append(f"{name} {v:.0f} ({v / np.median(loop):.0%})")
        out(f"  warpgroup {w}: " + ", ".join(cells))
    out(f"CTA: to K/V {np.median((c_kv - c_in)[ok]) / mhz:.2f} us, after the loop {np.median((c_out - c_loop)[ok]) / mhz:.2f} us, "
        f"whole {np.median((g1 - g0)[ok]) / 1e3:.2f} us (globaltimer); kernel span {(g1.max() - g0.min()) / 1e3:.1f} us")
    return res


def main(argv: list[str]) -> None:
    extra = [x for x in argv[1:] if "=" in x]
    os.environ["CUPY_FMHA_BWD_WS_WIDE_TILES"] = ",".join(["TIMING=1", *extra])

    import cupy_fmha
    import timing_build as T

    d, s = 256, int(argv[0])
    causal = "causal" in argv[1:]
    b, h, (q, k, v, do) = T.grid_inputs(d, s, 4)
    o, lse = cupy_fmha.attention_forward(q, k, v, causal=causal)
    call = lambda: cupy_fmha.attention_backward(do, q, k, v, o, lse, causal=causal)  # noqa: E731
    call()
    mod, spec = T.swap_in("fmha_bwd_dq_dk_dv_sm90_ws_wide")
    _, a = T.read_timeline(mod, "fmha_wide_timeline", (1 << 14, WORDS), call)
    mhz = T.sm_mhz()
    print(f"{spec.name} {extra}: d{d} s{s} {'causal' if causal else 'nc'}, b{b} h{h}")
    report(a, mhz, d)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])

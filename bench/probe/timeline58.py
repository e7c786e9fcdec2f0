"""Per-CTA timeline of the ws backward (the TIMING build: MMA thread 0 stamps %globaltimer and
clock64 at entry, K/V landed, first query block done, loop done, dK/dV stores issued, the last bulk
reads done, into the module's `fmha_timeline`), FlashAttention's grid, bf16, bshd. Prints the phases' medians (us, from clock64
at the SM clock ``--mhz``) and the gaps between consecutive CTAs on one SM (globaltimer, ns).

    python3 bench/probe/timeline58.py HDIM SEQLEN [causal] [det] [TILES]   (TILES: more CUPY_FMHA_BWD_WS_TILES entries)

``det``: deterministic mode (ordered dQ adds), and the phases by key block (grid x without the
heads-first grid): if each tile's semaphore admits key block kb only after kb - 1 and the CTAs of a
head start together, the first query block's time grows with kb (a staircase of one add's hop per
key block), which the writer thread (DQ_WRITER=1, step 76) does not remove.
"""
import os
import sys

extra = [a for a in sys.argv[3:] if "=" in a]
os.environ["CUPY_FMHA_BWD_WS_TILES"] = ",".join(["TIMING=1", *extra])
import numpy as np

import cupy_fmha
import timing_build as T

d, s = int(sys.argv[1]), int(sys.argv[2])
causal = "causal" in sys.argv[3:]
det = "det" in sys.argv[3:]
b, h, (q, k, v, do) = T.grid_inputs(d, s, 4)
o, lse = cupy_fmha.attention_forward(q, k, v, causal=causal)
call = lambda: cupy_fmha.attention_backward(do, q, k, v, o, lse, causal=causal, deterministic=det)
call()
mod, spec = T.swap_in("fmha_bwd_dq_dk_dv_sm90_ws")
rows, a = T.read_timeline(mod, "fmha_timeline", (1 << 15, 16), call, warmup=5)  # (rows: CTA indices, blockIdx.x fastest)
clk = T.sm_mhz()
g0, g4, smid, nblk = a[:, 0], a[:, 5], a[:, 6], a[:, 7]
c = a[:, 8:14] - a[:, 8:9]
us = c / clk
print(f"{spec.name} {extra}: {len(a)} CTAs, clock {clk:.0f} MHz (attribute), d{d} s{s} {'causal' if causal else 'nc'}")
print("phase medians (us): to K/V %.2f, first block %.2f, per later block %.3f, after loop %.2f (stores issued %.2f, bulk reads %.2f), whole CTA %.2f" % (
    np.median(us[:, 1]), np.median(us[:, 2] - us[:, 1]),
    np.median((us[:, 3] - us[:, 2])[nblk > 1] / (nblk[nblk > 1] - 1)), np.median(us[:, 5] - us[:, 3]),
    np.median(us[:, 4] - us[:, 3]), np.median(us[:, 5] - us[:, 4]), np.median(us[:, 5])))
gt = (a[:, 0:6] - a[:, 0:1]) / 1e3
print("globaltimer phase medians (us): to K/V %.2f, first block %.2f, after loop %.2f, whole CTA %.2f; distinct values of the K/V stamp: %d" % (
    np.median(gt[:, 1]), np.median(gt[:, 2] - gt[:, 1]), np.median(gt[:, 5] - gt[:, 3]), np.median(gt[:, 5]),
    len(np.unique(a[:, 1] % 1000))))
print("globaltimer whole CTA median (us): %.2f; kernel span (us): %.1f" % (np.median(g4 - g0) / 1e3, (g4.max() - g0.min()) / 1e3))
gaps = []
for sm in np.unique(smid):
    sel = np.argsort(g0[smid == sm])
    s0, s4 = g0[smid == sm][sel], g4[smid == sm][sel]
    gaps += list(s0[1:] - s4[:-1])
gaps = np.array(gaps)
print("gap between CTAs on an SM (ns): median %d, p10 %d, p90 %d, n %d" % (np.median(gaps), np.percentile(gaps, 10), np.percentile(gaps, 90), len(gaps)))
first = g0.min()
print("first CTA start to last CTA end per SM (us): median %.1f, max %.1f; last-wave idle: SMs done by (us) p10 %.1f" % (
    np.median([g4[smid == sm].max() - first for sm in np.unique(smid)]) / 1e3,
    max(g4[smid == sm].max() - first for sm in np.unique(smid)) / 1e3,
    np.percentile([g4[smid == sm].max() - first for sm in np.unique(smid)], 10) / 1e3))
for nb in sorted(set(nblk.tolist()))[:3] + sorted(set(nblk.tolist()))[-2:]:
    m = nblk == nb
    print(f"  {nb:3d} blocks: {m.sum():5d} CTAs, whole CTA median {np.median(us[m, 5]):.2f} us, to K/V {np.median(us[m, 1]):.2f}, "
          f"first block {np.median(us[m, 2] - us[m, 1]):.2f}, after loop {np.median(us[m, 5] - us[m, 3]):.2f}")
if det and not spec.macro("HEADS_X", 0):
    nkb = -(-s // spec.macro("BLOCK_N"))
    kb = rows % nkb
    print(f"deterministic, by key block (of {nkb}): first block (us) / whole CTA (us) / to K/V (us), medians")
    for lo in range(0, nkb, max(1, nkb // 8)):
        m = (kb >= lo) & (kb < lo + max(1, nkb // 8))
        print(f"  kb {lo:4d}-{min(nkb, lo + max(1, nkb // 8)) - 1:4d}: {np.median(us[m, 2] - us[m, 1]):7.2f} / "
              f"{np.median(us[m, 5]):7.2f} / {np.median(us[m, 1]):5.2f}  ({m.sum()} CTAs)")

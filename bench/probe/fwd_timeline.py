"""Per-CTA timeline of the ws forward (the TIMING build of fmha_fwd_sm90_ws: thread 0 of each MMA
warpgroup stamps clock64 at six phases of each of its first four row blocks and sums the cycles of
seven phases of every loop iteration; the CTA's entry and exit go in with %globaltimer too; all into
the module's `fmha_fwd_timeline`), FlashAttention's grid, bf16,
bshd. Issue 11's open forward points are the short ones (hdim 128 s1024 0.84x cuDNN against 0.95 at
s8192): this says where a row block's time goes besides its key blocks (Q's wait, the first softmax
without a P V under it, the last P V, O's epilogue) and how long CTAs take to start.

    python3 bench/probe/fwd_timeline.py HDIM SEQLEN [causal] [dropout] [bias] [TILES]   (TILES: more CUPY_FMHA_FWD_WS_TILES
        entries; dropout: the dropout build, p = 0.1; bias: an elementwise bf16 bias [b, h, s, s], the TMA bias build)

Prints medians in microseconds (clock64 at the SM clock the device attribute gives; globaltimer for
the CTA-level figures). `report` takes the raw rows, so it runs on made-up ones without a GPU.
"""
import os
import sys

import numpy as np

ROWS, EVENTS = 4, 6  # the kernel's TL_ROWS, TL_EVENTS
AT = 8 + ROWS  # its TL_AT: [8, AT) key blocks per row block, then the stamps
EVENT_NAMES = ("start", "Q landed", "S_0 + softmax", "last softmax", "last P V", "O issued")
#: the loop's phases (TL_PHASES of them, summed per MMA warpgroup from TL_PH_AT, then the count of
#: iterations), in the kernel's order
PHASES = ("K, V landed", "P V done", "rescale + P", "turn", "issue", "S done", "softmax")
PH_AT = AT + 3 * ROWS * EVENTS
WORDS = PH_AT + 3 * (len(PHASES) + 1)


def _med(x) -> float:
    x = np.asarray(x, dtype=float)
    return float(np.nanmedian(x)) if np.isfinite(x).any() else float("nan")


def report(a: np.ndarray, mhz: float, out=print) -> dict:
    """Print the phases of the rows ``a`` (int64, one per CTA that ran: WORDS words as the kernel
    writes them) at an SM clock of ``mhz``; returns the headline figures (us)."""
    g0, g1, smid, nrow, c0, c1, _, nwg = (a[:, i] for i in range(8))
    nkb = a[:, 8:AT]
    st = a[:, AT:PH_AT].reshape(len(a), 3, ROWS, EVENTS)
    us = np.where(st > 0, (st - c0[:, None, None, None]) / mhz, np.nan)  # us since the CTA's entry
    w0 = us[:, 0]
    out(f"{len(a)} CTAs, {int(nwg[0])} MMA warpgroups, row blocks per CTA {sorted(set(nrow.tolist()))[:6]}, "
        f"key blocks of row block 0 {int(np.median(nkb[:, 0]))} (median); clock {mhz:.0f} MHz")
    out("warpgroup 0, row block 0, from the CTA's entry: " + ", ".join(
        f"{n} {_med(w0[:, 0, e]):.2f}" for e, n in enumerate(EVENT_NAMES)))
    with np.errstate(invalid="ignore", divide="ignore"):
        steady = np.where(nkb > 1, (w0[:, :, 3] - w0[:, :, 2]) / np.maximum(nkb - 1, 1), np.nan)
    out(f"per key block in the loop: {_med(steady[:, 0]):.3f} (row block 0), {_med(steady):.3f} (all)")
    heads = {"per_block": _med(steady), "outside": []}
    exit_us = (c1 - c0) / mhz
    for r in range(ROWS):
        sel = nrow > r
        if not sel.any():
            break
        x = w0[sel, r]
        end = w0[sel, r + 1, 0] if r + 1 < ROWS else exit_us[sel]
        last = nrow[sel] == r + 1  # this CTA's last row block: it ends at the exit
        end = np.where(last | ~np.isfinite(end), exit_us[sel], end)
        span = end - x[:, 0]
        extra_t = span - steady[sel, r] * nkb[sel, r]
        heads["outside"].append(_med(extra_t))
        out(f"  row block {r} ({sel.sum()} CTAs, {int(np.median(nkb[sel, r]))} key blocks): Q wait {_med(x[:, 1] - x[:, 0]):.2f}, "
            f"S_0 + softmax {_med(x[:, 2] - x[:, 1]):.2f}, loop {_med(x[:, 3] - x[:, 2]):.2f}, "
            f"last P V {_med(x[:, 4] - x[:, 3]):.2f}, O {_med(x[:, 5] - x[:, 4]):.2f}, to the next / exit "
            f"{_med(end - x[:, 5]):.2f}; span {_med(span):.2f}, of it outside the loop's rate {_med(extra_t):.2f} "
            f"({_med(extra_t / steady[sel, r]):.2f} key blocks)")
    for w in range(1, int(nwg[0])):
        out(f"warpgroup {w} minus warpgroup 0, row block 0: " + ", ".join(
            f"{n} {_med(us[:, w, 0, e] - w0[:, 0, e]):+.2f}" for e, n in enumerate(EVENT_NAMES)))
    ph = a[:, PH_AT:].reshape(len(a), 3, len(PHASES) + 1)
    heads["phases"] = {}
    for w in range(int(nwg[0])):
        its = ph[:, w, len(PHASES)].sum()
        if its == 0:
            continue
        per = ph[:, w, :len(PHASES)].sum(axis=0) / its  # cycles per loop iteration, over every CTA
        heads["phases"][w] = dict(zip(PHASES, per.tolist()))
        out(f"warpgroup {w}, cycles per loop iteration (key blocks 1.., {int(its)} of them): " + ", ".join(
            f"{n} {c:.0f}" for n, c in zip(PHASES, per)) + f"; sum {per.sum():.0f}")
    heads["cta"] = float(np.median(g1 - g0)) / 1e3
    out(f"CTA (globaltimer): whole median {heads['cta']:.2f}; kernel span {(g1.max() - g0.min()) / 1e3:.1f}")
    gaps = []
    for sm in np.unique(smid):
        o = np.argsort(g0[smid == sm])
        gaps += list(g0[smid == sm][o][1:] - g1[smid == sm][o][:-1])
    if gaps:
        out(f"gap between CTAs on an SM (ns): median {np.median(gaps):.0f}, p10 {np.percentile(gaps, 10):.0f}, "
            f"p90 {np.percentile(gaps, 90):.0f}, n {len(gaps)}")
    ends = np.array([g1[smid == sm].max() - g0.min() for sm in np.unique(smid)]) / 1e3
    out(f"SMs done by (from the first CTA's start): p10 {np.percentile(ends, 10):.1f}, median {np.median(ends):.1f}, "
        f"max {ends.max():.1f} ({len(ends)} SMs)")
    return heads


def main(argv: list[str]) -> None:
    extra = [x for x in argv[2:] if "=" in x]
    os.environ["CUPY_FMHA_FWD_WS_TILES"] = ",".join(["TIMING=1", *extra])
    import cupy as cp

    import cupy_fmha
    import timing_build as T

    d, s = int(argv[0]), int(argv[1])
    causal = "causal" in argv[2:]
    drop = dict(dropout_p=0.1, seed=1) if "dropout" in argv[2:] else {}
    b, h, (q, k, v) = T.grid_inputs(d, s, 3)
    if "bias" in argv[2:]:  # (the same dtype as q: the 16-bit TMA bias build)
        drop["bias"] = cp.random.default_rng(1).standard_normal((b, h, s, s), dtype=cp.float32).astype(q.dtype)
    call = lambda: cupy_fmha.attention_forward(q, k, v, causal=causal, **drop)  # noqa: E731
    call()
    mod, spec = T.swap_in("fmha_fwd_sm90_ws")
    start, stop = cp.cuda.Event(), cp.cuda.Event()

    def timed():
        start.record()
        call()
        stop.record()

    _, a = T.read_timeline(mod, "fmha_fwd_timeline", (1 << 14, WORDS), timed, warmup=5)
    mhz = T.sm_mhz()
    print(f"{spec.name} {extra}: d{d} s{s} {'causal' if causal else 'nc'}{''.join(' ' + k for k in drop if k != 'seed')}, b{b} h{h}; "
          f"kernel {cp.cuda.get_elapsed_time(start, stop) * 1e3:.1f} us (events, with the stamps)")
    report(a, mhz)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1:])

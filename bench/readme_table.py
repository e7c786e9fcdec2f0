"""The README's performance table and its summary lines, drawn from `bench/sweep.py` JSON results.

Each cell is **ours** / flash backend / cuDNN backend (ours / cuDNN), TFLOP/s by FlashAttention's count;
the forward column comes from the forward sweeps given, the backward column from the backward ones
(a sweep run with ``--mode both`` serves both). Where two files hold the same point, the later one on
the command line wins. The summary gives, per pass, head dim, dtype and mask, the range of ours / cuDNN
from seqlen 2048 and at 1024, and ours / flash over all points::

    python bench/readme_table.py bench/results/2026-12-06-h200-sweep-*-s29.json
    python bench/readme_table.py --dtype fp16 --seqlen 1024,4096 FILES...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}


def load(paths: list[Path]) -> dict[str, dict[tuple, dict]]:
    """Points by pass ("fwd", "bwd") and (dtype, hdim, causal, seqlen); later files win."""
    out: dict[str, dict[tuple, dict]] = {"fwd": {}, "bwd": {}}
    for path in paths:
        doc = json.loads(path.read_text())
        for p in doc["points"]:
            key = (p["dtype"], p["hdim"], p["causal"], p["seqlen"])
            for m in out:
                if (p.get("ours") or {}).get(f"{m}_tflops") is not None:
                    out[m][key] = {**p, "source": path.name}
    return out


def _tf(p: dict, lib: str, m: str):
    return (p.get(lib) or {}).get(f"{m}_tflops")


def cell(p: dict | None, m: str) -> str:
    if p is None:
        return "-"
    ours, flash, cudnn = (_tf(p, lib, m) for lib in ("ours", "flash", "cudnn"))
    text = " / ".join("-" if v is None else f"{v:.0f}" for v in (ours, flash, cudnn))
    text = "**" + text.split(" / ", 1)[0] + "** / " + text.split(" / ", 1)[1]
    return text + (f" ({ours / cudnn:.2f}x)" if ours and cudnn else "")


def table(points: dict, dtype: str, seqlens: list[int]) -> list[str]:
    keys = sorted({k[1:] for m in points for k in points[m] if k[0] == dtype and k[3] in seqlens})
    rows = ["| hdim | causal | seqlen | forward | backward |", "|---|---|---|---|---|"]
    for hdim, causal, seqlen in keys:
        k = (dtype, hdim, causal, seqlen)
        rows.append(f"| {hdim} | {'yes' if causal else 'no'} | {seqlen} | {cell(points['fwd'].get(k), 'fwd')} | "
                    f"{cell(points['bwd'].get(k), 'bwd')} |")
    return rows


def _span(vals: list[float]) -> str:
    if not vals:
        return "-"
    lo, hi = min(vals), max(vals)
    return f"{lo:.2f}x" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}x"


def summary(points: dict) -> list[str]:
    lines = []
    for m, name in (("fwd", "forward"), ("bwd", "backward")):
        groups: dict[tuple, list[dict]] = {}
        for (dtype, hdim, causal, seqlen), p in points[m].items():
            groups.setdefault((hdim, dtype, causal), []).append(p)
        for (hdim, dtype, causal), ps in sorted(groups.items()):
            def ratios(peer, sel):
                return [_tf(p, "ours", m) / _tf(p, peer, m) for p in ps if sel(p) and _tf(p, peer, m)]
            lines.append(f"{name} hdim {hdim} {dtype} {'causal' if causal else 'no mask'}: ours/cuDNN "
                         f"{_span(ratios('cudnn', lambda p: p['seqlen'] >= 2048))} from seqlen 2048, "
                         f"{_span(ratios('cudnn', lambda p: p['seqlen'] < 2048))} below; ours/flash "
                         f"{_span(ratios('flash', lambda p: True))}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--dtype", default="bf16", choices=sorted(_DTYPE))
    ap.add_argument("--seqlen", default="1024,2048,4096,16384", help="the table's rows (the summary takes every point)")
    args = ap.parse_args()
    points = load(args.files)
    print("\n".join(table(points, _DTYPE[args.dtype], [int(s) for s in args.seqlen.split(",")])))
    print()
    print("\n".join(summary(points)))


if __name__ == "__main__":
    main()

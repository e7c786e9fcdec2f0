"""Host time per call of two source trees, alternating A, B, A, B, ...: runs this folder's
``host_overhead.py`` in a fresh process per tree and round with ``PYTHONPATH`` set to the tree
(each tree imports its own ``cupy_fmha``), then prints per case the minimum over all rounds of
each tree's minimum host time per call, and B - A.

    python bench/probe/host_ab.py --a .old --b . --rounds 3 [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", type=Path, required=True)
    ap.add_argument("--b", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    best: dict = {"a": {}, "b": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for side in ("a", "b"):
                tree = getattr(args, side).resolve()
                out = Path(tmp) / f"{side}{r}.json"
                print(f"# round {r} tree {side} ({tree})", flush=True)
                subprocess.run([sys.executable, str(HERE / "host_overhead.py"), "--json", str(out)], cwd=tree,
                               env=dict(os.environ, PYTHONPATH=str(tree)), check=True)
                for row in json.loads(out.read_text()):
                    k = (row["hdim"], row["causal"], row["mode"])
                    best[side][k] = min(row["host_min_us"], best[side].get(k, float("inf")))
    rows = []
    print(f"\n{'d':>4} {'causal':6} {'pass':4} {'A us':>7} {'B us':>7} {'B-A':>6}")
    for k in sorted(best["a"]):
        a, b = best["a"][k], best["b"][k]
        rows.append(dict(hdim=k[0], causal=k[1], mode=k[2], a_us=a, b_us=b))
        print(f"{k[0]:4} {str(k[1]):6} {k[2]:4} {a:7.1f} {b:7.1f} {b - a:+6.1f}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

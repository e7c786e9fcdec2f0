"""A/B timing of two source trees of cupy-fmha in one device session.

Runs ``bench/sweep.py`` of each tree in its own process (each tree imports its own
``cupy_fmha`` and compiles its own kernels), alternating A, B, A, B, ... so that drift of the
machine hits both, then prints, per point and pass, the best median time of each tree and the
ratio B / A (above 1: B slower). Peers are not timed (they do not change between trees).

    python bench/ab.py --a /path/to/old --b . --rounds 2 -- --hdim 64,128 --seqlen 1024,8192
    python bench/ab.py --a . --b . --env-b CUPY_FMHA_BWD_WS=1 -- --hdim 128 --mode bwd

Everything after ``--`` goes to both trees' sweep.py. ``--env-a`` / ``--env-b`` (repeatable,
VAR=VALUE) set environment variables for one side only: one tree against itself with a kernel
switch or a tile override. JSON results land in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


def _run(tree: Path, name: str, out: Path, sweep_args: list[str], extra_env: dict[str, str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONUNBUFFERED="1", **extra_env)
    cmd = [sys.executable, str(tree / "bench" / "sweep.py"), "--peers", "", "--no-check", "--out-dir", str(out),
           "--name", name, *sweep_args]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=tree, env=env, check=True)
    return json.loads((out / f"{name}.json").read_text())


def _key(p: dict) -> tuple:
    return (p["dtype"], p["hdim"], p["causal"], p["seqlen"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", type=Path, required=True, help="tree A (e.g. the old commit)")
    ap.add_argument("--b", type=Path, required=True, help="tree B (e.g. this checkout)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--tag", default="ab")
    ap.add_argument("--env-a", action="append", default=[], metavar="VAR=VALUE", help="environment of side A only")
    ap.add_argument("--env-b", action="append", default=[], metavar="VAR=VALUE", help="environment of side B only")
    ap.add_argument("sweep_args", nargs="*")
    args = ap.parse_args()
    envs = {}
    for side in ("a", "b"):
        pairs = getattr(args, f"env_{side}")
        bad = [x for x in pairs if "=" not in x]
        if bad:
            ap.error(f"--env-{side}: expected VAR=VALUE, got {bad[0]!r}")
        envs[side] = dict(x.split("=", 1) for x in pairs)
    args.out.mkdir(parents=True, exist_ok=True)
    best: dict = {"a": {}, "b": {}}
    for r in range(args.rounds):
        for side in ("a", "b"):
            tree = getattr(args, side).resolve()
            res = _run(tree, f"{args.tag}-{side}{r}", args.out.resolve(), args.sweep_args, envs[side])
            for p in res["points"]:
                ours = p.get("ours", {})
                for mode in ("fwd", "bwd"):
                    ms = ours.get(f"{mode}_ms")
                    if ms is None:
                        continue
                    k = (*_key(p), mode)
                    best[side][k] = min(ms, best[side].get(k, float("inf")))
    rows = []
    worst = 0.0
    print(f"\n{'dtype':9} {'d':>4} {'causal':6} {'seqlen':>6} {'pass':4} {'A ms':>9} {'B ms':>9} {'B/A':>6}")
    for k in sorted(set(best["a"]) & set(best["b"])):
        a, b = best["a"][k], best["b"][k]
        rows.append(dict(zip(("dtype", "hdim", "causal", "seqlen", "mode"), k), a_ms=a, b_ms=b, ratio=b / a))
        worst = max(worst, b / a)
        print(f"{k[0]:9} {k[1]:4} {str(k[2]):6} {k[3]:6} {k[4]:4} {a:9.3f} {b:9.3f} {b / a:6.3f}")
    print(f"worst B/A: {worst:.3f} (best of {args.rounds} rounds per tree)")
    (args.out / f"{args.tag}-summary.json").write_text(json.dumps({"rows": rows, "worst": worst}, indent=1))


if __name__ == "__main__":
    main()

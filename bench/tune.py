"""Tile-table experiments: time forward/backward under several tile overrides, one subprocess each
(the overrides are read when kernels are specialized). For choosing entries of cupy_fmha/spec.py.

    python bench/tune.py --hdim 128 --seqlen 8192 --bwd "NWARPS=8,BLOCK_M=32" "NWARPS=8,BLOCK_M=64"
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hdim", type=int, nargs="+", default=[128])
    ap.add_argument("--seqlen", type=int, nargs="+", default=[8192])
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--fwd", nargs="*", default=[], help="CUPY_FMHA_FWD_TILES values to try")
    ap.add_argument("--bwd", nargs="*", default=[], help="CUPY_FMHA_BWD_TILES values to try")
    ap.add_argument("--fwd-sm90", nargs="*", default=[], help="CUPY_FMHA_FWD_SM90_TILES values to try")
    ap.add_argument("--bwd-sm90", nargs="*", default=[], help="CUPY_FMHA_BWD_SM90_TILES values to try")
    a = ap.parse_args()
    runs = ([("fwd", t) for t in a.fwd] + [("bwd", t) for t in a.bwd]
            + [("fwd_sm90", t) for t in a.fwd_sm90] + [("bwd_sm90", t) for t in a.bwd_sm90])
    for kind, tiles in runs:
        for d in a.hdim:
            for s in a.seqlen:
                env = dict(os.environ)
                env[f"CUPY_FMHA_{kind.upper()}_TILES"] = tiles
                if kind in ("fwd", "bwd"):  # the mma.sync tables: keep wgmma out of the way
                    env["CUPY_FMHA_DISABLE_WGMMA"] = "1"
                cmd = [sys.executable, os.path.join(HERE, "quickperf.py"), "--hdim", str(d), "--seqlen", str(s),
                       "--no-peer"] + (["--causal"] if a.causal else [])
                out = subprocess.run(cmd, env=env, capture_output=True, text=True)
                line = (out.stdout.strip().splitlines() or [out.stderr.strip()[-300:]])[-1]
                print(f"{kind} [{tiles}] {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A/B of the warp-specialized forward's pipeline variants in one process, against PyTorch SDPA's
cuDNN backend on the same inputs (``--mode bwd``: the ws backward's variants, ``CUPY_FMHA_BWD_WS_TILES``).

For each point of FlashAttention's grid (batch * seqlen = 16384, nhead * hdim = 2048; bshd), every
variant (a ``CUPY_FMHA_FWD_WS_TILES`` value, switched in this process: the plan cache keys on it)
is timed ``--rounds`` times in alternating order (CUDA events, median of ``--repeat`` calls after
warm-up, rotating through 3 input sets) and its best median kept; each variant's O is compared
with the first variant's (max |difference| / max |O|: a broken variant shows as a large value,
not only as a fast time). Then cuDNN (``--peers``) on the same memory. Prints a table (ms,
TFLOP/s, ratio to the first variant and to cuDNN) and writes JSON.

``--mode bwd`` times ``attention_backward`` alone instead (given O and LSE of one default forward
per input set), switching ``CUPY_FMHA_BWD_WS_TILES`` (with ``CUPY_FMHA_BWD_WS=1``); the difference
is the largest of dQ's, dK's and dV's max |difference| / max |gradient| against the first variant,
and the peers' backward (autograd of SDPA) is timed on the same inputs.

    python bench/probe/fwd_variants.py --variants "" "SWIZZLE=1" "SWIZZLE=1,PV_OVERLAP=1" \\
        --hdim 64,128 --seqlen 1024,8192 --causal both --out fwd_variants.json
    python bench/probe/fwd_variants.py --mode bwd --variants "" "SWIZZLE=1" --out bwd_variants.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for p in (str(REPO), str(REPO / "bench")):
    if p not in sys.path:
        sys.path.insert(0, p)

import sweep as S  # noqa: E402 (bench/sweep.py: grid, inputs, peers, FLOPs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", nargs="+", default=["", "SWIZZLE=1"],
                    help='CUPY_FMHA_FWD_WS_TILES (--mode bwd: CUPY_FMHA_BWD_WS_TILES) values ("" = default)')
    ap.add_argument("--mode", default="fwd", choices=("fwd", "bwd"))
    ap.add_argument("--hdim", default="64,128")
    ap.add_argument("--seqlen", default="1024,8192")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--causal", default="both")
    ap.add_argument("--peers", default="cudnn", help="comma-separated SDPA backends (flash, cudnn; empty: none)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--time-limit", type=float, default=150.0, help="start no new point after this many seconds")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    import cupy as cp

    import cupy_fmha
    from cupy_fmha.backends import cuda
    from cupy_fmha.timing import time_cuda

    bwd_mode = args.mode == "bwd"
    var = "CUPY_FMHA_BWD_WS_TILES" if bwd_mode else "CUPY_FMHA_FWD_WS_TILES"
    os.environ["CUPY_FMHA_BWD_WS" if bwd_mode else "CUPY_FMHA_FWD_WS"] = "1"
    points = S.build_grid([int(x) for x in args.hdim.split(",")], [int(x) for x in args.seqlen.split(",")],
                          S._dtypes(args.dtype), S._causals(args.causal))
    tmod = S.load_torch() if args.peers else "no peers asked for"
    peers = [S.TorchPeer(tmod, n) for n in args.peers.split(",") if n] if not isinstance(tmod, str) else []
    if isinstance(tmod, str) and args.peers:
        print(f"# peers skipped: {tmod}", flush=True)
    t_start = time.perf_counter()
    rows = []
    for p in points:
        if time.perf_counter() - t_start > args.time_limit:
            print(f"# time limit: {p.label()} and later points not run", flush=True)
            break
        rng = cp.random.default_rng(0)
        sets = [{n: S.random_input(cp, rng, p.shape, p.dtype) for n in ("q", "k", "v", "do")} for _ in range(3)]
        kw = dict(causal=p.causal, dtype=p.dtype, layout="bshd")
        if bwd_mode:  # O and LSE of the default forward, once per set
            os.environ.pop(var, None)
            for s in sets:
                s["o"], s["lse"] = cupy_fmha.attention_forward(s["q"], s["k"], s["v"], **kw)
            args_sets = [(s["do"], s["q"], s["k"], s["v"], s["o"], s["lse"]) for s in sets]
        else:
            args_sets = [(s["q"], s["k"], s["v"]) for s in sets]
        flops = S.point_flops(p, args.mode)
        best: dict[str, float] = {}
        diff: dict[str, float] = {}
        names: dict[str, str] = {}
        ref = None
        for r in range(args.rounds):
            order = args.variants if r % 2 == 0 else list(reversed(args.variants))
            for v in order:
                os.environ[var] = v
                try:
                    dt = "bf16" if p.dtype == "bfloat16" else "fp16"
                    names[v] = (cuda.bwd_specs(dt, p.hdim, p.hdim, 90).dq_dk_dv if bwd_mode
                                else cuda.fwd_spec(dt, p.hdim, p.hdim, 90)).name
                    call = cupy_fmha.attention_backward if bwd_mode else cupy_fmha.attention_forward
                    if r == 0:
                        res = call(*args_sets[0], **kw)
                        outs = (res.dq, res.dk, res.dv) if bwd_mode else (res[0],)
                        o32 = [S.to_float32(cp, x, p.dtype) for x in outs]
                        if ref is None:
                            ref = o32
                        diff[v] = max(float(cp.abs(a - b).max() / cp.abs(b).max()) for a, b in zip(o32, ref))
                        del res, outs, o32
                    t = time_cuda(lambda *a: call(*a, **kw), warmup=args.warmup, repeat=args.repeat, rotate=args_sets)
                    best[v] = min(best.get(v, float("inf")), t.median_ms)
                except Exception as exc:  # noqa: BLE001 - a failing variant is a result too
                    diff[v] = float("nan")
                    print(f"# {p.label()} variant {v!r}: {S._err(exc)}", flush=True)
        os.environ.pop(var, None)
        peer_ms = {}
        if peers:
            sets_t = [tuple(S.torch_view(tmod[0], cp, s[n], p.dtype) for n in ("q", "k", "v", "do")) for s in sets]
            for peer in peers:
                res = peer.measure(p, sets_t, {args.mode}, args.warmup, args.repeat)
                if args.mode in res:
                    peer_ms[peer.name] = res[args.mode]["median_ms"]
                else:
                    print(f"# {p.label()} {peer.name}: {res.get(args.mode + '_error')}", flush=True)
        base = best.get(args.variants[0])
        print(f"\n{p.label()}  ({flops / 1e12:.2f} TFLOP per call)")
        for v in args.variants:
            ms = best.get(v)
            if ms is None:
                print(f"  {v or '(default)':40s} failed")
                continue
            line = f"  {v or '(default)':40s} {ms:8.3f} ms {S.tflops(flops, ms):7.1f} TFLOP/s"
            if base:
                line += f"  x{base / ms:5.3f} vs first"
            for name, pm in peer_ms.items():
                line += f"  {pm / ms:5.3f}x {name}"
            line += f"  {'grad' if bwd_mode else 'O'} diff {diff.get(v, float('nan')):.1e}"
            print(line, flush=True)
        for name, pm in peer_ms.items():
            print(f"  {name:40s} {pm:8.3f} ms {S.tflops(flops, pm):7.1f} TFLOP/s", flush=True)
        rows.append(dict(dtype=p.dtype, hdim=p.hdim, causal=p.causal, seqlen=p.seqlen, batch=p.batch, nhead=p.nhead,
                         flops=flops, ms=best, o_rel_diff=diff, instances=names, peers_ms=peer_ms))
        del sets, args_sets, ref
        cp.get_default_memory_pool().free_all_blocks()
        if args.out:
            args.out.write_text(json.dumps({"mode": args.mode, "variants": args.variants, "rounds": args.rounds,
                                            "points": rows}, indent=1))


if __name__ == "__main__":
    main()

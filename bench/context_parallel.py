"""Context parallelism (issue 14): ring attention on N GPUs against plain attention on one.

For each sequence length: a random problem (default bf16, batch 1, 16 heads, hdim 128, causal,
zigzag shards), checked against one-GPU ``attention_forward`` / ``attention_backward`` of the
whole problem (relative Frobenius error of every output, on every rank), then timed (CUDA
events, median of ``--repeat`` after ``--warmup``): plain attention on the whole sequence on GPU
0, and the ring forward and backward (the slowest rank's median). Speed-up = one-GPU time / ring
time, efficiency = speed-up / N. One more run of each pass records a per-step timeline on every
rank (:class:`cupy_fmha.parallel.Timeline`): compute time per step, the transfer of the next K/V
shard (and the dK/dV buffer in the backward) on the communication stream, the idle time of the
compute stream between steps (``exposed``: transfer time the computation did not hide) and the
final dK/dV hop home (``tail``), which nothing overlaps.

    python bench/context_parallel.py --nproc 2                       # seqlen 16k..128k on 2 GPUs (NCCL)
    python bench/context_parallel.py --nproc 2 --seqlen 131072 --out bench/results/cp.json
    python bench/context_parallel.py --local 2 --seqlen 16384        # 2 ranks emulated on one GPU
    python bench/context_parallel.py --plan-only --nproc 4 --seqlen 131072   # per-step work, no GPU

``--local N`` runs all N ranks in this process on one GPU (a LocalRing: device copies instead of
NCCL): it checks the results and shows each rank's per-step compute, but the ranks share one GPU,
so its times are the sum of every rank's work, not a speed-up. ``--plan-only`` prints which
attention calls each rank makes per step and the visible pairs it computes (balance of the
zigzag layout against the contiguous one), without a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))

from cupy_fmha.parallel.run import RunConfig, _Parser, _window, launch, run_local, run_many  # noqa: E402


def _seqlens(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive lengths, got {text!r}")
    return vals


def parser() -> argparse.ArgumentParser:
    # run's parser: it takes `--window -1,0` (plain argparse reads -1,0 as an option)
    p = _Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--nproc", type=int, help="ranks over NCCL, one process per GPU")
    mode.add_argument("--local", type=int, help="ranks emulated in one process on one GPU (LocalRing)")
    p.add_argument("--plan-only", action="store_true", help="print the per-step plan (needs --nproc or --local); no GPU")
    p.add_argument("--seqlen", "-s", type=_seqlens, default=[16384, 32768, 65536, 131072])
    p.add_argument("--batch", "-b", type=int, default=1)
    p.add_argument("--nhead", type=int, default=16)
    p.add_argument("--nhead-k", type=int, default=None)
    p.add_argument("--hdim", "-d", type=int, default=128)
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--window", type=_window, default=(-1, -1))
    p.add_argument("--layout", choices=("bshd", "bhsd"), default="bshd")
    p.add_argument("--scheme", choices=("zigzag", "contiguous"), default="zigzag")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--check", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--single", action=argparse.BooleanOptionalAction, default=True,
                   help="also time plain attention on the whole sequence on one GPU")
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--out", type=Path, default=None, help="write the JSON results here")
    return p


def plan_table(world: int, seqlens, cfg: RunConfig) -> list[dict]:
    from cupy_fmha.mask import resolve_mask
    from cupy_fmha.parallel import global_window, plan_ring

    spec = resolve_mask(None, cfg.causal, tuple(cfg.window))
    rows = []
    for s in seqlens:
        for scheme in ("zigzag", "contiguous"):
            plans = plan_ring(world, s, global_window(spec, s), scheme)
            work = [[st.visible for st in p.steps] for p in plans]
            per_step_max = [max(w[i] for w in work) for i in range(world)]
            rows.append({"seqlen": s, "scheme": scheme, "calls": [[len(st.calls) for st in p.steps] for p in plans],
                         "visible_pairs": work, "ideal_over_actual": round(
                             sum(map(sum, work)) / world / max(sum(per_step_max), 1), 4)})
    return rows


def summarize(res, world: int, local: bool) -> list[str]:
    lines = []
    for entry in res:
        cfg, ranks = entry["config"], entry["ranks"]
        ring_f = max(r["ring"]["fwd_ms"] for r in ranks)
        ring_b = max(r["ring"]["bwd_ms"] for r in ranks)
        single = next((r["single"] for r in ranks if r.get("single")), {})
        tfl = lambda flops, ms: flops / (ms * 1e-3) / 1e12  # noqa: E731
        fl = ranks[0]["flops"]
        line = f"s={cfg['seqlen']:>7} ring x{world}{' (local)' if local else ''}: fwd {ring_f:8.2f} ms bwd {ring_b:8.2f} ms"
        if single:
            sf, sb = single["fwd_ms"], single["bwd_ms"]
            line += (f" | 1 GPU: fwd {sf:8.2f} ms ({tfl(fl['fwd'], sf):.0f} TFLOP/s) bwd {sb:8.2f} ms "
                     f"({tfl(fl['bwd'], sb):.0f} TFLOP/s)")
            if not local:
                line += f" | speed-up fwd {sf / ring_f:.2f}x bwd {sb / ring_b:.2f}x (efficiency {sb / ring_b / world:.2f})"
        errs = {}
        for r in ranks:
            for k, v in r.get("rel_err", {}).items():
                errs[k] = max(errs.get(k, 0.0), v)
        if errs:
            ok = all(v <= ranks[0]["rel_limit"] for v in errs.values())
            line += " | err " + " ".join(f"{k} {v:.1e}" for k, v in errs.items()) + (" ok" if ok else " FAILED")
        lines.append(line)
        # local: one entry holding every emulated rank's timeline; NCCL: one entry per rank
        tls = ranks[0]["timeline"] if local else [dict(r["timeline"], rank=r["rank"]) for r in ranks]
        for tl_rank in tls:
            for pas in ("fwd", "bwd"):
                t = tl_rank[pas]
                lines.append(f"    rank {tl_rank['rank']} {pas}: compute/step {t['compute_ms']} ms, transfers "
                             f"{t['comm_total_ms']:.2f} ms, exposed {t['exposed_ms']:.2f} ms (gaps {t['gap_ms']}, "
                             f"tail {t['tail_ms']}), hidden {t['hidden_fraction']}")
    return lines


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    world = a.nproc if a.nproc is not None else a.local
    base = RunConfig(batch=a.batch, nhead=a.nhead, nhead_k=a.nhead_k, hdim=a.hdim, dtype=a.dtype, causal=a.causal,
                     window=tuple(a.window), layout=a.layout, scheme=a.scheme, warmup=a.warmup, repeat=a.repeat,
                     check=a.check, single=a.single)
    try:
        if world is None or world < 1:
            raise ValueError(f"--nproc/--local: expected at least 1, got {world}")
        cfgs = [replace(base, seqlen=s).validate(world) for s in a.seqlen]
    except ValueError as exc:
        print(f"context_parallel: error: {exc}", file=sys.stderr)
        return 2
    if a.plan_only:
        rows = plan_table(world, a.seqlen, cfgs[0])
        for r in rows:
            print(f"s={r['seqlen']} {r['scheme']:10} calls/step {r['calls'][0]} ... visible pairs per step, rank 0: "
                  f"{r['visible_pairs'][0]}, rank {world - 1}: {r['visible_pairs'][-1]}; balance {r['ideal_over_actual']}")
        if a.out:
            a.out.write_text(json.dumps({"plan": rows}, indent=1))
        return 0
    t0 = time.time()
    try:
        if a.local is not None:
            from cupy_fmha.api import _cupy

            _cupy()  # RuntimeError naming the reason when no GPU is usable
            res = [{"config": asdict(c), "ranks": [run_local(c, world)]} for c in cfgs]
        else:
            per_rank = launch(run_many, world, (cfgs,), timeout=a.timeout)
            res = [{"config": asdict(c), "ranks": [per_rank[r][i] for r in range(world)]} for i, c in enumerate(cfgs)]
    except (ValueError, RuntimeError) as exc:
        print(f"context_parallel: error: {exc}", file=sys.stderr)
        return 2
    for line in summarize(res, world, a.local is not None):
        print(line)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"mode": "local" if a.local is not None else "nccl", "world": world,
                                     "wall_s": round(time.time() - t0, 1), "results": res}, indent=1))
    ok = all(v <= r["rel_limit"] for e in res for r in e["ranks"] for v in r.get("rel_err", {}).values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

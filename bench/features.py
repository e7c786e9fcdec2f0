"""Feature cost: forward and backward time of each option against the plain call.

One problem (default: bf16, hdim 128, batch 4, nhead 16, seqlen 4096, bshd, no mask), timed
plain and with each feature switched on. Every row is a small dict of keyword arguments for
``attention_forward`` / ``attention_backward``; a row whose keywords the installed API does not
take (checked on the signature, and a ``TypeError`` for an unexpected keyword at call time) is
reported as "not available" instead of stopping the run, so the script can list features that
are still being built. Values that need the problem (arrays) are ``Make`` callables, built once
per run.

Timing: ``cupy_fmha.timing.time_cuda`` (CUDA events, warm-up, median of ``--repeat`` calls),
rotating through ``--sets`` input sets. The backward is timed alone, given the o and lse of the
row's own forward (or of the plain forward when the row does not change the forward).
TFLOP/s by FlashAttention's convention (``cupy_fmha.flops.attention_flops``); "vs plain" is the
ratio of medians (1.30 = 30 % slower). A peers row (PyTorch SDPA's flash backend on the same
memory, plain attention) is added when torch is importable, for context.

    python bench/features.py                       # all rows, table + bench/results/<date>-features.json
    python bench/features.py --rows plain,deterministic --repeat 30
    python bench/features.py --list                # rows and whether this API takes them (no GPU)
"""

from __future__ import annotations

import inspect
import json
import platform
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import typer

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
for p in (str(REPO), str(HERE)):  # run from a checkout without installing; sweep.py's helpers
    if p not in sys.path:
        sys.path.insert(0, p)

app = typer.Typer(add_completion=False, help=__doc__.split("\n\n")[0])


# ----------------------------------------------------------------------------- the problem


@dataclass(frozen=True)
class Problem:
    dtype: str  # "bfloat16" | "float16"
    batch: int
    nhead: int
    seqlen: int
    hdim: int
    causal: bool

    @property
    def shape(self) -> tuple[int, int, int, int]:  # bshd
        return (self.batch, self.seqlen, self.nhead, self.hdim)


class Make:
    """A keyword value built from the problem when the row runs: ``fn(ctx) -> value`` with
    ``ctx`` = (cupy, Problem, set index)."""

    def __init__(self, fn: Callable, describe: str):
        self.fn, self.describe = fn, describe

    def __repr__(self) -> str:
        return self.describe


def _cu_seqlens(ctx):
    cp, p, _ = ctx
    return cp.arange(0, (p.batch + 1) * p.seqlen, p.seqlen, dtype=cp.int32)


def _bias(ctx):
    cp, p, _ = ctx
    rng = cp.random.default_rng(11)
    x = rng.standard_normal((p.batch, p.nhead, p.seqlen, p.seqlen), dtype=cp.float32)
    from sweep import f32_to_bf16_bits

    out = f32_to_bf16_bits(cp, x) if p.dtype == "bfloat16" else x.astype(cp.float16)
    del x
    return out


def _slopes(ctx):
    cp, p, _ = ctx
    h = cp.arange(1, p.nhead + 1, dtype=cp.float32)
    return cp.exp2(-8.0 * h / p.nhead).astype(cp.float32)


CU = Make(_cu_seqlens, "cu_seqlens [0, s, 2s, ...] int32")
BIAS = Make(_bias, "bias [b, h, s, s] in the input dtype")
SLOPES = Make(_slopes, "slopes 2^(-8 h / nhead) float32 [h]")

#: name -> keyword arguments. "fwd"/"bwd": extra keywords for that pass (None: the row does not
#: change that pass, which is then not timed); "both": keywords for both; "inputs": "thd" packs
#: the batch into one axis (varlen). Add rows here.
ROWS: list[dict[str, Any]] = [
    {"name": "plain", "both": {}},
    {"name": "deterministic", "fwd": None, "bwd": {"deterministic": True}},
    {"name": "varlen", "inputs": "thd", "both": {"layout": "thd", "cu_seqlens_q": CU, "cu_seqlens_k": CU}},
    {"name": "dropout p=0.1", "both": {"dropout_p": 0.1, "seed": 1234}},
    {"name": "bias [b,h,s,s]", "both": {"bias": BIAS}},
    {"name": "bias [b,h,s,s] + dbias", "fwd": {"bias": BIAS}, "bwd": {"bias": BIAS, "return_dbias": True}},
    {"name": "alibi", "both": {"alibi_slopes": SLOPES}},
]


def row_kwargs(row: dict, mode: str) -> Optional[dict]:
    """The row's extra keywords for ``mode`` ("fwd"/"bwd"), or None when it leaves that pass alone."""
    if "both" in row:
        return dict(row["both"])
    kw = row.get(mode, {})
    return None if kw is None else dict(kw)


def missing_keywords(fn: Callable, kw: dict) -> list[str]:
    """Keywords of ``kw`` that ``fn``'s signature does not take."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    return [k for k in kw if k not in params]


def _unknown_keyword_error(exc: BaseException) -> bool:
    return isinstance(exc, TypeError) and "unexpected keyword" in str(exc)


def _resolve(kw: dict, ctx, cache: dict) -> dict:
    out = {}
    for k, v in kw.items():
        if isinstance(v, Make):
            if id(v) not in cache:
                cache[id(v)] = v.fn(ctx)
            v = cache[id(v)]
        out[k] = v
    return out


def _err(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0][:160] if msg else ''}"


# ----------------------------------------------------------------------------- measuring


def _flops(p: Problem, mode: str) -> int:
    from cupy_fmha.flops import attention_flops
    from cupy_fmha.mask import resolve_mask

    spec = resolve_mask(None, p.causal, (-1, -1))
    return int(attention_flops(p.batch, p.nhead, p.seqlen, p.seqlen, p.hdim, p.hdim, spec, mode))


def _inputs(cp, p: Problem, nsets: int, seed: int) -> list[dict]:
    from sweep import random_input

    rng = cp.random.default_rng(seed)
    return [{n: random_input(cp, rng, p.shape, p.dtype) for n in ("q", "k", "v", "do")} for _ in range(nsets)]


def _as_thd(a):
    b, s, h, d = a.shape
    return a.reshape(b * s, h, d)  # contiguous bshd: a view


def measure_row(cp, fmha, p: Problem, row: dict, sets: list[dict], plain_outs: list, warmup: int,
                repeat: int) -> dict:
    """{"fwd": Timing dict | None, "bwd": ..., "status": "ok" | "not available" | "error",
    "note": str}."""
    from cupy_fmha.timing import time_cuda

    fwd_extra, bwd_extra = row_kwargs(row, "fwd"), row_kwargs(row, "bwd")
    base = dict(causal=p.causal, dtype=p.dtype, layout="bshd")
    fwd_kw = None if fwd_extra is None else {**base, **fwd_extra}
    bwd_kw = {**base, **(bwd_extra or {})}
    missing = sorted(set(missing_keywords(fmha.attention_forward, fwd_kw or {}))
                     | set(missing_keywords(fmha.attention_backward, bwd_kw)))
    res: dict[str, Any] = {"fwd": None, "bwd": None, "status": "ok", "note": ""}
    if missing:
        res.update(status="not available", note="API lacks: " + ", ".join(missing))
        return res
    thd = row.get("inputs") == "thd"
    conv = _as_thd if thd else (lambda a: a)
    cache: dict = {}
    try:
        fwd_kw = None if fwd_kw is None else _resolve(fwd_kw, (cp, p, 0), cache)
        bwd_kw = _resolve(bwd_kw, (cp, p, 0), cache)
        args = []
        for i, s in enumerate(sets):
            q, k, v, do = (conv(s[n]) for n in ("q", "k", "v", "do"))
            if fwd_kw is None:
                o, lse = plain_outs[i]
            else:
                o, lse = fmha.attention_forward(q, k, v, **fwd_kw)
            args.append((q, k, v, do, o, lse))
        cp.cuda.Device().synchronize()
        if fwd_kw is not None:
            t = time_cuda(lambda q, k, v, do, o, lse: fmha.attention_forward(q, k, v, **fwd_kw),
                          warmup=warmup, repeat=repeat, rotate=args, label=f"{row['name']} fwd")
            res["fwd"] = t.as_dict()
        t = time_cuda(lambda q, k, v, do, o, lse: fmha.attention_backward(do, q, k, v, o, lse, **bwd_kw),
                      warmup=warmup, repeat=repeat, rotate=args, label=f"{row['name']} bwd")
        res["bwd"] = t.as_dict()
        if bwd_kw.get("deterministic"):  # two more calls on set 0: same bits?
            q, k, v, do, o, lse = args[0]
            g1 = fmha.attention_backward(do, q, k, v, o, lse, **bwd_kw)
            g2 = fmha.attention_backward(do, q, k, v, o, lse, **bwd_kw)
            same = all(bool((a.view(cp.uint16) == b.view(cp.uint16)).all()) for a, b in zip(g1[:3], g2[:3]))
            res["note"] = "bit-identical repeat: " + ("yes" if same else "NO")
            del g1, g2
        del args
    except Exception as exc:  # noqa: BLE001 - a row must not stop the run
        if _unknown_keyword_error(exc):
            res.update(status="not available", note=_err(exc))
        else:
            res.update(status="error", note=_err(exc))
            traceback.print_exc(file=sys.stderr)
    finally:
        cache.clear()
        cp.get_default_memory_pool().free_all_blocks()
    return res


def measure_peer(cp, p: Problem, sets: list[dict], warmup: int, repeat: int) -> dict:
    """PyTorch SDPA flash on the same memory (plain attention), or the reason it did not run."""
    from sweep import TorchPeer, load_torch, torch_time, torch_view

    tmod = load_torch()
    if isinstance(tmod, str):
        return {"status": "not available", "note": tmod, "fwd": None, "bwd": None}
    peer = TorchPeer(tmod, "flash")
    torch = peer.torch
    res: dict[str, Any] = {"status": "ok", "note": "torch SDPA flash (plain)", "fwd": None, "bwd": None}
    try:
        sets_t = [tuple(torch_view(torch, cp, s[n], p.dtype) for n in ("q", "k", "v", "do")) for s in sets]
        with peer.sdpa_kernel([peer.backend]):
            res["fwd"] = torch_time(torch, lambda q, k, v, do: peer.forward(q, k, v, p.causal), sets_t, warmup, repeat)
            graphs = [peer.graph(q, k, v, do, p.causal) for q, k, v, do in sets_t]
            res["bwd"] = torch_time(torch, peer.backward, graphs, warmup, repeat)
            del graphs
        del sets_t
    except Exception as exc:  # noqa: BLE001
        res.update(status="error", note=_err(exc))
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return res


# ----------------------------------------------------------------------------- output


def _ratio(x: Optional[dict], base: Optional[dict]) -> Optional[float]:
    if not x or not base or not base.get("median_ms"):
        return None
    return x["median_ms"] / base["median_ms"]


def _tflops(flops: int, t: Optional[dict]) -> Optional[float]:
    if not t or not t.get("median_ms"):
        return None
    return flops / (t["median_ms"] * 1e-3) / 1e12


def build_records(p: Problem, results: dict[str, dict]) -> list[dict]:
    ff, fb = _flops(p, "fwd"), _flops(p, "bwd")
    plain = results.get("plain", {})
    out = []
    for name, r in results.items():
        rec = {"row": name, "status": r["status"], "note": r.get("note", "")}
        for mode, fl in (("fwd", ff), ("bwd", fb)):
            t = r.get(mode)
            rec[f"{mode}_ms"] = t["median_ms"] if t else None
            rec[f"{mode}_tflops"] = _tflops(fl, t)
            rec[f"{mode}_vs_plain"] = _ratio(t, plain.get(mode)) if name != "plain" else (1.0 if t else None)
        out.append(rec)
    return out


def print_table(p: Problem, records: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    short = {"bfloat16": "bf16", "float16": "fp16"}[p.dtype]
    table = Table(title=f"feature cost: {short} hdim {p.hdim}, batch {p.batch}, nhead {p.nhead}, "
                        f"seqlen {p.seqlen}{' causal' if p.causal else ''}, bshd")
    for col in ("row", "fwd ms", "fwd TFLOP/s", "fwd vs plain", "bwd ms", "bwd TFLOP/s", "bwd vs plain", "note"):
        table.add_column(col, justify="left" if col in ("row", "note") else "right")
    f = lambda x, fmt: "-" if x is None else format(x, fmt)  # noqa: E731
    for r in records:
        if r["status"] != "ok":
            table.add_row(r["row"], *["-"] * 6, f"{r['status']}: {r['note']}")
            continue
        table.add_row(r["row"], f(r["fwd_ms"], ".3f"), f(r["fwd_tflops"], ".0f"), f(r["fwd_vs_plain"], ".2f"),
                      f(r["bwd_ms"], ".3f"), f(r["bwd_tflops"], ".0f"), f(r["bwd_vs_plain"], ".2f"), r["note"])
    console = Console()
    if not console.is_terminal:  # logs and pipes: do not wrap the table at 80 columns
        console = Console(width=170)
    console.print(table)


def meta_info(args: dict) -> dict:
    info: dict[str, Any] = {"args": args, "time": time.strftime("%Y-%m-%d %H:%M:%S"), "host": platform.node()}
    try:
        info["git"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                     text=True, timeout=5).stdout.strip()
    except Exception:  # noqa: BLE001
        pass
    try:
        import cupy

        info["cupy"] = cupy.__version__
        name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
        info["device"] = name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # noqa: BLE001
        pass
    return info


# ----------------------------------------------------------------------------- command


def _select(rows_opt: str) -> list[dict]:
    if not rows_opt.strip():
        return list(ROWS)
    want = [x.strip() for x in rows_opt.split(",") if x.strip()]
    names = {r["name"]: r for r in ROWS}
    picked = []
    for w in want:
        hits = [r for n, r in names.items() if n == w or n.startswith(w)]
        if not hits:
            raise typer.BadParameter(f"--rows: unknown row {w!r}; rows: {', '.join(names)}")
        picked += [h for h in hits if h not in picked]
    if not any(r["name"] == "plain" for r in picked):
        picked.insert(0, names["plain"])  # the baseline of every ratio
    return picked


@app.command()
def main(
    dtype: str = typer.Option("bf16", help="bf16 or fp16."),
    hdim: int = typer.Option(128),
    seqlen: int = typer.Option(4096),
    batch: int = typer.Option(4),
    nhead: int = typer.Option(16),
    causal: bool = typer.Option(False, "--causal", help="Causal mask for every row."),
    rows: str = typer.Option("", help="Comma-separated row names (a prefix is enough); default all."),
    warmup: int = typer.Option(5),
    repeat: int = typer.Option(20),
    sets: int = typer.Option(2, help="Input sets to rotate through."),
    seed: int = typer.Option(0),
    peers: bool = typer.Option(True, "--peers/--no-peers", help="Time torch SDPA flash too, when importable."),
    name: str = typer.Option("", help="Results file stem (default <date>-features)."),
    list_rows: bool = typer.Option(False, "--list", help="List the rows and whether this API takes them; no GPU."),
) -> None:
    """Time plain vs each feature row; print a table and write bench/results/<name>.json."""
    dt = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16"}.get(dtype.lower())
    if dt is None:
        raise typer.BadParameter(f"--dtype: bf16 or fp16, got {dtype!r}")
    picked = _select(rows)
    if list_rows:
        from cupy_fmha import api

        for r in picked:
            fkw, bkw = row_kwargs(r, "fwd"), row_kwargs(r, "bwd")
            miss = sorted(set(missing_keywords(api.attention_forward, fkw or {}))
                          | set(missing_keywords(api.attention_backward, bkw or {})))
            state = "available" if not miss else "not available (API lacks: " + ", ".join(miss) + ")"
            typer.echo(f"{r['name']}: fwd {fkw} | bwd {bkw} | {state}")
        return

    import cupy as cp

    import cupy_fmha as fmha

    p = Problem(dt, batch, nhead, seqlen, hdim, causal)
    data = _inputs(cp, p, sets, seed)
    base = dict(causal=p.causal, dtype=p.dtype, layout="bshd")
    plain_outs = [fmha.attention_forward(s["q"], s["k"], s["v"], **base) for s in data]
    results: dict[str, dict] = {}
    for r in picked:
        t0 = time.perf_counter()
        results[r["name"]] = measure_row(cp, fmha, p, r, data, plain_outs, warmup, repeat)
        print(f"{r['name']}: {results[r['name']]['status']} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    if peers:
        results["torch SDPA flash"] = measure_peer(cp, p, data, warmup, repeat)
    records = build_records(p, results)
    print_table(p, records)

    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = name or time.strftime("%Y-%m-%d") + "-features"
    path = RESULTS / f"{stem}.json"
    args = dict(dtype=dt, hdim=hdim, seqlen=seqlen, batch=batch, nhead=nhead, causal=causal, warmup=warmup,
                repeat=repeat, sets=sets, seed=seed, rows=[r["name"] for r in picked])
    doc = {"meta": meta_info(args), "flops_fwd": _flops(p, "fwd"), "flops_bwd": _flops(p, "bwd"),
           "rows": {r["name"]: {k: (repr(v) if isinstance(v, Make) else v) for k, v in
                                {"fwd": row_kwargs(r, "fwd"), "bwd": row_kwargs(r, "bwd")}.items()}
                    for r in picked},
           "results": records}
    path.write_text(json.dumps(doc, indent=1, default=repr))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    app()

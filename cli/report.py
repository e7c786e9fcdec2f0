"""What a run prints: one summary line, or one JSON object with ``--json``."""

from __future__ import annotations

import json
import math

from .config import RunConfig
from .run import Outcome


def _fmt_err(x: float) -> str:
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2e}"


def _fmt_rate(x: float) -> str:
    return f"{x:.1f}" if x >= 10 else f"{x:.3g}"


def _json_float(x):
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else str(x)


def work(cfg: RunConfig) -> tuple[int, int]:
    """(FLOPs, bytes) of the run; group mode sums the sequences, each with its own lengths."""
    from cupy_fmha import flops

    if cfg.group:
        seqs = [(1, a, b) for a, b in zip(cfg.seqlens_q, cfg.seqlens_k)]
    else:
        seqs = [(cfg.batch, cfg.seqlen_q, cfg.seqlen_k)]
    nflop = nbytes = 0
    for b, sq, sk in seqs:
        nflop += flops.attention_flops(b, cfg.nhead, sq, sk, cfg.hdim, cfg.hdim_v, cfg.mask_spec,
                                       cfg.mode)
        nbytes += flops.attention_bytes(  # by keyword: nhead_k is keyword-only in flops.py
            batch=b, nhead_q=cfg.nhead, nhead_k=cfg.nhead_k, seqlen_q=sq, seqlen_k=sk,
            hdim_q=cfg.hdim, hdim_v=cfg.hdim_v, mode=cfg.mode, itemsize=cfg.itemsize,
        )
    return nflop, nbytes


def _rates(cfg: RunConfig, out: Outcome) -> tuple[int, int, float, float]:
    nflop, nbytes = work(cfg)
    secs = out.timing.median_ms * 1e-3
    tflops = nflop / secs / 1e12 if secs > 0 else float("inf")
    gbs = nbytes / secs / 1e9 if secs > 0 else float("inf")
    return nflop, nbytes, tflops, gbs


def summary_line(cfg: RunConfig, out: Outcome) -> str:
    _, _, tflops, gbs = _rates(cfg, out)
    if cfg.group:
        sq, sk = (",".join(str(n) for n in lengths) for lengths in (cfg.seqlens_q, cfg.seqlens_k))
    else:
        sq, sk = cfg.seqlen_q, cfg.seqlen_k
    t = out.timing
    parts = [
        f"{cfg.mode} {cfg.dtype} {cfg.layout} b={cfg.batch} h={cfg.nhead}/{cfg.nhead_k}"
        f" sq={sq} sk={sk} d={cfg.hdim}/{cfg.hdim_v}"
        f" mask={cfg.mask_spec.describe()}" + ("" if cfg.bias == "n" else f" bias={cfg.bias}")
        + ("" if cfg.p_drop == 0.0 else f" p_drop={cfg.p_drop:g}")
        + (" deterministic" if cfg.deterministic else "") + f" [{cfg.backend}]",
        f"{t.median_ms:.3f} ms, {_fmt_rate(tflops)} TFLOP/s, {_fmt_rate(gbs)} GB/s",
    ]
    if out.checks is not None:
        parts.append(
            " ".join(
                f"{c.name} {_fmt_err(c.max_err)}/{_fmt_err(c.rel_err)}"
                + ("" if c.ok else f" ({getattr(c, 'reason', '') or 'FAIL'})")
                for c in out.checks
            )
        )
    parts.append("valid: " + ("-" if out.valid is None else ("y" if out.valid else "n")))
    return " | ".join(parts)


def json_object(cfg: RunConfig, out: Outcome) -> dict:
    nflop, nbytes, tflops, gbs = _rates(cfg, out)
    config = {
        "batch": cfg.batch, "nhead": cfg.nhead, "nhead_k": cfg.nhead_k, "seqlen_q": cfg.seqlen_q,
        "seqlen_k": cfg.seqlen_k, "hdim": cfg.hdim, "hdim_v": cfg.hdim_v, "dtype": cfg.dtype,
        "layout": cfg.layout, "mask": cfg.mask, "causal": cfg.causal, "scale": cfg.scale,
        "seed": cfg.seed, "bias": cfg.bias, "dbias": cfg.dbias,
    }
    if cfg.mode == "bwd":
        config["deterministic"] = cfg.deterministic
    config.update(p_drop=cfg.p_drop, drop_seed=cfg.drop_seed, drop_offset=cfg.drop_offset)
    return {
        "mode": cfg.mode,
        "backend": cfg.backend,
        "config": config,
        "seq_mode": cfg.seq_mode,
        "seqlens_q": None if cfg.seqlens_q is None else list(cfg.seqlens_q),
        "seqlens_k": None if cfg.seqlens_k is None else list(cfg.seqlens_k),
        "window": list(cfg.window),
        "mask_resolved": cfg.mask_spec.describe(),
        "timing": out.timing.as_dict(),
        "warmup": cfg.warmup,
        "repeat": cfg.repeat,
        "flops": nflop,
        "bytes": nbytes,
        "tflops": tflops,
        "gbs": gbs,
        "checks": None
        if out.checks is None
        else [
            {
                "name": c.name,
                "max_err": _json_float(c.max_err),
                "rel_err": _json_float(c.rel_err),
                "limit": _json_float(c.limit),
                "ok": bool(c.ok),
                "reason": getattr(c, "reason", "") or "",
            }
            for c in out.checks
        ],
        "checked": out.checked,
        "valid": out.valid,
    }


def render(cfg: RunConfig, out: Outcome) -> str:
    """The run's one line of output."""
    if cfg.json:
        return json.dumps(json_object(cfg, out))
    return summary_line(cfg, out)

"""Benchmark sweep: our forward/backward against PyTorch SDPA's flash and cuDNN backends.

The grid is FlashAttention's benchmark grid: batch * seqlen = 16384 tokens, nhead * hdim = 2048,
hdim 64/128/256, seqlen 512 ... 16384, causal and not, bf16 and fp16. For each point:

* ours: ``attention_forward`` timed alone; ``attention_backward`` timed alone, given the o and lse
  of our own forward; CUDA events (``cupy_fmha.timing.time_cuda``), warm-up, median, rotating
  through several input sets so that L2 does not flatter;
* peers (when ``torch`` is importable): ``scaled_dot_product_attention`` under
  ``sdpa_kernel(FLASH_ATTENTION)`` and ``sdpa_kernel(CUDNN_ATTENTION)`` on the very same memory
  (DLPack, bshd views transposed to SDPA's [b, h, s, d]); the backward is timed alone with
  ``torch.autograd.grad`` on a retained graph; ``torch.cuda.Event`` timing;
* ``fa3`` (asked for with ``--peers``, where the ``flash-attn3-jax`` wheel is installed):
  FlashAttention-3 through JAX, in a process of its own (``bench/fa3_peer.py``, run once before
  the grid for its hdim-128 points, the wheel's only head dim): the forward and the VJP alone, timed
  as bursts of asynchronous calls (JAX has no events on its stream; see that file), on inputs of
  its own with the same shapes and dtypes; not in the spot check;
* TFLOP/s by FlashAttention's convention (``cupy_fmha.flops.attention_flops``), and a spot check
  of our O, dQ, dK, dV against a peer's (relative difference) so that a fast wrong kernel shows.

PyTorch's ``is_causal`` is top-left aligned, ours bottom-right; with seqlen_q == seqlen_k they are
the same mask. Results go to ``bench/results/<name>.json`` (rewritten after every point, so a run
cut short keeps what it measured) and ``<name>_<dtype>.png``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import typer

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"

if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))

TOKENS = 16384  # batch * seqlen
WIDTH = 2048  # nhead * hdim
HDIMS = (64, 128, 256)
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
DTYPES = ("bfloat16", "float16")
QUICK = dict(hdims=(64, 128), seqlens=(1024, 4096), dtypes=("bfloat16",), causals=(False, True))
TORCH_PEERS = ("flash", "cudnn")
PEERS = TORCH_PEERS + ("fa3",)
_SHORT = {"bfloat16": "bf16", "float16": "fp16"}

app = typer.Typer(add_completion=False, help=__doc__.split("\n\n")[0])


# ----------------------------------------------------------------------------- grid


@dataclass(frozen=True)
class Point:
    dtype: str
    hdim: int
    causal: bool
    seqlen: int

    @property
    def batch(self) -> int:
        return max(TOKENS // self.seqlen, 1)

    @property
    def nhead(self) -> int:
        return max(WIDTH // self.hdim, 1)

    @property
    def shape(self) -> tuple[int, int, int, int]:  # bshd
        return (self.batch, self.seqlen, self.nhead, self.hdim)

    def label(self) -> str:
        c = "causal" if self.causal else "full"
        return f"{_SHORT[self.dtype]} d{self.hdim} {c} s{self.seqlen} (b{self.batch} h{self.nhead})"


def _ints(text: str, name: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{name}: comma-separated integers, got {text!r}") from None


def _dtypes(text: str) -> list[str]:
    alias = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16", "half": "float16"}
    out = []
    for x in text.split(","):
        x = x.strip().lower()
        if x:
            if x not in alias:
                raise typer.BadParameter(f"--dtype: bf16 or fp16, got {x!r}")
            out.append(alias[x])
    return out


def _causals(text: str) -> list[bool]:
    t = text.strip().lower()
    table = {"both": [False, True], "yes": [True], "true": [True], "1": [True], "no": [False], "false": [False], "0": [False]}
    if t not in table:
        raise typer.BadParameter(f"--causal: both, yes or no, got {text!r}")
    return table[t]


def build_grid(hdims, seqlens, dtypes, causals) -> list[Point]:
    """Points in the order they are run: dtype, hdim, causal, seqlen (bf16 first)."""
    return [Point(dt, d, c, s) for dt in dtypes for d in hdims for c in causals for s in seqlens]


# ----------------------------------------------------------------------------- FLOPs


def point_flops(p: Point, mode: str) -> int:
    """FlashAttention-convention FLOPs of one pass (library function, local formula if absent)."""
    try:
        from cupy_fmha.flops import attention_flops
        from cupy_fmha.mask import resolve_mask

        spec = resolve_mask(None, p.causal, (-1, -1))
        return int(attention_flops(p.batch, p.nhead, p.seqlen, p.seqlen, p.hdim, p.hdim, spec, mode))
    except ImportError:
        f = 4 * p.batch * p.nhead * p.seqlen * p.seqlen * p.hdim
        f = f // 2 if p.causal else f
        return int(f * 2.5) if mode == "bwd" else f


def tflops(flops: int, ms: Optional[float]) -> Optional[float]:
    if ms is None or not ms > 0:
        return None
    return flops / (ms * 1e-3) / 1e12


# ----------------------------------------------------------------------------- inputs


def f32_to_bf16_bits(cp, x):
    """float32 CuPy array -> uint16 bfloat16 bits, round to nearest even (finite inputs)."""
    u = x.view(cp.uint32)
    r = (u + cp.uint32(0x7FFF) + ((u >> cp.uint32(16)) & cp.uint32(1))) >> cp.uint32(16)
    return r.astype(cp.uint16)


def native_bf16(cp) -> bool:
    """Whether this CuPy has a bfloat16 dtype (CuPy 14 and newer)."""
    import ml_dtypes

    try:
        cp.empty(0, dtype=ml_dtypes.bfloat16)
        return True
    except Exception:  # noqa: BLE001
        return False


def random_input(cp, rng, shape, dtype: str):
    """A random fp16 or bf16 CuPy array (bf16: CuPy's native bfloat16 where it exists, else the
    bits as uint16, which the API takes with dtype="bfloat16")."""
    x = rng.standard_normal(shape, dtype=cp.float32)
    if dtype == "float16":
        out = x.astype(cp.float16)
    else:
        import ml_dtypes

        out = f32_to_bf16_bits(cp, x)
        if native_bf16(cp):
            out = out.view(ml_dtypes.bfloat16)
    del x
    return out


def to_float32(cp, a, dtype: str):
    """A result of ours (fp16, bf16, or bf16 bits as uint16) -> float32 CuPy array."""
    if a.dtype == cp.uint16 or str(a.dtype) == "bfloat16":
        return (a.view(cp.uint16).astype(cp.uint32) << cp.uint32(16)).view(cp.float32)
    return a.astype(cp.float32)


# ----------------------------------------------------------------------------- torch peers


def load_torch():
    """(torch, F, sdpa_kernel, SDPBackend) or a reason string."""
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as exc:  # noqa: BLE001
        return f"torch not importable: {type(exc).__name__}: {exc}"
    if not torch.cuda.is_available():
        return "torch has no CUDA device"
    return torch, F, sdpa_kernel, SDPBackend


def torch_view(torch, cp, a, dtype: str):
    """Zero-copy torch tensor over a CuPy array (bf16 bits reinterpreted as torch.bfloat16)."""
    if dtype == "bfloat16":
        try:
            return torch.from_dlpack(a.view(cp.int16)).view(torch.bfloat16)  # same bits, native or not
        except Exception:  # noqa: BLE001 - fall back to a copy if the view is refused
            return torch.tensor(cp.asnumpy(a).view("int16"), device="cuda").view(torch.bfloat16)
    return torch.from_dlpack(a)


def torch_time(torch, fn: Callable, sets: Sequence[tuple], warmup: int, repeat: int) -> dict:
    """Median of ``repeat`` calls timed with torch.cuda.Event, cycling through ``sets``."""
    n = len(sets)
    for i in range(max(warmup, 1)):
        fn(*sets[i % n])
    torch.cuda.synchronize()
    evs = []
    for i in range(repeat):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(*sets[(max(warmup, 1) + i) % n])
        e.record()
        evs.append((s, e))
        if i > 0:
            evs[i - 1][1].synchronize()  # at most two calls in flight, as time_cuda
    torch.cuda.synchronize()
    ms = [s.elapsed_time(e) for s, e in evs]
    return {"median_ms": statistics.median(ms), "min_ms": min(ms), "samples": len(ms)}


class TorchPeer:
    """One SDPA backend on bshd inputs shared with ours."""

    def __init__(self, tmod, name: str):
        self.torch, self.F, self.sdpa_kernel, B = tmod
        self.name = name
        self.backend = {"flash": B.FLASH_ATTENTION, "cudnn": B.CUDNN_ATTENTION}[name]

    def _attn(self, q, k, v, causal):  # q, k, v: [b, s, h, d] views -> out [b, h, s, d]
        return self.F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal
        )

    def forward(self, q, k, v, causal):
        with self.torch.no_grad():
            return self._attn(q, k, v, causal)

    def graph(self, q, k, v, do, causal):
        """Forward once with grad; returns (out, inputs, dO in [b, h, s, d]) for timing grads."""
        ins = tuple(x.detach().requires_grad_(True) for x in (q, k, v))
        out = self._attn(*ins, causal)
        return out, ins, do.transpose(1, 2)

    def backward(self, out, ins, do):
        return self.torch.autograd.grad(out, ins, do, retain_graph=True)

    def measure(self, p: Point, sets_t, modes, warmup, repeat) -> dict:
        """sets_t: list of (q, k, v, do) torch bshd tensors. Returns ms/results per mode."""
        res: dict[str, Any] = {}
        with self.sdpa_kernel([self.backend]):
            if "fwd" in modes:
                try:
                    t = torch_time(self.torch, lambda q, k, v, do: self.forward(q, k, v, p.causal), sets_t, warmup, repeat)
                    res["fwd"] = t
                except Exception as exc:  # noqa: BLE001
                    res["fwd_error"] = _err(exc)
            if "bwd" in modes or "grads" in modes:
                try:
                    graphs = [self.graph(q, k, v, do, p.causal) for q, k, v, do in sets_t]
                    if "bwd" in modes:
                        res["bwd"] = torch_time(self.torch, self.backward, graphs, warmup, repeat)
                    if "grads" in modes:  # set 0's output and gradients, for the spot check
                        out, ins, do = graphs[0]
                        res["out"] = out.detach().transpose(1, 2)
                        res["grads"] = self.backward(out, ins, do)
                    del graphs
                except Exception as exc:  # noqa: BLE001
                    res["bwd_error"] = _err(exc)
        return res


def _err(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0][:160] if msg else ''}"


# ----------------------------------------------------------------------------- FlashAttention-3 (JAX)


def fa3_key(dtype: str, hdim: int, causal: bool, seqlen: int) -> tuple:
    return (dtype, hdim, bool(causal), seqlen)


def run_fa3(points: Sequence[Point], modes: set, warmup: int, repeat: int, timeout: float) -> dict:
    """FlashAttention-3's times at ``points`` from ``bench/fa3_peer.py`` in a JAX process of its own:
    its JSON document (``available``, ``error``, ``results``; on a failure of the process itself,
    ``available`` false and the reason)."""
    pts = [dict(dtype=p.dtype, hdim=p.hdim, causal=p.causal, seqlen=p.seqlen, batch=p.batch, nhead=p.nhead)
           for p in points]
    # (bursts of fa3_peer.py's default 10 calls: a third of --repeat bursts, at least 3, time about as
    # many calls as ours and the SDPA peers get)
    cmd = [sys.executable, str(HERE / "fa3_peer.py"), "--points", json.dumps(pts), "--modes", ",".join(sorted(modes)),
           "--warmup", str(warmup), "--repeat", str(max(3, repeat // 3))]
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
        lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
        if not lines:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return {"available": False, "error": f"fa3_peer.py exit {done.returncode}: {tail[:200]}"}
        return json.loads(lines[-1])
    except Exception as exc:  # noqa: BLE001 - the sweep goes on without the peer
        return {"available": False, "error": _err(exc)}


def fa3_entry(doc_results: dict, rec: dict, modes) -> Optional[dict]:
    """The ``fa3`` entry of a point's record (times and TFLOP/s, or errors), None where not timed."""
    r = doc_results.get(fa3_key(rec["dtype"], rec["hdim"], rec["causal"], rec["seqlen"]))
    if r is None:
        return None
    entry: dict[str, Any] = {}
    for m in ("fwd", "bwd"):
        if m not in modes:
            continue
        if r.get(f"{m}_ms") is not None:
            entry[f"{m}_ms"] = r[f"{m}_ms"]
            entry[f"{m}_tflops"] = tflops(rec[f"flops_{m}"], r[f"{m}_ms"])
        else:
            entry[f"{m}_error"] = r.get(f"{m}_error", "not run")
    return entry


# ----------------------------------------------------------------------------- ours


class Ours:
    def __init__(self):
        import cupy

        import cupy_fmha
        from cupy_fmha.timing import time_cuda

        self.cp = cupy
        self.fmha = cupy_fmha
        self.time_cuda = time_cuda

    def measure(self, p: Point, sets, modes, warmup, repeat) -> dict:
        """sets: list of dicts with q, k, v, do (CuPy). Adds o, lse to each set (our forward)."""
        res: dict[str, Any] = {}
        kw = dict(causal=p.causal, dtype=p.dtype, layout="bshd")
        fwd = self.fmha.attention_forward
        bwd = self.fmha.attention_backward
        try:
            t0 = time.perf_counter()
            for s in sets:
                s["o"], s["lse"] = fwd(s["q"], s["k"], s["v"], **kw)
            self.cp.cuda.Device().synchronize()
            res["first_fwd_s"] = time.perf_counter() - t0  # includes any JIT compile
        except Exception as exc:  # noqa: BLE001
            res["fwd_error"] = _err(exc)
            res["bwd_error"] = "no forward: " + res["fwd_error"]
            return res
        args = [(s["q"], s["k"], s["v"], s["do"], s["o"], s["lse"]) for s in sets]
        if "fwd" in modes:
            try:
                t = self.time_cuda(lambda q, k, v, do, o, lse: fwd(q, k, v, **kw), warmup=warmup, repeat=repeat, rotate=args)
                res["fwd"] = t.as_dict() if hasattr(t, "as_dict") else {"median_ms": t.median_ms}
            except Exception as exc:  # noqa: BLE001
                res["fwd_error"] = _err(exc)
        if "bwd" in modes or "grads" in modes:
            try:
                t0 = time.perf_counter()
                g = bwd(*_bwd_args(args[0]), **kw)
                self.cp.cuda.Device().synchronize()
                res["first_bwd_s"] = time.perf_counter() - t0
                if "grads" in modes:
                    res["grads"] = (g.dq, g.dk, g.dv)
                del g
                if "bwd" in modes:
                    t = self.time_cuda(lambda *a: bwd(*_bwd_args(a), **kw), warmup=warmup, repeat=repeat, rotate=args)
                    res["bwd"] = t.as_dict() if hasattr(t, "as_dict") else {"median_ms": t.median_ms}
            except Exception as exc:  # noqa: BLE001
                res["bwd_error"] = _err(exc)
        return res


def _bwd_args(a):
    q, k, v, do, o, lse = a
    return (do, q, k, v, o, lse)


# ----------------------------------------------------------------------------- one point


def run_point(p: Point, ours: Optional[Ours], peers: list, modes: set, warmup: int, repeat: int,
              nsets: int, seed: int, check: bool) -> dict:
    import cupy as cp

    rec: dict[str, Any] = {
        "dtype": p.dtype, "hdim": p.hdim, "causal": p.causal, "seqlen": p.seqlen,
        "batch": p.batch, "nhead": p.nhead,
        "flops_fwd": point_flops(p, "fwd"), "flops_bwd": point_flops(p, "bwd"),
    }
    t_start = time.perf_counter()
    rng = cp.random.default_rng(seed)
    sets = [{n: random_input(cp, rng, p.shape, p.dtype) for n in ("q", "k", "v", "do")} for _ in range(nsets)]
    want = set(modes) | ({"grads"} if check else set())

    results: dict[str, dict] = {}
    if ours is not None:
        results["ours"] = ours.measure(p, sets, want, warmup, repeat)
    for peer in peers:
        cp.cuda.Device().synchronize()
        try:
            sets_t = [tuple(torch_view(peer.torch, cp, s[n], p.dtype) for n in ("q", "k", "v", "do")) for s in sets]
            results[peer.name] = peer.measure(p, sets_t, want, warmup, repeat)
            del sets_t
        except Exception as exc:  # noqa: BLE001
            results[peer.name] = {"fwd_error": _err(exc), "bwd_error": _err(exc)}
        peer.torch.cuda.synchronize()

    if check and ours is not None:
        rec["check"] = spot_check(cp, p, sets[0], results)

    for name, r in results.items():
        entry: dict[str, Any] = {}
        for m in ("fwd", "bwd"):
            if m not in modes:
                continue
            if m in r:
                entry[f"{m}_ms"] = r[m]["median_ms"]
                entry[f"{m}_tflops"] = tflops(rec[f"flops_{m}"], r[m]["median_ms"])
            else:
                entry[f"{m}_error"] = r.get(f"{m}_error", "not run")
        for extra in ("first_fwd_s", "first_bwd_s"):
            if extra in r:
                entry[extra] = r[extra]
        rec[name] = entry
    rec["wall_s"] = time.perf_counter() - t_start
    del sets, results
    cp.get_default_memory_pool().free_all_blocks()
    for peer in peers[:1]:
        peer.torch.cuda.empty_cache()
    return rec


def spot_check(cp, p: Point, s0: dict, results: dict) -> dict:
    """Relative difference of our O, dQ, dK, dV (input set 0) to the first peer that ran."""
    ours = results.get("ours", {})
    for name in PEERS:
        r = results.get(name, {})
        if "grads" not in r or "grads" not in ours:
            continue
        out = {}
        try:
            import torch

            pairs = [("o", s0["o"], r["out"])] + list(zip(("dq", "dk", "dv"), ours["grads"], r["grads"]))
            for label, a, b in pairs:
                a32 = torch.from_dlpack(to_float32(cp, a, p.dtype))
                b32 = b.float()
                num = (a32 - b32).norm().item()
                den = b32.norm().item()
                out[label] = num / den if den > 0 else num
        except Exception as exc:  # noqa: BLE001
            return {"peer": name, "error": _err(exc)}
        out["peer"] = name
        return out
    return {"peer": None, "error": "no peer gradients to compare with"}


# ----------------------------------------------------------------------------- output


def meta_info(args: dict, peer_note: str) -> dict:
    info: dict[str, Any] = {"args": args, "time": time.strftime("%Y-%m-%d %H:%M:%S"), "host": platform.node()}
    try:
        info["git"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except Exception:  # noqa: BLE001
        pass
    try:
        import cupy

        info["cupy"] = cupy.__version__
        props = cupy.cuda.runtime.getDeviceProperties(0)
        name = props["name"]
        info["device"] = name.decode() if isinstance(name, bytes) else str(name)
        info["sms"] = props.get("multiProcessorCount")
    except Exception as exc:  # noqa: BLE001
        info["device_error"] = _err(exc)
    try:
        import torch

        info["torch"] = torch.__version__
        info["cudnn"] = torch.backends.cudnn.version()
    except Exception:  # noqa: BLE001
        pass
    info["peers"] = peer_note
    return info


def write_json(path: Path, meta: dict, records: list) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"meta": meta, "points": records}, indent=1, default=_json_default))
    os.replace(tmp, path)


def _json_default(o):
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def _cell(entry: Optional[dict], mode: str) -> str:
    if not entry:
        return "-"
    v = entry.get(f"{mode}_tflops")
    if v is not None:
        return f"{v:.0f}"
    return "[red]err[/]" if f"{mode}_error" in entry else "-"


def _ratio(a: Optional[dict], b: Optional[dict], mode: str) -> str:
    x = (a or {}).get(f"{mode}_tflops")
    y = (b or {}).get(f"{mode}_tflops")
    if x is None or y is None or not y:
        return "-"
    r = x / y
    color = "green" if r >= 1.0 else ("yellow" if r >= 0.8 else "red")
    return f"[{color}]{r:.2f}[/]"


def point_line(rec: dict, modes) -> str:
    parts = [f"{_SHORT[rec['dtype']]} d{rec['hdim']} {'causal' if rec['causal'] else 'full'} s{rec['seqlen']}"]
    for name in ("ours",) + PEERS:
        e = rec.get(name)
        if e is None:
            continue
        vals = []
        for m in ("fwd", "bwd"):
            if m in modes:
                v = e.get(f"{m}_tflops")
                vals.append(f"{m} {v:.0f}" if v is not None else f"{m} ERR({e.get(f'{m}_error', '')[:90]})")
        parts.append(f"{name}: " + ", ".join(vals))
    chk = rec.get("check")
    if chk and "error" not in chk:
        parts.append("vs " + str(chk["peer"]) + " " + " ".join(f"{k}={chk[k]:.1e}" for k in ("o", "dq", "dk", "dv") if k in chk))
    parts.append(f"({rec.get('wall_s', 0):.1f} s)")
    return " | ".join(parts) + "  [TFLOP/s]"


def print_tables(con, records: list, modes) -> None:
    from rich.table import Table

    fa3 = any(r.get("fa3") for r in records)  # (its columns only where it ran)
    for m in ("fwd", "bwd"):
        if m not in modes:
            continue
        tab = Table(title=f"{'forward' if m == 'fwd' else 'backward'} TFLOP/s (FlashAttention convention)")
        cols = ["dtype", "hdim", "causal", "seqlen", "b x h", "ours", "flash", "cudnn", "ours/flash", "ours/cudnn"]
        cols += ["fa3", "ours/fa3"] if fa3 else []
        for col in cols + ["check vs peer"]:
            tab.add_column(col, justify="right")
        for r in records:
            chk = r.get("check") or {}
            keys = ("o",) if m == "fwd" else ("dq", "dk", "dv")
            if "error" in chk:
                chk_cell = "[red]err[/]"
            elif any(k in chk for k in keys):
                worst = max(chk[k] for k in keys if k in chk)
                chk_cell = f"{worst:.1e}" if worst < 2e-2 else f"[red]{worst:.1e}[/]"
            else:
                chk_cell = "-"
            cells = [
                _SHORT[r["dtype"]], str(r["hdim"]), "yes" if r["causal"] else "no", str(r["seqlen"]),
                f"{r['batch']}x{r['nhead']}", _cell(r.get("ours"), m), _cell(r.get("flash"), m),
                _cell(r.get("cudnn"), m), _ratio(r.get("ours"), r.get("flash"), m),
                _ratio(r.get("ours"), r.get("cudnn"), m),
            ]
            if fa3:
                cells += [_cell(r.get("fa3"), m), _ratio(r.get("ours"), r.get("fa3"), m)]
            tab.add_row(*cells, chk_cell)
        con.print(tab)


def plot(records: list, base: Path, modes) -> list[Path]:
    """One PNG per dtype: rows = causal, columns = hdim; TFLOP/s vs seqlen for ours and peers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for dt in sorted({r["dtype"] for r in records}):
        rs = [r for r in records if r["dtype"] == dt]
        hdims = sorted({r["hdim"] for r in rs})
        causals = sorted({r["causal"] for r in rs})
        fig, axes = plt.subplots(len(causals), len(hdims), figsize=(4.2 * len(hdims), 3.4 * len(causals)), squeeze=False)
        for i, c in enumerate(causals):
            for j, d in enumerate(hdims):
                ax = axes[i][j]
                pts = sorted((r for r in rs if r["hdim"] == d and r["causal"] == c), key=lambda r: r["seqlen"])
                for impl, color in (("ours", "C0"), ("flash", "C1"), ("cudnn", "C2"), ("fa3", "C3")):
                    for m, style in (("fwd", "-"), ("bwd", "--")):
                        if m not in modes:
                            continue
                        xs = [r["seqlen"] for r in pts if (r.get(impl) or {}).get(f"{m}_tflops") is not None]
                        ys = [r[impl][f"{m}_tflops"] for r in pts if (r.get(impl) or {}).get(f"{m}_tflops") is not None]
                        if xs:
                            ax.plot(xs, ys, style, color=color, marker="o", ms=3, label=f"{impl} {m}")
                ax.set_xscale("log", base=2)
                ticks = [r["seqlen"] for r in pts]
                if ticks:
                    ax.set_xticks(ticks)
                    ax.set_xticklabels([str(t) for t in ticks])
                    ax.minorticks_off()
                ax.set_title(f"{_SHORT[dt]} hdim {d} {'causal' if c else 'non-causal'}", fontsize=9)
                ax.set_xlabel(f"seqlen (batch*seqlen = {TOKENS}, nhead*hdim = {WIDTH})", fontsize=8)
                ax.set_ylabel("TFLOP/s", fontsize=8)
                ax.set_ylim(bottom=0)
                ax.grid(alpha=0.3)
                ax.tick_params(labelsize=7)
                if i == 0 and j == 0:
                    ax.legend(fontsize=7)
        fig.tight_layout()
        path = base.with_name(f"{base.name}_{_SHORT[dt]}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


# ----------------------------------------------------------------------------- CLI


@app.command()
def main(
    hdim: str = typer.Option(",".join(map(str, HDIMS)), help="comma-separated head dims"),
    seqlen: str = typer.Option(",".join(map(str, SEQLENS)), help="comma-separated sequence lengths"),
    dtype: str = typer.Option("bf16,fp16", help="comma-separated: bf16, fp16"),
    causal: str = typer.Option("both", help="both, yes or no"),
    mode: str = typer.Option("both", help="fwd, bwd or both"),
    quick: bool = typer.Option(False, "--quick", help="small subset: bf16, hdim 64/128, seqlen 1024/4096"),
    peers: str = typer.Option("flash,cudnn", help="comma-separated peers to time (empty: none): flash, cudnn "
                              "(PyTorch SDPA), fa3 (FlashAttention-3 through JAX, hdim 128, where flash-attn3-jax is installed)"),
    no_ours: bool = typer.Option(False, "--no-ours", help="time the peers only"),
    warmup: int = typer.Option(3, help="untimed calls per measurement"),
    repeat: int = typer.Option(20, help="timed calls per measurement (median reported)"),
    nsets: int = typer.Option(3, help="input sets to rotate through (defeats L2 reuse)"),
    seed: int = typer.Option(0),
    check: bool = typer.Option(True, help="spot-check our O/dQ/dK/dV against a peer's"),
    time_limit: float = typer.Option(480.0, help="stop starting new points after this many seconds"),
    out_dir: Path = typer.Option(RESULTS, help="where the JSON and PNGs go"),
    name: str = typer.Option("", help="result file base name (default: sweep-<timestamp>)"),
):
    """Time ours vs PyTorch SDPA (flash, cuDNN) and FlashAttention-3 (fa3, where installed) over
    FlashAttention's benchmark grid."""
    from rich.console import Console

    con = Console(width=None if sys.stdout.isatty() else 200)  # full numbers in logs
    t_begin = time.perf_counter()
    if quick:
        grid = build_grid(QUICK["hdims"], QUICK["seqlens"], QUICK["dtypes"], QUICK["causals"])
    else:
        grid = build_grid(_ints(hdim, "--hdim"), _ints(seqlen, "--seqlen"), _dtypes(dtype), _causals(causal))
    modes = {"fwd": {"fwd"}, "bwd": {"bwd"}, "both": {"fwd", "bwd"}}.get(mode)
    if modes is None:
        raise typer.BadParameter("--mode: fwd, bwd or both")

    from cupy_fmha import device

    why = device.gpu_problem()
    if why:  # before any file is written: every point would fail
        con.print(f"[red]the sweep needs CuPy and a CUDA GPU: {why}[/]")
        raise typer.Exit(2)

    ours = None
    if not no_ours:
        try:
            ours = Ours()
        except Exception as exc:  # noqa: BLE001
            con.print(f"[red]cupy_fmha unavailable: {_err(exc)}; timing peers only[/]")
    peer_objs = []
    wanted = [x.strip() for x in peers.split(",") if x.strip()]
    unknown = [x for x in wanted if x not in PEERS]
    if unknown:
        raise typer.BadParameter(f"--peers: unknown {unknown}; expected some of {', '.join(PEERS)}")
    torch_wanted = [x for x in wanted if x in TORCH_PEERS]
    tmod = load_torch() if torch_wanted else "no torch peers requested"
    if isinstance(tmod, str):
        peer_note = tmod
        if torch_wanted:
            con.print(f"[yellow]peers skipped: {tmod}[/]")
    else:
        peer_objs = [TorchPeer(tmod, n) for n in torch_wanted]
        peer_note = ", ".join(p.name for p in peer_objs)
    fa3_results: dict = {}
    if "fa3" in wanted:
        pts = [p for p in grid if p.hdim == 128]
        doc = run_fa3(pts, modes, warmup, repeat, timeout=max(60.0, time_limit / 2)) if pts else \
            {"available": False, "error": "no hdim-128 point in the grid"}
        if doc.get("available"):
            fa3_results = {fa3_key(r["dtype"], r["hdim"], r["causal"], r["seqlen"]): r for r in doc.get("results", [])}
            peer_note += f"; fa3 (flash-attn3-jax {doc.get('version', '?')}, JAX {doc.get('jax', '?')}: {doc.get('method')})"
        else:
            peer_note += f"; fa3 skipped: {doc.get('error')}"
            con.print(f"[yellow]fa3 skipped: {doc.get('error')}[/]")

    out_dir.mkdir(parents=True, exist_ok=True)
    base = out_dir / (name or time.strftime("sweep-%Y%m%d-%H%M%S"))
    json_path = base.with_suffix(".json")
    args = dict(hdim=hdim, seqlen=seqlen, dtype=dtype, causal=causal, mode=mode, quick=quick,
                warmup=warmup, repeat=repeat, nsets=nsets, seed=seed, peers=peers)
    meta = meta_info(args, peer_note)
    con.print(f"device: {meta.get('device', '?')}; cupy {meta.get('cupy', '?')}; torch {meta.get('torch', '-')}; "
              f"cuDNN {meta.get('cudnn', '-')}; peers: {peer_note}; {len(grid)} points")

    records: list = []
    skipped = []
    for i, p in enumerate(grid):
        if time.perf_counter() - t_begin > time_limit:
            skipped.append(p.label())
            continue
        try:
            rec = run_point(p, ours, peer_objs, modes, warmup, repeat, nsets, seed + i, check)
        except Exception as exc:  # noqa: BLE001 - a failing point prints an error and the sweep goes on
            rec = {"dtype": p.dtype, "hdim": p.hdim, "causal": p.causal, "seqlen": p.seqlen,
                   "batch": p.batch, "nhead": p.nhead, "error": _err(exc)}
            con.print(f"[red]{p.label()}: {rec['error']}[/]")
            if os.environ.get("SWEEP_TRACEBACK"):
                traceback.print_exc()
            try:
                import cupy

                cupy.get_default_memory_pool().free_all_blocks()
            except Exception:  # noqa: BLE001
                pass
        else:
            entry = fa3_entry(fa3_results, rec, modes)
            if entry is not None:
                rec["fa3"] = entry
            con.print(f"[{i + 1}/{len(grid)}] " + point_line(rec, modes), highlight=False)
        records.append(rec)
        meta["elapsed_s"] = time.perf_counter() - t_begin
        meta["skipped"] = skipped
        write_json(json_path, meta, records)

    if skipped:
        con.print(f"[yellow]time limit {time_limit:.0f} s reached; skipped {len(skipped)} points[/]")
    meta["elapsed_s"] = time.perf_counter() - t_begin
    meta["skipped"] = skipped
    write_json(json_path, meta, records)
    print_tables(con, records, modes)
    try:
        pngs = plot(records, base, modes)
    except Exception as exc:  # noqa: BLE001
        pngs = []
        con.print(f"[yellow]plot failed: {_err(exc)}[/]")
    con.print(f"wrote {json_path}" + "".join(f", {x}" for x in pngs) + f" in {meta['elapsed_s']:.0f} s")
    failed = sum("error" in r for r in records)
    if records and failed == len(records):
        con.print(f"[red]every point failed ({failed})[/]")
        raise typer.Exit(1)


if __name__ == "__main__":
    app()

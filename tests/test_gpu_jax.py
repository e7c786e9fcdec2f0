"""cupy_fmha.jax on the GPU, under jax.jit and jax.grad, against a float32 JAX reference written
here (einsum + softmax): outputs and gradients for masks, GQA, ALiBi, both layouts, fp16 and
bf16; deterministic gradients bit-identical run to run. Fresh random inputs per case; lengths
that are not multiples of any tile. Skipped without JAX (with a GPU backend) or a device."""

from __future__ import annotations

import os

import numpy as np
import pytest

# JAX takes 75% of the GPU's memory at its first use unless told not to; CuPy allocates here too
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from conftest import seed_for  # noqa: E402
from cupy_fmha.jax import attention  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _jax_gpu():
    try:
        ok = jax.devices()[0].platform == "gpu"
    except RuntimeError:
        ok = False
    if not ok:
        pytest.skip("JAX has no GPU backend here")


def _ref(q, k, v, *, causal, window, layout, slopes):
    """float32 attention in bhsd; FlashAttention's bottom-right masks and ALiBi."""
    if layout == "bshd":
        q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = jnp.repeat(k, g, axis=1), jnp.repeat(v, g, axis=1)
    sq, sk = q.shape[2], k.shape[2]
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
    i, j = jnp.arange(sq)[:, None], jnp.arange(sk)[None, :]
    rel = i + sk - sq - j  # >= 0: key at or left of the diagonal
    if slopes is not None:
        s = s - slopes[None, :, None, None] * jnp.abs(rel)[None, None]
    left, right = window
    if causal:
        right = 0
    vis = jnp.ones((sq, sk), bool)
    if left >= 0:
        vis &= rel <= left
    if right >= 0:
        vis &= -rel <= right
    s = jnp.where(vis[None, None], s, -jnp.inf)
    o = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)
    return jnp.swapaxes(o, 1, 2) if layout == "bshd" else o


CASES = {
    # id: (dtype, layout, b, sq, sk, hq, hk, d, causal, window, alibi)
    "bf16-bshd-causal-gqa2": (jnp.bfloat16, "bshd", 2, 333, 333, 4, 2, 128, True, (-1, -1), False),
    "f16-bshd-none-777x300": (jnp.float16, "bshd", 1, 777, 300, 2, 2, 64, False, (-1, -1), False),
    "bf16-bhsd-window": (jnp.bfloat16, "bhsd", 2, 200, 260, 2, 1, 64, False, (40, 8), False),
    "f16-bshd-alibi-causal": (jnp.float16, "bshd", 1, 130, 130, 4, 4, 128, True, (-1, -1), True),
}


def _inputs(case):
    dtype, layout, b, sq, sk, hq, hk, d, *_ = CASES[case]
    rng = np.random.default_rng(seed_for(f"jax-{case}"))
    shape = lambda s, h: (b, s, h, d) if layout == "bshd" else (b, h, s, d)  # noqa: E731
    q, k, v, w = (jnp.asarray(rng.standard_normal(shape(*sh)).astype(np.float32)).astype(dtype)
                  for sh in ((sq, hq), (sk, hk), (sk, hk), (sq, hq)))
    slopes = jnp.asarray(rng.uniform(0.01, 0.5, hq).astype(np.float32))
    return q, k, v, w, slopes


@pytest.mark.parametrize("case", list(CASES))
def test_jit_forward_and_grad_match_reference(case):
    dtype, layout, *_, causal, window, alibi = CASES[case]
    q, k, v, w, slopes = _inputs(case)
    s = slopes if alibi else None
    kw = dict(causal=causal, window_size=window, layout=layout, alibi_slopes=s)

    def loss(q, k, v):
        return (attention(q, k, v, **kw).astype(jnp.float32) * w.astype(jnp.float32)).sum()

    def ref_loss(q, k, v):
        return (_ref(q, k, v, causal=causal, window=window, layout=layout, slopes=s) * w.astype(jnp.float32)).sum()

    o = jax.jit(lambda q, k, v: attention(q, k, v, **kw))(q, k, v)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    ref_o = _ref(q, k, v, causal=causal, window=window, layout=layout, slopes=s)
    ref_grads = jax.grad(ref_loss, argnums=(0, 1, 2))(*(x.astype(jnp.float32) for x in (q, k, v)))
    tol = 2e-2 if dtype == jnp.bfloat16 else 5e-3
    for name, x, r in (("o", o, ref_o), ("dq", grads[0], ref_grads[0]), ("dk", grads[1], ref_grads[1]),
                       ("dv", grads[2], ref_grads[2])):
        x, r = np.asarray(x.astype(jnp.float32)), np.asarray(r)
        assert x.shape == r.shape and x.dtype == np.float32, name
        assert np.isfinite(x).all(), name
        err = np.abs(x - r).max() / max(np.abs(r).max(), 1e-6)
        assert err <= tol, f"{name}: relative error {err:.2e} > {tol}"


def test_deterministic_grads_are_bit_identical():
    q, k, v, w, _ = _inputs("bf16-bshd-causal-gqa2")
    g = jax.jit(jax.grad(lambda q, k, v: (attention(q, k, v, causal=True, deterministic=True).astype(jnp.float32)
                                          * w.astype(jnp.float32)).sum(), argnums=(0, 1, 2)))
    first = [np.asarray(x).view(np.uint16) for x in g(q, k, v)]
    for _ in range(3):
        assert all((np.asarray(x).view(np.uint16) == f).all() for x, f in zip(g(q, k, v), first))

"""cupy_fmha.jax at trace time, on JAX's CPU backend (no GPU needed): output shapes, the gradient's
trace, and bad arguments refused with this library's named messages before anything runs.
Skipped without JAX."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from cupy_fmha.jax import attention, attention_with_lse  # noqa: E402


def _spec(shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


def test_output_shapes_and_dtypes():
    q, k, v = _spec((2, 100, 8, 64)), _spec((2, 77, 2, 64)), _spec((2, 77, 2, 32))
    o = jax.eval_shape(lambda q, k, v: attention(q, k, v, causal=True), q, k, v)
    assert o.shape == (2, 100, 8, 32) and o.dtype == jnp.bfloat16
    o, lse = jax.eval_shape(lambda q, k, v: attention_with_lse(q, k, v, layout="bshd"), q, k, v)
    assert lse.shape == (2, 8, 100) and lse.dtype == jnp.float32
    qh = _spec((2, 8, 100, 64), jnp.float16)
    kh, vh = _spec((2, 2, 77, 64), jnp.float16), _spec((2, 2, 77, 64), jnp.float16)
    assert jax.eval_shape(lambda q, k, v: attention(q, k, v, layout="bhsd"), qh, kh, vh).shape == (2, 8, 100, 64)


def test_gradient_traces_under_jit():
    q, k, v = _spec((1, 64, 4, 128)), _spec((1, 64, 2, 128)), _spec((1, 64, 2, 128))
    slopes = _spec((4,), jnp.float32)

    def loss(q, k, v, s):
        return attention(q, k, v, causal=True, alibi_slopes=s, deterministic=True).astype(jnp.float32).sum()

    grads = jax.eval_shape(jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))), q, k, v, slopes)
    assert [g.shape for g in grads] == [(1, 64, 4, 128), (1, 64, 2, 128), (1, 64, 2, 128), (4,)]
    assert [g.dtype for g in grads[:3]] == [jnp.bfloat16] * 3
    text = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v, slopes))
    assert text.count("buffer_callback") == 2  # the forward and the backward, nothing else


@pytest.mark.parametrize("make,kw,words", [
    (lambda: (_spec((1, 16, 2, 7)),) * 3, {}, "head dim"),
    (lambda: (_spec((1, 16, 2, 64)), _spec((1, 16, 2, 64), jnp.float16), _spec((1, 16, 2, 64))), {}, "dtype"),
    (lambda: (_spec((1, 16, 2, 64), jnp.float32),) * 3, {}, "dtype"),
    (lambda: (_spec((1, 16, 3, 64)), _spec((1, 16, 2, 64)), _spec((1, 16, 2, 64))), {}, "number of heads"),
    (lambda: (_spec((1, 16, 2, 64)),) * 3, {"mask": "t", "causal": True}, "not both"),
    (lambda: (_spec((1, 16, 2, 64)),) * 3, {"layout": "thd"}, "group mode"),
    (lambda: (_spec((1, 16, 2, 64)),) * 3, {"softmax_scale": float("nan")}, "softmax_scale"),
])
def test_bad_arguments_are_refused_at_trace_time(make, kw, words):
    with pytest.raises((TypeError, ValueError), match=words):
        jax.eval_shape(lambda q, k, v: attention(q, k, v, **kw), *make())

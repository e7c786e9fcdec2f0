"""cupy_fmha.jax at trace time, on JAX's CPU backend (no GPU needed): output shapes, the gradient's
trace (which callbacks, with which operands and results; lse's cotangent as the backward's extra
operand), group mode, the bias and its dBias,
dropout from a PRNG key, vmap, and bad arguments refused with this library's named messages
before anything runs. Skipped without JAX."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from cupy_fmha.jax import attention, attention_with_lse, dropout_seed_offset  # noqa: E402


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
    (lambda: (_spec((1, 16, 2, 64)),) * 3, {"layout": "thd"}, "max_seqlen_q: cupy_fmha.jax needs"),
    (lambda: (_spec((1, 16, 2, 64)),) * 3, {"softmax_scale": float("nan")}, "softmax_scale"),
    # what attention_forward refuses, refused here too, by name (float() used to take them)
    (lambda: (_spec((1, 16, 2, 64)),) * 3, {"softmax_scale": "0.1"}, "softmax_scale: expected a real number"),
    (lambda: (_spec((1, 16, 2, 64)),) * 3, {"softmax_scale": True}, "softmax_scale: expected a real number"),
    (lambda: (_spec((1, 16, 2, 64)),) * 3, {"softmax_scale": np.array(0.2)}, "softmax_scale: expected a real"),
    (lambda: (_spec((1, 16, 2, 64)),) * 3, {"causal": "yes"}, "causal: expected a bool"),
    (lambda: (_spec((1, 16, 2, 64)),) * 3, {"deterministic": 1.0}, "deterministic: expected a bool"),
    (lambda: (_spec((1, 16, 2, 64)),) * 3, {"bias": np.zeros((16, 16))}, "bias: got float64"),
    (lambda: (_spec((1, 16, 2, 64)),) * 3, {"alibi_slopes": np.ones(2)}, "alibi_slopes: got float64"),
    (lambda: (_spec((1, 16, 2, 64)),) * 3, {"window_size": np.array([2.5, 0])}, "window_size: expected a pair"),
])
def test_bad_arguments_are_refused_at_trace_time(make, kw, words):
    with pytest.raises((TypeError, ValueError), match=words):
        jax.eval_shape(lambda q, k, v: attention(q, k, v, **kw), *make())


def test_window_size_may_be_a_numpy_pair():
    q = _spec((1, 16, 2, 64))
    a = jax.eval_shape(lambda q: attention(q, q, q, window_size=np.array([3, 0])), q)
    assert a.shape == q.shape


def test_non_arrays_are_named():
    with pytest.raises(TypeError, match="q: expected a JAX array, got builtins.list"):
        attention([[1.0]], [[1.0]], [[1.0]])


@pytest.mark.parametrize("name", ["softmax_scale", "causal"])
def test_traced_static_options_are_refused_by_name(name):
    """softmax_scale and causal are static: a traced value is a named TypeError, not JAX's tracer error."""
    q = _spec((1, 16, 2, 64))
    value = jnp.float32(0.1) if name == "softmax_scale" else jnp.bool_(True)
    with pytest.raises(TypeError, match=f"{name}: expected a"):
        jax.eval_shape(jax.jit(lambda q, x: attention(q, q, q, **{name: x})), q, value)


# --------------------------------------------------------------------------- helpers


def _callbacks(fn, *args):
    """The buffer_callback equations of ``fn``'s jaxpr, sub-jaxprs (scan, custom_vjp) included."""
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "buffer_callback":
                found.append(eqn)
            for value in eqn.params.values():
                for sub in value if isinstance(value, (tuple, list)) else (value,):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


def _shapes(avals):
    return [(tuple(a.shape), np.dtype(a.dtype)) for a in avals]


def _loss(**kw):
    def f(q, k, v, *extra):
        names = [n for n in ("bias", "cu_seqlens_q", "cu_seqlens_k") if n in kw and kw[n] is None]
        return attention(q, k, v, **{**kw, **dict(zip(names, extra))}).astype(jnp.float32).sum()

    return f


# --------------------------------------------------------------------------- group mode

# three sequences: total_q 50, total_k 70; max lengths 30 and 40 (an empty one fits too)
GQ, GK, GV = _spec((50, 4, 64)), _spec((70, 2, 64)), _spec((70, 2, 32))
CU = _spec((4,), jnp.int32)
THD = dict(layout="thd", max_seqlen_q=30, max_seqlen_k=40)


def test_group_mode_shapes():
    o, lse = jax.eval_shape(lambda q, k, v, a, b: attention_with_lse(q, k, v, cu_seqlens_q=a, cu_seqlens_k=b, **THD),
                            GQ, GK, GV, CU, CU)
    assert (o.shape, o.dtype) == ((50, 4, 32), jnp.bfloat16)
    assert (lse.shape, lse.dtype) == ((3, 4, 30), jnp.float32)  # [batch, nhead_q, max_seqlen_q]


def test_group_mode_gradient_has_two_callbacks_with_offsets_as_operands():
    f = _loss(causal=True, cu_seqlens_q=None, cu_seqlens_k=None, **THD)
    grads = jax.eval_shape(jax.jit(jax.grad(f, argnums=(0, 1, 2))), GQ, GK, GV, CU, CU)
    assert [g.shape for g in grads] == [(50, 4, 64), (70, 2, 64), (70, 2, 32)]
    fwd, bwd = _callbacks(jax.grad(f, argnums=(0, 1, 2)), GQ, GK, GV, CU, CU)
    # forward: q, k, v, cu_q, cu_k -> o, lse; backward: do, q, k, v, o, lse, cu_q, cu_k -> dq, dk, dv
    assert _shapes(v.aval for v in fwd.invars)[3:] == [((4,), np.int32)] * 2
    assert _shapes(fwd.params["result_avals"]) == [((50, 4, 32), jnp.bfloat16), ((3, 4, 30), np.float32)]
    assert len(bwd.invars) == 8 and _shapes(v.aval for v in bwd.invars)[6:] == [((4,), np.int32)] * 2
    assert _shapes(bwd.params["result_avals"]) == [((50, 4, 64), jnp.bfloat16), ((70, 2, 64), jnp.bfloat16),
                                                   ((70, 2, 32), jnp.bfloat16)]


def test_group_mode_empty_sequences_and_zero_max_fit():
    # every sequence empty: total 0, max 0
    q, k = _spec((0, 2, 64)), _spec((0, 2, 64))
    o, lse = jax.eval_shape(lambda q, k, v, a, b: attention_with_lse(
        q, k, v, layout="thd", cu_seqlens_q=a, cu_seqlens_k=b, max_seqlen_q=0, max_seqlen_k=0), q, k, k, CU, CU)
    assert o.shape == (0, 2, 64) and lse.shape == (3, 2, 0)


@pytest.mark.parametrize("kw,exc,words", [
    (dict(layout="thd", max_seqlen_k=40), ValueError, "max_seqlen_q: cupy_fmha.jax needs max_seqlen_q and max_seqlen_k"),
    (dict(layout="thd", max_seqlen_q=30), ValueError, "max_seqlen_k: cupy_fmha.jax needs"),
    (dict(layout="thd", max_seqlen_q=30.0, max_seqlen_k=40), TypeError, "max_seqlen_q: expected a Python int"),
    (dict(layout="thd", max_seqlen_q=-1, max_seqlen_k=40), ValueError, r"max_seqlen_q: expected a Python int \(a static value in cupy_fmha.jax\) >= 0, got -1"),
    (dict(layout="thd", max_seqlen_q=16, max_seqlen_k=40), ValueError,
     "cu_seqlens_q: 50 packed tokens .q's first dimension. cannot be 3 sequences of at most max_seqlen=16"),
    (dict(layout="thd", max_seqlen_q=30, max_seqlen_k=20), ValueError, "cu_seqlens_k: 70 packed tokens"),
    (dict(layout="bshd"), ValueError, "cu_seqlens_q: variable-length inputs need layout='thd'"),
    (dict(THD, check_cu_seqlens=1), TypeError, "check_cu_seqlens: expected a bool"),
    (dict(layout="bshd", check_cu_seqlens=True), ValueError, "check_cu_seqlens: True checks group mode's offsets"),
])
def test_group_mode_bad_arguments(kw, exc, words):
    with pytest.raises(exc, match=words):
        jax.eval_shape(lambda q, k, v, a, b: attention(q, k, v, cu_seqlens_q=a, cu_seqlens_k=b, **kw),
                       GQ, GK, GV, CU, CU)


def test_group_mode_bad_offsets_and_tensors_use_the_library_messages():
    run = lambda q, k, v, a, b, **kw: jax.eval_shape(  # noqa: E731
        lambda q, k, v, a, b: attention(q, k, v, cu_seqlens_q=a, cu_seqlens_k=b, **{**THD, **kw}), q, k, v, a, b)
    with pytest.raises(TypeError, match="cu_seqlens_q: expected dtype int32, got float32"):
        run(GQ, GK, GV, _spec((4,), jnp.float32), CU)
    with pytest.raises(ValueError, match="cu_seqlens_k: 3 entries but cu_seqlens_q has 4"):
        run(GQ, GK, GV, CU, _spec((3,), jnp.int32))
    with pytest.raises(ValueError, match="cu_seqlens_q: expected a rank-1 array"):
        run(GQ, GK, GV, _spec((4, 1), jnp.int32), CU)
    with pytest.raises(ValueError, match="q: expected a rank-3 array"):
        run(_spec((1, 50, 4, 64)), GK, GV, CU, CU)
    with pytest.raises(ValueError, match="layout 'thd' needs cu_seqlens_q and cu_seqlens_k"):
        jax.eval_shape(lambda q, k, v: attention(q, k, v, **THD), GQ, GK, GV)


# --------------------------------------------------------------------------- bias and dBias

Q, K, V = _spec((2, 100, 4, 64)), _spec((2, 77, 2, 64)), _spec((2, 77, 2, 64))


@pytest.mark.parametrize("shape,dtype", [((1, 1, 100, 77), jnp.float32), ((2, 4, 100, 77), jnp.bfloat16),
                                         ((100, 77), jnp.float16), ((4, 1, 77), jnp.float32)])
def test_bias_gradient_is_dbias_in_the_bias_shape_and_dtype(shape, dtype):
    bias = _spec(shape, dtype)
    f = _loss(causal=True, bias=None)
    grads = jax.eval_shape(jax.jit(jax.grad(f, argnums=(0, 1, 2, 3))), Q, K, V, bias)
    assert (grads[3].shape, grads[3].dtype) == (shape, dtype)
    fwd, bwd = _callbacks(jax.grad(f, argnums=(0, 1, 2, 3)), Q, K, V, bias)
    assert _shapes(fwd.invars[i].aval for i in (3,)) == [(shape, np.dtype(dtype))]
    # backward: do, q, k, v, o, lse, bias -> dq, dk, dv, dbias
    assert len(bwd.invars) == 7 and _shapes(bwd.params["result_avals"])[3] == (shape, np.dtype(dtype))


def test_dbias_only_when_the_bias_is_differentiated():
    bias = _spec((1, 4, 100, 77), jnp.float32)
    f = _loss(bias=None)
    _, bwd = _callbacks(jax.grad(f, argnums=(0, 1, 2)), Q, K, V, bias)  # bias outside argnums
    assert len(bwd.params["result_avals"]) == 3
    _, bwd = _callbacks(jax.grad(f, argnums=(3,)), Q, K, V, bias)
    assert len(bwd.params["result_avals"]) == 4
    # a constant bias (closed over) is not differentiated either
    const = jnp.zeros((100, 77), jnp.float32)
    _, bwd = _callbacks(jax.grad(lambda q, k, v: attention(q, k, v, bias=const).astype(jnp.float32).sum()), Q, K, V)
    assert len(bwd.params["result_avals"]) == 3


def test_gradient_through_a_stopped_lse_only_runs_no_backward():
    f = lambda q, k, v: jax.lax.stop_gradient(attention_with_lse(q, k, v)[1]).sum() + q.sum()  # noqa: E731
    assert len(_callbacks(jax.grad(f), Q, K, V)) == 1
    assert jax.eval_shape(jax.grad(f), Q, K, V).shape == Q.shape


@pytest.mark.parametrize("loss", [
    lambda o, lse: lse.sum(),                                   # lse only: do is a symbolic zero
    lambda o, lse: o.astype(jnp.float32).sum() + (lse * lse).sum(),  # both
    lambda o, lse: jnp.where(jnp.isfinite(lse), lse, 0.0).mean(),  # a rows-without-keys-safe z-loss
])
def test_a_loss_depending_on_lse_passes_its_cotangent_to_the_backward(loss):
    """lse's cotangent used to be dropped (a silently wrong gradient), then refused with a TypeError
    (f03a1c5); now it is one more operand of the backward callback, float32 in lse's shape: dlse."""
    f = lambda q, k, v: loss(*attention_with_lse(q, k, v, causal=True))  # noqa: E731
    grads = jax.eval_shape(jax.jit(jax.grad(f, argnums=(0, 1, 2))), Q, K, V)
    assert [(g.shape, g.dtype) for g in grads] == [(x.shape, x.dtype) for x in (Q, K, V)]
    fwd, bwd = _callbacks(jax.grad(f, argnums=(0, 1, 2)), Q, K, V)
    # backward: do, q, k, v, o, lse, dlse -> dq, dk, dv
    assert len(bwd.invars) == 7 and _shapes([bwd.invars[-1].aval]) == [((2, 4, 100), np.float32)]
    assert bwd.params["callback"].names[-1] == "dlse" and len(bwd.params["result_avals"]) == 3
    assert "dlse" not in fwd.params["callback"].names
    text = str(jax.make_jaxpr(jax.grad(f, argnums=(0, 1, 2)))(Q, K, V))
    assert text.count("buffer_callback") == 2  # the forward and the backward, nothing else


def test_lse_unused_stopped_or_aux_keeps_the_plain_backward():
    """No lse operand where lse's cotangent is a symbolic zero: the plain backward's callback."""
    plain = _callbacks(jax.grad(_loss(causal=True), argnums=(0, 1, 2)), Q, K, V)[1]
    for f, kw in ((lambda q: attention_with_lse(q, K, V, causal=True)[0].astype(jnp.float32).sum(), {}),
                  (lambda q: (lambda o, lse: (o.astype(jnp.float32).sum(), lse))(*attention_with_lse(q, K, V, causal=True)),
                   dict(has_aux=True)),
                  (lambda q: (lambda o, lse: o.astype(jnp.float32).sum() + jax.lax.stop_gradient(lse).sum())(
                      *attention_with_lse(q, K, V, causal=True)), {})):
        (bwd,) = _callbacks(jax.grad(f, **kw), Q)[1:]
        assert len(bwd.invars) == 6 and "dlse" not in bwd.params["callback"].names
        assert bwd.params["callback"] is plain.params["callback"]  # the same (shared) callback
    g = jax.grad(lambda q: (lambda o, lse: (o.astype(jnp.float32).sum(), lse))(*attention_with_lse(q, K, V)),
                 has_aux=True)
    assert [x.shape for x in jax.eval_shape(g, Q)] == [Q.shape, (2, 4, 100)]
    vg = jax.vmap(jax.grad(lambda q: attention_with_lse(q, q, q)[0].astype(jnp.float32).sum()))
    assert jax.eval_shape(vg, _spec((3,) + Q.shape)).shape == (3,) + Q.shape


def test_vjp_with_an_lse_cotangent_and_group_mode_and_vmap():
    """jax.vjp with both cotangents; group mode (dlse [batch, nhead_q, max_seqlen_q]) with a
    differentiated bias (dBias carries the lse term too); vmap of a gradient through lse."""
    o, lse = jax.eval_shape(lambda q, k, v: attention_with_lse(q, k, v), Q, K, V)

    def vjp(q, k, v, do, dlse):
        _, back = jax.vjp(lambda q, k, v: attention_with_lse(q, k, v), q, k, v)
        return back((do, dlse))

    assert [g.shape for g in jax.eval_shape(vjp, Q, K, V, o, lse)] == [Q.shape, K.shape, V.shape]
    bwd = _callbacks(vjp, Q, K, V, o, lse)[-1]
    assert bwd.params["callback"].names[-1] == "dlse"
    bias = _spec((3, 1, 30, 40), jnp.float32)
    f = lambda q, k, v, b, cu: attention_with_lse(q, k, v, bias=b, cu_seqlens_q=cu, cu_seqlens_k=cu,  # noqa: E731
                                                  **THD)[1].sum()
    grads = jax.eval_shape(jax.grad(f, argnums=(0, 1, 2, 3)), GQ, GK, GV, bias, CU)
    assert [g.shape for g in grads] == [GQ.shape, GK.shape, GV.shape, bias.shape]
    bwd = _callbacks(jax.grad(f, argnums=(0, 3)), GQ, GK, GV, bias, CU)[-1]
    assert _shapes([bwd.invars[-1].aval]) == [((3, 4, 30), np.float32)] and len(bwd.params["result_avals"]) == 4
    qs = _spec((3,) + Q.shape)
    vg = jax.vmap(jax.grad(lambda q: (lambda o, lse: o.astype(jnp.float32).sum() + lse.sum())(
        *attention_with_lse(q, q, q))))
    assert jax.eval_shape(vg, qs).shape == qs.shape


@pytest.mark.parametrize("bias,kw,exc,words", [
    (_spec((2, 4, 100, 76), jnp.float32), {}, ValueError, "bias: shape .* is not broadcastable"),
    (_spec((3, 4, 100, 77), jnp.float32), {}, ValueError, "its batch dimension is 3"),
    (_spec((100, 77), jnp.int32), {}, TypeError, "bias: expected float16, bfloat16 or float32"),
    (_spec((100, 77), jnp.float32), {"alibi_slopes": jnp.ones(4, jnp.float32)}, ValueError,
     "bias, alibi_slopes: give at most one"),
])
def test_bad_bias_is_refused_at_trace_time(bias, kw, exc, words):
    with pytest.raises(exc, match=words):
        jax.eval_shape(lambda q, k, v, b: attention(q, k, v, bias=b, **kw), Q, K, V, bias)


def test_group_mode_bias_shapes():
    bias = _spec((3, 1, 30, 40), jnp.bfloat16)
    f = _loss(bias=None, cu_seqlens_q=None, cu_seqlens_k=None, **THD)
    grads = jax.eval_shape(jax.grad(f, argnums=(3,)), GQ, GK, GV, bias, CU, CU)
    assert (grads[0].shape, grads[0].dtype) == ((3, 1, 30, 40), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"bias: shape \(3, 1, 30, 41\) is not broadcastable to \[batch, nhead_q, "
                                         r"max_seqlen_q, max_seqlen_k\]"):
        jax.eval_shape(f, GQ, GK, GV, _spec((3, 1, 30, 41), jnp.float32), CU, CU)


# --------------------------------------------------------------------------- dropout


def test_dropout_key_draws_words_on_the_device_and_feeds_both_callbacks():
    key = jax.random.key(7)
    f = lambda q, k, v, key: attention(q, k, v, dropout_p=0.2, dropout_key=key).astype(jnp.float32).sum()  # noqa: E731
    fwd, bwd = _callbacks(jax.grad(f, argnums=(0, 1, 2)), Q, K, V, key)
    assert _shapes([fwd.invars[-1].aval]) == [((4,), np.uint32)]  # the four words: seed and offset
    assert _shapes([bwd.invars[-1].aval]) == [((4,), np.uint32)]
    grads = jax.eval_shape(jax.jit(jax.grad(f, argnums=(0, 1, 2))), Q, K, V, key)
    assert [g.shape for g in grads] == [Q.shape, K.shape, V.shape]


def test_dropout_key_without_dropout_adds_no_operand():
    f = lambda q, k, v: attention(q, k, v, dropout_p=0.0, dropout_key=jax.random.key(1))  # noqa: E731
    (fwd,) = _callbacks(f, Q, K, V)
    assert len(fwd.invars) == 3


def test_dropout_seed_offset_of_typed_and_raw_keys():
    seed, offset = dropout_seed_offset(jax.random.key(3))
    assert (seed, offset) == dropout_seed_offset(jax.random.PRNGKey(3))
    assert 0 <= seed < 2**64 and 0 <= offset < 2**64 and (seed, offset) != dropout_seed_offset(jax.random.key(4))
    w = np.asarray(jax.random.bits(jax.random.key(3), (4,), jnp.uint32)).astype(np.uint64)
    assert seed == int(w[0] | (w[1] << np.uint64(32))) and offset == int(w[2] | (w[3] << np.uint64(32)))


@pytest.mark.parametrize("kw,exc,words", [
    (dict(dropout_p=0.1, dropout_key=jax.random.key(0), seed=5), ValueError, "dropout_key: give dropout_key or seed"),
    (dict(dropout_p=0.1, dropout_key=5), TypeError, "dropout_key: expected a JAX PRNG key"),
    (dict(dropout_p=1.0), ValueError, "dropout_p: expected a number in"),
    (dict(dropout_p="0.1"), TypeError, "dropout_p: expected a real number"),
    (dict(dropout_p=0.1, seed=-1), ValueError, "seed"),
])
def test_bad_dropout_arguments(kw, exc, words):
    with pytest.raises(exc, match=words):
        jax.eval_shape(lambda q, k, v: attention(q, k, v, **kw), Q, K, V)


# --------------------------------------------------------------------------- vmap


def test_vmap_runs_one_call_per_element():
    qs, ks, vs = (_spec((3,) + x.shape) for x in (Q, K, V))
    o = jax.eval_shape(jax.vmap(lambda q, k, v: attention(q, k, v, causal=True)), qs, ks, vs)
    assert o.shape == (3, 2, 100, 4, 64)
    f = jax.vmap(jax.grad(_loss(causal=True), argnums=(0, 1, 2)))
    grads = jax.eval_shape(jax.jit(f), qs, ks, vs)
    assert [g.shape for g in grads] == [qs.shape, ks.shape, vs.shape]
    calls = _callbacks(f, qs, ks, vs)
    assert len(calls) == 2 and all(c.params["vmap_method"] == "sequential" for c in calls)
    assert "scan" in str(jax.make_jaxpr(f)(qs, ks, vs))  # the loop over the vmapped axis


def test_vmap_of_group_mode_with_keys():
    qs, ks, vs, cus = (_spec((2,) + x.shape, x.dtype) for x in (GQ, GK, GV, CU))
    keys = jax.random.split(jax.random.key(0), 2)
    f = lambda q, k, v, a, key: attention_with_lse(q, k, v, cu_seqlens_q=a, cu_seqlens_k=a, dropout_p=0.1,  # noqa: E731
                                                   dropout_key=key, **THD)
    o, lse = jax.eval_shape(jax.vmap(f), qs, ks, vs, cus, keys)
    assert o.shape == (2, 50, 4, 32) and lse.shape == (2, 3, 4, 30)


# --------------------------------------------------------------------------- the callbacks' planning


@pytest.mark.parametrize("cc", [80, 90])
def test_run_time_plan_from_standin_offsets_matches_the_trace(cc):
    """What a callback plans before launching, with NumPy arrays standing in for XLA's buffers:
    group mode with a bias, the offsets replaced by host stand-ins (no device read), for both
    GPU families; with check_cu_seqlens the real offsets are checked instead."""
    from cupy_fmha import jax as fj
    from cupy_fmha.plan import plan_backward, plan_forward

    bf16 = np.dtype(jnp.bfloat16)
    q, k, v = (np.zeros(s, bf16) for s in ((50, 4, 64), (70, 2, 64), (70, 2, 32)))
    o, do, lse = np.zeros((50, 4, 32), bf16), np.zeros((50, 4, 32), bf16), np.zeros((3, 4, 30), np.float32)
    bias = np.zeros((3, 1, 30, 40), np.float32)
    real = {"cu_seqlens_q": np.array([0, 29, 29, 50], np.int32), "cu_seqlens_k": np.array([0, 0, 40, 70], np.int32)}
    for check in (False, True):
        opts = fj._Options(None, True, (-1, -1), None, "thd", 0.1, 3, 4, True, 30, 40, check)
        offsets = fj._plan_offsets(opts, q, k, real["cu_seqlens_q"], real["cu_seqlens_k"])
        kw = fj._runtime_kw(opts, real, offsets)
        assert (kw["cu_seqlens_q"] is real["cu_seqlens_q"]) == check
        fp = plan_forward(q, k, v, bias=bias, alibi_slopes=None, cc=lambda: cc, return_dropout_mask=False, **kw)
        assert fp.o_shape == (50, 4, 32) and fp.lse_shape == (3, 4, 30) and fp.dropout.seed == 3
        bp = plan_backward(do, q, k, v, o, lse, bias=bias, alibi_slopes=None, cc=lambda: cc, return_dbias=True,
                           deterministic=True, **kw)
        assert bp.grad_shapes == ((50, 4, 64), (70, 2, 64), (70, 2, 32)) and bp.want_dbias
    bad = dict(real, cu_seqlens_q=np.array([0, 31, 31, 50], np.int32))  # a sequence above max_seqlen_q
    with pytest.raises(ValueError, match="max_seqlen_q: 30 is less than the longest sequence"):
        plan_forward(q, k, v, cc=lambda: cc, return_dropout_mask=False, **fj._runtime_kw(opts, bad, offsets))


def test_eager_call_on_cpu_arrays_is_refused_by_name():
    # run, the callback would fail inside XLA with a long wrapped traceback; the eager call says
    # which argument sits where before anything is traced
    cpu = jax.devices("cpu")[0]
    q = jax.device_put(jnp.ones((1, 16, 2, 64), jnp.bfloat16), cpu)
    with pytest.raises(RuntimeError, match="q: on JAX's cpu device; cupy_fmha.jax runs its kernels on a CUDA GPU"):
        attention(q, q, q, causal=True)
    with pytest.raises(RuntimeError, match="k: on JAX's cpu device"):
        attention_with_lse(np.ones((1, 16, 2, 64), np.float16), q, q)  # (a NumPy q has no device)
    # traced values have no device yet: tracing on the CPU still works
    assert jax.eval_shape(lambda q: attention(q, q, q), q).shape == q.shape


@pytest.mark.parametrize("name,make", [
    ("window_size", lambda x: (x, 0)),                       # a pair holding a tracer
    ("window_size", lambda x: jnp.stack([x, x])),            # a traced pair
    ("mask", lambda x: x),
    ("layout", lambda x: x),
    ("max_seqlen_q", lambda x: x),                           # (outside group mode too)
])
def test_traced_window_mask_layout_max_seqlen_are_refused_by_name(name, make):
    """These options are static too: a traced value was JAX's UnexpectedTracerError about
    nondiff_argnums, naming neither the option nor the fix."""
    q = _spec((1, 16, 2, 64))
    with pytest.raises(TypeError, match=f"{name}: expected .*a static value in cupy_fmha.jax"):
        jax.eval_shape(jax.jit(lambda q, x: attention(q, q, q, **{name: make(x)})), q, jnp.int32(1))


@pytest.mark.parametrize("key,exc,words", [
    (jax.random.split(jax.random.key(0), 2), ValueError,
     r"dropout_key: expected one PRNG key .* typed key array of shape \(2,\); for a key per vmapped element, jax.vmap"),
    (jax.random.split(jax.random.PRNGKey(0), 2), ValueError,
     r"dropout_key: expected one PRNG key .* raw key array of shape \(2, 2\)"),
    (jnp.uint32(3), ValueError, r"dropout_key: expected one PRNG key .* shape \(\)"),
    (jnp.zeros(3, jnp.uint32), TypeError, r"dropout_key: expected a JAX PRNG key .* got uint32 of shape \(3,\)"),
    (jnp.zeros(2, jnp.float32), TypeError, r"dropout_key: expected a JAX PRNG key .* got float32 of shape \(2,\)"),
])
def test_bad_dropout_keys_are_named(key, exc, words):
    """A batch of keys, a scalar or a raw key of the wrong length or dtype were jax.random.bits'
    errors ('bits accepts a single key', 'invalid PRNG key data'), naming no argument."""
    with pytest.raises(exc, match=words):
        jax.eval_shape(lambda q, k, v: attention(q, k, v, dropout_p=0.1, dropout_key=key), Q, K, V)
    with pytest.raises(exc, match="dropout_key: "):
        dropout_seed_offset(key)


def test_raw_key_of_numpy_and_vmapped_keys_still_work():
    o = jax.eval_shape(lambda q, k, v: attention(q, k, v, dropout_p=0.1, dropout_key=np.array([0, 7], np.uint32)),
                       Q, K, V)
    assert o.shape == Q.shape
    qs = _spec((3,) + Q.shape)
    f = jax.vmap(lambda q, key: attention(q, q, q, dropout_p=0.1, dropout_key=key))
    assert jax.eval_shape(f, qs, jax.random.split(jax.random.PRNGKey(0), 3)).shape == qs.shape


@pytest.mark.parametrize("transform", [
    lambda L: jax.grad(lambda q, k, v: jax.grad(L)(q, k, v).astype(jnp.float32).sum()),   # grad of grad
    lambda L: jax.hessian(L),
    lambda L: lambda q, k, v: jax.jvp(jax.grad(L), (q, k, v), (q, k, v)),
])
def test_higher_order_derivatives_are_refused_by_name(transform):
    """They were JAX's 'Buffer callbacks do not support JVP. Please use jax.custom_jvp', advice
    for the library's author; first-order gradients and remat are unchanged."""
    q = _spec((1, 16, 2, 16))
    L = _loss(causal=True)
    with pytest.raises(TypeError, match="cupy_fmha.jax.attention: higher-order derivatives .* are not supported"):
        jax.eval_shape(transform(L), q, q, q)
    grads = jax.eval_shape(jax.jit(jax.grad(jax.checkpoint(L), argnums=(0, 1, 2))), q, q, q)
    assert [g.shape for g in grads] == [q.shape] * 3


@pytest.mark.parametrize("kw,words", [
    (dict(bias="x"), "bias: expected a JAX or NumPy array, got builtins.str"),
    (dict(alibi_slopes={"h": 1.0}), "alibi_slopes: expected a JAX or NumPy array, got builtins.dict"),
    (dict(bias=[[0.0] * 16, [0.0] * 15]), "bias: expected a JAX or NumPy array, got builtins.list"),  # ragged
    (dict(layout="thd", cu_seqlens_q="abc", cu_seqlens_k=np.array([0, 16], np.int32), max_seqlen_q=16,
          max_seqlen_k=16), "cu_seqlens_q: expected a JAX or NumPy array"),
])
def test_operands_jax_cannot_convert_are_named(kw, words):
    """jnp.asarray's own refusal ('Value 'x' with dtype <U1 is not a valid JAX array type')
    named no argument."""
    with pytest.raises(TypeError, match=words):
        jax.eval_shape(lambda q: attention(q, q, q, **kw), _spec((1, 16, 2, 64)))


def test_float64_numpy_q_names_its_own_dtype():
    """JAX turned it into float32 first, and the library's check said 'got dtype float32'."""
    x = np.zeros((1, 16, 2, 64))
    with pytest.raises(TypeError, match="q: got float64; expected float16 or bfloat16"):
        attention(x, x, x)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_check_cu_seqlens_outside_group_mode_is_refused(layout):
    """It was taken silently (and sent every call down the general path: views, a new plan)."""
    with pytest.raises(ValueError, match=f"check_cu_seqlens: True checks group mode's offsets .*got layout '{layout}'"):
        jax.eval_shape(lambda q: attention(q, q, q, layout=layout, check_cu_seqlens=True), _spec((1, 16, 2, 64)))
    assert jax.eval_shape(lambda q: attention(q, q, q, layout=layout, check_cu_seqlens=False),
                          _spec((1, 16, 2, 64))).shape == (1, 16, 2, 64)


def test_symbolic_shapes_are_refused_by_name():
    """jax.export's shape polymorphism: a symbolic batch raised InconclusiveDimensionOperation
    from inside the planning (int() of the dimension), naming no argument."""
    from jax import export

    (b,) = export.symbolic_shape("b")
    with pytest.raises(ValueError, match=r"q: shape \(b, 16, 2, 64\) has a symbolic dimension"):
        jax.eval_shape(lambda q, k: attention(q, k, k), _spec((b, 16, 2, 64)), _spec((2, 16, 2, 64)))
    with pytest.raises(ValueError, match=r"bias: shape \(b, 16\) has a symbolic dimension"):
        jax.eval_shape(lambda q, x: attention(q, q, q, bias=x), _spec((1, 16, 2, 64)), _spec((b, 16), jnp.float32))

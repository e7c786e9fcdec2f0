"""cupy_fmha.jax on the GPU, under jax.jit and jax.grad, against a float32 JAX reference written
here (einsum + softmax): outputs and gradients for masks, GQA, ALiBi, both layouts, fp16 and
bf16; deterministic gradients bit-identical run to run; group mode (cu_seqlens as JAX arrays,
odd and empty lengths, with and without a bias, trusted and checked offsets); the elementwise
bias and its dBias; dropout from a PRNG key (the same as the static seed/offset it stands for,
and against a reference that applies cupy_fmha.reference's keep mask); vmap. Fresh random inputs
per case; lengths that are not multiples of any tile. Skipped without JAX (with a GPU backend)
or a device."""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest

# JAX takes 75% of the GPU's memory at its first use unless told not to; CuPy allocates here too
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from conftest import seed_for  # noqa: E402
from cupy_fmha import philox, reference  # noqa: E402
from cupy_fmha.jax import attention, attention_with_lse, dropout_seed_offset  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _jax_gpu():
    try:
        ok = jax.devices()[0].platform == "gpu"
    except RuntimeError:
        ok = False
    if not ok:
        pytest.skip("JAX has no GPU backend here")


def _scores(q, k, *, causal, window, slopes, bias=None):
    """float32 scaled and masked scores [b, hq, sq, sk] from bhsd q, k (k already repeated to hq
    heads); FlashAttention's bottom-right masks, ALiBi, an additive bias broadcast NumPy-style."""
    sq, sk = q.shape[2], k.shape[2]
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
    i, j = jnp.arange(sq)[:, None], jnp.arange(sk)[None, :]
    rel = i + sk - sq - j  # >= 0: key at or left of the diagonal
    if slopes is not None:
        s = s - slopes[None, :, None, None] * jnp.abs(rel)[None, None]
    if bias is not None:
        s = s + bias.astype(jnp.float32)
    left, right = window
    if causal:
        right = 0
    vis = jnp.ones((sq, sk), bool)
    if left >= 0:
        vis &= rel <= left
    if right >= 0:
        vis &= -rel <= right
    return jnp.where(vis[None, None], s, -jnp.inf)


# One XLA program per shape and mask. Run op by op, each of the reference's operations (and its gradient's) is compiled
# on first use in every xdist worker: on CPU one case's output and gradients take 3 s that way and 0.6 s as one program,
# with the same results to 3e-7; in the GPU suite these tests took 50-90 s each (2026-12-06, 16 workers).
@functools.partial(jax.jit, static_argnames=("causal", "window", "layout", "dropout_p", "with_lse"))
def _ref(q, k, v, *, causal, window, layout, slopes, bias=None, keep=None, dropout_p=0.0, with_lse=False):
    """float32 attention; ``keep``: a bool [b, hq, sq, sk] dropout mask applied as keep * keep_scale(p)
    to the softmax (the LSE stays the undropped one, as the library defines it)."""
    if layout == "bshd":
        q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = jnp.repeat(k, g, axis=1), jnp.repeat(v, g, axis=1)
    s = _scores(q, k, causal=causal, window=window, slopes=slopes, bias=bias)
    p = jax.nn.softmax(s, axis=-1)
    if keep is not None:
        p = p * jnp.asarray(keep, jnp.float32) * philox.keep_scale(dropout_p)
    o = jnp.einsum("bhqk,bhkd->bhqd", p, v)
    o = jnp.swapaxes(o, 1, 2) if layout == "bshd" else o
    return (o, jax.scipy.special.logsumexp(s, axis=-1)) if with_lse else o


def _rel_err(x, r):
    x, r = np.asarray(jnp.asarray(x).astype(jnp.float32)), np.asarray(r, np.float32)
    assert x.shape == r.shape, (x.shape, r.shape)
    assert np.isfinite(x).all()
    return float(np.abs(x - r).max() / max(float(np.abs(r).max()), 1e-6))


def _check_close(named, tol):
    for name, x, r in named:
        assert float(np.abs(np.asarray(r)).max()) > 0, f"{name}: the reference is all zero (a vacuous check)"
        err = _rel_err(x, r)
        assert err <= tol, f"{name}: relative error {err:.2e} > {tol}"


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


@pytest.mark.parametrize("loss_kind", ["o+lse", "lse-only"])
@pytest.mark.parametrize("case", list(CASES))
def test_grad_through_o_and_lse_matches_jax(case, loss_kind):
    """jax.grad of a loss of o and lse (lse's cotangent reaches the backward as dlse: dS = P (dP - D
    + dlse)), or of lse alone (do = 0), against jax.grad of the float32 reference with its lse
    (logsumexp of the scores). The masks here leave every row a key: lse finite everywhere."""
    dtype, layout, *_, causal, window, alibi = CASES[case]
    q, k, v, w, slopes = _inputs(case)
    s = slopes if alibi else None
    kw = dict(causal=causal, window_size=window, layout=layout, alibi_slopes=s)
    rng = np.random.default_rng(seed_for(f"jax-lse-{case}"))
    u = jnp.asarray(4.0 * rng.standard_normal(jax.eval_shape(lambda q, k, v: attention_with_lse(q, k, v, **kw),
                                                                q, k, v)[1].shape).astype(np.float32))
    wo = 0.0 if loss_kind == "lse-only" else 1.0

    def loss(q, k, v):
        o, lse = attention_with_lse(q, k, v, **kw)
        term = (lse * u).sum()
        return term if loss_kind == "lse-only" else (o.astype(jnp.float32) * w.astype(jnp.float32)).sum() + term

    def ref_loss(q, k, v):
        o, lse = _ref(q, k, v, causal=causal, window=window, layout=layout, slopes=s, with_lse=True)
        return wo * (o * w.astype(jnp.float32)).sum() + (lse * u).sum()

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    ref_grads = jax.grad(ref_loss, argnums=(0, 1, 2))(*(x.astype(jnp.float32) for x in (q, k, v)))
    tol = 2e-2 if dtype == jnp.bfloat16 else 5e-3
    assert all(x.dtype == dtype for x in grads)
    _check_close([("dq", grads[0], ref_grads[0]), ("dk", grads[1], ref_grads[1]), ("dv", grads[2], ref_grads[2])]
                 if loss_kind == "o+lse" else [("dq", grads[0], ref_grads[0]), ("dk", grads[1], ref_grads[1])], tol)
    if loss_kind == "lse-only":  # dv does not depend on lse
        assert not np.asarray(grads[2].astype(jnp.float32)).any()
    # the lse term matters: the gradient of the loss without it is far from this one
    plain = jax.grad(lambda q, k, v: wo * (_ref(q, k, v, causal=causal, window=window, layout=layout, slopes=s)
                                           * w.astype(jnp.float32)).sum(), argnums=(0,))(
        *(x.astype(jnp.float32) for x in (q, k, v)))[0]
    assert _rel_err(grads[0], plain) > 10 * tol if loss_kind == "o+lse" else not np.asarray(plain).any()


def test_deterministic_grads_are_bit_identical():
    q, k, v, w, _ = _inputs("bf16-bshd-causal-gqa2")
    g = jax.jit(jax.grad(lambda q, k, v: (attention(q, k, v, causal=True, deterministic=True).astype(jnp.float32)
                                          * w.astype(jnp.float32)).sum(), argnums=(0, 1, 2)))
    first = [np.asarray(x).view(np.uint16) for x in g(q, k, v)]
    for _ in range(3):
        assert all((np.asarray(x).view(np.uint16) == f).all() for x, f in zip(g(q, k, v), first))


def _bits(x):
    x = np.asarray(x)
    return x.view(np.uint16) if x.dtype.itemsize == 2 else x.view(np.uint32)


def _same_bits(a, b):
    return all(np.array_equal(_bits(x), _bits(y)) for x, y in zip(a, b))


def _rand(rng, shape, dtype, scale=1.0):
    return jnp.asarray((scale * rng.standard_normal(shape)).astype(np.float32)).astype(dtype)


# --------------------------------------------------------------------------- group mode

GROUP_Q = (37, 0, 101, 5, 64)   # an empty query sequence; 5 query rows that see no key
GROUP_K = (50, 19, 130, 0, 64)  # ... and 19 keys no query sees
MAX_Q, MAX_K = 128, 140         # above the longest sequences (101, 130)


def _offsets(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def _group_ref(q, k, v, bias, causal):
    """float32 group-mode reference from host-known lengths: one batch-mode call per sequence;
    a sequence without keys gives zero rows, lse -inf."""
    cq, ck = _offsets(GROUP_Q), _offsets(GROUP_K)
    hq = q.shape[1]
    outs, lses = [], []
    for b, (sq, sk) in enumerate(zip(GROUP_Q, GROUP_K)):
        lse = jnp.full((hq, MAX_Q), -jnp.inf, jnp.float32)
        if sq and sk:
            qb, kb, vb = (x[c[b]:c[b + 1]][None] for x, c in ((q, cq), (k, ck), (v, ck)))
            bb = None if bias is None else jnp.broadcast_to(bias, (len(GROUP_Q), hq, MAX_Q, MAX_K))[b:b + 1, :, :sq, :sk]
            o, l_ = _ref(qb, kb, vb, causal=causal, window=(-1, -1), layout="bshd", slopes=None, bias=bb, with_lse=True)
            outs.append(o[0])
            lse = lse.at[:, :sq].set(l_[0])
        else:
            outs.append(jnp.zeros((sq, hq, v.shape[-1]), jnp.float32))
        lses.append(lse)
    return jnp.concatenate(outs), jnp.stack(lses)


@pytest.mark.parametrize("with_bias", [False, True], ids=["plain", "bias"])
def test_group_mode_matches_per_sequence_reference(with_bias):
    rng = np.random.default_rng(seed_for(f"jax-group-{with_bias}"))
    tq, tk, hq, hk, d = sum(GROUP_Q), sum(GROUP_K), 4, 2, 64
    q, k, v, w = (_rand(rng, sh, jnp.bfloat16) for sh in ((tq, hq, d), (tk, hk, d), (tk, hk, d), (tq, hq, d)))
    # bias [batch, 1, max_q, max_k] bf16: dBias is summed over the heads, 0 outside each sequence's corner
    bias = _rand(rng, (len(GROUP_Q), 1, MAX_Q, MAX_K), jnp.bfloat16) if with_bias else None
    cq, ck = jnp.asarray(_offsets(GROUP_Q)), jnp.asarray(_offsets(GROUP_K))
    kw = dict(layout="thd", causal=True, max_seqlen_q=MAX_Q, max_seqlen_k=MAX_K, deterministic=True)

    def fwd(q, k, v, bias, cq, ck, check=False):
        return attention_with_lse(q, k, v, bias=bias, cu_seqlens_q=cq, cu_seqlens_k=ck, check_cu_seqlens=check, **kw)

    def loss(q, k, v, bias, cq, ck, check=False):
        return (fwd(q, k, v, bias, cq, ck, check)[0].astype(jnp.float32) * w.astype(jnp.float32)).sum()

    def ref_loss(q, k, v, bias):
        return (_group_ref(q, k, v, bias, True)[0] * w.astype(jnp.float32)).sum()

    argnums = (0, 1, 2, 3) if with_bias else (0, 1, 2)
    o, lse = jax.jit(fwd)(q, k, v, bias, cq, ck)
    grads = jax.jit(jax.grad(loss, argnums=argnums))(q, k, v, bias, cq, ck)
    ref_o, ref_lse = _group_ref(q, k, v, bias, True)
    f32 = lambda x: None if x is None else x.astype(jnp.float32)  # noqa: E731
    ref_grads = jax.grad(ref_loss, argnums=argnums)(f32(q), f32(k), f32(v), f32(bias))
    names = ("dq", "dk", "dv", "dbias")
    _check_close([("o", o, ref_o)] + [(n, g, r) for n, g, r in zip(names, grads, ref_grads)], 2e-2)

    lse, ref_lse = np.asarray(lse), np.asarray(ref_lse)
    assert lse.shape == (len(GROUP_Q), hq, MAX_Q)
    assert np.array_equal(np.isinf(lse), np.isinf(ref_lse)), "lse: -inf beyond each sequence and for keyless rows"
    fin = np.isfinite(ref_lse)
    assert np.abs(lse[fin] - ref_lse[fin]).max() < 1e-3
    cq_h, ck_h = _offsets(GROUP_Q), _offsets(GROUP_K)
    assert not np.asarray(o[cq_h[3]:cq_h[4]]).any()  # the query rows without keys: exactly 0
    assert not np.asarray(grads[0][cq_h[3]:cq_h[4]]).any()
    assert not np.asarray(grads[1][ck_h[1]:ck_h[2]]).any() and not np.asarray(grads[2][ck_h[1]:ck_h[2]]).any()
    if with_bias:  # dbias outside every sequence's corner is 0
        db = np.asarray(grads[3].astype(jnp.float32))
        for b, (sq, sk) in enumerate(zip(GROUP_Q, GROUP_K)):
            assert not db[b, :, sq:, :].any() and not db[b, :, :, sk:].any()

    # the library's own check of the offsets (a host read) gives the same bits
    o2, lse2 = jax.jit(functools.partial(fwd, check=True))(q, k, v, bias, cq, ck)
    assert _same_bits((o, lse), (o2, lse2))
    grads2 = jax.jit(jax.grad(functools.partial(loss, check=True), argnums=argnums))(q, k, v, bias, cq, ck)
    assert _same_bits(grads, grads2)


# --------------------------------------------------------------------------- bias and dBias

BIAS_CASES = {
    # id: (bias shape, bias dtype) on q [2, 150, 4, 64], k/v [2, seqlen_k = the bias's last dim, 2, 64], bshd, fp16
    "f32-1hqk": ((1, 4, 150, 190), jnp.float32),
    "bf16-qk": ((150, 190), jnp.bfloat16),
    "f16-b1qk": ((2, 1, 150, 190), jnp.float16),
    # broadcast along nothing: dS straight into XLA's dBias buffer, element by element (190 keys) or,
    # with rows of a 16-byte multiple, by the ws kernel's TMA store
    "f16-bhqk": ((2, 4, 150, 190), jnp.float16),
    "f16-bhqk-192": ((2, 4, 150, 192), jnp.float16),
}


@pytest.mark.parametrize("case", list(BIAS_CASES))
def test_bias_and_dbias_match_reference(case):
    shape, bdt = BIAS_CASES[case]
    rng = np.random.default_rng(seed_for(f"jax-bias-{case}"))
    sk = shape[-1]
    q, k, v = (_rand(rng, sh, jnp.float16) for sh in ((2, 150, 4, 64), (2, sk, 2, 64), (2, sk, 2, 64)))
    w = _rand(rng, (2, 150, 4, 64), jnp.float32)
    bias = _rand(rng, shape, bdt, scale=2.0)
    kw = dict(causal=True, layout="bshd")

    def loss(q, k, v, bias):
        return (attention(q, k, v, bias=bias, **kw).astype(jnp.float32) * w).sum()

    def ref_loss(q, k, v, bias):
        return (_ref(q, k, v, window=(-1, -1), slopes=None, bias=bias, **kw) * w).sum()

    o = jax.jit(lambda q, k, v, b: attention(q, k, v, bias=b, **kw))(q, k, v, bias)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(q, k, v, bias)
    assert grads[3].shape == shape and grads[3].dtype == bdt
    up = [x.astype(jnp.float32) for x in (q, k, v, bias)]
    ref_o = _ref(*up[:3], window=(-1, -1), slopes=None, bias=up[3], **kw)
    ref_grads = jax.grad(ref_loss, argnums=(0, 1, 2, 3))(*up)
    tol = 2e-2 if bdt == jnp.bfloat16 else 1e-2
    _check_close([("o", o, ref_o)] + list(zip(("dq", "dk", "dv", "dbias"), grads, ref_grads)), tol)
    # without dBias (bias outside argnums) the other gradients agree
    dq_only = jax.jit(jax.grad(loss))(q, k, v, bias)
    assert _rel_err(dq_only, np.asarray(grads[0].astype(jnp.float32))) < 1e-2


# --------------------------------------------------------------------------- dropout


def _dropout_inputs():
    rng = np.random.default_rng(seed_for("jax-dropout"))
    q, k, v = (_rand(rng, sh, jnp.bfloat16) for sh in ((2, 130, 4, 64), (2, 170, 2, 64), (2, 170, 2, 64)))
    return q, k, v, _rand(rng, (2, 130, 4, 64), jnp.float32)


def test_dropout_key_is_the_static_seed_offset_it_stands_for_and_deterministic():
    q, k, v, w = _dropout_inputs()
    key = jax.random.key(2024)
    seed, offset = dropout_seed_offset(key)

    def loss(q, k, v, key, seed=0, offset=0):
        return (attention(q, k, v, dropout_p=0.3, dropout_key=key, seed=seed, offset=offset, causal=True,
                          deterministic=True).astype(jnp.float32) * w).sum()

    def out(q, k, v, key, seed=0, offset=0):
        return attention(q, k, v, dropout_p=0.3, dropout_key=key, seed=seed, offset=offset, causal=True)

    o_key, o_seed = jax.jit(out)(q, k, v, key), jax.jit(lambda q, k, v: out(q, k, v, None, seed, offset))(q, k, v)
    assert _same_bits([o_key], [o_seed])
    g_key = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    g_seed = jax.jit(jax.grad(lambda q, k, v: loss(q, k, v, None, seed, offset), argnums=(0, 1, 2)))
    g1 = g_key(q, k, v, key)
    assert _same_bits(g1, g_seed(q, k, v))  # the backward regenerated the forward's mask from the same words
    assert _same_bits(g1, g_key(q, k, v, key)) and _same_bits([o_key], [jax.jit(out)(q, k, v, key)])
    assert not _same_bits([o_key], [jax.jit(out)(q, k, v, jax.random.key(2025))])  # another key, another mask
    # dropout really happened: the undropped output differs
    assert not _same_bits([o_key], [jax.jit(lambda q, k, v: attention(q, k, v, causal=True))(q, k, v)])


def test_dropout_matches_reference_keep_mask():
    q, k, v, w = _dropout_inputs()
    p, key = 0.25, jax.random.key(7)
    seed, offset = dropout_seed_offset(key)
    # the library's NumPy oracle gives the keep mask bit for bit (cupy_fmha.philox)
    _, _, keep = reference.attention_forward(*(np.asarray(x) for x in (q, k, v)), causal=True, dropout_p=p, seed=seed,
                                             offset=offset, return_dropout_mask=True)
    assert 0.6 < keep.mean() < 0.9

    def loss(q, k, v):
        return (attention(q, k, v, causal=True, dropout_p=p, dropout_key=key).astype(jnp.float32) * w).sum()

    def ref_loss(q, k, v):
        return (_ref(q, k, v, causal=True, window=(-1, -1), layout="bshd", slopes=None, keep=keep,
                     dropout_p=p) * w).sum()

    o = jax.jit(lambda q, k, v: attention(q, k, v, causal=True, dropout_p=p, dropout_key=key))(q, k, v)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    up = [x.astype(jnp.float32) for x in (q, k, v)]
    ref_o = _ref(*up, causal=True, window=(-1, -1), layout="bshd", slopes=None, keep=keep, dropout_p=p)
    ref_grads = jax.grad(ref_loss, argnums=(0, 1, 2))(*up)
    _check_close([("o", o, ref_o)] + list(zip(("dq", "dk", "dv"), grads, ref_grads)), 2e-2)


# --------------------------------------------------------------------------- vmap


def test_vmap_equals_one_call_per_element():
    rng = np.random.default_rng(seed_for("jax-vmap"))
    q, k, v = (_rand(rng, (3, 1, 90, 2, 64), jnp.float16) for _ in range(3))
    keys = jax.random.split(jax.random.key(5), 3)
    f = lambda q, k, v, key: attention(q, k, v, causal=True, dropout_p=0.1, dropout_key=key)  # noqa: E731
    batched = jax.jit(jax.vmap(f))(q, k, v, keys)
    for i in range(3):
        assert np.array_equal(_bits(batched[i]), _bits(jax.jit(f)(q[i], k[i], v[i], keys[i])))
    g = jax.jit(jax.vmap(jax.grad(lambda q, k, v, key: f(q, k, v, key).astype(jnp.float32).sum())))(q, k, v, keys)
    g0 = jax.jit(jax.grad(lambda q, k, v, key: f(q, k, v, key).astype(jnp.float32).sum()))(q[0], k[0], v[0], keys[0])
    assert g.shape == q.shape and _rel_err(g[0], np.asarray(g0.astype(jnp.float32))) < 1e-2


# --------------------------------------------------------------------------- last: an error inside a callback


def test_last_group_mode_checked_offsets_raise_at_run_time():
    rng = np.random.default_rng(seed_for("jax-group-bad"))
    q = _rand(rng, (20, 2, 64), jnp.float16)
    bad = jnp.asarray(np.array([0, 12, 8, 20], np.int32))  # decreasing
    f = jax.jit(lambda q, c: attention(q, q, q, layout="thd", cu_seqlens_q=c, cu_seqlens_k=c, max_seqlen_q=12,
                                       max_seqlen_k=12, check_cu_seqlens=True))
    # the library's ValueError, raised inside the callback, reaches the caller through XLA
    with pytest.raises(Exception, match="cu_seqlens_q"):
        jax.block_until_ready(f(q, bad))

"""cupy_fmha.jax's callbacks at run time, on the CPU: the callbacks that a trace hands to
``buffer_callback`` are called with stand-ins for XLA's buffers (NumPy arrays with a
``__cuda_array_interface__``) and CuPy (tests/fake_cupy.py), which records the launches.

* a callback plans once per static key and device: later calls, and later traces with the same
  shapes and options (which get the same callback), plan nothing; different shapes or options
  get their own callback and plan;
* the launches of a call with the cached plan, second call included, are those of the library's
  general path (``plan_forward`` / ``plan_backward`` on the same arrays, then ``_run_forward`` /
  ``_run_backward``): kernels, grid, block, shared memory, every parameter (addresses mapped to
  the buffers they point at), and the TMA maps' bytes, for masks, GQA, both layouts, ALiBi,
  bias and dBias, dropout from key words, deterministic, group mode, and both GPU families;
* XLA's stream becomes a CuPy stream once per handle, without the deprecation warning;
* ``check_cu_seqlens=True`` checks the real offsets in every call (the named error), and a
  misaligned buffer takes the general path;
* a loss of lse: the backward callback's extra operand ``dlse`` (lse's cotangent) is subtracted
  from D before dq_dk_dv on both paths, and on the CPU backend it is XLA's cotangent buffer;
* on JAX's CPU backend a jitted gradient runs its two callbacks for real (with host addresses).
Skipped without JAX."""

from __future__ import annotations

import dataclasses
import hashlib
import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import fake_cupy as F  # noqa: E402
from cupy_fmha import api  # noqa: E402
from cupy_fmha import jax as fj  # noqa: E402
from cupy_fmha.backends import tma  # noqa: E402


#: buffer addresses -> names, for tests comparing maps across calls: a map of an address not in
#: here (a fresh copy, e.g. the padded bias the ws forward's TMA reads) is encoded as "workspace"
_KNOWN: dict = {}


def _encode(args) -> np.ndarray:
    """A stand-in tensor map: 128 bytes that differ when the encoding's arguments differ."""
    if _KNOWN:
        args = dataclasses.replace(args, address=_KNOWN.get(args.address, "workspace"))
    digest = hashlib.sha256(repr(args).encode()).digest()
    return np.frombuffer(digest * 4, np.dtype((np.void, 128))).copy()


@pytest.fixture(params=["90", "80"])
def env(request, monkeypatch):
    """The stand-in CuPy for compute capability 9.0 or 8.0, a recorder for the launches, counted
    plans; caches that could hold another test's stand-ins are emptied."""
    cp = F.fake_cupy(request.param)
    monkeypatch.setattr(api, "_cupy", lambda: cp)
    monkeypatch.setattr(api, "_CC", {})
    monkeypatch.delenv("CUPY_FMHA_DISABLE_WGMMA", raising=False)
    rec = F.Recorder(hook=_fill_ds)
    monkeypatch.setattr(api, "get_function", rec)
    monkeypatch.setattr(tma, "encode_tile_map", _encode)
    _KNOWN.clear()
    api._tile_map.cache_clear()
    api._bias_map_cached.cache_clear()
    monkeypatch.setattr(api, "_BY_VALUE", {})
    monkeypatch.setattr(fj, "_CALLBACKS", {})
    monkeypatch.setattr(fj, "_STREAMS", {})
    counts = {"fwd": 0, "bwd": 0}

    def counted(kind, fn):
        def plan(*a, **kw):
            if kw["cc"] is not fj._never_device:  # run-time plans only, not the trace's checks
                counts[kind] += 1
            return fn(*a, **kw)
        return plan

    monkeypatch.setattr(fj, "plan_forward", counted("fwd", fj.plan_forward))
    monkeypatch.setattr(fj, "plan_backward", counted("bwd", fj.plan_backward))
    return dict(cp=cp, rec=rec, counts=counts, cc=int(request.param))


def _fill_ds(launch):
    """Acts as dq_dk_dv for dBias: the dS workspace gets values that depend on the position."""
    ds = launch["args"].get("dbias_acc")
    if isinstance(ds, np.ndarray) and ds.ndim == 4:
        ds[...] = np.arange(ds.size, dtype=np.float32).reshape(ds.shape) % 7 - 3


class Buf:
    """One of XLA's buffers as a callback sees it: an address (``__cuda_array_interface__``) and
    a device, over a stand-in device array."""

    def __init__(self, a):
        self.a = a

    @property
    def __cuda_array_interface__(self):
        return {"data": (self.a.__array_interface__["data"][0], False), "shape": self.a.shape,
                "typestr": self.a.dtype.str, "version": 2}

    def __dlpack_device__(self):
        return (2, 0)


class Ctx:
    stream = 0x5151


def _spec(shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


def _callbacks(fn, *args):
    """The callbacks of ``fn``'s buffer_callback equations, in trace order."""
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "buffer_callback":
                found.append(eqn.params["callback"])
            for value in eqn.params.values():
                for sub in value if isinstance(value, (tuple, list)) else (value,):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


# --------------------------------------------------------------------------- the cases

CU_Q, CU_K = np.array([0, 29, 29, 50], np.int32), np.array([0, 0, 40, 70], np.int32)
WORDS = np.array([0x11, 0x22, 0x33, 0x44], np.uint32)

#: id -> (operand specs, attention keywords, argnums differentiated, values of the int operands)
CASES = {
    "bshd-causal-gqa-bf16": (dict(q=_spec((2, 37, 4, 64)), k=_spec((2, 53, 2, 64)), v=_spec((2, 53, 2, 64))),
                             dict(causal=True), (0, 1, 2)),
    "bhsd-window-alibi-f16": (dict(q=_spec((1, 4, 40, 64), jnp.float16), k=_spec((1, 2, 40, 64), jnp.float16),
                                   v=_spec((1, 2, 40, 32), jnp.float16), alibi_slopes=_spec((4,), jnp.float32)),
                              dict(layout="bhsd", window_size=(8, 4)), (0, 1, 2)),
    "bias-dbias": (dict(q=_spec((2, 30, 2, 64)), k=_spec((2, 30, 2, 64)), v=_spec((2, 30, 2, 64)),
                        bias=_spec((2, 1, 30, 30), jnp.float32)), dict(causal=True), (0, 1, 2, 3)),
    # a bias that broadcasts along nothing: dS goes straight into XLA's dBias buffer (no workspace)
    "full-bias-dbias": (dict(q=_spec((2, 30, 2, 64)), k=_spec((2, 32, 2, 64)), v=_spec((2, 32, 2, 64)),
                             bias=_spec((2, 2, 30, 32))), dict(causal=True), (0, 1, 2, 3)),
    "bias-not-differentiated": (dict(q=_spec((1, 30, 2, 64)), k=_spec((1, 30, 2, 64)), v=_spec((1, 30, 2, 64)),
                                     bias=_spec((30, 30), jnp.bfloat16)), dict(), (0, 1, 2)),
    "dropout-key-deterministic": (dict(q=_spec((1, 64, 2, 128)), k=_spec((1, 64, 2, 128)), v=_spec((1, 64, 2, 128))),
                                  dict(dropout_p=0.2, dropout_key=True, deterministic=True), (0, 1, 2)),
    "static-seed-deterministic": (dict(q=_spec((1, 64, 2, 128)), k=_spec((1, 64, 2, 128)),
                                       v=_spec((1, 64, 2, 128))),
                                  dict(dropout_p=0.1, seed=5, offset=9, deterministic=True), (0, 1, 2)),
    "group-bias": (dict(q=_spec((50, 4, 64)), k=_spec((70, 2, 64)), v=_spec((70, 2, 64)),
                        bias=_spec((3, 1, 30, 40), jnp.float32), cu_seqlens_q=_spec((4,), jnp.int32),
                        cu_seqlens_k=_spec((4,), jnp.int32)),
                   dict(layout="thd", max_seqlen_q=30, max_seqlen_k=40, causal=True), (0, 1, 2, 3)),
}


def _loss(names, kw):
    def f(*arrays):
        a = dict(zip(names, arrays))
        extra = dict(kw)
        if extra.pop("dropout_key", False):
            extra["dropout_key"] = jax.random.key(0)
        o = fj.attention(a.pop("q"), a.pop("k"), a.pop("v"), **a, **extra)
        return o.astype(jnp.float32).sum()
    return f


def _trace(case):
    specs, kw, argnums = CASES[case]
    names = tuple(specs)
    fwd, bwd = _callbacks(jax.grad(_loss(names, kw), argnums=argnums), *specs.values())
    return fwd, bwd


def _arrays(cbs) -> dict:
    """Stand-in device arrays for every operand and result of the two callbacks (random values;
    the offsets and dropout words fixed)."""
    rng = np.random.default_rng(0)
    out = {}
    fwd, bwd = cbs
    named = [*fwd.avals.items(), *zip(("o", "lse"), fwd.outs), *bwd.avals.items(),
             *zip(("dq", "dk", "dv", "dbias"), bwd.outs)]
    for name, aval in named:
        if name in out:
            continue
        if name == "cu_seqlens_q":
            a = CU_Q
        elif name == "cu_seqlens_k":
            a = CU_K
        elif name == "dropout_words":
            a = WORDS
        else:
            a = rng.standard_normal(aval.shape).astype(aval.dtype)
        out[name] = F._fake(np.array(a))
    return out


def _call(cb, arrays, results):
    cb(Ctx(), [Buf(arrays[n]) for n in results], *[Buf(arrays[n]) for n in cb.names])


def _fresh(env, cbs, arrays):
    """The library's general path on the same arrays: a plan made now from the real arrays (and
    offsets, and the seed and offset the words give), then _run_forward / _run_backward."""
    fwd, bwd = cbs
    a = arrays
    seed = offset = None
    if "dropout_words" in fwd.names:
        w = [int(x) for x in WORDS]
        seed, offset = w[0] | (w[1] << 32), w[2] | (w[3] << 32)
    cu = (a.get("cu_seqlens_q"), a.get("cu_seqlens_k"))
    kw = fwd.opts.kw(seed, offset, cu)
    cc = lambda: env["cc"]  # noqa: E731
    bias, slopes = a.get("bias"), a.get("alibi_slopes")
    plan = fj.plan_forward(a["q"], a["k"], a["v"], bias=bias, alibi_slopes=slopes, cc=cc, return_dropout_mask=False,
                           **kw)
    api._run_forward(plan, a["q"], a["k"], a["v"], bias, slopes, (a["o"], a["lse"]), *cu)
    arrays6 = [a[n] for n in ("do", "q", "k", "v", "o", "lse")]
    plan = fj.plan_backward(*arrays6, bias=bias, alibi_slopes=slopes, cc=cc, return_dbias=bwd.want_dbias,
                            deterministic=fwd.opts.deterministic, **kw)
    return api._run_backward(plan, *arrays6, bias, slopes, (a["dq"], a["dk"], a["dv"]), *cu)


def _normal(launches, arrays) -> list:
    """Launches with every address replaced by the name of the buffer it points at (workspaces,
    fresh per call, by their shape and dtype)."""
    names = {x.__array_interface__["data"][0]: n for n, x in arrays.items() if x.size}
    out = []
    for la in launches:
        args = {}
        for key, val in la["args"].items():
            if isinstance(val, np.ndarray) and val.shape != ():
                addr = val.__array_interface__["data"][0]
                args[key] = names.get(addr, ("workspace", val.shape, str(val.dtype)))
            else:
                args[key] = np.asarray(val).item()
        out.append((la["spec"], tuple(la["grid"]), tuple(la["block"]), la["smem"], la["maps"], la["map_bytes"], args))
    return out


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("case", list(CASES))
def test_cached_plan_launches_what_a_fresh_plan_launches(env, case, monkeypatch):
    cbs = _trace(case)
    fwd, bwd = cbs
    arrays = _arrays(cbs)
    _KNOWN.clear()
    _KNOWN.update({x.__array_interface__["data"][0]: n for n, x in arrays.items() if x.size})
    rec = env["rec"]
    reduce_calls = []
    real_reduce = fj.reduce_dbias
    monkeypatch.setattr(fj, "reduce_dbias", lambda *a: (reduce_calls.append(1), real_reduce(*a))[1])
    for _ in range(2):  # the first call plans, the second uses the cached plan and maps
        rec.launches.clear()
        _call(fwd, arrays, ("o", "lse"))
        _call(bwd, arrays, ("dq", "dk", "dv", "dbias")[:len(bwd.outs)])
        got = _normal(rec.launches, arrays)
        dbias = np.array(arrays["dbias"]) if bwd.want_dbias else None
    assert env["counts"] == {"fwd": 1, "bwd": 1} and fwd.plans == 1 and bwd.plans == 1
    rec.launches.clear()
    direct = case == "full-bias-dbias"
    if direct:  # the general path stores dBias into a fresh array: here into XLA's buffer, as the callback does
        real = api._direct_dbias
        monkeypatch.setattr(api, "_direct_dbias", lambda cp, plan, bias: real(cp, plan, bias, into=arrays["dbias"]))
    g = _fresh(env, cbs, arrays)
    want = _normal(rec.launches, arrays)
    assert len(got) == len(want) >= 4
    for x, y in zip(got, want):
        assert x == y
    (main,) = [la for la in got if la[0].source.startswith("fmha_bwd_dq_dk_dv")]
    if direct:  # dBias is XLA's buffer itself: its address, or (the ws kernel's TMA store) its map
        assert g.dbias is arrays["dbias"] and len(reduce_calls) == 0
        if env["cc"] == 90:  # the ws backward's BIAS build: dBias through its 6th map
            assert main[-1]["bias_ds_kind"] == api.DS_KIND_TMA and main[-1]["dbias_acc"] == 0
        else:
            assert main[-1]["dbias_acc"] == "dbias" and main[-1]["bias_ds_kind"] == 2
    elif bwd.want_dbias:  # reduced from the same dS and copied into XLA's buffer
        assert np.array_equal(dbias, np.asarray(g.dbias)) and np.abs(dbias).sum() > 0
    if "dropout_words" in fwd.names:  # the words became the seed and offset of both passes
        assert got[0][-1]["dropout_seed"] == 0x22_00000011 and got[0][-1]["dropout_offset"] == 0x44_00000033


def test_equal_traces_share_a_callback_and_plan_once(env):
    specs, kw, argnums = CASES["bshd-causal-gqa-bf16"]
    f = jax.grad(_loss(tuple(specs), kw), argnums=argnums)
    first, second = _callbacks(f, *specs.values()), _callbacks(jax.jit(f), *specs.values())
    assert first[0] is second[0] and first[1] is second[1]
    arrays = _arrays(first)
    for _ in range(3):
        _call(second[0], arrays, ("o", "lse"))
    assert env["counts"]["fwd"] == 1 and first[0].plans == 1


def test_different_shapes_or_options_do_not_share_a_plan(env):
    seen = []
    for sq, causal in ((37, True), (250, True), (37, False)):  # (250: more row blocks than 37 at any BLOCK_M <= 192)
        q = _spec((2, sq, 4, 64))
        (fwd,) = _callbacks(lambda q, k, v: fj.attention(q, k, v, causal=causal), q, _spec((2, 53, 2, 64)),
                            _spec((2, 53, 2, 64)))
        arrays = _arrays((fwd, fwd))
        env["rec"].launches.clear()
        _call(fwd, arrays, ("o", "lse"))
        (launch,) = env["rec"].launches
        seen.append((fwd, (launch["grid"], launch["args"]["seqlen_q"]), launch["args"]["mask_win_x"]))
    (a, ga, xa), (b, gb, _), (c, _, xc) = seen
    assert len({id(a), id(b), id(c)}) == 3 and env["counts"]["fwd"] == 3
    assert a.plans == b.plans == c.plans == 1
    assert ga[1] == 37 and gb[1] == 250 and ga[0] != gb[0]  # 37 vs 250 query rows: a plan of its own
    assert xa != xc  # causal or not


def test_stream_is_made_once_per_handle_without_a_warning(env):
    fwd, bwd = _trace("bshd-causal-gqa-bf16")
    arrays = _arrays((fwd, bwd))
    before = F.FakeStream.entered
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            _call(fwd, arrays, ("o", "lse"))
            _call(bwd, arrays, ("dq", "dk", "dv"))
    assert F.FakeStream.entered - before == 6  # every call runs on XLA's stream
    assert list(fj._STREAMS) == [Ctx.stream] and fj._STREAMS[Ctx.stream].ptr == Ctx.stream


def test_check_cu_seqlens_checks_the_real_offsets_in_every_call(env):
    specs, kw, _ = CASES["group-bias"]
    names = tuple(specs)
    (fwd,) = _callbacks(lambda *x: fj.attention(*x[:3], **dict(zip(names[3:], x[3:])), **kw, check_cu_seqlens=True),
                        *specs.values())
    arrays = _arrays((fwd, fwd))
    for _ in range(2):
        _call(fwd, arrays, ("o", "lse"))
    assert env["counts"]["fwd"] == 2 and fwd.plans == 0  # the library plans (and reads the offsets) each time
    arrays["cu_seqlens_q"][1:3] = 31  # a sequence longer than max_seqlen_q
    with pytest.raises(ValueError, match="max_seqlen_q: 30 is less than the longest sequence"):
        _call(fwd, arrays, ("o", "lse"))


def test_misaligned_input_takes_the_general_path(env):
    fwd, bwd = _trace("bshd-causal-gqa-bf16")
    arrays = _arrays((fwd, bwd))
    raw = F._fake(np.zeros(arrays["q"].nbytes + 16, np.uint8))
    base = raw.__array_interface__["data"][0]
    shift = (16 - base % 16) % 16 + 8  # 8 bytes past a 16-byte boundary
    q = raw[shift:shift + arrays["q"].nbytes].view(arrays["q"].dtype).reshape(arrays["q"].shape).view(F.FakeArray)
    q[...] = arrays["q"]
    arrays["q"] = F._fake(q)
    _call(fwd, arrays, ("o", "lse"))
    (launch,) = env["rec"].launches
    assert env["counts"]["fwd"] == 2  # the cached plan (bind), then the general path's
    assert isinstance(launch["args"]["q"], np.ndarray) and launch["args"]["q"] is not arrays["q"]  # a copy
    assert np.array_equal(np.asarray(launch["args"]["q"]), np.asarray(arrays["q"]))


def test_jitted_gradient_runs_both_callbacks_on_the_cpu_backend(env, monkeypatch):
    """XLA's own buffers on the CPU backend (host addresses), the jitted program calling the
    callbacks: buffers arrive in the order the callbacks name them."""
    monkeypatch.setattr(fj, "_address", lambda b: np.asarray(b).__array_interface__["data"][0])
    monkeypatch.setattr(fj, "_stream_handle", lambda ctx: 0)
    monkeypatch.setattr(F, "decode_params", lambda params: {})  # XLA's buffers are not the stand-in's arrays
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.standard_normal((1, 32, 2, 64)), jnp.bfloat16) for _ in range(3))
    grad = jax.jit(jax.grad(lambda q, k, v: fj.attention(q, k, v, causal=True).astype(jnp.float32).sum(),
                            argnums=(0, 1, 2)))
    for _ in range(3):
        jax.block_until_ready(grad(q, k, v))
    kinds = [la["spec"].source for la in env["rec"].launches]
    assert len(kinds) == 3 * 4 and kinds[0].startswith("fmha_fwd") and kinds[1] == "fmha_bwd_dot_do_o"
    assert env["counts"] == {"fwd": 1, "bwd": 1}


def test_address_falls_back_to_the_dlpack_capsule():
    """Where ``__cuda_array_interface__`` is refused (a jaxlib without a typestr for the dtype),
    the address comes from the DLPack capsule: data plus byte offset."""
    base = np.zeros(64, np.float32)
    view = base[8:]  # a view: the capsule's data or byte offset carries the 32 bytes

    class NoInterface:
        def __init__(self, a):
            self.a = a

        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("Unimplemented primitive type BF16")

        def __dlpack__(self, **kw):
            return self.a.__dlpack__()

    for a in (base, view):
        assert fj._address(NoInterface(a)) == a.__array_interface__["data"][0]
    assert fj._address(Buf(F._fake(view))) == view.__array_interface__["data"][0]


@pytest.mark.parametrize("layout", ["bshd", "thd"])
def test_lse_cotangent_is_subtracted_from_d_on_both_paths(env, layout):
    """A loss of o and lse: the backward callback gets lse's cotangent as its last operand, dlse,
    and D - dlse reaches dq_dk_dv, with the cached plan (twice) and on the library's general path;
    both paths launch the same kernels with the same parameters, and dlse's buffer is not written."""
    if layout == "thd":
        specs = dict(q=_spec((50, 4, 64)), k=_spec((70, 2, 64)), v=_spec((70, 2, 64)),
                     cu_seqlens_q=_spec((4,), jnp.int32), cu_seqlens_k=_spec((4,), jnp.int32))
        kw = dict(layout="thd", max_seqlen_q=30, max_seqlen_k=40, causal=True)
        lse_shape = (3, 4, 30)
    else:
        specs = dict(q=_spec((2, 37, 4, 64)), k=_spec((2, 53, 2, 64)), v=_spec((2, 53, 2, 64)))
        kw = dict(causal=True)
        lse_shape = (2, 4, 37)
    names = tuple(specs)

    def loss(*arrays):
        a = dict(zip(names, arrays))
        o, lse = fj.attention_with_lse(a.pop("q"), a.pop("k"), a.pop("v"), **a, **kw)
        return o.astype(jnp.float32).sum() + jnp.where(jnp.isfinite(lse), lse * lse, 0.0).sum()

    fwd, bwd = _callbacks(jax.grad(loss, argnums=(0, 1, 2)), *specs.values())
    assert bwd.names[-1] == "dlse" and bwd.avals["dlse"].shape == lse_shape
    assert bwd.avals["dlse"].dtype == np.float32
    arrays = _arrays((fwd, bwd))
    dlse_before = np.array(arrays["dlse"])
    seen: list = []
    rec = env["rec"]
    rec.hook = F.delta_hook(seen)
    results = ("dq", "dk", "dv")
    for _ in range(2):  # planning, then the cached plan
        rec.launches.clear()
        _call(bwd, arrays, results)
    fast = _normal(rec.launches, arrays)
    rec.launches.clear()
    bwd._general(env["cp"], [Buf(arrays[n]) for n in results], [Buf(arrays[n]) for n in bwd.names])
    general = _normal(rec.launches, arrays)
    assert fast == general and len(fast) >= 3
    assert len(seen) == 3
    for s in seen:
        np.testing.assert_array_equal(s["main"], F.delta_pattern(lse_shape) - dlse_before)
    np.testing.assert_array_equal(np.asarray(arrays["dlse"]), dlse_before)


def test_jitted_gradient_through_lse_hands_its_cotangent_to_the_backward(env, monkeypatch):
    """On JAX's CPU backend (XLA's own buffers): the backward callback's dlse operand is lse's
    cotangent, here the constant weights of sum(lse * w); without lse in the loss, none."""
    monkeypatch.setattr(fj, "_address", lambda b: np.asarray(b).__array_interface__["data"][0])
    monkeypatch.setattr(fj, "_stream_handle", lambda ctx: 0)
    monkeypatch.setattr(F, "decode_params", lambda params: {})  # XLA's buffers are not the stand-in's arrays
    got = []
    real = api._launch_backward
    monkeypatch.setattr(api, "_launch_backward", lambda *a, **kw: (got.append(
        None if kw.get("dlse") is None else np.array(kw["dlse"])), real(*a, **kw))[1])
    rng = np.random.default_rng(2)
    q, k, v = (jnp.asarray(rng.standard_normal((1, 32, 2, 64)), jnp.bfloat16) for _ in range(3))
    w = jnp.asarray(rng.standard_normal((1, 2, 32)), jnp.float32)

    def loss(q, k, v, w):
        o, lse = fj.attention_with_lse(q, k, v, causal=True)
        return o.astype(jnp.float32).sum() + (lse * w).sum()

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    for _ in range(2):
        jax.block_until_ready(grad(q, k, v, w))
    assert len(got) == 2 and all(g is not None for g in got)
    for g in got:
        np.testing.assert_array_equal(g, np.asarray(w))
    got.clear()
    jax.block_until_ready(jax.jit(jax.grad(lambda q, k, v: fj.attention(q, k, v).astype(jnp.float32).sum()))(q, k, v))
    assert got == [None]

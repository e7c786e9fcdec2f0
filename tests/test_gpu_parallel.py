"""Ring attention (cupy_fmha.parallel) on the GPU.

* A LocalRing of 2, 3 or 4 ranks on one GPU (every rank's shards in this process, K/V and dK/dV
  moving by device copies on each rank's communication stream) against one-shot
  ``attention_forward`` / ``attention_backward`` of the whole problem and against the float64
  reference by the project's rule (:func:`cupy_fmha.verify.compare`: error within twice that of a
  plain same-precision implementation): causal and not, sliding windows, GQA/MQA, bf16 and fp16,
  both layouts, both schemes, chunks of 200 tokens (not a multiple of any tile).
* The backward with lse's cotangent (``dlse``, sharded as lse) against one-shot
  ``attention_backward(..., dlse=)`` and the float64 reference with the same dlse.
* A ring of size 1 equals one-shot attention value for value (deterministic backward), through a
  LocalRing and through a 1-rank NCCL communicator; NCCL's send/recv to itself.
* The inputs are left untouched, timelines are recorded, CuPy-specific errors name the argument.
* Two GPUs over NCCL (:func:`cupy_fmha.parallel.run.launch`): skipped with fewer than 2 GPUs.

Every test is marked ``gpu`` and skipped without CuPy or a device (conftest.py).
"""

from __future__ import annotations

import types

import numpy as np
import pytest

try:
    import cupy as cp
except Exception:  # pragma: no cover - no CuPy at all
    cp = None

import cupy_fmha
from conftest import BF16, F16, Inputs, assert_close, reference_outputs, seed_for
from cupy_fmha.parallel import (
    LocalRing,
    NcclRing,
    Timeline,
    local_ring_attention_backward,
    local_ring_attention_forward,
    nccl_available,
    nccl_unique_id,
    ring_attention_backward,
    ring_attention_forward,
    shard,
    unshard,
)
from cupy_fmha import reference as R
from cupy_fmha.verify import compare, rel_limit

pytestmark = pytest.mark.gpu

CHUNK = 200

# id: (ranks, dtype, layout, batch, nhead_q, nhead_k, hdim, mask kwargs, scheme)
CASES = {  # bf16 first (the bulk), two fp16 cases: each (dtype, hdim) is a kernel compile on a cold cache
    "n2-causal-bf16-gqa2": (2, BF16, "bshd", 1, 4, 2, 128, {"causal": True}, "zigzag"),
    "n4-causal-bf16": (4, BF16, "bshd", 1, 4, 4, 128, {"causal": True}, "zigzag"),
    "n4-none-bf16-bhsd": (4, BF16, "bhsd", 1, 4, 2, 128, {}, "zigzag"),
    "n2-window150,0-bf16": (2, BF16, "bshd", 1, 4, 2, 128, {"window_size": (150, 0)}, "zigzag"),
    "n4-window300,90-bf16": (4, BF16, "bshd", 1, 2, 2, 128, {"window_size": (300, 90)}, "zigzag"),
    "n4-causal-left500-bf16-gqa": (4, BF16, "bshd", 1, 4, 2, 128, {"causal": True, "window_size": (500, -1)}, "zigzag"),
    "n3-causal-fp16-contiguous": (3, F16, "bshd", 1, 4, 2, 128, {"causal": True}, "contiguous"),
    "n2-none-fp16-mqa-b2": (2, F16, "bshd", 2, 4, 1, 128, {}, "zigzag"),
}


def _inputs(case_id, n, dtype, layout, b, hq, hk, d, scheme):
    s = CHUNK * n * (2 if scheme == "zigzag" else 1)
    return Inputs(dtype, layout, b, s, s, hq, hk, d, d, seed_for("ring", case_id), bf16_bits=False)


def _axis(layout):
    return 1 if layout == "bshd" else 2


def _ring(inp, n, kw, scheme, **extra):
    """The local ring's forward and backward, unsharded: (o, lse, grads)."""
    ax = _axis(inp.layout)
    d = inp.dev
    sh = lambda x: [shard(x, r, n, scheme=scheme, axis=ax) for r in range(n)]  # noqa: E731
    rkw = dict(kw, layout=inp.layout, scheme=scheme)
    fw = local_ring_attention_forward(sh(d["q"]), sh(d["k"]), sh(d["v"]), **rkw)
    os_, lses = [f[0] for f in fw], [f[1] for f in fw]
    bw = local_ring_attention_backward(sh(d["do"]), sh(d["q"]), sh(d["k"]), sh(d["v"]), os_, lses, **rkw, **extra)
    o = unshard(os_, scheme=scheme, axis=ax)
    lse = unshard(lses, scheme=scheme, axis=2)
    g = [unshard([x[i] for x in bw], scheme=scheme, axis=ax) for i in range(3)]
    cp.cuda.get_current_stream().synchronize()
    return o, lse, types.SimpleNamespace(dq=g[0], dk=g[1], dv=g[2])


def _one_shot(inp, kw, deterministic=False, dlse=None):
    d = inp.dev
    o, lse = cupy_fmha.attention_forward(d["q"], d["k"], d["v"], layout=inp.layout, **kw)
    g = cupy_fmha.attention_backward(d["do"], d["q"], d["k"], d["v"], o, lse, layout=inp.layout,
                                     deterministic=deterministic, dlse=dlse, **kw)
    cp.cuda.get_current_stream().synchronize()
    return o, lse, g


def _same(a, b) -> bool:
    """Equal values, element for element, same dtype (16-bit values compared after an exact
    conversion to float32, so -0 equals +0: a merge with an empty partial may add +0 to -0)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(cp.array_equal(a.astype(cp.float32), b.astype(cp.float32)))


def _rel(a, b):
    a, b = cp.asnumpy(a).astype(np.float64), cp.asnumpy(b).astype(np.float64)
    fin = np.isfinite(b)
    den = np.linalg.norm(b[fin])
    return float(np.linalg.norm((a - b)[fin]) / (den if den > 0 else 1.0))


@pytest.mark.parametrize("case_id", list(CASES))
def test_local_ring_matches_one_shot(case_id):
    n, dtype, layout, b, hq, hk, d, kw, scheme = CASES[case_id]
    inp = _inputs(case_id, n, dtype, layout, b, hq, hk, d, scheme)
    o, lse, g = _ring(inp, n, kw, scheme)
    assert o.dtype == inp.dev["q"].dtype and lse.dtype == cp.float32
    assert g.dq.shape == inp.dev["q"].shape and g.dk.shape == inp.dev["k"].shape and g.dv.shape == inp.dev["v"].shape
    # the project's rule against the float64 reference (and the plain same-precision emulation)
    assert_close(inp, reference_outputs(inp, o, lse, g, kw))
    # and close to this library's one-GPU result
    one = _one_shot(inp, kw)
    limit = rel_limit(dtype, d, d)
    for name, a, ref in (("o", o, one[0]), ("lse", lse, one[1]), ("dq", g.dq, one[2].dq), ("dk", g.dk, one[2].dk),
                         ("dv", g.dv, one[2].dv)):
        assert _rel(a, ref) < limit, (name, _rel(a, ref))
    assert np.array_equal(np.isneginf(cp.asnumpy(lse)), np.isneginf(cp.asnumpy(one[1])))


DLSE_CASES = ["n2-causal-bf16-gqa2", "n4-none-bf16-bhsd", "n4-window300,90-bf16", "n3-causal-fp16-contiguous"]


@pytest.mark.parametrize("case_id", DLSE_CASES)
def test_local_ring_dlse_matches_one_shot(case_id):
    """lse's cotangent through the ring (every call over a row gets that row's dlse): the project's
    rule against the float64 reference with the same dlse, close to one-shot attention_backward
    with it, far from the reference without it (dq, dk); the caller's dlse untouched."""
    n, dtype, layout, b, hq, hk, d, kw, scheme = CASES[case_id]
    inp = _inputs(case_id, n, dtype, layout, b, hq, hk, d, scheme)
    s = inp.dev["q"].shape[_axis(layout)]
    host = (4.0 * np.random.default_rng(seed_for("ring dlse", case_id)).standard_normal((b, hq, s))).astype(np.float32)
    dlse = cp.asarray(host)
    shards = [shard(dlse, r, n, scheme=scheme, axis=2) for r in range(n)]
    o, lse, g = _ring(inp, n, kw, scheme, dlse=shards)
    assert bool((dlse == cp.asarray(host)).all()) and all(
        bool((x == shard(dlse, r, n, scheme=scheme, axis=2)).all()) for r, x in enumerate(shards))
    outs = reference_outputs(inp, o, lse, g, kw, dlse=host)
    assert_close(inp, outs)
    h = inp.host
    plain = R.attention_backward(h["do"], h["q"], h["k"], h["v"], **inp.reference_kw(kw))
    for name, i in (("dq", 0), ("dk", 1)):
        assert not compare(name, outs[name][0], plain[i], dtype=inp.dtype, hdim_q=d, hdim_v=d).ok, name
    one = _one_shot(inp, kw, dlse=dlse)
    limit = rel_limit(dtype, d, d)
    for name, a, ref in (("dq", g.dq, one[2].dq), ("dk", g.dk, one[2].dk), ("dv", g.dv, one[2].dv)):
        assert _rel(a, ref) < limit, (name, _rel(a, ref))


def test_ring_of_one_equals_one_shot():
    """One rank: one causal call over the whole (unpermuted) sequence, merged with nothing: the
    same values as one-shot attention (deterministic backward, so dQ has no atomics order)."""
    inp = Inputs(BF16, "bshd", 1, 2 * CHUNK, 2 * CHUNK, 4, 2, 128, 128, seed_for("ring1"), bf16_bits=False)
    kw = {"causal": True}
    o, lse, g = _ring(inp, 1, kw, "zigzag", deterministic=True)
    o1, lse1, g1 = _one_shot(inp, kw, deterministic=True)
    for a, b in ((o, o1), (lse, lse1), (g.dq, g1.dq), (g.dk, g1.dk), (g.dv, g1.dv)):
        assert _same(a, b)


def test_inputs_untouched_and_timelines():
    """Four ranks reuse the receive buffers; the caller's shards must not be written (compared
    value for value with copies). The timelines hold every step's compute and every transfer."""
    n = 4
    inp = _inputs("untouched", n, BF16, "bshd", 1, 4, 2, 128, "zigzag")
    d = inp.dev
    sh = lambda x: [shard(x, r, n) for r in range(n)]  # noqa: E731
    qs, ks, vs, dos = sh(d["q"]), sh(d["k"]), sh(d["v"]), sh(d["do"])
    keep = [x.copy() for x in qs + ks + vs + dos]
    tf, tb = [Timeline() for _ in range(n)], [Timeline() for _ in range(n)]
    fw = local_ring_attention_forward(qs, ks, vs, causal=True, timelines=tf)
    local_ring_attention_backward(dos, qs, ks, vs, [f[0] for f in fw], [f[1] for f in fw], causal=True, timelines=tb)
    cp.cuda.get_current_stream().synchronize()
    assert all(_same(a, b) for a, b in zip(qs + ks + vs + dos, keep))
    for t in tf:
        rows = t.summary()
        assert [r["step"] for r in rows if r["kind"] == "compute"] == list(range(n))
        assert sorted(r["step"] for r in rows if r["kind"] == "kv") == list(range(1, n))
        assert all(r["ms"] >= 0 for r in rows)
    for t in tb:
        assert sorted(r["step"] for r in t.summary() if r["kind"] == "dkv") == list(range(n))


def test_gpu_errors_name_the_argument():
    inp = _inputs("errors", 2, BF16, "bshd", 1, 2, 2, 128, "zigzag")
    d = inp.dev
    sh = lambda x: [shard(x, r, 2) for r in range(2)]  # noqa: E731
    with pytest.raises(TypeError, match="q: ring attention takes native"):
        local_ring_attention_forward([x.view(cp.uint16) for x in sh(d["q"])], [x.view(cp.uint16) for x in sh(d["k"])],
                                     [x.view(cp.uint16) for x in sh(d["v"])])
    with pytest.raises(ValueError, match="comm: a host"):
        local_ring_attention_forward(sh(d["q"]), sh(d["k"]), sh(d["v"]), ring=LocalRing(2))
    with pytest.raises(TypeError, match="k: a numpy"):
        local_ring_attention_forward(sh(d["q"]), [cp.asnumpy(x) for x in sh(d["k"])], sh(d["v"]))
    fw = local_ring_attention_forward(sh(d["q"]), sh(d["k"]), sh(d["v"]), causal=True)
    os_, lses = [f[0] for f in fw], [f[1] for f in fw]
    args = (sh(d["do"]), sh(d["q"]), sh(d["k"]), sh(d["v"]), os_, lses)
    for bad, exc, msg in (([cp.asnumpy(x) for x in lses], TypeError, "dlse: a numpy"),
                          ([x.astype(cp.float16) for x in lses], TypeError, "dlse: expected float32"),
                          ([x[:, :, :7] for x in lses], ValueError, "dlse: expected lse's shape")):
        with pytest.raises(exc, match=msg):
            local_ring_attention_backward(*args, causal=True, dlse=bad)


# --------------------------------------------------------------------------- NCCL


def _need_nccl():
    if not nccl_available():
        pytest.skip("cupy.cuda.nccl is not available (libnccl not found)")


def test_nccl_ring_of_one():
    """A 1-rank NCCL communicator: the ring never exchanges, and equals one-shot attention value
    for value (deterministic backward)."""
    _need_nccl()
    comm = NcclRing(1, 0, nccl_unique_id())
    try:
        inp = Inputs(BF16, "bshd", 2, 2 * CHUNK, 2 * CHUNK, 4, 1, 128, 128, seed_for("nccl1"), bf16_bits=False)
        d, kw = inp.dev, {"causal": True, "window_size": (123, -1)}
        o, lse = ring_attention_forward(d["q"], d["k"], d["v"], comm, **kw)
        g = ring_attention_backward(d["do"], d["q"], d["k"], d["v"], o, lse, comm, deterministic=True, **kw)
        o1, lse1, g1 = _one_shot(inp, kw, deterministic=True)
        for a, b in ((o, o1), (lse, lse1), (g[0], g1.dq), (g[1], g1.dk), (g[2], g1.dv)):
            assert _same(a, b)
    finally:
        comm.close()


def test_nccl_send_to_self():
    """NCCL point-to-point to one's own rank inside a group (what an exchange on a 1-rank
    communicator would do)."""
    _need_nccl()
    comm = NcclRing(1, 0, nccl_unique_id())
    try:
        a = cp.arange(1000, dtype=cp.float32)
        b = cp.zeros_like(a)
        ev = cp.cuda.Event()
        ev.record()
        comm.stream.wait_event(ev)
        comm.exchange([a], [b])
        comm.stream.synchronize()
        assert cp.array_equal(a, b)
    finally:
        comm.close()


@pytest.mark.parametrize("causal, hk", [(True, 2), (False, 4)])
def test_nccl_two_gpus(causal, hk):
    """Two processes, one GPU each, over NCCL: every rank's shards match one-GPU attention of the
    whole problem (computed on that rank's GPU)."""
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs 2 GPUs")
    _need_nccl()
    from cupy_fmha.parallel.run import RunConfig, launch, run_rank

    cfg = RunConfig(seqlen=4 * CHUNK * 2, batch=1, nhead=4, nhead_k=hk, hdim=128, dtype="bf16", causal=causal,
                    warmup=0, repeat=1, check=True).validate(2)
    res = launch(run_rank, 2, (cfg,), timeout=300)
    for r in res:
        assert all(v <= r["rel_limit"] for v in r["rel_err"].values()), r["rel_err"]
        assert len(r["timeline"]["fwd"]["compute_ms"]) == 2

"""Input checks (cupy_fmha.validate) with NumPy arrays: every error names its argument, and the
inputs are never modified."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from cupy_fmha.mask import MaskSpec
from cupy_fmha.validate import Problem, check_backward_inputs, check_forward_inputs

BF16 = ml_dtypes.bfloat16


def arrays(layout="bshd", b=2, sq=5, sk=7, hq=4, hk=2, d=16, dv=8, dtype=np.float16, seed=0):
    rng = np.random.default_rng(seed)

    def mk(s, h, n):
        shape = (b, s, h, n) if layout == "bshd" else (b, h, s, n)
        return rng.standard_normal(shape).astype(dtype)

    q, k, v = mk(sq, hq, d), mk(sk, hk, d), mk(sk, hk, dv)
    o, do = mk(sq, hq, dv), mk(sq, hq, dv)
    lse = rng.standard_normal((b, hq, sq)).astype(np.float32)
    return dict(do=do, q=q, k=k, v=v, o=o, lse=lse)


def fwd(a, **kw):
    return check_forward_inputs(a["q"], a["k"], a["v"], **kw)


def bwd(a, **kw):
    return check_backward_inputs(a["do"], a["q"], a["k"], a["v"], a["o"], a["lse"], **kw)


def test_problem_fields():
    a = arrays()
    p = fwd(a, causal=True)
    assert isinstance(p, Problem)
    assert (p.batch, p.seqlen_q, p.seqlen_k, p.nhead_q, p.nhead_k, p.hdim_q, p.hdim_v) == (2, 5, 7, 4, 2, 16, 8)
    assert p.dtype == np.float16 and p.layout == "bshd" and p.group == 2
    assert math.isclose(p.softmax_scale, 1 / 4)
    assert p.mask == MaskSpec("bottom_right", -1, 0)
    assert p.window == p.mask.window(5, 7)
    assert bwd(a) == fwd(a)
    b = arrays("bhsd", dtype=BF16)
    p = bwd(b, layout="bhsd", softmax_scale=0.5, mask="t:1,1")
    assert p.dtype == np.dtype(BF16) and p.seqlen_q == 5 and p.nhead_k == 2 and p.softmax_scale == 0.5
    assert fwd(b, layout="bhsd", dtype="bfloat16").dtype == np.dtype(BF16)


def test_uint16_bf16_bits():
    a = arrays(dtype=BF16)
    bits = {n: (x.view(np.uint16) if n != "lse" else x) for n, x in a.items()}
    assert bwd(bits, dtype="bfloat16").dtype == np.dtype(BF16)
    assert bwd(bits, dtype="bf16").dtype == np.dtype(BF16)
    with pytest.raises(TypeError, match=r"q: .*uint16.*dtype='bfloat16'"):
        fwd(bits)
    with pytest.raises(TypeError, match="q: .*uint16"):
        fwd(bits, dtype="float16")
    with pytest.raises(ValueError, match="dtype"):
        fwd(bits, dtype="int8")


ERRORS = [
    # (argument named, exception, message fragment, mutation of the arrays / kwargs)
    ("q", TypeError, "array", lambda a, kw: a.update(q=a["q"].tolist())),
    ("k", TypeError, "array", lambda a, kw: a.update(k=None)),
    ("v", ValueError, "rank-4", lambda a, kw: a.update(v=a["v"][0])),
    ("do", ValueError, "rank-4", lambda a, kw: a.update(do=a["do"][None])),
    ("lse", ValueError, "rank-3", lambda a, kw: a.update(lse=a["lse"][..., None])),
    ("layout", ValueError, "bshd", lambda a, kw: kw.update(layout="sbhd")),
    ("layout", ValueError, "needs cu_seqlens_q", lambda a, kw: kw.update(layout="thd")),
    ("k", ValueError, "batch", lambda a, kw: a.update(k=np.concatenate([a["k"], a["k"]]))),
    ("v", ValueError, "batch", lambda a, kw: a.update(v=a["v"][:1])),
    ("v", ValueError, "seqlen", lambda a, kw: a.update(v=a["v"][:, :3])),
    ("v", ValueError, "heads", lambda a, kw: a.update(v=a["v"][:, :, :1])),
    ("k", ValueError, "head dim", lambda a, kw: a.update(k=a["k"][..., :8])),
    ("k", ValueError, "divide", lambda a, kw: a.update(k=np.concatenate([a["k"]] * 3, axis=2),
                                                       v=np.concatenate([a["v"]] * 3, axis=2))),
    ("o", ValueError, "shape", lambda a, kw: a.update(o=a["o"][:, :4])),
    ("do", ValueError, "shape", lambda a, kw: a.update(do=np.concatenate([a["do"]] * 2, axis=3))),
    ("lse", ValueError, "shape", lambda a, kw: a.update(lse=a["lse"][:, :, :4])),
    ("lse", TypeError, "float32", lambda a, kw: a.update(lse=a["lse"].astype(np.float64))),
    ("k", TypeError, "dtype", lambda a, kw: a.update(k=a["k"].astype(BF16))),
    ("o", TypeError, "dtype", lambda a, kw: a.update(o=a["o"].astype(np.float32))),
    ("q", TypeError, "float16 or bfloat16", lambda a, kw: [a.update({n: a[n].astype(np.float32)})
                                                          for n in ("q", "k", "v", "o", "do")]),
    ("q", ValueError, "multiple of 8", lambda a, kw: a.update(q=a["q"][..., :12], k=a["k"][..., :12])),
    ("v", ValueError, "multiple of 8", lambda a, kw: a.update(v=np.zeros(a["v"].shape[:3] + (264,), np.float16),
                                                              o=np.zeros(a["o"].shape[:3] + (264,), np.float16),
                                                              do=np.zeros(a["o"].shape[:3] + (264,), np.float16))),
    ("q", ValueError, "last dimension must be contiguous (stride 1), got stride 2; pass a copy",
     lambda a, kw: a.update(q=np.repeat(a["q"], 2, axis=3)[..., ::2])),
    ("do", ValueError, "last dimension must be contiguous",
     lambda a, kw: a.update(do=np.ascontiguousarray(np.swapaxes(a["do"], 2, 3)).swapaxes(2, 3))),
    ("q", ValueError, "zero-size", lambda a, kw: a.update(q=a["q"][:, :0])),
    ("k", ValueError, "zero-size", lambda a, kw: a.update(k=a["k"][:, :0], v=a["v"][:, :0])),
    ("softmax_scale", ValueError, "finite", lambda a, kw: kw.update(softmax_scale=0.0)),
    ("softmax_scale", ValueError, "finite", lambda a, kw: kw.update(softmax_scale=float("nan"))),
    ("softmax_scale", ValueError, "finite", lambda a, kw: kw.update(softmax_scale=float("inf"))),
    ("softmax_scale", TypeError, "number", lambda a, kw: kw.update(softmax_scale="0.1")),
    ("softmax_scale", TypeError, "number", lambda a, kw: kw.update(softmax_scale=True)),
    ("causal", TypeError, "bool", lambda a, kw: kw.update(causal="yes")),
    ("mask", ValueError, "parse", lambda a, kw: kw.update(mask="q:1")),
    ("mask", ValueError, "not both", lambda a, kw: kw.update(mask="t", causal=True)),
    ("mask", TypeError, "mask", lambda a, kw: kw.update(mask=3.5)),
    ("window_size", ValueError, "pair", lambda a, kw: kw.update(window_size=(1, 2, 3))),
    ("window_size", ValueError, ">= -1", lambda a, kw: kw.update(window_size=(-2, 0))),
    ("mask", ValueError, "without a visible key", lambda a, kw: kw.update(mask="g:0,0")),
    ("mask", ValueError, "without a visible key", lambda a, kw: kw.update(mask="g:1,-10")),
    ("dtype", ValueError, "dtype", lambda a, kw: kw.update(dtype="float32")),
]


@pytest.mark.parametrize("arg, exc, frag, mutate", ERRORS, ids=[f"{e[0]}-{i}" for i, e in enumerate(ERRORS)])
def test_errors_name_the_argument(arg, exc, frag, mutate):
    a, kw = arrays(), {}
    mutate(a, kw)
    snapshot = {n: (np.array(x, copy=True) if isinstance(x, np.ndarray) else x) for n, x in a.items()}
    with pytest.raises(exc) as info:
        bwd(a, **kw)
    msg = str(info.value)
    assert msg.startswith(f"{arg}:") or f"{arg}:" in msg, msg
    assert frag in msg, msg
    if arg not in ("o", "do", "lse"):  # the forward check raises the same
        with pytest.raises(exc, match=arg):
            fwd(a, **kw)
    for n, x in a.items():  # inputs untouched
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, snapshot[n])
            assert x.flags.writeable


def test_strided_views_accepted():
    rng = np.random.default_rng(1)
    b, s, h, d = 2, 9, 4, 32
    qkv = rng.standard_normal((b, s, 3, h, d)).astype(np.float16)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    p = check_forward_inputs(q, k, v, causal=True)
    assert (p.seqlen_q, p.nhead_k, p.hdim_v) == (s, h, d)
    # bhsd views of a bshd buffer, do with different strides than o
    o = rng.standard_normal((b, s, h, d)).astype(np.float16)
    do = np.ascontiguousarray(o.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    lse = np.zeros((b, 2 * h, s), np.float32)[:, ::2]  # strided lse rows
    p = check_backward_inputs(do, q, k, v, o, lse)
    assert p.nhead_q == h
    # broadcast (stride 0) K/V heads are fine for reading
    k1 = np.broadcast_to(k[:, :, :1], k.shape)
    check_forward_inputs(q, k1, v)


def test_different_gpu_devices_are_rejected():
    class Dev:
        def __init__(self, i):
            self.id = i

    class FakeCupy:
        def __init__(self, arr, dev):
            self._a, self.device = arr, Dev(dev)
            self.shape, self.dtype, self.strides = arr.shape, arr.dtype, arr.strides

    a = arrays()
    q = FakeCupy(a["q"], 0)
    k = FakeCupy(a["k"], 0)
    check_forward_inputs(q, k, a["v"])  # NumPy mixed with one device: fine (copied)
    with pytest.raises(ValueError, match=r"v: .*GPU 1.*q"):
        check_forward_inputs(q, k, FakeCupy(a["v"], 1))


def _huge(b, s, h, d=8):
    """A bshd fp16 array of any shape without the memory: every element aliases one row."""
    return np.lib.stride_tricks.as_strided(np.zeros(d, np.float16), shape=(b, s, h, d), strides=(0, 0, 0, 2))


@pytest.mark.parametrize(
    "b, sq, sk, h, frag",
    [
        (65536, 4, 4, 1, r"q: batch size 65536 exceeds .* 65535"),
        (1, 4, 4, 65536, r"q: 65536 query heads exceed .* 65535"),
        (1, (1 << 30) - (1 << 16) + 1, 4, 1, r"q: seqlen \d+ exceeds"),
        (1, 4, (1 << 30) - (1 << 16) + 1, 1, r"k: seqlen \d+ exceeds"),
    ],
)
def test_kernel_size_limits(b, sq, sk, h, frag):
    # grid y/z are nhead_q/batch (<= 65535); row indices and the window are int32 in the kernels
    q, k = _huge(b, sq, h), _huge(b, sk, h)
    with pytest.raises(ValueError, match=frag):
        check_forward_inputs(q, k, k)
    # the NumPy reference's checks have no such limits
    from cupy_fmha.validate import check_reference_inputs

    check_reference_inputs(q, k, k)


def test_kernel_size_limits_at_the_edge():
    from cupy_fmha.validate import GRID_YZ_MAX, SEQLEN_MAX

    check_forward_inputs(_huge(GRID_YZ_MAX, 4, 1), _huge(GRID_YZ_MAX, 4, 1), _huge(GRID_YZ_MAX, 4, 1))
    check_forward_inputs(_huge(1, 4, GRID_YZ_MAX), _huge(1, 4, 1), _huge(1, 4, 1))
    check_forward_inputs(_huge(1, SEQLEN_MAX, 1), _huge(1, SEQLEN_MAX, 1), _huge(1, SEQLEN_MAX, 1))


def test_kernel_size_limits_group_mode():
    from cupy_fmha.validate import check_varlen_inputs

    n = 65536  # sequences of one token each: batch 65536 > grid z
    q = np.zeros((n, 1, 8), np.float16)
    cu = np.arange(n + 1, dtype=np.int32)
    with pytest.raises(ValueError, match="cu_seqlens_q: number of sequences 65536 exceeds"):
        check_varlen_inputs(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu)
    check_varlen_inputs(q[:-1], q[:-1], q[:-1], cu_seqlens_q=cu[:-1], cu_seqlens_k=cu[:-1])
    check_varlen_inputs(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu, hdim_rule=False)


# ---------------------------------------------------------------------------------------------
# softmax_scale: the kernels fold log2(e) into it in float32


def test_scale_whose_log2e_product_overflows_float32_is_refused():
    q, k, v = (np.zeros((1, 4, 1, 8), np.float16) for _ in range(3))
    limit = float(np.finfo(np.float32).max) / 1.4426950408889634
    for bad in (1e300, -1e300, 2.5e38, limit * 1.001):
        with pytest.raises(ValueError, match=r"^softmax_scale: .*float32"):
            check_forward_inputs(q, k, v, softmax_scale=bad)
    assert check_forward_inputs(q, k, v, softmax_scale=limit).softmax_scale == limit
    assert check_forward_inputs(q, k, v, softmax_scale=-1e30).softmax_scale == -1e30


def test_fp16_checks_do_not_import_ml_dtypes():
    # importing ml_dtypes takes seconds on a slow machine: the CLI's up-front checks and fp16
    # problems must not pay for it; bf16 still works (and _BF16 stays importable)
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from cupy_fmha import validate\n"
        "q = np.zeros((1, 4, 2, 8), np.float16)\n"
        "validate.check_forward_inputs(q, q, q, dtype='float16', mask='t')\n"
        "validate.check_bias(np.zeros((4, 4), np.float32), 1, 2, 4, 4)\n"
        "assert 'ml_dtypes' not in sys.modules, 'imported'\n"
        "from cupy_fmha.validate import _BF16\n"
        "import ml_dtypes\n"
        "assert _BF16 == np.dtype(ml_dtypes.bfloat16)\n"
        "b = q.astype(ml_dtypes.bfloat16)\n"
        "assert validate.check_forward_inputs(b, b, b).dtype == _BF16\n"
        "u = q.view(np.uint16)\n"
        "assert validate.check_forward_inputs(u, u, u, dtype='bf16').dtype == _BF16\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


# ---------------------------------------------------------------------------------------------
# the arguments a user reaches less often: MaskSpec's fields, mask / causal types, huge scales,
# backward_workspace_bytes, a uint16 bias with fp16 inputs, group mode's names


@pytest.mark.parametrize("fields, exc, words", [
    (("foo",), ValueError, r"mask: MaskSpec kind must be one of"),
    (("generic", 1.5, 3), TypeError, r"mask: MaskSpec left must be an int, got 1.5"),
    (("top_left", None, None), TypeError, r"mask: MaskSpec left must be an int, got None"),
    (("generic", 3, float("nan")), TypeError, r"mask: MaskSpec right must be an int"),
    (("bottom_right", True, 0), TypeError, r"mask: MaskSpec left must be an int, got True"),
    (("generic", 2**70, 2**70), ValueError, r"mask: MaskSpec left=\d+ is out of range"),
])
def test_maskspec_fields_are_checked(fields, exc, words):
    with pytest.raises(exc, match=words):
        MaskSpec(*fields)


def test_maskspec_takes_numpy_ints_as_ints():
    m = MaskSpec("top_left", np.int64(4), np.int32(0))
    assert (m.left, m.right) == (4, 0) and type(m.left) is int and m == MaskSpec("top_left", 4, 0)


def test_mask_and_causal_types():
    from cupy_fmha.mask import parse_mask, resolve_mask

    assert parse_mask(np.int64(1)) == parse_mask(1) == MaskSpec("top_left", -1, 0)
    q = np.zeros((1, 4, 1, 8), np.float16)
    assert check_forward_inputs(q, q, q, mask=np.int64(2)).mask == MaskSpec("bottom_right", -1, 0)
    for bad in (True, np.bool_(False), 1.0, [1]):
        with pytest.raises(TypeError, match="mask: expected a CK mask string"):
            check_forward_inputs(q, q, q, mask=bad)
    with pytest.raises(TypeError, match="causal: expected a bool, got 'no'"):
        resolve_mask(None, "no", (-1, -1))  # (truthy: it used to mean causal)
    assert resolve_mask(None, np.bool_(True), (-1, -1)) == MaskSpec("bottom_right", -1, 0)


def test_huge_int_scale_is_a_named_value_error():
    q = np.zeros((1, 4, 1, 8), np.float16)
    with pytest.raises(ValueError, match="softmax_scale: expected a finite nonzero number"):
        check_forward_inputs(q, q, q, softmax_scale=10**400)


@pytest.mark.parametrize("over, exc, words", [
    ({"batch": -1}, ValueError, "batch: expected an int >= 1"),
    ({"batch": 2.5}, TypeError, "batch: expected an int"),
    ({"seqlen_k": True}, TypeError, "seqlen_k: expected an int"),
    ({"hdim_q": 12}, ValueError, "hdim_q: head dim must be a multiple of 8"),
    ({"hdim_v": 512}, ValueError, "hdim_v: head dim must be a multiple of 8"),
    ({"nhead_k": 3}, ValueError, "nhead_k: 3 must divide nhead_q=16"),
    ({"deterministic": "yes"}, TypeError, "deterministic: expected a bool"),
    ({"cc": "90"}, TypeError, "cc: expected an int"),
    ({"dtype": "float64"}, ValueError, "dtype: expected"),
])
def test_backward_workspace_bytes_checks_its_arguments(over, exc, words):
    from cupy_fmha import backward_workspace_bytes

    kw = dict(batch=2, nhead_q=16, seqlen_q=1000, seqlen_k=1000, hdim_q=128) | over
    with pytest.raises(exc, match=words):
        backward_workspace_bytes(**kw)


def test_backward_workspace_bytes_takes_the_calls_dtype_names():
    from cupy_fmha import backward_workspace_bytes

    a = backward_workspace_bytes(2, 16, 1000, 1000, 128, dtype="bf16", deterministic=True)
    assert backward_workspace_bytes(2, 16, 1000, 1000, 128, dtype="bfloat16", deterministic=True) == a
    b = backward_workspace_bytes(2, 16, 1000, 1000, 128, dtype=np.float16, cc=80, deterministic=True)
    assert b == backward_workspace_bytes(2, 16, 1000, 1000, 128, dtype="fp16", cc=80, deterministic=True)


def test_uint16_bias_with_fp16_inputs_says_what_to_pass():
    from cupy_fmha.validate import check_bias

    with pytest.raises(TypeError, match="with float16 inputs pass the bias as a bfloat16 .* or float32 array"):
        check_bias(np.zeros((4, 4), np.uint16), 1, 1, 4, 4, dtype="float16")


def test_group_mode_names_cu_seqlens_and_lse():
    from cupy_fmha.validate import check_varlen_inputs

    q = np.zeros((5, 2, 8), np.float16)
    cu = np.array([0, 2, 5], np.int32)
    with pytest.raises(ValueError, match=r"lse: expected a rank-3 float32 array .* got shape \(2, 2\)"):
        check_varlen_inputs(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu, lse=np.zeros((2, 2), np.float32))
    with pytest.raises(TypeError, match="lse: expected a rank-3 float32 array .* got builtins.list"):
        check_varlen_inputs(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu, lse=[1.0])

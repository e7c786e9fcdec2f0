"""Group mode (varlen) without a GPU: the per-sequence window the kernels compute, the kernel
argument layout, and the GPU API's input checks (which run before any GPU use)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import cupy_fmha
from cupy_fmha import api
from cupy_fmha import compile as C
from cupy_fmha import launch as L
from cupy_fmha.mask import Window, dense_mask, resolve_mask

MASKS = ["0", "t", "b", "t:3,0", "b:3,0", "t:2,5", "b:4,4", "b:-1,2", "t:0,-1", "xt:5", "xb:6",
         "g:3,2", "g:-4,9"]
LENGTHS = [(5, 5), (3, 9), (9, 3), (0, 4), (4, 0), (0, 0), (1, 1), (17, 250), (250, 17), (64, 65)]


def _kernel_visible(spec, sq, sk):
    """The mask a kernel applies: window_for_sequence on the host arguments, keys j < sk."""
    y, x = L.sequence_window(*L.kernel_window_spec(spec), sq, sk)
    return dense_mask(Window(y, x), sq, sk)


@pytest.mark.parametrize("mask", MASKS)
def test_per_sequence_window_matches_mask_spec(mask):
    spec = resolve_mask(mask)
    for sq, sk in LENGTHS:
        np.testing.assert_array_equal(_kernel_visible(spec, sq, sk), dense_mask(spec, sq, sk),
                                      err_msg=f"{mask} sq={sq} sk={sk}")


@pytest.mark.parametrize("kw", [dict(causal=True), dict(window_size=(3, 0)), dict(window_size=(2, 7)),
                                dict(window_size=(-1, 4)), dict(causal=True, window_size=(5, -1))])
def test_flash_attention_options_per_sequence(kw):
    spec = resolve_mask(None, kw.get("causal", False), kw.get("window_size", (-1, -1)))
    for sq, sk in LENGTHS:
        np.testing.assert_array_equal(_kernel_visible(spec, sq, sk), dense_mask(spec, sq, sk))


def test_window_arguments_stay_in_int32():
    i32 = (-(2**31), 2**31 - 1)
    big = 2**31 - 1  # the largest size a mask string may carry (larger ones are refused)
    for spec in (resolve_mask("b:-1,0"), resolve_mask(f"b:{big},{big}"), resolve_mask(f"g:-{big},5")):
        y, x, br = L.kernel_window_spec(spec)
        assert all(i32[0] <= v <= i32[1] for v in (y, x)) and br in (0, 1)
        for sq, sk in ((2**30 - 1, 1), (1, 2**30 - 1), (2**30 - 1, 2**30 - 1)):  # lengths < 2^30
            y2, x2 = L.sequence_window(y, x, br, sq, sk)
            assert abs(y2) <= L.WINDOW_INF and abs(x2) <= L.WINDOW_INF
            # what the kernels add to them must fit too
            assert sq + x2 < 2**31 and sk + y2 < 2**31
    # unlimited stays unlimited whatever the lengths
    assert L.sequence_window(L.WINDOW_INF, L.WINDOW_INF, 1, 5, 2**29) == (L.WINDOW_INF, L.WINDOW_INF)


def test_kernel_window_spec_forms():
    assert L.kernel_window_spec(resolve_mask("0")) == (L.WINDOW_INF, L.WINDOW_INF, 0)
    assert L.kernel_window_spec(resolve_mask("t")) == (L.WINDOW_INF, 1, 0)
    assert L.kernel_window_spec(resolve_mask("b")) == (L.WINDOW_INF, 1, 1)
    assert L.kernel_window_spec(resolve_mask("b:3,4")) == (4, 5, 1)
    assert L.kernel_window_spec(resolve_mask("g:7,-2")) == (7, -2, 0)


def test_window_inf_agrees_with_the_kernels():
    text = (C.kernel_dir() / "varlen.cuh").read_text()
    m = re.search(r"#define FMHA_WINDOW_INF \(1 << (\d+)\)", text)
    assert m and (1 << int(m.group(1))) == L.WINDOW_INF


def _signature(stem: str) -> str:
    src = C.load_source(stem)
    start = src.index(f"{stem}(")
    return " ".join(src[start:src.index("{", start)].split())


@pytest.mark.parametrize("stem, struct", [
    ("fmha_fwd", "FwdParams"), ("fmha_fwd_sm90", "FwdParams"), ("fmha_bwd_dq_dk_dv", "BwdParams"),
    ("fmha_bwd_dq_dk_dv_sm90", "BwdParams"), ("fmha_bwd_dot_do_o", "DotDoOParams"),
    ("fmha_bwd_convert_dq", "ConvertParams"), ("fmha_dropout_mask", "DropoutMaskParams")])
def test_every_kernel_takes_its_one_params_struct(stem, struct):
    # the launch ABI: one struct by value, laid out as cupy_fmha.params mirrors it (the group-mode
    # fields live in SeqArg / MaskArg; tests/test_params_layout.py checks the layouts)
    from cupy_fmha.params import FLAT_ABI

    if stem in FLAT_ABI:  # the struct's fields as separate arguments (kernels/params.cuh says why)
        assert _signature(stem) == f"{stem}(FMHA_BWD_PARAMS_ARGS)"
    else:
        assert _signature(stem) == f"{stem}(const __grid_constant__ {struct} p)"


def test_empty_grid():
    from cupy_fmha.spec import fwd_spec

    spec = fwd_spec("fp16", 64, 64)
    assert L.empty_grid(L.fwd_launch(spec, 3, 2, 0))
    assert not L.empty_grid(L.fwd_launch(spec, 3, 2, 1))


# --------------------------------------------------------------------------- API checks


def _packed(lq=(5, 0, 7), lk=(4, 3, 0), hq=2, hk=1, d=32, dtype=np.float16):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((sum(lq), hq, d)).astype(dtype)
    k = rng.standard_normal((sum(lk), hk, d)).astype(dtype)
    v = rng.standard_normal((sum(lk), hk, d)).astype(dtype)
    cq = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    return q, k, v, cq, ck


def _gpu_usable() -> bool:
    try:
        api._cupy()
        return True
    except RuntimeError:
        return False


BAD_FORWARD = [
    ("cu_seqlens_q", TypeError, lambda q, k, v, cq, ck: dict(cu_seqlens_q=cq.astype(np.int64))),
    ("cu_seqlens_q", ValueError, lambda q, k, v, cq, ck: dict(cu_seqlens_q=cq[::-1].copy())),
    ("cu_seqlens_q", ValueError, lambda q, k, v, cq, ck: dict(cu_seqlens_q=cq + 1)),
    ("cu_seqlens_k", ValueError, lambda q, k, v, cq, ck: dict(cu_seqlens_k=np.array([0, 7], np.int32))),
    ("cu_seqlens_k", ValueError, lambda q, k, v, cq, ck: dict(cu_seqlens_k=None)),
    ("cu_seqlens_k", TypeError, lambda q, k, v, cq, ck: dict(cu_seqlens_k=[0, 4, 7, 7])),
    ("max_seqlen_q", ValueError, lambda q, k, v, cq, ck: dict(max_seqlen_q=6)),
    ("max_seqlen_k", TypeError, lambda q, k, v, cq, ck: dict(max_seqlen_k=4.0)),
    ("layout", ValueError, lambda q, k, v, cq, ck: dict(layout="bshd", q=q[None], k=k[None], v=v[None])),
    ("alibi_slopes", ValueError, lambda q, k, v, cq, ck: dict(alibi_slopes=np.ones((2, 2), np.float32))),
    ("q", ValueError, lambda q, k, v, cq, ck: dict(q=q[..., :12], k=k[..., :12])),
    ("k", ValueError, lambda q, k, v, cq, ck: dict(k=np.concatenate([k] * 3, axis=1),
                                                  v=np.concatenate([v] * 3, axis=1))),
    ("k", TypeError, lambda q, k, v, cq, ck: dict(k=k.astype(np.float32))),
    ("mask", ValueError, lambda q, k, v, cq, ck: dict(mask="t", causal=True)),
]


@pytest.mark.parametrize("arg, exc, change", BAD_FORWARD, ids=[f"{a}-{i}" for i, (a, _, _) in enumerate(BAD_FORWARD)])
def test_bad_varlen_forward_inputs_rejected_before_gpu(arg, exc, change):
    q, k, v, cq, ck = _packed()
    before = [x.copy() for x in (q, k, v, cq, ck)]
    kw = dict(q=q, k=k, v=v, cu_seqlens_q=cq, cu_seqlens_k=ck, layout="thd")
    kw.update(change(q, k, v, cq, ck))
    with pytest.raises(exc, match=arg):
        cupy_fmha.attention_forward(kw.pop("q"), kw.pop("k"), kw.pop("v"), **kw)
    for x, y in zip((q, k, v, cq, ck), before):
        np.testing.assert_array_equal(x, y)


def test_cu_seqlens_need_layout_thd():
    q, k, v, cq, ck = _packed()
    with pytest.raises(ValueError, match="cu_seqlens_q.*thd"):
        cupy_fmha.attention_forward(q[None], k[None], v[None], cu_seqlens_q=cq, cu_seqlens_k=ck)
    with pytest.raises(ValueError, match="max_seqlen_k.*thd"):
        cupy_fmha.attention_backward(q[None], q[None], k[None], v[None], q[None],
                                     np.zeros((1, 2, 12), np.float32), max_seqlen_k=4)


def test_bad_varlen_backward_inputs_rejected_before_gpu():
    q, k, v, cq, ck = _packed()
    o, do = q.copy(), q.copy()
    lse = np.zeros((3, 2, 7), np.float32)
    kw = dict(cu_seqlens_q=cq, cu_seqlens_k=ck, layout="thd")
    with pytest.raises(ValueError, match="lse"):
        cupy_fmha.attention_backward(do, q, k, v, o, lse[:, :, :5], **kw)
    with pytest.raises(TypeError, match="lse"):
        cupy_fmha.attention_backward(do, q, k, v, o, lse.astype(np.float16), **kw)
    with pytest.raises(ValueError, match="do"):
        cupy_fmha.attention_backward(do[:5], q, k, v, o, lse, **kw)
    with pytest.raises(ValueError, match="o"):
        cupy_fmha.attention_backward(do, q, k, v, o[..., :16], lse, **kw)
    with pytest.raises(ValueError, match="lse"):  # lse pitch follows max_seqlen_q
        cupy_fmha.attention_backward(do, q, k, v, o, lse, max_seqlen_q=9, **kw)


@pytest.mark.skipif(_gpu_usable(), reason="checks the no-GPU message")
def test_valid_varlen_input_without_gpu_says_so():
    q, k, v, cq, ck = _packed()
    with pytest.raises(RuntimeError, match="no usable CUDA GPU"):
        cupy_fmha.attention_forward(q, k, v, layout="thd", cu_seqlens_q=cq, cu_seqlens_k=ck, causal=True)

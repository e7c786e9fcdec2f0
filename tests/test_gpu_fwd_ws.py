"""The warp-specialized Hopper forward (kernels/fmha_fwd_sm90_ws.cu; the default at equal padded
head dims 64/128, CUPY_FMHA_FWD_WS=1 takes it wherever it applies) against the NumPy reference:
the forward cases of
the main GPU suites (batch mode: masks, GQA, both layouts, lengths that are not multiples of any
tile; strided inputs; group mode with empty sequences; ALiBi; Inf in a neighbouring sequence)
rerun with the switch on, plus a check that the switch really selects the kernel. The backward
runs as usual (it reads this forward's O and LSE). Configurations it does not take (dropout,
bias, head dims above 128, devices before sm_90) run the usual kernels under the switch too."""

from __future__ import annotations

import pytest

try:
    import cupy as cp
except Exception:  # pragma: no cover
    cp = None

import test_gpu_attention as A
import test_gpu_varlen as V
from cupy_fmha.backends import cuda

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _ws_on(monkeypatch):
    monkeypatch.setenv("CUPY_FMHA_FWD_WS", "1")


def test_switch_selects_the_ws_kernel():
    if cp.cuda.Device().compute_capability < "90":
        pytest.skip("sm_90 only")
    assert cuda.fwd_spec("bf16", 128, 128, 90).source == "fmha_fwd_sm90_ws"
    assert cuda.fwd_spec("bf16", 64, 64, 90, alibi=True).source == "fmha_fwd_sm90_ws"
    assert cuda.fwd_spec("bf16", 128, 128, 90, dropout=True).source == "fmha_fwd_sm90"


@pytest.mark.parametrize("case", [c for c, v in A.CASES.items() if max(v[7], v[8]) <= 128])
def test_batch_mode(case):
    A.test_forward_backward_matches_reference(case)


@pytest.mark.parametrize("case", list(A.STRIDED))
def test_strided(case):
    A.test_strided_inputs_match_contiguous(case)


@pytest.mark.parametrize("case", [c for c, v in V.CASES.items() if max(v[5], v[6]) <= 128])
def test_group_mode(case):
    V.test_varlen_matches_reference(case)


@pytest.mark.parametrize("case", list(V.ALIBI))
def test_group_mode_alibi(case):
    V.test_varlen_alibi_matches_reference(case)


def test_group_mode_empty_sides():
    V.test_varlen_all_keys_empty()
    V.test_varlen_all_queries_empty()


@pytest.mark.parametrize("d", [64, 128])
def test_group_mode_inf_neighbour(d):
    V.test_inf_in_one_sequence_leaves_its_neighbours_alone(d)

"""GPU-API behaviour that needs no GPU: validation order, the no-GPU error, the tolerance rule's
zero-reference case, and mask-argument hygiene."""

from __future__ import annotations

import numpy as np
import pytest

import cupy_fmha
from cupy_fmha import api
from cupy_fmha.mask import parse_mask, resolve_mask
from cupy_fmha.verify import compare


def _gpu_usable() -> bool:
    try:
        api._cupy()
        return True
    except RuntimeError:
        return False


@pytest.mark.skipif(_gpu_usable(), reason="checks the no-GPU message")
def test_valid_input_without_gpu_says_so():
    q = np.random.default_rng(0).standard_normal((1, 16, 2, 64)).astype(np.float16)
    with pytest.raises(RuntimeError, match="no usable CUDA GPU.*cupy_fmha.reference"):
        cupy_fmha.attention_forward(q, q, q)


def test_bad_input_is_reported_before_any_gpu_use():
    q = np.zeros((1, 16, 2, 64), np.float16)
    with pytest.raises(ValueError, match="k"):
        cupy_fmha.attention_forward(q, q[..., :32], q)


def _fwd_options(**over):
    """attention_forward's keyword defaults (what plan_forward receives), with ``over`` applied."""
    import inspect

    kw = {k: p.default for k, p in inspect.signature(api.attention_forward).parameters.items()
          if p.default is not inspect.Parameter.empty and k not in ("bias", "alibi_slopes", "out")}
    kw.update(over)
    return kw


def test_plan_is_memoized_but_errors_are_not():
    from cupy_fmha import plan

    q = np.zeros((1, 16, 2, 64), np.float16)
    a = plan.plan_forward(q, q, q, cc=lambda: 90, **_fwd_options(causal=True))
    b = plan.plan_forward(q, q, q, cc=lambda: 90, **_fwd_options(causal=True))
    assert a is b and a.spec.target == "sm90a"
    assert plan.plan_forward(q, q, q, cc=lambda: 80, **_fwd_options(causal=True)).spec.target == "sm80"
    for _ in range(2):
        with pytest.raises(ValueError):
            plan.plan_forward(q, q, q[:, :8], cc=lambda: 90, **_fwd_options(causal=True))


def test_zero_reference_is_judged_by_absolute_error():
    ref = np.zeros((4, 8))
    noise = np.full((4, 8), 1e-3)
    assert compare("dq", noise, ref, dtype="float16", hdim_q=64, hdim_v=64).ok
    assert not compare("dq", noise * 100, ref, dtype="float16", hdim_q=64, hdim_v=64).ok
    assert compare("dq", noise * 1e-13, ref + 1e-15, dtype="float16", hdim_q=64, hdim_v=64).ok  # float64 noise


@pytest.mark.parametrize("scale", [1.0, 1e-4, 1e-7, 1e-9])
def test_small_references_are_judged_relatively(scale):
    """A reference that is small, not zero (a scaled loss's gradients), keeps the relative rule: a
    5% error, a sign flip or a 100x output fail at every scale, a 0.1% one passes."""
    ref = np.random.default_rng(1).standard_normal((16, 64)) * scale
    judge = lambda out: compare("dq", out, ref, dtype="bfloat16", hdim_q=64, hdim_v=64).ok  # noqa: E731
    assert judge(ref * 1.001)
    assert not judge(ref * 1.05) and not judge(-ref) and not judge(ref * 100)


def test_compare_refuses_complex_and_infinite_references():
    ref = np.ones(8)
    with pytest.raises(TypeError, match="expected a real array"):
        compare("o", ref * 1j, ref, dtype="float16", hdim_q=64, hdim_v=64)
    bad = ref.copy()
    bad[3] = np.inf
    assert "+inf in the reference" in compare("o", ref, bad, dtype="float16", hdim_q=64, hdim_v=64).reason


@pytest.mark.parametrize("bad", [(1.5, 2), (True, 2), (1,), "ab", None])
def test_window_size_must_be_two_ints(bad):
    with pytest.raises(ValueError, match="window_size"):
        resolve_mask(None, False, bad)


def test_negative_ck_window_sizes_mean_unlimited():
    assert parse_mask("t:-5,3") == parse_mask("t:-1,3")
    assert parse_mask("b:-2,-7").describe() == "b:-1,-1"


def test_validation_cache_tells_equal_but_invalid_values_apart():
    # a passed check must not make an equal-comparing but invalid value pass later (True == 1.0)
    from cupy_fmha import plan

    q = np.zeros((1, 8, 2, 16), np.float16)

    def resolve(**over):
        return plan.plan_forward(q, q, q, cc=lambda: 90, **_fwd_options(**over))

    with pytest.raises(TypeError, match="causal"):
        resolve(causal=1.0)
    resolve(causal=True)
    with pytest.raises(TypeError, match="causal"):
        resolve(causal=1.0)
    resolve(window_size=(2, 0))
    with pytest.raises((TypeError, ValueError), match="window_size"):
        resolve(window_size=(2.0, 0.0))


def test_alibi_slopes_checked_before_the_gpu(monkeypatch):
    # without a GPU, bad slopes must still be named (the check runs before CuPy is needed)
    from cupy_fmha import api

    def no_gpu():
        raise RuntimeError("no usable CUDA GPU (test)")

    monkeypatch.setattr(api, "_cupy", no_gpu)
    q = np.zeros((1, 8, 2, 16), np.float16)
    with pytest.raises((TypeError, ValueError), match="alibi_slopes"):
        api.attention_forward(q, q, q, alibi_slopes=np.ones(3, np.float32))
    do = q
    lse = np.zeros((1, 2, 8), np.float32)
    with pytest.raises((TypeError, ValueError), match="alibi_slopes"):
        api.attention_backward(do, q, q, q, q, lse, alibi_slopes=np.ones(3, np.float16))


def test_every_subpackage_is_in_the_wheel():
    # pyproject lists the packages by hand: a subpackage missing there is absent from a
    # non-editable install (`pip install .`, a wheel), e.g. cupy_fmha.backends, which the plan,
    # the launcher and the GPU API import.
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")
    root = Path(__file__).resolve().parents[1]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"cupy_fmha." + ".".join(p.parent.relative_to(root / "cupy_fmha").parts)
             for p in (root / "cupy_fmha").glob("*/**/__init__.py")}
    assert found, "no subpackages found"
    assert found <= listed, f"not in pyproject's packages: {sorted(found - listed)}"


@pytest.mark.parametrize("d", [64, 128, 256])
def test_causal_backward_starts_heavy_key_blocks_first(d):
    # the ws backwards under a causal mask up to BWD_WS_HEADS_X_SEQLEN_K keys: the HEADS_X build and
    # its grid (nhead_q, key blocks, batch); otherwise, and off Hopper, (key blocks, nhead_q, batch)
    import inspect

    from cupy_fmha import launch as L
    from cupy_fmha import plan
    from cupy_fmha.backends.cuda import BWD_WS_HEADS_X_SEQLEN_K

    kw = {k: p.default for k, p in inspect.signature(api.attention_backward).parameters.items()
          if p.default is not inspect.Parameter.empty and k not in ("bias", "alibi_slopes", "out")}

    def resolve(s, cc=90, **over):
        q = np.zeros((2, s, 3, d), np.float16)
        lse = np.zeros((2, 3, s), np.float32)
        bp = plan.plan_backward(q, q, q, q, q, lse, cc=lambda: cc, **{**kw, **over})
        spec = bp.specs.dq_dk_dv
        return spec, bp.launches["dq_dk_dv"], -(-s // spec.macro("BLOCK_N"))

    for s in (1000, BWD_WS_HEADS_X_SEQLEN_K):
        spec, launch, nkb = resolve(s, causal=True)
        assert spec.macro("HEADS_X") == 1 and launch.grid == (3, nkb, 2), (s, spec.name, launch.grid)
        assert L.dq_dk_dv_key_blocks(spec, launch) == nkb
    for s, over in ((BWD_WS_HEADS_X_SEQLEN_K + 8, dict(causal=True)), (1000, dict(causal=False)),
                    (1000, dict(window_size=(100, 0)))):
        spec, launch, nkb = resolve(s, **over)
        assert not spec.macro("HEADS_X", 0) and launch.grid == (nkb, 3, 2), (s, over, spec.name, launch.grid)
    spec, launch, nkb = resolve(1000, cc=80, causal=True)
    assert not spec.macro("HEADS_X", 0) and launch.grid[1:] == (3, 2)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_causal_backward_groups_heads_up_to_8192_keys(d, monkeypatch):
    # from BWD_WS_HEADS_X_SEQLEN_K to BWD_WS_HEADS_GROUP_SEQLEN_K keys under a causal mask, with
    # nhead_q a multiple of BWD_WS_HEADS_GROUP, the ws backward (hdim <= 128) takes the grouped start
    # order on the heads-first grid; odd head counts, longer sequences and the wide kernel do not;
    # forcing it through the tile variable with an odd head count is refused before any launch
    import inspect

    from cupy_fmha import plan
    from cupy_fmha.backends.cuda import BWD_WS_HEADS_GROUP, BWD_WS_HEADS_GROUP_SEQLEN_K, BWD_WS_HEADS_X_SEQLEN_K

    monkeypatch.delenv("CUPY_FMHA_BWD_WS_TILES", raising=False)
    kw = {k: p.default for k, p in inspect.signature(api.attention_backward).parameters.items()
          if p.default is not inspect.Parameter.empty and k not in ("bias", "alibi_slopes", "out")}

    def resolve(s, h, **over):
        q = np.zeros((1, s, h, d), np.float16)
        lse = np.zeros((1, h, s), np.float32)
        bp = plan.plan_backward(q, q, q, q, q, lse, cc=lambda: 90, **{**kw, **over})
        spec = bp.specs.dq_dk_dv
        return spec, bp.launches["dq_dk_dv"], -(-s // spec.macro("BLOCK_N"))

    for s in (BWD_WS_HEADS_X_SEQLEN_K + 8, BWD_WS_HEADS_GROUP_SEQLEN_K):
        spec, launch, nkb = resolve(s, 4, causal=True)
        want = BWD_WS_HEADS_GROUP if d <= 128 else 0
        assert spec.macro("HEADS_X", 0) == want, (s, spec.name)
        assert launch.grid == ((4, nkb, 1) if want else (nkb, 4, 1)), (s, launch.grid)
        spec, launch, nkb = resolve(s, 3, causal=True)
        assert not spec.macro("HEADS_X", 0) and launch.grid == (nkb, 3, 1)
    spec, launch, nkb = resolve(BWD_WS_HEADS_GROUP_SEQLEN_K + 8, 4, causal=True)
    assert not spec.macro("HEADS_X", 0)
    spec, launch, nkb = resolve(BWD_WS_HEADS_GROUP_SEQLEN_K, 4, causal=True, dropout_p=0.1)
    assert not spec.macro("HEADS_X", 0)  # (the dropout and bias builds are not grouped: they would spill)
    if d <= 128:
        monkeypatch.setenv("CUPY_FMHA_BWD_WS_TILES", f"HEADS_X={BWD_WS_HEADS_GROUP}")
        with pytest.raises(ValueError, match="nhead_q=3 is no multiple"):
            resolve(200, 3)


def test_small_cancellation_noise_keeps_the_absolute_bound():
    """Below 1e-6 a reference that the same-precision reference misses by the relative limit too is
    noise from cancellation (dQ with a nearly one-hot P): the absolute bound judges it, as before;
    one the same-precision reference reproduces is judged relatively."""
    rng = np.random.default_rng(2)
    ref = rng.standard_normal(256) * 1e-8
    low = ref + rng.standard_normal(256) * 1e-6  # the plain implementation: noise 100x the value
    out = ref + rng.standard_normal(256) * 3e-6
    assert compare("dq", out, ref, low, dtype="bfloat16", hdim_q=64, hdim_v=64).ok
    assert not compare("dq", out, ref, ref * 1.001, dtype="bfloat16", hdim_q=64, hdim_v=64).ok

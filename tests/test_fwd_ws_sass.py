"""The ws forward's PV_OVERLAP pipeline, checked in the machine code (offline: NVRTC, nvdisasm; no
GPU). The overlap exists only if the compiler keeps the softmax's exp2s between the wait for S
(`WARPGROUP.DEPBAR.LE gsb0, 0x1`) and the wait for P V (`... 0x0`): nothing in the source's data
flow forbids moving them, and two layouts of the loop lost it silently (the compiler sank the
exp2s below the P V wait, or hoisted the wait above them; kernels/fmha_fwd_sm90_ws.cu says how the
loop is arranged now). Also: in the loop, the S and P V GEMMs are issued back to back under one
`WARPGROUP.ARRIVE`, and each warpgroup's loop holds one wait for P V."""

from __future__ import annotations

import pytest

from cupy_fmha import compile as C
from cupy_fmha.backends import cuda

pytestmark = pytest.mark.skipif(C.nvrtc_version() is None or C.nvdisasm_path() is None,
                                reason="needs NVRTC and nvdisasm (the cuda13 and test extras)")


def _runs_of_gemms(sass: list[str]) -> list[list[str]]:
    """The wgmma instructions after each WARPGROUP.ARRIVE up to the next wait, barrier, branch or
    arrive (address arithmetic may sit between them), as lists."""
    stop = ("WARPGROUP", "BAR", "SYNCS", "BRA", "EXIT")
    runs = []
    for i, s in enumerate(sass):
        if "WARPGROUP.ARRIVE" not in s:
            continue
        run = []
        for t in sass[i + 1:]:
            op = t.split()[1] if t.startswith("@") else t.split()[0]  # (after a predicate)
            if op.startswith("HGMMA"):
                run.append(t)
            elif op.startswith(stop):
                break
        runs.append(run)
    return runs


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("variant", [dict(PV_OVERLAP=1), dict(SWIZZLE=1, PV_OVERLAP=1),
                                     dict(SWIZZLE=1, PV_OVERLAP=1, PINGPONG=1),
                                     # the softmax variants of step 87 too (EXP_EMU's exponentials partly FADD.RM-led)
                                     dict(SWIZZLE=1, PV_OVERLAP=1, PINGPONG=1, SMAX_TREE=1, MASK_ROWS=2),
                                     dict(SWIZZLE=1, PV_OVERLAP=1, PINGPONG=1, EXP_EMU=2, LAZY_RESCALE=8),
                                     # the descriptors from one 32-bit address (step 103)
                                     dict(SWIZZLE=1, PV_OVERLAP=1, PINGPONG=1, DESC_ADDR=1)],
                         ids=lambda v: ",".join(v))
def test_softmax_runs_between_the_two_waits(d, variant):
    spec = cuda.fwd_ws_spec("bf16", d, d, tiles=dict(NWG=2, BLOCK_N=128, **variant))
    sass = C.sass_instructions(spec)
    # the loop's wait for S (the only wait that leaves a group pending), then the exp2s of the
    # block's 64 scores per thread (and the row factors) before the next wait of any kind
    first = [i for i, s in enumerate(sass) if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in s]
    assert len(first) == 1, (spec.name, len(first))
    nxt = next(i for i in range(first[0] + 1, len(sass)) if "WARPGROUP.DEPBAR" in sass[i])
    ex2 = sum("MUFU.EX2" in s for s in sass[first[0]:nxt])
    poly = sum("FADD.RM" in s for s in sass[first[0]:nxt])  # (EXP_EMU: poly_exp2's floor, one per exponential)
    assert ex2 + poly >= 64 and poly == 64 * variant.get("EXP_EMU", 0) // 8, (spec.name, ex2, poly)
    # one arrive issues the loop's S (HDIM_Q / 16 wgmma, K-major B) and P V (BLOCK_N / 16, V
    # MN-major: tnspB) back to back
    both = [r for r in _runs_of_gemms(sass) if len(r) == d // 16 + 128 // 16]
    assert len(both) == 1, (spec.name, [len(r) for r in _runs_of_gemms(sass)])
    assert all("tnspB" not in g for g in both[0][:d // 16]) and all("tnspB" in g for g in both[0][d // 16:]), spec.name


def _loop_r2ur(spec) -> int:
    ops = [(x.split()[1] if x.startswith("@") else x.split()[0]).split(".")[0] for x in C.sass_instructions(spec)]
    first = ops.index("HGMMA")
    last = len(ops) - 1 - ops[::-1].index("HGMMA")
    return ops[first:last + 1].count("R2UR")


@pytest.mark.parametrize("d", [192, 256])
def test_desc_addr_descriptors_uniform(d, monkeypatch):
    """DESC_ADDR (bench/NOTES.md steps 103-104, the table's default at hdim 192 and 256): there the
    pointer-formed builds (DESC_ADDR=0) form their Q and K descriptors in vector registers (R2UR in the
    loop, counted here so the comparison stays honest); the default's loop descriptors all come from
    uniform arithmetic: no R2UR, no spill, no serialization, plain, ALiBi and dropout."""
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "DESC_ADDR=0")
    pointers = cuda.fwd_ws_spec("bf16", d, d)
    assert pointers.macro("DESC_ADDR") is None
    assert _loop_r2ur(pointers) >= 20, pointers.name  # (if this fails, the pointer form lost the symptom)
    monkeypatch.delenv("CUPY_FMHA_FWD_WS_TILES")
    for kw in (dict(), dict(alibi=True), dict(dropout=True)):
        spec = cuda.fwd_ws_spec("bf16", d, d, **kw)
        assert spec.macro("DESC_ADDR") == 1
        res = C.offline_compile(spec)
        assert res.spill_stores == 0 and not res.wgmma_serialized, (spec.name, res.spill_stores)
        # (one R2UR, a loop bound's, not a descriptor; with FOLD and SMAX_TREE the step has one copy per sign of
        # the scale, so it appears twice: bench/NOTES.md step 113)
        copies = 2 if spec.macro("FOLD") and spec.macro("SMAX_TREE") else 1
        assert _loop_r2ur(spec) <= copies, spec.name

"""The ws backward's machine code (offline: NVRTC, nvdisasm; no GPU), guarding what bench/NOTES.md
step 31 found and fixed: the wgmma descriptors must come from uniform registers (not rebuilt per
instruction in vector registers and moved over with R2UR: ~13 integer instructions per HGMMA
before), and the P/dS mask test must be one branch per tile, not a branch per element (the compiler
did not unswitch `edge` in this kernel). Both cost 22-38% of the backward's time on the H200; both
come back silently if the warpgroup or stage index stops looking warp-uniform to the compiler."""

from __future__ import annotations

import pytest

from cupy_fmha import compile as C
from cupy_fmha.backends import cuda

pytestmark = pytest.mark.skipif(C.nvrtc_version() is None or C.nvdisasm_path() is None,
                                reason="needs NVRTC and nvdisasm (the cuda13 and test extras)")


def _ops(sass: list[str]) -> list[str]:
    return [(s.split()[1] if s.startswith("@") else s.split()[0]).split(".")[0] for s in sass]


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("d,diagonal", [(64, False), (128, False), (128, True)])
def test_descriptors_uniform_and_mask_unswitched(dtype, d, diagonal):
    spec = cuda.bwd_ws_spec(dtype, d, d, diagonal=diagonal)
    ops = _ops(C.sass_instructions(spec))
    hgmma, bssy = ops.count("HGMMA"), ops.count("BSSY")
    # (hdim 64 with 128 query rows per step: 8 + 16 + 8; hdim 128 with 80 rows: 16 + 10 + 8, GEMM1 and
    # GEMM3 over 5 k16 slices of the 80 rows; with 64 rows 16 + 8 + 8)
    assert hgmma == {128: 32, 80: 34, 64: 32}[spec.macro("BLOCK_M")]
    # R2UR from the first HGMMA to the last (the loop's GEMMs): 1-2 since the fix, about 4 per HGMMA
    # before it (92 / 124 in the whole kernel). Counted on that span, not the whole kernel, because the
    # dK/dV epilogue's bulk row copies (step 60) take their addresses in uniform registers too.
    first = ops.index("HGMMA")
    last = len(ops) - 1 - ops[::-1].index("HGMMA")
    r2ur = ops[first:last + 1].count("R2UR")
    # The dQ-writer builds (the hdim-128 default without a short diagonal mask: 80 rows) form the
    # stage-dependent descriptors (Q, dO, dS^T) in vector registers: 67 R2UR, two per such HGMMA; the
    # K/V ones stay uniform. They measured 0.94-0.99x the time of the 80-row build without the writer,
    # whose descriptors are uniform only with a select for the stage (bench/NOTES.md step 100); an
    # opaque re-formed layout base made them uniform but spilled 32-120 bytes. Bounded, so that more
    # does not creep in.
    # (the default forms them from one 32-bit address since step 104, DESC_ADDR: the test below)
    limit = 68 if spec.macro("DQ_WRITER", 0) and not spec.macro("DESC_ADDR", 0) else 6
    assert r2ur <= limit, f"{spec.name}: {r2ur} R2UR among {hgmma} HGMMA: descriptors left the uniform registers"
    # 23 after the fix (26 with the step-60 epilogue), 53 before it (one per element of S^T: NQ * 4 = 32)
    assert bssy < 32, f"{spec.name}: {bssy} BSSY: the mask test is back to a branch per element"


@pytest.mark.parametrize("d,diagonal,deterministic", [(128, False, False), (128, True, False), (64, False, True)])
def test_desc_addr_descriptors_uniform_without_spill(d, diagonal, deterministic, monkeypatch):
    """DESC_ADDR (bench/NOTES.md step 102, the default since step 104): every descriptor of the loop from
    one 32-bit address, so the dQ-writer builds (the hdim-128 80-row default, deterministic mode at 64) lose
    the 60-67 R2UR of their pointer-formed builds (DESC_ADDR=0, counted here so the comparison stays honest)
    and the 80-row build its 4 bytes of spill; not serialized."""
    if diagonal is False:  # (the dQ-writer builds)
        monkeypatch.setenv("CUPY_FMHA_BWD_WS_TILES", "DESC_ADDR=0")
        pointers = cuda.bwd_ws_spec("bf16", d, d, deterministic=deterministic)
        assert pointers.macro("DESC_ADDR") is None and pointers.macro("DQ_WRITER") == 1
        ops = _ops(C.sass_instructions(pointers))
        first, last = ops.index("HGMMA"), len(ops) - 1 - ops[::-1].index("HGMMA")
        assert ops[first:last + 1].count("R2UR") >= 20, pointers.name  # (else: the pointer form lost the symptom)
        monkeypatch.delenv("CUPY_FMHA_BWD_WS_TILES")
    spec = cuda.bwd_ws_spec("bf16", d, d, diagonal=diagonal, deterministic=deterministic)
    assert spec.macro("DESC_ADDR") == 1
    res = C.offline_compile(spec)
    assert res.spill_stores == 0 and not res.wgmma_serialized, (spec.name, res.spill_stores, res.wgmma_serialized)
    ops = _ops(C.sass_instructions(spec))
    first = ops.index("HGMMA")
    last = len(ops) - 1 - ops[::-1].index("HGMMA")
    assert ops[first:last + 1].count("R2UR") <= 2, spec.name

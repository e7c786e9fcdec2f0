"""The gfx9 (AMD, wave64) MFMA fragment layouts: one table (cupy_fmha/backends/gfx9_layout.py)
drives both the generated C++ header (kernels/arch/gfx9/layout.cuh) and a NumPy model of the
instructions. Checks: the header is what the table generates; the header's formulas, compiled
with the host C++ compiler and evaluated for every lane and element, equal the model's; each
layout covers every element of A, B and D exactly once; and the model, scattering random A and B
into lanes and multiplying lane by lane, gives A @ B + C. A formula changed on one side only
fails the second check (test_a_changed_formula_is_caught). CPU only; no AMD GPU has run these
layouts (see the module's docstring for which ones are not yet checked against AMD's tables)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cupy_fmha.backends import gfx9_layout as G

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import gen_arch_gfx9  # noqa: E402


def test_header_is_generated_from_the_table():
    assert (ROOT / "kernels/arch/gfx9/layout.cuh").read_text() == gen_arch_gfx9.render(), \
        "run tools/gen_arch_gfx9.py"


def _cpp_coords(header_text: str, tmp_path) -> dict:
    """Every (shape, operand, lane, element) -> coordinates, evaluated by the host compiler."""
    cxx = shutil.which("g++") or shutil.which("clang++") or shutil.which("clang++-22")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    (tmp_path / "layout.cuh").write_text(header_text)
    lines = ['#include <cstdio>', '#include "layout.cuh"', "using namespace fmha::gfx9;", "int main() {"]
    for s in G.LAYOUTS:
        t = f"Mfma{s.name}"
        lines.append(f'for (int l = 0; l < 64; ++l) for (int i = 0; i < {t}::KPL; ++i) '
                     f'std::printf("{s.name} A %d %d %d %d\\n", l, i, {t}::a_row(l, i), {t}::a_k(l, i));')
        lines.append(f'for (int l = 0; l < 64; ++l) for (int i = 0; i < {t}::KPL; ++i) '
                     f'std::printf("{s.name} B %d %d %d %d\\n", l, i, {t}::b_k(l, i), {t}::b_col(l, i));')
        lines.append(f'for (int l = 0; l < 64; ++l) for (int r = 0; r < {t}::ACC; ++r) '
                     f'std::printf("{s.name} D %d %d %d %d\\n", l, r, {t}::d_row(l, r), {t}::d_col(l, r));')
    lines.append('for (int l = 0; l < 64; ++l) std::printf("tr16 addr %d 0 %d %d\\n", l, DsReadTr16::addr_row(l), DsReadTr16::addr_col(l));')
    lines.append('for (int l = 0; l < 64; ++l) for (int r = 0; r < DsReadTr16::ELEMS; ++r) '
                 'std::printf("tr16 src %d %d %d %d\\n", l, r, DsReadTr16::src_lane(l, r), DsReadTr16::src_elem(l, r));')
    lines.append("return 0; }")
    (tmp_path / "main.cpp").write_text("\n".join(lines))
    subprocess.run([cxx, "-std=c++17", "-O0", "-o", str(tmp_path / "coords"), str(tmp_path / "main.cpp")], check=True)
    out = subprocess.run([str(tmp_path / "coords")], check=True, capture_output=True, text=True).stdout
    coords = {}
    for line in out.splitlines():
        name, op, l, i, x, y = line.split()
        coords[(name, op, int(l), int(i))] = (int(x), int(y))
    return coords


def _model_coords() -> dict:
    coords = {}
    for s in G.LAYOUTS:
        for l in range(G.WAVE):
            for i in range(s.kpl):
                coords[(s.name, "A", l, i)] = G.a_coords(s, l, i)
                coords[(s.name, "B", l, i)] = G.b_coords(s, l, i)
            for r in range(s.acc):
                coords[(s.name, "D", l, r)] = G.d_coords(s, l, r)
    for l in range(G.WAVE):
        coords[("tr16", "addr", l, 0)] = G.tr16_address(l)
        for r in range(4):
            coords[("tr16", "src", l, r)] = G.tr16_source(l, r)
    return coords


def test_header_formulas_equal_the_model(tmp_path):
    assert _cpp_coords(gen_arch_gfx9.render(), tmp_path) == _model_coords()


def test_a_changed_formula_is_caught(tmp_path):
    """The check above is not vacuous: one formula of the header changed (32x32 accumulator rows
    4 apart between blocks instead of 8) no longer matches the model."""
    bad = gen_arch_gfx9.render().replace("8 * (r / 4) + 4 * (lane / 32) + r % 4", "4 * (r / 4) + 4 * (lane / 32) + r % 4")
    assert bad != gen_arch_gfx9.render()
    assert _cpp_coords(bad, tmp_path) != _model_coords()


@pytest.mark.parametrize("s", G.LAYOUTS, ids=lambda s: s.name)
def test_layouts_cover_each_element_once(s):
    a = sorted(G.a_coords(s, l, i) for l in range(G.WAVE) for i in range(s.kpl))
    b = sorted(G.b_coords(s, l, i) for l in range(G.WAVE) for i in range(s.kpl))
    d = sorted(G.d_coords(s, l, r) for l in range(G.WAVE) for r in range(s.acc))
    assert a == [(m, k) for m in range(s.m) for k in range(s.k)]
    assert b == [(k, n) for k in range(s.k) for n in range(s.n)]
    assert d == [(m, n) for m in range(s.m) for n in range(s.n)]


@pytest.mark.parametrize("s", G.LAYOUTS, ids=lambda s: s.name)
def test_model_multiplies(s):
    rng = np.random.default_rng(len(s.name) * 1000 + s.k)
    a = rng.standard_normal((s.m, s.k)).astype(np.float16)
    b = rng.standard_normal((s.k, s.n)).astype(np.float16)
    c = rng.standard_normal((s.m, s.n)).astype(np.float32)
    rc = np.array([[c[G.d_coords(s, l, r)] for r in range(s.acc)] for l in range(G.WAVE)], np.float32)
    d = G.gather_d(s, G.mfma_model(s, G.scatter_a(s, a), G.scatter_b(s, b), rc))
    want = a.astype(np.float32) @ b.astype(np.float32) + c
    np.testing.assert_allclose(d, want, rtol=1e-5, atol=1e-5)
    # and a wrong accumulator layout would not: D rows gathered through the A layout's rows
    assert not np.allclose(d.T, want)


def test_tr16_reads_columns_of_each_groups_block():
    """ds_read_b64_tr_b16 as modelled: each group of 16 lanes, addressing its 4 x 16 block as
    tr16_address says, gets column lane % 16 of the block, rows 0..3, in elements 0..3; every
    element of the block lands once. (The model's rule is taken from public users of the
    instruction, not checked on a GPU; see the module docstring of gfx9_layout.)"""
    rng = np.random.default_rng(950)
    blocks = rng.integers(0, 2 ** 16, size=(4, 4, 16))  # [group][row][column]
    loaded = np.array([[blocks[l // 16, G.tr16_address(l)[0], G.tr16_address(l)[1] + e] for e in range(4)]
                       for l in range(G.WAVE)])
    out = G.tr16_model(loaded)
    for l in range(G.WAVE):
        assert list(out[l]) == [blocks[l // 16, r, l % 16] for r in range(4)]
    assert sorted(G.tr16_source(l, r) for l in range(G.WAVE) for r in range(4)) == \
        [(l, e) for l in range(G.WAVE) for e in range(4)]

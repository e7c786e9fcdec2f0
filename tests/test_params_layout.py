"""The kernel parameter structs (kernels/params.cuh) and their NumPy mirror (cupy_fmha/params.py)
agree field by field: ``static_assert`` lines generated from the dtypes are compiled against the
header with the host C++ compiler (params.cuh is plain C++). A field moved, resized or renamed on
one side only fails here."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from cupy_fmha import params as P
from cupy_fmha.compile import kernel_dir

CXX = shutil.which("g++") or shutil.which("clang++")
pytestmark = pytest.mark.skipif(CXX is None, reason="no host C++ compiler (g++ or clang++)")


def _compile(asserts: str, tmp_path) -> subprocess.CompletedProcess:
    src = tmp_path / "layout.cpp"
    src.write_text('#include "params.cuh"\n' + asserts)
    return subprocess.run([CXX, "-std=c++17", "-fsyntax-only", f"-I{kernel_dir()}", str(src)],
                          capture_output=True, text=True)


def test_header_matches_dtypes(tmp_path):
    r = _compile(P.layout_asserts(), tmp_path)
    assert r.returncode == 0, r.stderr


def test_every_header_struct_is_mirrored():
    text = (kernel_dir() / "params.cuh").read_text()
    declared = {line.split()[1] for line in text.splitlines() if line.startswith("struct ")}
    assert declared == set(P.STRUCTS)


def _moved(dt: np.dtype, a: str, b: str) -> np.dtype:
    """``dt`` with fields ``a`` and ``b`` swapped (what a one-sided edit would do)."""
    names = list(dt.names)
    i, j = names.index(a), names.index(b)
    names[i], names[j] = names[j], names[i]
    return np.dtype([(n, dt.fields[n][0]) for n in names], align=True)


@pytest.mark.parametrize("struct,a,b", [("BwdParams", "hdim_q", "hdim_v"), ("FwdParams", "q", "k"),
                                        ("DropoutArg", "seed", "offset")])
def test_a_field_moved_on_one_side_fails(tmp_path, struct, a, b):
    structs = dict(P.STRUCTS)
    structs[struct] = _moved(structs[struct], a, b)
    # same sizes, different names at each offset: the asserts must catch the swap
    r = _compile(P.layout_asserts(structs), tmp_path)
    assert r.returncode != 0 and f"{struct}.{a}: offset" in r.stderr


def test_pack_round_trip():
    one = P.pack(P.DROPOUT_MASK, (0xDEAD, 3, 5, (7, 11, 40000, 1.25)))
    assert one.shape == (1,) and one.dtype == P.DROPOUT_MASK
    assert one[0]["dropout"]["offset"] == 11 and one[0]["seqlen_k"] == 5


def test_flattened_backward_abi_matches_the_struct():
    # FMHA_BWD_PARAMS_ARGS declares BwdParams' fields in order; flat_args passes them so
    import re

    text = (kernel_dir() / "params.cuh").read_text()
    body = text[text.index("#define FMHA_BWD_PARAMS_ARGS"):text.index("#define FMHA_BWD_PARAMS_STRUCT")]
    names = [m.group(1) for m in re.finditer(r"(\w+)\s*(?:,|$)", body.replace("\\", " ").split("ARGS", 1)[1])]
    assert names == P.flat_names(P.BWD)
    one = P.pack(P.BWD, tuple(np.zeros(1, P.BWD)[0].tolist()))
    one["hdim_q"], one["dropout"]["seed"], one["mask"]["win_x"] = 96, 2**63 + 5, -7
    args = P.flat_args(one)
    assert len(args) == len(P.flat_names(P.BWD))
    assert np.array_equal(P.unflatten(P.BWD, args), one)


def test_kernel_args_flat_equals_the_struct_flattened():
    values = ((1, 2, 3, 4),) * 6 + (5, 6, 7, 8, 21, -9, (10, 11, 12, 13), 64, 72, 2, 1, 0.125, 0.5, (-3, 7, 1, 0),
                                    (14, 4), (15, 16, 17, 18, 19, 3, 0), (2**64 - 1, 20, 40000, 1.25))
    struct_one = P.kernel_args(P.BWD, values, flat=False)
    assert len(struct_one) == 1 and struct_one[0].dtype == np.dtype((np.void, P.BWD.itemsize))
    assert struct_one[0].dtype.names is None  # unstructured: CuPy copies the bytes (see kernel_args)
    struct_one = (struct_one[0].view(P.BWD),)
    assert struct_one[0] == P.pack(P.BWD, values)
    flat = P.kernel_args(P.BWD, values, flat=True)
    assert [type(a) for a in flat] == [type(a) for a in P.flat_args(struct_one[0])]
    assert [a.item() for a in flat] == [a.item() for a in P.flat_args(struct_one[0])]

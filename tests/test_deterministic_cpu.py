"""Deterministic backward without a GPU: the dQ workspace maths, the slab decomposition the
kernels implement (simulated in NumPy through the Python mirror of ``query_block_range``), the
``deterministic`` argument check and the CLI's ``--deterministic`` on the NumPy backend."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from cupy_fmha import device
from cupy_fmha import launch as L
from cupy_fmha.cli import app as cli
from cupy_fmha.compile import load_source
from cupy_fmha.mask import dense_mask, resolve_mask
from cupy_fmha.spec import bwd_specs, default_dispatch_table

# --------------------------------------------------------------------------- workspace


@pytest.mark.parametrize("hdim,cc", [(64, 90), (128, 90), (32, 80), (96, 80), (256, 80), (128, 80)])
def test_workspace_has_one_slab_per_key_block(hdim, cc):
    spec = bwd_specs("bf16", hdim, hdim, cc, deterministic=True).dq_dk_dv
    bn, bm = L.dq_dk_dv_blocks(spec)
    launch = L.dq_dk_dv_launch(spec, 2, 3, 1000)
    nsplit_cols = spec.macro("NSPLIT", 1)
    assert L.dq_dk_dv_key_blocks(spec, launch) == -(-1000 // bn) * nsplit_cols  # the grid's key blocks
    ws = L.dq_workspace(spec, 2, 3, 777, 1000, hdim, True)
    atomic = L.dq_workspace(spec, 2, 3, 777, 1000, hdim, False)
    if spec.macro("DQ_ORDERED", 0):  # the ws kernel: no slabs, one semaphore per query tile
        assert ws == (atomic.shape, 0, 0, L.dq_tile_kind(spec), 2 * 3 * -(-777 // bm)) and atomic.tiled and not atomic.nsem
        assert ws.nbytes == 4 * 2 * 3 * -(-777 // bm) * bm * spec.macro("HDIM_Q") + 4 * ws.nsem
        return
    assert ws.nsplit == -(-1000 // bn) and ws.shape == (ws.nsplit, 2, 3, 777, hdim)
    assert ws.split_stride == 2 * 3 * 777 * hdim
    assert ws.nbytes == 4 * ws.nsplit * ws.split_stride
    assert atomic == ((2, 3, 777, hdim), 0, 0, False, 0)
    if spec.target == "sm90a":  # (the ws kernel: 128 query rows per step at hdim 64, 80 at 128, BWD_WS_BY_HDIM)
        assert (bn, bm) == (128, {64: 128, 128: 80}[hdim] if spec.source.endswith("_ws") else 64)
    else:
        assert bm == spec.macro("BLOCK_M") and bn == 16 * spec.macro("NWARPS")


@pytest.mark.parametrize("hdim", [64, 120, 128])
def test_tiled_workspace_rounds_rows_and_columns(hdim):
    """The bulk-copy kernels (DQ_TILED) write whole tiles of BLOCK_M rows x HDIM_Q (padded) floats
    (BLOCK_M: 128 at hdim 64, 80 at 128, whose chunks are dq_tile_chunk's kind 2; 64 there under a
    short diagonal mask)."""
    from cupy_fmha.backends.cuda import bwd_ws_spec
    for diagonal in (False, True):
        spec = bwd_ws_spec("bf16", hdim, hdim, diagonal=diagonal)
        assert spec.macro("DQ_TILED") == 1
        rows, tiles, kind = (896, 7, 1) if hdim == 64 else (832, 13, 1) if diagonal else (800, 10, 2)
        ws = L.dq_workspace(spec, 2, 3, 777, 1000, hdim, False)
        assert ws == ((2, 3, rows, 128 if hdim > 64 else 64), 0, 0, kind, 0) and (ws.pitch, ws.cols) == ws.shape[2:]
        det = L.dq_workspace(spec, 2, 3, 777, 1000, hdim, True)  # ordered adds: the same tiles + semaphores
        assert det == (ws.shape, 0, 0, kind, 2 * 3 * tiles)


def test_workspace_bytes_of_the_benchmark_shape():
    # the numbers quoted in attention_backward's docstring: slabs on the other kernels (here the
    # mma.sync one at hdim 128 on an A100, BLOCK_N 128), the ordered adds on the ws kernel
    spec = bwd_specs("bf16", 128, 128, 80, deterministic=True).dq_dk_dv
    ws = L.dq_workspace(spec, 4, 16, 4096, 4096, 128, True)
    assert ws.nsplit == 4096 // L.dq_dk_dv_blocks(spec)[0] and ws.nbytes == ws.nsplit * 4 * 16 * 4096 * 128 * 4
    ws90 = L.dq_workspace(bwd_specs("bf16", 128, 128, 90, deterministic=True).dq_dk_dv, 4, 16, 4096, 4096, 128, True)
    assert ws90.nbytes == 4 * 16 * 4160 * 128 * 4 + 4 * 4 * 16 * 52  # 80-row tiles: 136 MB + 13 KB of semaphores
    assert L.dq_workspace(spec, 4, 16, 4096, 4096, 128, False).nbytes == 4 * 16 * 4096 * 128 * 4


def test_every_dispatch_instance_has_block_sizes():
    for spec in default_dispatch_table():
        if spec.source.startswith("fmha_bwd_dq_dk_dv"):
            bn, bm = L.dq_dk_dv_blocks(spec)
            assert bn > 0 and bm > 0 and bm % 16 == 0


# --------------------------------------------------------------------------- kernel sources


def _signature(stem: str, entry: str) -> list[str]:
    src = load_source(stem)
    m = re.search(rf"{entry}\((.*?)\)\s*{{", src, re.S)
    assert m, entry
    return [p.split()[-1].lstrip("*") for p in m.group(1).split(",")]


@pytest.mark.parametrize("stem,struct", [("fmha_bwd_dq_dk_dv", "BwdParams"), ("fmha_bwd_dq_dk_dv_sm90", "BwdParams"),
                                         ("fmha_bwd_convert_dq", "ConvertParams")])
def test_kernels_take_their_params_struct(stem, struct):
    # the split stride, the varlen group and the window travel in the struct (kernels/params.cuh,
    # mirrored by cupy_fmha/params.py; tests/test_params_layout.py checks the two agree)
    from cupy_fmha.params import FLAT_ABI

    if stem in FLAT_ABI:  # the struct's fields as separate arguments, rebuilt as p (params.cuh says why)
        assert f"{stem}(FMHA_BWD_PARAMS_ARGS) {{\n    const {struct} p = FMHA_BWD_PARAMS_STRUCT;" in load_source(stem)
        return
    assert _signature(stem, stem) == ["p"]
    assert f"{stem}(const __grid_constant__ {struct} p)" in load_source(stem)


def test_python_range_mirrors_the_kernel_header():
    src = load_source("fmha_bwd_convert_dq")  # includes attention.cuh
    body = src[src.index("void query_block_range"):]
    body = body[:body.index("}")]
    for line in ("const int lo = max(k0 - w.x + 1, 0);",
                 "const int hi = min(min(k0 + n, seqlen_k) - 1 + w.y, seqlen_q);",
                 "begin = lo / m;",
                 "end = hi > lo ? (hi + m - 1) / m : begin;"):
        assert line in body, line


# --------------------------------------------------------------------------- slab decomposition

MASKS = [
    dict(),
    dict(causal=True),
    dict(mask="t"),
    dict(mask="b"),
    dict(window_size=(37, 0)),
    dict(window_size=(20, 45)),
    dict(mask="xt:33"),
    dict(mask="g:50,10"),
    dict(mask="t:0,0"),
]
SHAPES = [(1, 1), (253, 253), (1000, 253), (253, 1000), (17, 300), (300, 17), (129, 128)]
BLOCKS = [(128, 64), (128, 32), (64, 16), (128, 16)]


def _rows_written(win, kb, bn, bm, sq, sk):
    """Rows slab kb holds: every row of the query blocks in the key block's range."""
    y, x = L.kernel_window(win)
    b, e = L.query_block_range(y, x, kb * bn, bn, bm, sq, sk)
    rows = np.zeros(sq, dtype=bool)
    if e > b:
        rows[b * bm:min(e * bm, sq)] = True
    return rows


@pytest.mark.parametrize("mkw", MASKS, ids=lambda m: repr(m))
@pytest.mark.parametrize("sq,sk", SHAPES)
def test_slabs_cover_every_visible_pair(mkw, sq, sk):
    spec = resolve_mask(mkw.get("mask"), causal=mkw.get("causal", False),
                        window_size=mkw.get("window_size", (-1, -1)))
    win = spec.window(sq, sk)
    vis = dense_mask(win, sq, sk)
    for bn, bm in BLOCKS:
        nsplit = -(-sk // bn)
        for kb in range(nsplit):
            rows = _rows_written(win, kb, bn, bm, sq, sk)
            # a visible (i, j) with j in this key block must be in a row the CTA handles
            seen = vis[:, kb * bn:(kb + 1) * bn].any(axis=1)
            assert not (seen & ~rows).any(), (kb, np.nonzero(seen & ~rows)[0][:5])


@pytest.mark.parametrize("mkw", [dict(), dict(causal=True), dict(window_size=(40, 8)), dict(mask="t")],
                         ids=lambda m: repr(m))
def test_ordered_slab_sum_equals_dense_dq(mkw):
    """NumPy model of the deterministic path: CTA kb stores dS[:, kb] K[kb] into the rows of its
    query blocks (zeros where the mask hides everything), nothing else of slab kb is written
    (NaN stands for never-written memory); convert sums, kb ascending, the slabs whose range
    holds the row. The result must equal the dense dS K and never touch a NaN."""
    rng = np.random.default_rng(7)
    sq, sk, d, bn, bm = 300, 200, 16, 64, 32
    spec = resolve_mask(mkw.get("mask"), causal=mkw.get("causal", False),
                        window_size=mkw.get("window_size", (-1, -1)))
    win = spec.window(sq, sk)
    ds = rng.standard_normal((sq, sk)) * dense_mask(win, sq, sk)
    k = rng.standard_normal((sk, d))
    nsplit = -(-sk // bn)
    slabs = np.full((nsplit, sq, d), np.nan)
    written = []
    for kb in range(nsplit):
        rows = _rows_written(win, kb, bn, bm, sq, sk)
        slabs[kb][rows] = ds[rows, kb * bn:(kb + 1) * bn] @ k[kb * bn:(kb + 1) * bn]
        written.append(rows)
    dq = np.zeros((sq, d))
    for kb in range(nsplit):  # convert_dq: kb ascending, only written slabs
        dq[written[kb]] += slabs[kb][written[kb]]
    assert not np.isnan(dq).any()
    np.testing.assert_allclose(dq, ds @ k, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- argument check


@pytest.mark.parametrize("bad", [1, 0, "yes", None, 1.0])
def test_deterministic_must_be_a_bool(bad):
    from cupy_fmha import api

    x = np.zeros((1, 16, 2, 64), np.float16)
    lse = np.zeros((1, 2, 16), np.float32)
    with pytest.raises(TypeError, match="deterministic"):
        api.attention_backward(x, x, x, x, x, lse, deterministic=bad)


# --------------------------------------------------------------------------- CLI (numpy backend)

runner = CliRunner()
SMALL = ["-b", "2", "--nhead", "2", "-s", "48", "-d", "32", "--backend", "numpy"]


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(device, "gpu_available", lambda: False)


def test_cli_bwd_deterministic_is_accepted_on_numpy(no_gpu):
    res = runner.invoke(cli.app, ["bwd", *SMALL, "--deterministic", "--causal"])
    assert res.exit_code == 0, (res.stdout, res.stderr)
    line = res.stdout.strip()
    assert line.endswith("valid: y") and " deterministic [numpy]" in line


def test_cli_bwd_deterministic_json(no_gpu):
    res = runner.invoke(cli.app, ["bwd", *SMALL, "--deterministic", "--json", "--nhead-k", "1"])
    assert res.exit_code == 0, res.stderr
    obj = json.loads(res.stdout)
    assert obj["config"]["deterministic"] is True and obj["valid"] is True
    res = runner.invoke(cli.app, ["bwd", *SMALL, "--json"])
    assert json.loads(res.stdout)["config"]["deterministic"] is False


def test_cli_fwd_has_no_deterministic_option(no_gpu):
    res = runner.invoke(cli.app, ["fwd", *SMALL, "--deterministic"])
    assert res.exit_code == 2


def test_split_convert_is_its_own_instance():
    for cc in (80, 90):
        s = bwd_specs("fp16", 128, 128, cc)
        assert s.convert_dq.macro("DQ_SPLIT") is None and s.convert_dq_split.macro("DQ_SPLIT") == 1
        assert s.convert_dq_split.source == s.convert_dq.source
    names = {spec.name for spec in default_dispatch_table()}
    assert {"fmha_bwd_convert_dq_fp16_DQ_SPLIT1_ROWS16", "fmha_bwd_convert_dq_bf16_DQ_SPLIT1_ROWS16"} <= names


def test_dq_path_per_instance():
    """The Hopper backward adds dQ with one bulk copy per block (into the tiled workspace) in
    atomic mode without dropout; on the older kernel the deterministic slabs and dropout use the
    per-thread path (DQ_BULK=0, row workspace), the ws kernel bulk copies in every mode; and each of those instances is in the dispatch table (so CI
    compiles it)."""
    names = {spec.name for spec in default_dispatch_table()}
    for dtype in ("fp16", "bf16"):
        for feats in ({}, {"alibi": True}, {"bias": True}, {"dropout": True}):
            for d in (64, 128):
                for det in (False, True):
                    spec = bwd_specs(dtype, d, d, 90, **feats, deterministic=det).dq_dk_dv
                    if spec.source.endswith("_ws"):  # (a bias TMA cannot load: not ws) bulk copies, ordered in deterministic mode
                        assert not feats.get("bias") and spec.macro("DQ_ORDERED") == 1
                    bulk = not det and not feats.get("dropout")
                    assert spec.macro("DQ_BULK", 1) == int(bulk) or spec.source.endswith("_ws"), spec.name
                    assert spec.macro("DQ_TILED") == int(bulk or spec.source.endswith("_ws")), spec.name
                    assert spec.name in names
        # the mma.sync kernel has no such switch: one instance for both modes (the ws kernel, where 96 rounds
        # to, takes the dQ writer in deterministic mode only with 64 rows, under a short diagonal mask:
        # BWD_WS_DQ_WRITER, bench/NOTES.md step 83; with 80 rows in both modes, step 100)
        assert bwd_specs(dtype, 48, 48, 90) == bwd_specs(dtype, 48, 48, 90, deterministic=True)
        a, b = (bwd_specs(dtype, 96, 96, 90, diagonal=True, deterministic=det).dq_dk_dv for det in (False, True))
        assert (a.macro("DQ_WRITER", 0), b.macro("DQ_WRITER")) == (0, 1) and a.name != b.name
        a, b = (bwd_specs(dtype, 96, 96, 90, deterministic=det).dq_dk_dv for det in (False, True))
        assert a.macro("DQ_WRITER") == 1 and a == b


def test_workspace_bytes_follow_the_mask():
    """backward_workspace_bytes picks the query tile the call would: at hdim 128 on sm_90 80 rows without
    a mask (1000 rows round to 1040), 64 under a causal mask up to 4096 keys or a sliding window (1024),
    80 again for a causal mask over more keys (bench/NOTES.md step 100)."""
    import cupy_fmha

    acc = lambda **kw: cupy_fmha.backward_workspace_bytes(1, 16, 1000, 1000, 128, **kw)["dq_accumulator"]
    assert acc() == 16 * 1040 * 128 * 4
    assert acc(causal=True) == acc(sliding_window=True) == 16 * 1024 * 128 * 4
    long = cupy_fmha.backward_workspace_bytes(1, 16, 1000, 8192, 128, causal=True)["dq_accumulator"]
    assert long == 16 * 1040 * 128 * 4
    assert acc(cc=80) == 16 * 1000 * 128 * 4  # (no tiled workspace off Hopper)

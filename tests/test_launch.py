"""Launch maths: grids, blocks and shared memory for every kernel instance, without a GPU."""

from __future__ import annotations

import pytest

from cupy_fmha import launch as L
from cupy_fmha.mask import Window
from cupy_fmha.spec import bwd_specs, default_dispatch_table, fwd_spec, pad_hdim

HDIMS = [(d, d) for d in range(8, 257, 8)] + [(192, 128), (64, 256), (256, 64)]


@pytest.mark.parametrize("hq,hv", HDIMS)
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_shared_memory_fits_and_grids_cover(hq, hv, dtype):
    f = fwd_spec(dtype, hq, hv)
    lf = L.fwd_launch(f, 3, 5, 1000)
    assert 0 < lf.smem <= L.SMEM_LIMIT
    bm = 16 * f.macro("NWARPS")
    assert lf.grid == (-(-1000 // bm), 5, 3) and lf.block == (32 * f.macro("NWARPS"), 1, 1)
    assert f.macro("HDIM_Q") >= hq and f.macro("HDIM_V") >= hv and f.macro("HDIM_Q") % 16 == 0

    b = bwd_specs(dtype, hq, hv)
    lb = L.dq_dk_dv_launch(b.dq_dk_dv, 3, 5, 777)
    assert 0 < lb.smem <= L.SMEM_LIMIT
    bn = 16 * b.dq_dk_dv.macro("NWARPS")
    ns = b.dq_dk_dv.macro("NSPLIT")
    assert lb.grid == (-(-777 // bn) * ns, 5, 3)
    dqp = b.dq_dk_dv.macro("HDIM_Q")
    assert dqp >= hq and (dqp // ns) % 16 == 0
    assert L.dot_do_o_launch(b.dot_do_o, 3, 5, 1000).grid[0] * b.dot_do_o.macro("ROWS") >= 1000
    assert L.convert_launch(b.convert_dq, 3, 5, 1000).grid[0] * b.convert_dq.macro("ROWS") >= 1000


def test_dispatch_table_names_unique_and_both_dtypes():
    specs = default_dispatch_table()
    names = [s.name for s in specs]
    assert len(names) == len(set(names))
    assert {s.dtype for s in specs} == {"fp16", "bf16"}


def test_kernel_window_clamps():
    assert L.kernel_window(None) == (L.WINDOW_INF, L.WINDOW_INF)
    assert L.kernel_window(Window(5, -3)) == (5, -3)
    assert L.kernel_window(Window(1 << 40, -(1 << 40))) == (L.WINDOW_INF, -L.WINDOW_INF)


def test_pad_hdim():
    assert [pad_hdim(d) for d in (8, 16, 40, 72, 104)] == [16, 16, 48, 80, 112]


@pytest.mark.parametrize("hq,hv", [(64, 64), (128, 128), (64, 128), (120, 56)])
def test_sm90_instances_fit(hq, hv):
    f = fwd_spec("bf16", hq, hv, 90)
    b = bwd_specs("bf16", hq, hv, 90).dq_dk_dv
    assert f.target == b.target == "sm90a"
    lf = L.fwd_launch(f, 2, 3, 1000)
    lb = L.dq_dk_dv_launch(b, 2, 3, 1000)
    assert 0 < lf.smem <= L.SMEM_LIMIT and 0 < lb.smem <= L.SMEM_LIMIT
    # the warp-specialized kernels (equal padded head dims) add a producer warpgroup to the MMA ones
    assert lf.block == (128 * (f.macro("NWG") + f.source.endswith("_ws")), 1, 1)
    assert lb.block == (128 * (2 + b.source.endswith("_ws")), 1, 1)
    assert b.source.endswith("_ws") == f.source.endswith("_ws") == (hq == hv)
    assert lb.grid == (-(-1000 // 128), 3, 2)


def test_sm80_devices_never_get_wgmma():
    assert fwd_spec("fp16", 64, 64, 80).target == "sm80"
    assert bwd_specs("fp16", 128, 128, 86).dq_dk_dv.target == "sm80"
    assert bwd_specs("fp16", 40, 40, 90, dropout=True).dq_dk_dv.target == "sm80"  # hdim 40: mma.sync path


def test_ws_backward_routing(monkeypatch):
    """The warp-specialized Hopper backward: by default at equal padded hdims 64 / 128 (deterministic too),
    with dropout too (its DROPOUT build; not together with a bias), not with a bias it cannot take;
    CUPY_FMHA_BWD_WS=1 / 0 force it on (where it applies) / off."""
    from cupy_fmha.backends import cuda as cuda_mod
    from cupy_fmha.backends.cuda import bwd_specs
    src = lambda *a, **kw: bwd_specs("bf16", *a, 90, **kw).dq_dk_dv.source
    monkeypatch.delenv("CUPY_FMHA_BWD_WS", raising=False)
    assert src(128, 128) == src(120, 120) == src(128, 128, alibi=True) == "fmha_bwd_dq_dk_dv_sm90_ws"
    assert src(128, 128, deterministic=True) == src(64, 64, deterministic=True) == "fmha_bwd_dq_dk_dv_sm90_ws"
    assert src(128, 128, bias=True) == src(64, 64, dropout=True, bias=True, bias_tma=2) == "fmha_bwd_dq_dk_dv_sm90"
    # dropout: the DROPOUT build, at the plain build's rows (128 at hdim 64, 64 at 128: bench/NOTES.md step 50)
    for d, rows in ((128, 64), (120, 64), (64, 128), (56, 128)):
        drop = bwd_specs("bf16", d, d, 90, dropout=True).dq_dk_dv
        assert (drop.source, drop.macro("DROPOUT"), drop.macro("BLOCK_M")) == ("fmha_bwd_dq_dk_dv_sm90_ws", 1, rows)
        assert src(d, d, dropout=True, alibi=True, deterministic=True) == drop.source
    assert src(64, 64) == src(56, 64) == "fmha_bwd_dq_dk_dv_sm90_ws"
    assert src(128, 64) == "fmha_bwd_dq_dk_dv_sm90"
    # head dims that round up to 128 (their columns past the head dim zero-filled by TMA) leave the
    # mma.sync kernel; 48 and below, and 136 and above, stay there
    for d in (72, 96, 104):
        s = bwd_specs("bf16", d, d, 90).dq_dk_dv
        assert (s.source, s.macro("HDIM_Q"), s.macro("HDIM_V")) == ("fmha_bwd_dq_dk_dv_sm90_ws", 128, 128)
        assert src(d, d, bias=True) == "fmha_bwd_dq_dk_dv"
        assert bwd_specs("bf16", d, d, 90, dropout=True).dq_dk_dv.name == bwd_specs("bf16", 128, 128, 90, dropout=True).dq_dk_dv.name
    assert src(32, 32) == src(48, 48) == src(48, 48, dropout=True) == "fmha_bwd_dq_dk_dv"
    # wider ones round up to 256 on the wide build (64-key blocks), not with dropout or a bias
    for d in (136, 192, 256):
        s = bwd_specs("bf16", d, d, 90).dq_dk_dv
        assert (s.source, s.macro("HDIM_Q"), s.macro("BLOCK_N"), s.macro("DQ_TILED")) == ("fmha_bwd_dq_dk_dv_sm90_ws_wide", 256, 64, 1)
        assert s.macro("DQ_ORDERED") == 1  # dQ staged in the Q / dO buffers: tiled, ordered deterministic adds
        assert s.macro("SMEM_BYTES") <= L.SMEM_LIMIT and src(d, d, alibi=True, deterministic=True) == s.source
        assert src(d, d, dropout=True) == src(d, d, bias=True) == "fmha_bwd_dq_dk_dv"
    s = bwd_specs("bf16", 192, 128, 90).dq_dk_dv  # (unequal with one above 128: the alternative is mma.sync)
    assert (s.source, s.macro("HDIM_Q"), s.macro("HDIM_V")) == ("fmha_bwd_dq_dk_dv_sm90_ws_wide", 256, 128)
    assert s.macro("DQ_TILED") == s.macro("DQ_ORDERED") == 0  # (the dO buffer is too small for the dQ tile's half)
    assert bwd_specs("bf16", 128, 192, 90).dq_dk_dv.macro("DQ_TILED") == 1
    # its tuning variable takes only its own entries, and at least two stages (a stage goes back a block late)
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_WIDE_TILES", "DQ_STAGE=0")
    assert bwd_specs("bf16", 256, 256, 90).dq_dk_dv.macro("DQ_TILED") == 0
    # the dQ writer (by default at 256 since step 83: BWD_WS_DQ_WRITER): its mbarriers and jobs, 32
    # bytes per stage, only where dQ is staged
    monkeypatch.delenv("CUPY_FMHA_BWD_WS_WIDE_TILES")
    assert bwd_specs("bf16", 256, 256, 90).dq_dk_dv.macro("DQ_WRITER") == 1
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_WIDE_TILES", "DQ_WRITER=0")
    plain = {hv: bwd_specs("bf16", 256, hv, 90).dq_dk_dv for hv in (128, 256)}
    assert plain[256].macro("DQ_WRITER", 0) == 0
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_WIDE_TILES", "DQ_WRITER=1")
    w = {hv: bwd_specs("bf16", 256, hv, 90).dq_dk_dv for hv in (128, 256)}
    assert w[256].macro("DQ_WRITER") == 1 and w[256].name != plain[256].name
    assert w[256].macro("SMEM_BYTES") == plain[256].macro("SMEM_BYTES") + 2 * 32 <= L.SMEM_LIMIT
    assert w[128].macro("SMEM_BYTES") == plain[128].macro("SMEM_BYTES")
    monkeypatch.delenv("CUPY_FMHA_BWD_WS_WIDE_TILES")
    # ... and the ws build's (hdim 64 and 128): two mbarriers and the job, 40 bytes; not in the
    # dropout or bias builds
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_TILES", "DQ_WRITER=0")
    plain = {d: bwd_specs("bf16", d, d, 90).dq_dk_dv for d in (64, 128)}
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_TILES", "DQ_WRITER=1")
    for d in (64, 128):
        w = bwd_specs("bf16", d, d, 90).dq_dk_dv
        assert (w.source, w.macro("DQ_WRITER")) == ("fmha_bwd_dq_dk_dv_sm90_ws", 1)
        assert w.macro("SMEM_BYTES") == plain[d].macro("SMEM_BYTES") + 40 <= L.SMEM_LIMIT
        assert bwd_specs("bf16", d, d, 90, dropout=True).dq_dk_dv.macro("DQ_WRITER", 0) == 0
        assert bwd_specs("bf16", d, d, 90, bias=True, bias_tma=2).dq_dk_dv.macro("DQ_WRITER", 0) == 0
    monkeypatch.delenv("CUPY_FMHA_BWD_WS_TILES")
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_WIDE_TILES", "DQ_WRITER=1")
    for bad, what in (("SPLIT_PDS=1", "unknown"), ("STAGES=1", "STAGES")):
        monkeypatch.setenv("CUPY_FMHA_BWD_WS_WIDE_TILES", bad)
        with pytest.raises(ValueError, match=what):
            bwd_specs("bf16", 256, 256, 90)
    monkeypatch.delenv("CUPY_FMHA_BWD_WS_WIDE_TILES")
    assert src(192, 128, dropout=True) == "fmha_bwd_dq_dk_dv"
    monkeypatch.setenv("CUPY_FMHA_BWD_WS", "1")
    assert src(32, 32) == src(96, 64) == "fmha_bwd_dq_dk_dv_sm90_ws"
    assert src(128, 64) == src(128, 128, deterministic=True) == "fmha_bwd_dq_dk_dv_sm90_ws"
    assert src(128, 64, dropout=True) == "fmha_bwd_dq_dk_dv_sm90_ws"
    # never with a bias (no such build)
    assert src(64, 64, dropout=True, bias=True, bias_tma=2) == "fmha_bwd_dq_dk_dv_sm90"
    with pytest.raises(ValueError, match="bias and dropout"):
        cuda_mod.bwd_ws_spec("bf16", 64, 64, bias_tma=2, dropout=True)
    monkeypatch.setenv("CUPY_FMHA_BWD_WS", "0")
    assert src(128, 128) == src(64, 64) == src(128, 128, dropout=True) == "fmha_bwd_dq_dk_dv_sm90"
    assert src(256, 256) == "fmha_bwd_dq_dk_dv"
    for bad in ("true", "off", "2"):  # (only 0 and 1: "off" used to mean on)
        monkeypatch.setenv("CUPY_FMHA_BWD_WS", bad)
        with pytest.raises(ValueError, match="CUPY_FMHA_BWD_WS: expected 0 or 1"):
            src(128, 128)


def test_fwd_ws_routing_and_geometry(monkeypatch):
    """The warp-specialized Hopper forward: the default when both head dims round up (to a multiple
    of 64) to the same of 64/128/192/256 (unequal ones under CUPY_FMHA_FWD_WS=1, none under =0),
    never with dropout or a bias it cannot load (one that does not fit beside 192/256-wide tiles
    either); a producer and two MMA warpgroups over 128 query rows (three over 192 at hdim 64, except
    with a bias, dropout or a short diagonal mask); the key block by head dim."""
    from cupy_fmha.backends.cuda import fwd_spec
    monkeypatch.delenv("CUPY_FMHA_FWD_WS", raising=False)
    assert fwd_spec("bf16", 128, 128, 90).source == fwd_spec("fp16", 56, 64, 90).source == "fmha_fwd_sm90_ws"
    assert fwd_spec("bf16", 128, 64, 90).source == "fmha_fwd_sm90"
    for d, dpad, bn in ((96, 128, 128), (160, 192, 112), (192, 192, 112), (224, 256, 80), (256, 256, 80)):
        s = fwd_spec("bf16", d, d, 90)
        assert (s.source, s.macro("HDIM_Q"), s.macro("HDIM_V"), s.macro("BLOCK_N")) == ("fmha_fwd_sm90_ws", dpad, dpad, bn)
        assert s.macro("SMEM_BYTES") <= L.SMEM_LIMIT and s.macro("PV_OVERLAP") == 1
        assert fwd_spec("bf16", d, d, 90, bias=True, bias_tma=2).source == ("fmha_fwd_sm90_ws" if d <= 128 else "fmha_fwd")
        drop = fwd_spec("bf16", d, d, 90, dropout=True)  # (the serial pipeline above 128: step 48; at 128 overlapped since step 97)
        assert (drop.source, drop.macro("DROPOUT"), drop.macro("FOLD"), drop.macro("PV_OVERLAP"), drop.macro("PINGPONG")) == (
            "fmha_fwd_sm90_ws", 1, None, *((1, 1) if dpad == 128 else (None, None)))
        assert drop.macro("BLOCK_N") == {128: 128, 192: 96, 256: 80}[dpad]
        # (a bias with dropout: no ws build; at these head dims the mma.sync kernel, as without TMA)
        assert fwd_spec("bf16", d, d, 90, bias=True, dropout=True, bias_tma=2).source == "fmha_fwd"
    assert fwd_spec("bf16", 128, 128, 90, bias=True, dropout=True, bias_tma=2).source == "fmha_fwd_sm90"
    d64 = fwd_spec("bf16", 64, 64, 90, dropout=True)  # (two warpgroups, ping-pong: step 74)
    assert d64.source == "fmha_fwd_sm90_ws" and d64.macro("FOLD") is None
    assert d64.macro("PV_OVERLAP") == 1 and d64.macro("PINGPONG") == 1 and d64.macro("NWG") == 2
    assert fwd_spec("bf16", 64, 64, 90, dropout=True, short=True).name == d64.name  # (short diagonal masks: the same)
    assert fwd_spec("bf16", 32, 32, 90, dropout=True).source == "fmha_fwd"
    a = fwd_spec("fp16", 256, 256, 90, alibi=True)  # (the overlapped pipeline spills with ALiBi at 256)
    assert a.source == "fmha_fwd_sm90_ws" and a.macro("PV_OVERLAP") is None and a.macro("PINGPONG") is None
    s = fwd_spec("bf16", 192, 128, 90)  # (unequal with one above 128: the alternative is mma.sync)
    assert (s.source, s.macro("HDIM_Q"), s.macro("HDIM_V"), s.macro("BLOCK_N")) == ("fmha_fwd_sm90_ws", 192, 128, 112)
    monkeypatch.setenv("CUPY_FMHA_FWD_WS", "0")
    assert fwd_spec("bf16", 128, 128, 90).source == fwd_spec("bf16", 64, 64, 90).source == "fmha_fwd_sm90"
    assert fwd_spec("bf16", 256, 256, 90).source == "fmha_fwd"
    monkeypatch.setenv("CUPY_FMHA_FWD_WS", "1")
    assert fwd_spec("bf16", 128, 64, 90).source == "fmha_fwd_sm90_ws"
    s = fwd_spec("bf16", 128, 128, 90)
    assert s.source == "fmha_fwd_sm90_ws" and fwd_spec("fp16", 120, 120, 90, alibi=True).source == s.source
    assert fwd_spec("bf16", 128, 128, 90, dropout=True).source == "fmha_fwd_sm90_ws"
    assert fwd_spec("bf16", 64, 64, 90, bias=True).source == "fmha_fwd_sm90"
    assert fwd_spec("bf16", 128, 128, 80).source == "fmha_fwd"
    launch = L.fwd_launch(s, 2, 3, 1000)
    assert launch.grid == (-(-1000 // 128), 3, 2) and launch.block == (384, 1, 1) and launch.smem <= L.SMEM_LIMIT


@pytest.mark.parametrize("per, grid_x", [(0, 8), (1, 8), (2, 4), (3, 3), (4, 2), (8, 1), (20, 1)])
def test_fwd_ws_persist_grid(monkeypatch, per, grid_x):
    """CUPY_FMHA_FWD_WS_TILES=PERSIST=n: up to n row blocks per CTA of the ws forward (grid x =
    ceil(row blocks / n); the kernel strides over them by grid x, so every row block 0 .. 7 of
    seqlen 1000 / 128 rows has exactly one CTA); 0 forces one per CTA; the kernel is the same for
    every n (only the launch changes); negative is refused."""
    from cupy_fmha.backends.cuda import fwd_spec
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", f"PERSIST={per}")
    s = fwd_spec("bf16", 128, 128, 90)
    assert s.macro("PERSIST") == per and f"PERSIST{per}" in s.name
    launch = L.fwd_launch(s, 2, 3, 1000)
    assert launch.grid == (grid_x, 3, 2)
    owners = sorted(x for c in range(grid_x) for x in range(c, 8, grid_x))
    assert owners == list(range(8)) and max(len(range(c, 8, grid_x)) for c in range(grid_x)) <= (per or 1)
    assert L.empty_grid(L.fwd_launch(s, 2, 3, 0))
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "PERSIST=-1")
    with pytest.raises(ValueError, match="PERSIST must be >= 0"):
        fwd_spec("bf16", 128, 128, 90)


def test_fwd_ws_key_block_variants(monkeypatch):
    """Step 111's 176- and 192-key blocks at hdim 128 (O staged in Q's buffer): plain and ALiBi builds; the dropout
    build keeps 128 keys (176 overflow its keep words, 192 spill), and O then has its own stage again."""
    from cupy_fmha.backends import cuda

    for n in (176, 192):
        monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", f"BLOCK_N={n},O_IN_Q=1")
        for alibi in (False, True):
            s = fwd_spec("bf16", 128, 128, 90, alibi=alibi)
            assert s.macro("BLOCK_N") == n and s.macro("O_IN_Q") == 1 and s.macro("O_STAGE") == 0, s.name
            assert s.macro("SMEM_BYTES") <= cuda.SMEM_LIMIT
        s = fwd_spec("bf16", 128, 128, 90, dropout=True)
        assert s.macro("BLOCK_N") == 128 and s.macro("O_IN_Q", 0) == 0 and s.macro("O_STAGE") == 1, s.name
    monkeypatch.delenv("CUPY_FMHA_FWD_WS_TILES")
    assert fwd_spec("bf16", 128, 128, 90).macro("BLOCK_N") == 128  # (the table's without the variable)


def test_fwd_ws_o_in_kv_where_it_applies(monkeypatch):
    """O_IN_KV (bench/NOTES.md row 127: O staged in the last key block's K and V tiles) where the overlapped pipeline
    runs on two MMA warpgroups and O has no stage of its own: at 192 and 256 (there in place of the table's O_IN_Q,
    given or not), ALiBi at 192, the two-warpgroup dropout build at 64; dropped, with the table's O_IN_Q kept, where it
    does not apply: 128 (O's own stage), 64's three warpgroups, the serial pipeline (ALiBi at 256, dropout at 192 / 256),
    key blocks under 64, unequal head dims."""
    for env in ("O_IN_KV=1", "O_IN_KV=1,O_IN_Q=0", "O_IN_KV=1,O_IN_Q=1"):
        monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", env)
        for d, kw in ((192, {}), (256, {}), (192, dict(alibi=True)), (64, dict(dropout=True))):
            s = fwd_spec("bf16", d, d, 90, **kw)
            assert s.source == "fmha_fwd_sm90_ws" and s.macro("O_IN_KV") == 1 and s.macro("O_IN_Q", 0) == 0, s.name
            assert s.macro("PV_OVERLAP") == 1 and s.macro("NWG") == 2 and s.macro("O_STAGE") == 0, s.name
        s = fwd_spec("bf16", 256, 256, 90, alibi=True)
        assert s.macro("O_IN_KV", 0) == 0 and s.macro("O_IN_Q", 0) == (env != "O_IN_KV=1,O_IN_Q=0"), s.name
        for d, kw in ((128, {}), (64, {}), (192, dict(dropout=True)), (256, dict(dropout=True))):
            s = fwd_spec("bf16", d, d, 90, **kw)
            assert s.source == "fmha_fwd_sm90_ws" and s.macro("O_IN_KV", 0) == 0, s.name
        assert fwd_spec("bf16", 256, 128, 90).macro("O_IN_KV", 0) == 0  # (unequal head dims: O's own stage)
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "O_IN_KV=1,BLOCK_N=48")
    assert fwd_spec("bf16", 256, 256, 90).macro("O_IN_KV", 0) == 0
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "O_IN_KV=1,PINGPONG=0")  # (the overlapped pipeline without turns)
    assert fwd_spec("bf16", 256, 256, 90).macro("O_IN_KV") == 1
    monkeypatch.delenv("CUPY_FMHA_FWD_WS_TILES")
    # the table's at 192 (bench/NOTES.md row 128), with ALiBi too; not at 64, 128 or 256, nor the serial dropout build
    assert [fwd_spec("bf16", d, d, 90).macro("O_IN_KV", 0) for d in (64, 128, 192, 256)] == [0, 0, 1, 0]
    assert fwd_spec("bf16", 192, 192, 90, alibi=True).macro("O_IN_KV", 0) == 1
    assert fwd_spec("bf16", 192, 192, 90, dropout=True).macro("O_IN_KV", 0) == 0


def test_fwd_ws_wg_skip_where_it_applies(monkeypatch):
    """WG_SKIP (MMA warpgroups leave out the key blocks none of their rows sees, bench/NOTES.md row 130) on the
    overlapped pipeline's plain, ALiBi and dropout builds at 64, 128 and 256 when asked for; dropped from the serial
    ones (ALiBi and dropout at 256, dropout at 192), the bias builds and beside O_IN_KV (192's table entry). The table
    has it at 64 (plain, ALiBi) and 256 (plain), not at 128 nor in the dropout builds; its 0 leaves the name as it
    was."""
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "WG_SKIP=1")
    for d, kw in ((64, {}), (128, {}), (256, {}), (64, dict(alibi=True)), (128, dict(alibi=True)),
                  (64, dict(dropout=True)), (128, dict(dropout=True))):
        s = fwd_spec("bf16", d, d, 90, **kw)
        assert s.source == "fmha_fwd_sm90_ws" and s.macro("WG_SKIP") == 1 and s.macro("PV_OVERLAP") == 1, s.name
    for d, kw in ((192, {}), (192, dict(dropout=True)), (256, dict(alibi=True)), (256, dict(dropout=True)),
                  (64, dict(bias=True, bias_tma=2)), (128, dict(bias=True, bias_tma=2))):
        s = fwd_spec("bf16", d, d, 90, **kw)
        assert s.source == "fmha_fwd_sm90_ws" and s.macro("WG_SKIP", 0) == 0, s.name
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "WG_SKIP=1,O_IN_KV=0")  # (192 without O_IN_KV takes it)
    assert fwd_spec("bf16", 192, 192, 90).macro("WG_SKIP") == 1
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "WG_SKIP=0")
    off = fwd_spec("bf16", 128, 128, 90).name
    assert "WG_SKIP" not in fwd_spec("bf16", 64, 64, 90).name
    monkeypatch.delenv("CUPY_FMHA_FWD_WS_TILES")
    assert off == fwd_spec("bf16", 128, 128, 90).name
    assert [fwd_spec("bf16", d, d, 90).macro("WG_SKIP", 0) for d in (64, 128, 192, 256)] == [1, 0, 0, 1]
    assert fwd_spec("bf16", 64, 64, 90, alibi=True).macro("WG_SKIP") == 1
    assert [fwd_spec("bf16", d, d, 90, dropout=True).macro("WG_SKIP", 0) for d in (64, 128, 192, 256)] == [0, 0, 0, 0]


def test_fwd_ws_softmax_defaults(monkeypatch):
    """Step 113's softmax (FWD_WS_SOFTMAX: FOLD, SMAX_TREE, LAZY_RESCALE=8) at hdim 64, 128, 256 and (step 115) 192:
    the plain and ALiBi builds carry all three (the ALiBi kernel takes the unfolded form, FOLD && !ALIBI); the dropout
    builds (FOLD=0 in FWD_WS_DROPOUT_BY_HDIM: step 114's folded form is a variant) and the bias builds go without FOLD
    and keep the other two, except the 16-bit bias at 64 (three warpgroups), which keeps the chain maxima (the trees
    spill 240 bytes there), and the dropout build at 64, which keeps the softmax before step 113 (step 115: faster
    there) and makes its keep decisions inside the softmax (KEEP_SINK, step 116); MASK_ROWS=2 at 64 and 128 (step 115) in every build there; the variable turns them off."""
    monkeypatch.delenv("CUPY_FMHA_FWD_WS_TILES", raising=False)
    for d in (64, 128, 192, 256):
        for alibi in (False, True):
            s = fwd_spec("bf16", d, d, 90, alibi=alibi)
            assert s.source == "fmha_fwd_sm90_ws", s.name
            assert (s.macro("FOLD"), s.macro("SMAX_TREE"), s.macro("LAZY_RESCALE")) == (1, 1, 8), s.name
        s = fwd_spec("bf16", d, d, 90, dropout=True)
        want = (0, 0, 0) if d == 64 else (0, 1, 8)
        assert (s.macro("FOLD", 0), s.macro("SMAX_TREE", 0), s.macro("LAZY_RESCALE", 0)) == want, s.name
        # (steps 116-117: the keep decisions inside the softmax at 64, half of them at 128)
        assert s.macro("KEEP_SINK", 0) == {64: 1, 128: 2}.get(d, 0), s.name
        for kw in (dict(), dict(alibi=True), dict(dropout=True), dict(bias=True, bias_tma=2), dict(bias=True, bias_tma=4)):
            if d > 128 and "bias" in kw:
                continue
            s = fwd_spec("bf16", d, d, 90, **kw)
            assert s.macro("MASK_ROWS", 0) == (2 if d <= 128 else 0), s.name
    for d, n, tree in ((128, 2, 1), (128, 4, 1), (64, 4, 1), (64, 2, 0)):
        s = fwd_spec("bf16", d, d, 90, bias=True, bias_tma=n)
        assert (s.macro("FOLD", 0), s.macro("SMAX_TREE", 0), s.macro("LAZY_RESCALE")) == (0, tree, 8), s.name
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "FOLD=0,SMAX_TREE=0,LAZY_RESCALE=0,MASK_ROWS=0")
    s = fwd_spec("bf16", 128, 128, 90)
    assert not any(k in s.name for k in ("FOLD", "SMAX_TREE", "LAZY_RESCALE", "MASK_ROWS")), s.name


@pytest.mark.parametrize("text,message", [("SMAXTREE=1", r"unknown entries \['SMAXTREE'\]"),
                                          ("PERSIST=2,FOO=1", r"unknown entries \['FOO'\]"),
                                          ("PERSIST=abc", "PERSIST expects an integer"),
                                          ("BLOCK_N=", "BLOCK_N expects an integer")])
def test_fwd_ws_tiles_bad_entries(monkeypatch, text, message):
    """CUPY_FMHA_FWD_WS_TILES refuses a name no build reads (a typo would otherwise become a -D macro that
    changes nothing, timed as if it were a variant) and a value that is not an integer, naming the variable."""
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", text)
    with pytest.raises(ValueError, match=f"CUPY_FMHA_FWD_WS_TILES: .*{message}"):
        fwd_spec("bf16", 128, 128, 90)
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "PERSIST=2,")  # (a trailing comma is no entry)
    assert fwd_spec("bf16", 128, 128, 90).macro("PERSIST") == 2


@pytest.mark.parametrize("name", ["Q_EARLY", "TURN_CARRY", "Q_STAGES", "O_VEC", "CLUSTER", "ROWSUM_MMA", "KEEP_RING",
                                  "O_WRITER", "XRB", "LINEAR"])
def test_fwd_ws_removed_variants_refused(monkeypatch, name):
    """The ws forward's variants removed in step 88, ROWSUM_MMA (step 89, no gain in step 91),
    KEEP_RING (step 99, slower), O_WRITER (step 106, no gain; none at 16 row blocks per CTA in step 109),
    XRB (step 109, slower) and LINEAR (step 110, no gain; slower under causal masks) are refused by name, not
    built as the default under another name (an old A/B command would otherwise time the default against
    itself); the message names the steps, 106, 109 and 110 among them."""
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", f"PERSIST=2,{name}=1")
    with pytest.raises(ValueError, match=f"{name} no longer exist.*bench/NOTES.md steps .*106, 109 and 110"):
        fwd_spec("bf16", 128, 128, 90)
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "PERSIST=2")
    assert name not in fwd_spec("bf16", 128, 128, 90).name


def test_first_key_block_matches_counting():
    """The deterministic ordered dQ adds admit a query tile's key blocks in ascending order; a CTA
    (key block kb) finds the first of them with first_key_block, walking as its query tiles
    advance (kernels/common.cuh, mirrored in launch.py). Against counting over every key block
    and query tile, for random lengths and windows, including windows that exclude the diagonal
    and ones that leave key or query blocks with nothing to see: the first equals the smallest
    key block whose query range holds the tile, and the key blocks below kb that see the tile
    number exactly kb - first (they are contiguous)."""
    import random

    rng = random.Random(10)
    inf = L.WINDOW_INF
    checked = 0
    for _ in range(300):
        n, m = rng.choice([(128, 64), (64, 64), (128, 128)])
        sq, sk = rng.randint(1, 700), rng.randint(1, 700)
        wy = rng.choice([inf, rng.randint(-200, 800)])
        wx = rng.choice([inf, rng.randint(-200, 800)])
        nkb = -(-sk // n)
        ranges = [L.query_block_range(wy, wx, kb * n, n, m, sq, sk) for kb in range(nkb)]
        for kb, (b, e) in enumerate(ranges):
            first = kb
            for qb in range(b, e):
                first = L.first_key_block(wy, wx, qb, first, qb == b, n, m, sq, sk)
                seeing = [k for k, (kb_b, kb_e) in enumerate(ranges) if kb_b <= qb < kb_e]
                assert first == min(seeing), (n, m, sq, sk, wy, wx, kb, qb)
                assert sum(1 for k in seeing if k < kb) == kb - first
                checked += 1
    assert checked > 3000


def test_fwd_ws_persist_default(monkeypatch):
    """Without the variable the launcher picks the row blocks per CTA (backends/cuda.py
    FWD_WS_PERSIST, bench/NOTES.md step 39): 4 at seqlen <= 1024 (8 row blocks of 128), 2 up to
    2048, then one per CTA (at hdim 128 2 up to 2048: FWD_WS_PERSIST_BY_HDIM, step 115); never when the grid would fall below three waves of 132 SMs (a small
    batch keeps one row block per CTA); the ws forward only (the other forwards' grids unchanged)."""
    from cupy_fmha.backends import cuda
    monkeypatch.delenv("CUPY_FMHA_FWD_WS_TILES", raising=False)
    s = cuda.fwd_spec("bf16", 128, 128, 90)
    assert s.macro("PERSIST") is None and "PERSIST" not in s.name
    # FlashAttention's grid (batch * seqlen = 16384, nhead * hdim = 2048), hdim 128
    assert L.fwd_launch(s, 16, 16, 1024).grid == (4, 16, 16)  # (2 per CTA at hdim 128, FWD_WS_PERSIST_BY_HDIM)
    assert L.fwd_launch(s, 8, 16, 2048).grid == (8, 16, 8)
    assert L.fwd_launch(s, 4, 16, 4096).grid == (32, 16, 4)
    assert L.fwd_launch(s, 1, 16, 16384).grid == (128, 16, 1)
    assert L.fwd_launch(s, 1, 8, 1024).grid == (8, 8, 1)  # 64 CTAs: one row block each
    # (row blocks, batch * heads) -> per CTA: 8 x 198 at 4 per CTA is 396 CTAs (4); 8 x 197 at 4 is 394,
    # at 2 it is 788 (2); 8 x 98 at 2 is 392 (0); 16 x 50 at 2 is 400 (2); 16 x 49 at 2 is 392 (0); 17 row blocks (0)
    cases = ((8, 198), (8, 197), (8, 98), (16, 50), (16, 49), (17, 10**6))
    assert [cuda.fwd_ws_persist(n, bh) for n, bh in cases] == [4, 2, 0, 2, 0, 0]
    # hdim 128 (step 115): 2 per CTA up to 16 row blocks; other head dims FWD_WS_PERSIST's
    assert [cuda.fwd_ws_persist(n, bh, 128) for n, bh in cases] == [2, 2, 0, 2, 0, 0]
    assert [cuda.fwd_ws_persist(n, bh, 64) for n, bh in cases] == [4, 2, 0, 2, 0, 0]
    assert L.fwd_launch(cuda.fwd_spec("bf16", 64, 64, 90), 16, 32, 1024).grid == (2, 32, 16)  # (6 row blocks of 192, 4 per CTA)
    plain = cuda.fwd_spec("bf16", 128, 128, 80)
    assert plain.source == "fmha_fwd" and L.fwd_launch(plain, 16, 16, 1024).grid[0] == -(-1024 // plain.macro("BLOCK_M"))


def test_fwd_ws_bias_acc_variant(monkeypatch):
    """CUPY_FMHA_FWD_WS_TILES=BIAS_ACC=1 (bench/NOTES.md step 77) builds the ws forward's TMA-bias
    instances with the bias as S's starting value; the plain, ALiBi and dropout builds (and a
    dropout build with a bias) ignore it, and without the switch no instance carries it."""
    from cupy_fmha.backends import cuda

    # by default at hdim 64 (FWD_WS_BIAS_BY_HDIM: 1.35x plain against 1.52x, bench/NOTES.md step 83), and at 128 for a
    # 16-bit bias (step 119: 1.40 -> 1.36x plain), not for an fp32 one there (untimed)
    assert fwd_spec("bf16", 64, 64, 90, bias=True, bias_tma=2).macro("BIAS_ACC", 0) == 1
    assert fwd_spec("bf16", 128, 128, 90, bias=True, bias_tma=2).macro("BIAS_ACC", 0) == 1
    assert fwd_spec("bf16", 128, 128, 90, bias=True, bias_tma=4).macro("BIAS_ACC", 0) == 0
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "BIAS_ACC=1")
    for d in (64, 128):
        for n in (2, 4):
            s = fwd_spec("bf16", d, d, 90, bias=True, bias_tma=n)
            assert (s.source, s.macro("BIAS_ACC"), s.macro("BIAS_TMA")) == ("fmha_fwd_sm90_ws", 1, n), s.name
        for kw in (dict(), dict(alibi=True), dict(dropout=True), dict(dropout=True, bias=True, bias_tma=2)):
            assert fwd_spec("bf16", d, d, 90, **kw).macro("BIAS_ACC", 0) == 0, kw
        assert cuda.fwd_ws_spec("bf16", d, d, alibi=True, bias_tma=2).macro("BIAS_ACC", 0) == 0  # (no such build)


def test_dq_writer_default_by_mode(monkeypatch):
    """BWD_WS_DQ_WRITER puts the dQ writer into the ws backwards' default builds per dQ mode and
    padded head dim (the measured table: atomic 256, deterministic all three); the tuning
    variables override it, and the bias and dropout builds never take it."""
    from cupy_fmha.backends import cuda

    for det in (False, True):
        for d in (64, 128, 256):
            want = int(d in cuda.BWD_WS_DQ_WRITER["deterministic" if det else "atomic"])
            spec = bwd_specs("bf16", d, d, 90, deterministic=det, diagonal=True).dq_dk_dv
            assert spec.macro("DQ_WRITER", 0) == want, (d, det)
            # (the 80-row build at 128, without a short diagonal, carries the writer in its table entry)
            assert bwd_specs("bf16", d, d, 90, deterministic=det).dq_dk_dv.macro("DQ_WRITER", 0) == max(want, d == 128)
    # (atomic at 128 with 64 rows: 1.02x the time)
    assert bwd_specs("bf16", 128, 128, 90, diagonal=True).dq_dk_dv.macro("DQ_WRITER", 0) == 0
    assert bwd_specs("bf16", 64, 64, 90).dq_dk_dv.macro("DQ_WRITER", 0) == 0
    monkeypatch.setattr(cuda, "BWD_WS_DQ_WRITER", {"atomic": (128,), "deterministic": (64, 128, 256)})
    for d, atomic in ((64, 0), (128, 1), (256, 0)):
        assert bwd_specs("bf16", d, d, 90, diagonal=True).dq_dk_dv.macro("DQ_WRITER", 0) == atomic, d
        det = bwd_specs("bf16", d, d, 90, deterministic=True, diagonal=True).dq_dk_dv
        assert det.macro("DQ_WRITER") == 1 and det.macro("DQ_ORDERED") == 1, det.name
    assert bwd_specs("bf16", 192, 192, 90, deterministic=True).dq_dk_dv.macro("DQ_WRITER") == 1  # (rounds to 256)
    assert bwd_specs("bf16", 64, 64, 90, deterministic=True, dropout=True).dq_dk_dv.macro("DQ_WRITER", 0) == 0
    assert bwd_specs("bf16", 128, 128, 90, deterministic=True, bias=True,
                     bias_tma=2).dq_dk_dv.macro("DQ_WRITER", 0) == 0
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_TILES", "DQ_WRITER=0")
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_WIDE_TILES", "DQ_WRITER=0")
    for d in (64, 128, 256):
        s = bwd_specs("bf16", d, d, 90, deterministic=True).dq_dk_dv
        assert s.macro("DQ_WRITER", 0) == 0 and "DQ_WRITER" not in s.name, s.name

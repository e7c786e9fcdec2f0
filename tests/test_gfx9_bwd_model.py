"""NumPy model of the gfx9 backward's index maps (fmha_bwd_dq_dk_dv.cu on kernels/arch/gfx9/:
fragment.cuh's AccFrag and keep_bit and row-slot stores, tile.cuh's load_a, load_a_t, store_a,
mma_row_nmajor / mma_row_kmajor and acc_to_a), over the layouts of cupy_fmha.backends.gfx9_layout,
and a host build of those C++ functions that shows they compute the same maps.

The model runs one workgroup's step the way the kernel does (every wavefront owns 16 keys):
S^T and dP^T through v_mfma_f32_16x16x16 with the query (dO) rows as the A operand and the
wavefront's K (V) fragment as B, so a lane holds one key and 4 adjacent query rows per tile; P^T
and dS^T element by element (keep bits from fill_keep_bits' byte mask through keep_bit); dV += P^T
dO and dK += dS^T Q with the accumulators fed back as the B operand (acc_to_a); dS^T through LDS
(store_a, then load_a_t as GEMM4's row fragments) into dQ = dS K; the row-slot stores of dQ, dK
and dV. It gathers the results through the same maps and compares them with dense NumPy. The
keep-bit map is also checked against the Philox host replica.

test_cpp_maps_equal_the_model compiles the arch layer's headers with the host clang (the
builtins the layer calls replaced by recorders: an MFMA call records its operands) and checks
every map, lane by lane, against this file's formulas; test_a_changed_formula_is_caught shows it
fails when one formula changes on the C++ side. CPU only: nothing here ran on an AMD GPU."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from cupy_fmha import philox
from cupy_fmha.backends import gfx9_layout as G

ROOT = Path(__file__).resolve().parent.parent
S16 = next(s for s in G.LAYOUTS if s.name == "16x16x16")
LANES = range(G.WAVE)
E = 4  # AccFrag::SLOT_ELEMS (one row slot per tile)


# -- the maps of fragment.cuh / tile.cuh (L = Mfma16x16x16) --
def a_row(l, i=0): return G.a_coords(S16, l, i)[0]
def a_k(l, i): return G.a_coords(S16, l, i)[1]
def b_k(l, i): return G.b_coords(S16, l, i)[0]
def b_col(l, i=0): return G.b_coords(S16, l, i)[1]
def d_row(l, r): return G.d_coords(S16, l, r)[0]
def d_col(l, r=0): return G.d_coords(S16, l, r)[1]


def frag_row(l, e):  # AccFrag::row: the lane's key (backward) / query row (forward)
    return d_col(l, e)


def frag_col(l, n, e):  # AccFrag::col
    return 16 * n + d_row(l, e)


def load_a_idx(m0, k0, l, i):  # load_a: (row, col) of the [m][k] tile in element i of lane l
    return m0 + b_col(l), k0 + b_k(l, i)


def load_a_t_idx(m0, k0, l, i):  # load_a_t: A = M^T from a [k][m] tile M
    return k0 + b_k(l, i), m0 + b_col(l)


def store_a_idx(m0, k0, l, i):  # store_a: element i of lane l goes to this (row, col)
    return m0 + b_col(l), k0 + b_k(l, i)


def kmajor_idx(n0, k0, l, i):  # mma_row_kmajor's A operand, from a [k][n] tile
    return k0 + a_k(l, i), n0 + a_row(l)


def keep_bit_idx(pitch, l, n, e):  # keep_bit: (byte, bit) of fill_keep_bits' mask
    key = frag_row(l, e)
    return (key >> 3) * pitch + frag_col(l, n, 0) + e, key & 7


def slot_offset(c):  # store_slot_* / add_slot_f32: value c of the slot, columns from the slot's first
    return c


def gather(tile, idx):
    return np.array([[tile[idx(l, i)] for i in range(4)] for l in LANES], dtype=np.float32)


def mfma(ra, rb, rc):
    return G.mfma_model(S16, ra, rb, rc)


def test_the_maps_need_these_layout_identities():
    """tile.cuh reads K's rows with load_a for the A operand and the fragment for B (so A's (row, k)
    must be B's (col, k)), and hands accumulators to acc_to_a as B operands (so D's (row, col) must
    be B's (k, col)); load_a_t and store_a address 4 consecutive k per lane."""
    for l in LANES:
        for i in range(4):
            assert (a_row(l, i), a_k(l, i)) == (b_col(l, i), b_k(l, i))
            assert (d_row(l, i), d_col(l, i)) == (b_k(l, i), b_col(l, i))
            assert b_k(l, i) == b_k(l, 0) + i


def test_ds_round_trip_through_lds_gives_gemm4_its_rows():
    """store_a writes each wavefront's dS^T fragment (keys n0.., query rows of k-step kk) into the
    [BLOCK_N][BLOCK_M] tile, and load_a_t reads the tile back as dS's row fragments: every element
    lands once, and a read returns dS[row][key]."""
    rng = np.random.default_rng(3)
    bn, bm = 32, 32
    ds_t = rng.standard_normal((bn, bm)).astype(np.float32)  # dS^T [key][query row]
    tile = np.full((bn, bm), np.nan, np.float32)
    for n0 in range(0, bn, 16):
        for kk in range(bm // 16):
            frag = gather(ds_t, lambda l, i: store_a_idx(n0, 16 * kk, l, i))
            for l in LANES:
                for i in range(4):
                    r, c = store_a_idx(n0, 16 * kk, l, i)
                    assert np.isnan(tile[r, c])
                    tile[r, c] = frag[l, i]
    np.testing.assert_array_equal(tile, ds_t)
    for m0 in range(0, bm, 16):
        for kk in range(bn // 16):
            a = gather(tile, lambda l, i: load_a_t_idx(m0, 16 * kk, l, i))
            for l in LANES:
                for i in range(4):
                    assert a[l, i] == ds_t.T[m0 + b_col(l), 16 * kk + b_k(l, i)]


def _keep_mask_bytes(keep, bm, bn):
    """fill_keep_bits' byte mask of a tile: byte [jg * bm + il] bit c = keep[il, 8 jg + c]."""
    out = np.zeros((bn // 8) * bm, np.uint8)
    for jg in range(bn // 8):
        for il in range(bm):
            out[jg * bm + il] = sum(int(keep[il, 8 * jg + c]) << c for c in range(8))
    return out


@pytest.mark.parametrize("nwarps, bm, dq, dv, dropout", [(2, 32, 32, 48, True), (4, 16, 48, 32, False), (1, 16, 16, 16, True)])
def test_backward_step_of_one_workgroup(nwarps, bm, dq, dv, dropout):
    """One query block through fmha_bwd_dq_dk_dv's five products on the model, gathered through
    the kernel's maps (dQ, dK, dV row-slot stores), against dense NumPy."""
    rng = np.random.default_rng(nwarps * 100 + bm)
    bn, scale = 16 * nwarps, 0.3
    q = rng.standard_normal((bm, dq)).astype(np.float32)
    k = rng.standard_normal((bn, dq)).astype(np.float32)
    v = rng.standard_normal((bn, dv)).astype(np.float32)
    do = rng.standard_normal((bm, dv)).astype(np.float32)
    lse = (rng.standard_normal(bm) + 2).astype(np.float32)
    dd = rng.standard_normal(bm).astype(np.float32)
    keep = rng.random((bm, bn)) < 0.7 if dropout else np.ones((bm, bn), bool)
    rp_keep = 1 / 0.7 if dropout else 1.0
    mask = _keep_mask_bytes(keep, bm, bn)
    nq = bm // 16  # accumulator tiles along the query rows

    ds_tile = np.zeros((bn, bm), np.float32)
    dk = np.full((bn, dq), np.nan, np.float32)
    dv_out = np.full((bn, dv), np.nan, np.float32)
    for w in range(nwarps):
        n0 = 16 * w
        s = [np.zeros((64, 4), np.float32) for _ in range(nq)]
        dp = [np.zeros((64, 4), np.float32) for _ in range(nq)]
        for kk in range(dq // 16):  # GEMM0, mma_row_nmajor: A = Q rows, B = K fragment
            kf = gather(k, lambda l, i: load_a_idx(n0, 16 * kk, l, i))
            for n in range(nq):
                s[n] = mfma(gather(q, lambda l, i: load_a_idx(16 * n, 16 * kk, l, i)), kf, s[n])
        for kk in range(dv // 16):  # GEMM2
            vf = gather(v, lambda l, i: load_a_idx(n0, 16 * kk, l, i))
            for n in range(nq):
                dp[n] = mfma(gather(do, lambda l, i: load_a_idx(16 * n, 16 * kk, l, i)), vf, dp[n])
        keep_bits = mask[(n0 // 8) * bm:]  # the kernel's pointer: sKeep + (n0 / 8) * BLOCK_M
        for n in range(nq):  # backward_p_ds
            for l in LANES:
                for e in range(4):
                    c = frag_col(l, n, e)
                    p = np.exp2(s[n][l, e] * scale * np.log2(np.e) - lse[c] * np.log2(np.e))
                    byte, bit = keep_bit_idx(16 * nq, l, n, e)
                    z = rp_keep if (keep_bits[byte] >> bit) & 1 else 0.0
                    s[n][l, e] = p * z
                    dp[n][l, e] = p * (dp[n][l, e] * z - dd[c])
        acc_dv = [np.zeros((64, 4), np.float32) for _ in range(dv // 16)]
        acc_dk = [np.zeros((64, 4), np.float32) for _ in range(dq // 16)]
        for kk in range(nq):  # GEMM1, GEMM3 (acc_to_a: tile kk is the B operand), dS^T to LDS
            for t in range(dv // 16):
                acc_dv[t] = mfma(gather(do, lambda l, i: kmajor_idx(16 * t, 16 * kk, l, i)), s[kk], acc_dv[t])
            for t in range(dq // 16):
                acc_dk[t] = mfma(gather(q, lambda l, i: kmajor_idx(16 * t, 16 * kk, l, i)), dp[kk], acc_dk[t])
            for l in LANES:
                for i in range(4):
                    ds_tile[store_a_idx(n0, 16 * kk, l, i)] = dp[kk][l, i]
        for acc, out, mult in ((acc_dk, dk, scale), (acc_dv, dv_out, 1.0)):  # store_dk_dv's slots
            for t, a in enumerate(acc):
                for l in LANES:
                    for c in range(E):
                        out[n0 + frag_row(l, 0), frag_col(l, t, 0) + slot_offset(c)] = a[l, c] * mult
    # GEMM4 over the workgroup: wavefront w takes m-tile w % MT4 and its share of the columns
    mt, wc = bm // 16, nwarps // (bm // 16)
    nt4 = (dq // 16 + wc - 1) // wc
    dqo = np.full((bm, dq), np.nan, np.float32)
    for w in range(nwarps):
        mt4, wc4 = w % mt, w // mt
        c0 = wc4 * nt4 * 16
        acc = [np.zeros((64, 4), np.float32) for _ in range(nt4)]
        for kk in range(bn // 16):
            a = gather(ds_tile, lambda l, i: load_a_t_idx(16 * mt4, 16 * kk, l, i))
            for t in range(nt4):
                if c0 + 16 * t < dq:
                    acc[t] = mfma(gather(k, lambda l, i: kmajor_idx(c0 + 16 * t, 16 * kk, l, i)), a, acc[t])
        for t in range(nt4):
            for l in LANES:
                col = c0 + frag_col(l, t, 0)
                if col < dq:
                    for c in range(E):
                        dqo[16 * mt4 + frag_row(l, 0), col + slot_offset(c)] = acc[t][l, c]

    p = np.exp(q @ k.T * scale - lse[:, None])
    z = keep * rp_keep
    ds = p * ((do @ v.T) * z - dd[:, None])
    np.testing.assert_allclose(dv_out, (p * z).T @ do, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(dk, scale * ds.T @ q, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(dqo, ds @ k, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("q0, k0, bm, nwarps", [(0, 0, 32, 2), (48, 4096 + 64, 16, 4)])
def test_keep_bits_match_the_host_replica(q0, k0, bm, nwarps):
    """keep_bit over fill_keep_bits' mask (each byte half of one Philox call's 16 keys of one query
    row, built here from the replica's keep decisions) gives element (lane, n, e) the keep decision of query row
    q0 + col(n, e) and key k0 + n0 + row(e)."""
    seed, offset, b, nh, h, p = 0xDEAD_BEEF_0123, 5, 2, 4, 3, 0.25
    bn = 16 * nwarps
    keep = np.array([[philox.dropout_keep(seed, offset, b, nh, h, q0 + il, k0 + j, p) for j in range(bn)]
                     for il in range(bm)], bool)
    mask = _keep_mask_bytes(keep, bm, bn)
    for w in range(nwarps):
        n0 = 16 * w
        bits = mask[(n0 // 8) * bm:]
        for l in LANES:
            for n in range(bm // 16):
                for e in range(4):
                    byte, bit = keep_bit_idx(bm, l, n, e)
                    want = philox.dropout_keep(seed, offset, b, nh, h, q0 + frag_col(l, n, e), k0 + n0 + frag_row(l, e), p)
                    assert bool((bits[byte] >> bit) & 1) == bool(want)


# -- the C++ side: the arch layer's functions on the host, with recorders for the builtins --
_HARNESS = r"""
#include <cstdio>
#include <cstring>
#include <cmath>
#define __host__
#define __device__
#define __global__
#define __shared__
#define __forceinline__ inline
#define __align__(n) alignas(n)
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
template <class T> T min(T a, T b) { return b < a ? b : a; }
template <class T> T max(T a, T b) { return a < b ? b : a; }
static int g_lane;
static int g_calls;
static unsigned short g_rec[64][2][4];  // per MFMA call: A and B operand bits
template <class V, class C>
C host_mfma(V a, V b, C c) {
    std::memcpy(g_rec[g_calls][0], &a, 8);
    std::memcpy(g_rec[g_calls][1], &b, 8);
    ++g_calls;
    return c;
}
#define __builtin_amdgcn_mfma_f32_16x16x16f16(a, b, c, x, y, z) host_mfma(a, b, c)
#define __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, c, x, y, z) host_mfma(a, b, c)
#define __builtin_amdgcn_mfma_f32_32x32x8f16(a, b, c, x, y, z) host_mfma(a, b, c)
#define __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(a, b, c, x, y, z) host_mfma(a, b, c)
#define __builtin_amdgcn_mbcnt_lo(m, v) 0u
#define __builtin_amdgcn_mbcnt_hi(m, v) ((unsigned)g_lane)
#define __builtin_amdgcn_ds_bpermute(a, v) (v)
#define __builtin_amdgcn_exp2f(x) std::exp2(x)
#define __builtin_amdgcn_logf(x) std::log2(x)
#define __builtin_amdgcn_fence(o, s)
#define __builtin_amdgcn_wave_barrier()
#define __builtin_amdgcn_ballot_w64(p) ((unsigned long long)(p))  // (one lane at a time: AccFrag::any)
#define __builtin_amdgcn_mfma_f32_32x32x16_f16(a, b, c, x, y, z) host_mfma(a, b, c)
#define __builtin_amdgcn_mfma_f32_32x32x16_bf16(a, b, c, x, y, z) host_mfma(a, b, c)
#define __builtin_amdgcn_mfma_f32_16x16x32_f16(a, b, c, x, y, z) host_mfma(a, b, c)
#define __builtin_amdgcn_mfma_f32_16x16x32_bf16(a, b, c, x, y, z) host_mfma(a, b, c)
#define __hip_atomic_fetch_add(p, v, o, s) (*(p) += (v))
#define FMHA_BF16 1
#include "arch/gfx9/layout.cuh"
// gfx950's ds_read_b64_tr_b16, across lanes: the harness runs every lane twice; pass 0 records
// each lane's address per call, pass 1 returns what the instruction gives (layout.cuh's
// DsReadTr16: element r from lane src_lane, element src_elem) and prints.
static int g_pass;
typedef short hshort4 __attribute__((ext_vector_type(4)));
static const void* g_tr_addr[256][64];
static int g_tr_calls;
static hshort4 host_tr16(const void* p) {
    const int call = g_tr_calls++;
    hshort4 out = {0, 0, 0, 0};
    if (!g_pass) {
        g_tr_addr[call][g_lane] = p;
        return out;
    }
    using T = fmha::gfx9::DsReadTr16;
    for (int r = 0; r < 4; ++r) out[r] = static_cast<const short*>(g_tr_addr[call][T::src_lane(g_lane, r)])[T::src_elem(g_lane, r)];
    return out;
}
#define __builtin_amdgcn_ds_read_tr16_b64_v4i16(p) host_tr16((const void*)(p))
#define printf(...) (g_pass ? std::printf(__VA_ARGS__) : 0)
#include "arch/gfx9/tile.cuh"
using namespace fmha;

constexpr int R = 48, C = 40;  // probe tiles: element (r, c) holds r * C + c
alignas(16) static uint16_t tile[R * C];
static void ids(const char* op, int l, const uint32_t* a) {
    for (int i = 0; i < 4; ++i) {
        const unsigned v = (a[i / 2] >> (16 * (i % 2))) & 0xffffu;
        printf("%s %d %d %u %u\n", op, l, i, v / C, v % C);
    }
}
static void rec(const char* op, int l) {
    for (int n = 0; n < g_calls; ++n)
        for (int i = 0; i < 4; ++i)
            printf("%s %d %d %u %u\n", op, l, 4 * n + i, g_rec[n][0][i] / C, g_rec[n][0][i] % C);
    g_calls = 0;
}
int main() {
    for (int i = 0; i < R * C; ++i) tile[i] = (uint16_t)i;
    for (g_pass = 0; g_pass < 2; ++g_pass)
    for (int l = 0; l < 64; ++l) {
        g_lane = l;
        g_calls = g_tr_calls = 0;
        const AccFrag f(l);
        for (int n = 0; n < 2; ++n)
            for (int e = 0; e < 4; ++e) printf("acc %d %d %d %d\n", l, 4 * n + e, f.row(e), f.col(n, e));
        uint32_t a[2];
        load_a(a, tile, C, 16, 12, l);
        ids("load_a", l, a);
        load_a_t(a, tile, C, 16, 12, l);
        ids("load_a_t", l, a);
        alignas(16) static uint16_t out[R * C];
        std::memset(out, 0, sizeof(out));
        const uint32_t mine[2] = {(uint32_t)(4 * l + 1) | (uint32_t)(4 * l + 2) << 16,
                                  (uint32_t)(4 * l + 3) | (uint32_t)(4 * l + 4) << 16};
        store_a(out, C, 16, 12, mine, f);
        for (int i = 0; i < R * C; ++i)
            if (out[i]) printf("store_a %d %d %d %d\n", l, out[i] - 4 * l - 1, i / C, i % C);
        float acc[2][4] = {};
        g_calls = 0;
        mma_row_nmajor<2>(acc, mine, tile, C, 8, 12, l);
        rec("nmajor", l);
        mma_row_kmajor<2>(acc, mine, tile, C, 8, 12, l);
        rec("kmajor", l);
        // acc_to_a: accumulator element (kk, e) = 4 kk + e + 1, exact in bf16
        float c[2][4];
        for (int kk = 0; kk < 2; ++kk)
            for (int e = 0; e < 4; ++e) c[kk][e] = (float)(4 * kk + e + 1);
        acc_to_a(a, c, 1);
        for (int i = 0; i < 4; ++i) {
            const unsigned bits = ((a[i / 2] >> (16 * (i % 2))) & 0xffffu) << 16;
            float x;
            std::memcpy(&x, &bits, 4);
            printf("acc_to_a %d %d %d %d\n", l, i, 1, (int)x - 5);
        }
        // keep_bit: which (byte, bit) of a 2-group mask of 32 query rows each element reads
        alignas(16) static unsigned char bits[64];
        for (int n = 0; n < 2; ++n)
            for (int e = 0; e < 4; ++e)
                for (int byte = 0; byte < 64; ++byte)
                    for (int bit = 0; bit < 8; ++bit) {
                        std::memset(bits, 0, sizeof(bits));
                        bits[byte] = (unsigned char)(1u << bit);
                        if (f.keep_bit(bits, 32, n, e)) printf("keep %d %d %d %d\n", l, 4 * n + e, byte, bit);
                    }
        // the row-slot stores: where value c lands, from the slot's first column
        const float v[4] = {1.f, 2.f, 3.f, 4.f};
        alignas(16) float fo[8] = {}, fs[4] = {};
        AccFrag::store_slot_f32(fo, 0, v);
        AccFrag::add_slot_f32(fo, 4, v);
        AccFrag::store_slot_f32(fs, 0, AccFrag::scaled_slot(v, 2.f));
        alignas(16) uint16_t ho[4] = {};
        AccFrag::store_slot_16bit(ho, 0, v);
        for (int i = 0; i < 4; ++i) {
            const unsigned hb = (unsigned)ho[i] << 16;
            float hx;
            std::memcpy(&hx, &hb, 4);
            printf("slot %d %d %d %d\n", l, i, (int)fo[i] - 1, (int)fo[4 + i] - 1);
            printf("slot16 %d %d %d %d\n", l, i, (int)hx - 1, (int)(fs[i] / 2) - 1);
        }
    }
    return 0;
}
"""


def _cpp_maps(kernel_dir: Path, tmp_path: Path, gfx950: bool = False) -> dict:
    cxx = shutil.which("clang++-22") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no clang++ (the host build needs clang's vector extensions)")
    src = tmp_path / "maps.cpp"
    src.write_text(_HARNESS)
    exe = tmp_path / "maps"
    arch = ["-D__gfx950__"] if gfx950 else []
    subprocess.run([cxx, "-std=c++17", "-O0", "-w", *arch, f"-I{kernel_dir}", "-o", str(exe), str(src)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    maps: dict = {}
    for line in out.splitlines():
        op, l, i, x, y = line.split()
        maps.setdefault(op, set()).add((int(l), int(i), int(x), int(y)))
    return maps


def _model_maps() -> dict:
    m: dict = {op: set() for op in ("acc", "load_a", "load_a_t", "store_a", "nmajor", "kmajor", "acc_to_a", "keep",
                                    "slot", "slot16")}
    for l in LANES:
        for n in range(2):
            for e in range(4):
                m["acc"].add((l, 4 * n + e, frag_row(l, e), frag_col(l, n, e)))
                m["keep"].add((l, 4 * n + e, *keep_bit_idx(32, l, n, e)))
        for i in range(4):
            m["load_a"].add((l, i, *load_a_idx(16, 12, l, i)))
            m["load_a_t"].add((l, i, *load_a_t_idx(16, 12, l, i)))
            m["store_a"].add((l, i, *store_a_idx(16, 12, l, i)))
            m["acc_to_a"].add((l, i, 1, i))  # element i of the row fragment: accumulator element (kk, i)
            m["slot"].add((l, i, slot_offset(i), slot_offset(i)))
            m["slot16"].add((l, i, slot_offset(i), slot_offset(i)))
            for n in range(2):  # tiles n of an n-major [n][k] and a k-major [k][n] tile, from column 8
                m["nmajor"].add((l, 4 * n + i, *load_a_idx(8 + 16 * n, 12, l, i)))
                m["kmajor"].add((l, 4 * n + i, *kmajor_idx(8 + 16 * n, 12, l, i)))
    return m


@pytest.mark.parametrize("gfx950", [False, True], ids=["gfx90a-gfx942", "gfx950"])
def test_cpp_maps_equal_the_model(tmp_path, gfx950):
    """The host build of arch/gfx9's functions reads, writes and multiplies exactly the elements
    this file's formulas say, for every lane: AccFrag's row / col, load_a, load_a_t, store_a, the
    A operands of mma_row_nmajor / mma_row_kmajor (recorded at the MFMA builtin), acc_to_a,
    keep_bit's byte and bit, and the row-slot stores. The gfx950 build reads columns (load_a_t,
    mma_row_kmajor) through the transposed LDS read, emulated across lanes by layout.cuh's
    DsReadTr16 (which tests/test_gfx9_layout.py checks against gfx9_layout's model)."""
    from cupy_fmha.compile import kernel_dir

    got, want = _cpp_maps(kernel_dir(), tmp_path, gfx950), _model_maps()
    assert got.keys() == want.keys()
    for op in want:
        assert got[op] == want[op], op


_MUTATIONS = {
    # keep_bit reading byte e ^ 1 instead of byte e
    "keep_bit": ("arch/gfx9/fragment.cuh", "(quad >> (8 * e + row_in_group()))",
                 "(quad >> (8 * (e ^ 1) + row_in_group()))", False, {"keep"}),
    # gfx950: the transposed read's lane addresses with the 4-column groups in the wrong order
    "tr16_address": ("arch/gfx9/layout.cuh", "return 4 * (lane % 4);", "return 4 * (3 - lane % 4);", True,
                     {"load_a_t", "kmajor"}),
}


@pytest.mark.parametrize("name", sorted(_MUTATIONS))
def test_a_changed_formula_is_caught(tmp_path, name):
    """The check above is not vacuous: one formula changed in a copy of the C++ layer no longer
    matches the model, in exactly the maps that use it."""
    from cupy_fmha.compile import kernel_dir

    path, old, new, gfx950, broken = _MUTATIONS[name]
    kdir = tmp_path / "kernels"
    shutil.copytree(kernel_dir(), kdir)
    text = (kdir / path).read_text()
    assert text.count(old) == 1
    (kdir / path).write_text(text.replace(old, new))
    got, want = _cpp_maps(kdir, tmp_path, gfx950), _model_maps()
    assert {op for op in want if got.get(op) != want[op]} == broken

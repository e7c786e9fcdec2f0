"""NumPy model of the gfx9 backward's index maps (fmha_bwd_dq_dk_dv.cu on kernels/arch/gfx9/:
fragment.cuh's AccFrag and keep_bit and row-slot stores, tile.cuh's load_a, load_a_t, store_a,
mma_row_nmajor / mma_row_kmajor and acc_to_a), over the layouts of cupy_fmha.backends.gfx9_layout,
and a host build of those C++ functions that shows they compute the same maps.

The model runs one workgroup's step the way the kernel does (every wavefront owns 16 keys):
S^T and dP^T through v_mfma_f32_16x16x16 with the query (dO) rows as the A operand and the
wavefront's K (V) fragment as B, so a lane holds one key and 4 adjacent query rows per tile; P^T
and dS^T element by element (keep bits from fill_keep_words' word tile through keep_bit); dV += P^T
dO and dK += dS^T Q with the accumulators fed back as the B operand (acc_to_a); dS^T through LDS
(store_a, then load_a_t as GEMM4's row fragments) into dQ = dS K; the row-slot stores of dQ, dK
and dV. It gathers the results through the same maps and compares them with dense NumPy. The
keep-bit map is also checked against the Philox host replica (philox.cuh's word tile, keying of
bench/NOTES.md step 96: words[call][row pair], bit = draw).

test_cpp_maps_equal_the_model compiles the arch layer's headers with the host clang (the
builtins the layer calls replaced by recorders: an MFMA call records its operands) and checks
every map, lane by lane, against this file's formulas (and the forward's fwd_keep_words against
tests/test_gfx9_fwd_model.py's fwd_keep_sources); test_a_changed_formula_is_caught shows it fails
when one formula changes on the C++ side. CPU only: nothing here ran on an AMD GPU."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import test_gfx9_fwd_model as F  # (tests/ is on sys.path, as for the other test modules' imports)
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


call_of, draw_of = F.call_of, F.draw_of  # philox.cuh Dropout::call_of, draw_of


def keep_word_idx(m, il, jl):  # keep_word_bit: (word, bit) of element (il, jl) of a word tile of m query rows
    return call_of(jl) * (m // 2) + 8 * (il >> 4) + (il & 7), draw_of(il, jl)


def keep_bit_idx(m, key0l, l, n, e):  # AccFrag::keep_bit: query row col(n, e), key key0l + row(e)
    return keep_word_idx(m, frag_col(l, n, e), key0l + frag_row(l, e))


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


def _keep_words(keep, bm, bn):
    """The word tile of a tile's keep decisions keep[il, jl] (bm query rows, bn keys), laid out as
    keep_word_bit reads it: bit draw_of(il, jl) of word keep_word_idx(bm, il, jl)."""
    out = np.zeros((bn // 8) * (bm // 2), np.uint32)
    for il in range(bm):
        for jl in range(bn):
            w, d = keep_word_idx(bm, il, jl)
            out[w] |= np.uint32(int(keep[il, jl]) << d)
    return out.astype(np.uint16)


def fill_keep_words(bm, bn, q0, k0, p, seed, offset, b, nh, h):
    """philox.cuh fill_keep_words<M, N, NT> (any thread order): words[x] = keep16(q0 + 16 (P >> 3) +
    (P & 7), 4 (k0 >> 5) + c), P = x % (M / 2), c = x / (M / 2); keep16 from the replica's Philox."""
    assert bm % 16 == 0 and bn % 32 == 0  # (its static_assert)
    t = offset + b * nh + h
    key = np.array([seed & 0xFFFFFFFF, seed >> 32], np.uint32)
    thr = philox.keep_threshold(p)
    words = np.zeros((bm // 2) * (bn // 8), np.uint16)
    for x in range(len(words)):
        pp, c = x % (bm // 2), x // (bm // 2)
        ip, cc = q0 + 16 * (pp >> 3) + (pp & 7), 4 * (k0 >> 5) + c
        r = philox.philox4x32(np.array([cc, ip, t & 0xFFFFFFFF, t >> 32], np.uint32), key, philox.DROPOUT_ROUNDS)
        words[x] = sum(int(((int(r[d >> 2]) >> (8 * (d & 3))) & 0xFF) < thr) << d for d in range(16))
    return words


@pytest.mark.parametrize("bm, bn", [(16, 32), (32, 64), (64, 32)])
def test_keep_word_bit_covers_the_tile_once(bm, bn):
    """keep_word_bit maps a tile's bm x bn elements one to one onto the bits of its (bn / 8) (bm / 2)
    words (whole 16-row tiles, whole 32-key calls: fill_keep_words' static_assert)."""
    seen = {keep_word_idx(bm, il, jl) for il in range(bm) for jl in range(bn)}
    assert len(seen) == bm * bn
    assert seen == {(w, d) for w in range((bn // 8) * (bm // 2)) for d in range(16)}


# (one wavefront: BLOCK_N = 16, whose keep words are those of the 32-key span holding the block,
# KEEP_N = 32, read from key k0 & 31 = 16 on: fmha_bwd_dq_dk_dv.cu's KeepTile{.., n0 + (k0 & 31)})
@pytest.mark.parametrize("nwarps, bm, dq, dv, dropout", [(2, 32, 32, 48, True), (4, 16, 48, 32, False), (1, 16, 16, 16, True),
                                                         (4, 32, 16, 32, True)])
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
    kn, koff = max(bn, 32), 16 if bn < 32 else 0  # KEEP_N, k0 & 31 (the block is the span's second half)
    keep_span = np.ones((bm, kn), bool)
    keep_span[:, koff:koff + bn] = keep
    words = _keep_words(keep_span, bm, kn) if dropout else None
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
        # the kernel's KeepTile{sKeep + buf * KEEP_WORDS, n0 + (k0 & 31)}: the span's tile, the warp's first key in it
        for n in range(nq):  # backward_p_ds
            for l in LANES:
                for e in range(4):
                    c = frag_col(l, n, e)
                    p = np.exp2(s[n][l, e] * scale * np.log2(np.e) - lse[c] * np.log2(np.e))
                    if dropout:  # keep_at: keep_bit(words, N * NQ, key0l, n, e)
                        word, bit = keep_bit_idx(16 * nq, n0 + koff, l, n, e)
                        z = rp_keep if (int(words[word]) >> bit) & 1 else 0.0
                    else:
                        z = 1.0
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


@pytest.mark.parametrize("q0, k0, bm, nwarps", [(0, 0, 32, 2), (48, 4096 + 64, 16, 4), (128, 96, 64, 2)])
def test_keep_bits_match_the_host_replica(q0, k0, bm, nwarps):
    """keep_bit over fill_keep_words' word tile (one Philox call per (row pair, call), made here by
    the replica's Philox) gives element (lane, n, e) of wavefront w the keep decision of query row
    q0 + col(n, e) and key k0 + n0 + row(e) (n0 = 16 w, KeepTile's key0l)."""
    seed, offset, b, nh, h, p = 0xDEAD_BEEF_0123, 5, 2, 4, 3, 0.25
    bn = 16 * nwarps
    words = fill_keep_words(bm, bn, q0, k0, p, seed, offset, b, nh, h)
    want = philox.dropout_keep(seed, offset, b, nh, h, q0 + np.arange(bm)[:, None], k0 + np.arange(bn)[None, :], p)
    assert 0 < want.sum() < want.size
    np.testing.assert_array_equal(words, _keep_words(want, bm, bn))
    for w in range(nwarps):
        n0 = 16 * w
        for l in LANES:
            for n in range(bm // 16):
                for e in range(4):
                    word, bit = keep_bit_idx(bm, n0, l, n, e)
                    assert bool((int(words[word]) >> bit) & 1) == bool(want[frag_col(l, n, e), n0 + frag_row(l, e)])


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

// fwd_keep_words' Drop: keep16 of one (row pair, call) has only draw d kept, every other call none
struct ProbeDrop {
    int ip, c, d;
    static int call_of(int j) { return Dropout::call_of(j); }
    static int draw_of(int i, int j) { return Dropout::draw_of(i, j); }
    uint32_t keep16(int ip_, int c_) const { return ip_ == ip && c_ == c ? 1u << d : 0u; }
};

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
        // keep_bit: which (word, bit) of a word tile of M = 32 query rows and 32 keys (4 calls x 16
        // row pairs: 64 words, in a buffer of 128) each element reads, for the keys 16 .. 31 of the
        // tile (key0l = 16)
        if (g_pass) {
            alignas(16) static uint16_t words[128];
            for (int n = 0; n < 2; ++n)
                for (int e = 0; e < 4; ++e)
                    for (int w = 0; w < 128; ++w)
                        for (int bit = 0; bit < 16; ++bit) {
                            words[w] = (uint16_t)(1u << bit);
                            if (f.keep_bit(words, 32, 16, n, e)) printf("keep %d %d %d %d\n", l, 4 * n + e, w, bit);
                            words[w] = 0;
                        }
        }
        // fwd_keep_words: NS = 10 tiles (two words) of keys from k0 = 64 in the rows from row0 = 16;
        // which (row pair, call, draw) each of the 64 bits takes (row pairs 8 .. 31, calls 0 .. 31
        // scanned: the tiles' are 16 .. 23 and 8 .. 27)
        if (g_pass)
            for (int ip = 8; ip < 32; ++ip)
                for (int c = 0; c < 32; ++c)
                    for (int d = 0; d < 16; ++d) {
                        uint32_t kw[AccFrag::ROW_SLOTS][2];
                        f.fwd_keep_words<10>(ProbeDrop{ip, c, d}, 16, 64, kw);
                        for (int bit = 0; bit < 64; ++bit)
                            if ((kw[0][bit / 32] >> (bit % 32)) & 1u) printf("fwdkeep %d %d %d %d\n", l, bit, ip, 16 * c + d);
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
                                    "fwdkeep", "slot", "slot16")}
    for l in LANES:
        for n in range(2):
            for e in range(4):
                m["acc"].add((l, 4 * n + e, frag_row(l, e), frag_col(l, n, e)))
                m["keep"].add((l, 4 * n + e, *keep_bit_idx(32, 16, l, n, e)))
        for bit, (ip, c, d) in F.fwd_keep_sources(l, 10, 16, 64).items():
            m["fwdkeep"].add((l, bit, ip, 16 * c + d))
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
    keep_bit's word and bit, the (row pair, call, draw) of each of fwd_keep_words' bits (with a
    probe Drop whose keep16 keeps one draw of one call), and the row-slot stores. The gfx950 build reads columns (load_a_t,
    mma_row_kmajor) through the transposed LDS read, emulated across lanes by layout.cuh's
    DsReadTr16 (which tests/test_gfx9_layout.py checks against gfx9_layout's model)."""
    from cupy_fmha.compile import kernel_dir

    got, want = _cpp_maps(kernel_dir(), tmp_path, gfx950), _model_maps()
    assert got.keys() == want.keys()
    for op in want:
        assert got[op] == want[op], op


_MUTATIONS = {
    # keep_bit reading the query row of element e ^ 1 instead of e
    "keep_bit": ("arch/gfx9/fragment.cuh", "keep_word_bit(words, M, col(n, e), key0l + row(e))",
                 "keep_word_bit(words, M, col(n, e ^ 1), key0l + row(e))", False, {"keep"}),
    # fwd_keep_words' second call keyed by the row instead of the row pair
    "fwd_keep_words": ("arch/gfx9/fragment.cuh", "const uint32_t y = drop.keep16(i & ~8, c + 1);",
                       "const uint32_t y = drop.keep16(i, c + 1);", False, {"fwdkeep"}),
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

// Attention maths shared by the mma.sync and the wgmma kernels: block ranges under a mask,
// the forward's online softmax, the backward's P / dS step and its dK/dV store. Everything works
// on accumulators of tiles of AccFrag::N columns (n8 tiles on sm80, 16 columns on gfx9), flattened
// (element e of tile n is [4n + e]), addressed through the architecture layer's fragment type
// (AccFrag: row(e), col(n, e), row reductions, keep bits, row-slot stores). No PTX here beyond the
// architecture layer's helpers.
#pragma once
#include "common.cuh"
#include "arch/arch.cuh"
#include "philox.cuh"

// DROPOUT (config.cuh) builds the dropout instances (Philox keep test in the forward's softmax and
// the backward's P / dS step); without it none of that code is compiled, so those instances are
// unchanged in code and cost and ignore the dropout parameters. ALIBI and BIAS likewise.

namespace fmha {

// ALiBi (FlashAttention's definition): bias[i, j] = -slope * |i + seqlen_k - seqlen_q - j|, added
// after scaling, in instances built with ALIBI=1. Kept in log2 units: slope_log2 = slope * log2(e).
struct Alibi {
    float slope_log2;
    int diag;  // seqlen_k - seqlen_q
    __device__ __forceinline__ float operator()(int i, int j) const {
        return -slope_log2 * fabsf((float)(i + diag - j));
    }
};

__device__ __forceinline__ Alibi make_alibi(const float* slopes, index_t batch_stride, int b, int h, int seqlen_q,
                                            int seqlen_k) {
    if constexpr (ALIBI) return Alibi{slopes[b * batch_stride + h] * FMHA_LOG2E, seqlen_k - seqlen_q};
    else return Alibi{0.f, seqlen_k - seqlen_q};
}

// Elementwise bias: any tensor broadcastable to [batch, nhead_q, seqlen_q, seqlen_k], read
// through strides (0 along broadcast dimensions), added after scaling like ALiBi. Its dtype is
// chosen at run time: kind 1 fp16, 2 bf16, 3 fp32 (0: none). Positions outside [0, rows) x
// [0, cols) read as 0, so partial tiles never read past the tensor. Returns log2 units.
struct ElemBias {
    enum : int { PAIRS = 0 };  // read element by element (softmax_p_scaled)
    const void* ptr;  // element (b, h, 0, 0)
    index_t sq, sk;   // strides along query rows and keys, in elements
    int kind, rows, cols;
    __device__ __forceinline__ float operator()(int i, int j) const {
        if (i >= rows || j >= cols) return 0.f;
        const index_t off = (index_t)i * sq + (index_t)j * sk;
        float x;
        if (kind == 3) {
            x = static_cast<const float*>(ptr)[off];
        } else {
            const uint16_t u = static_cast<const uint16_t*>(ptr)[off];
            x = kind == 2 ? bf16_bits_to_float(u) : f16_bits_to_float(u);
        }
        return x * FMHA_LOG2E;
    }
};

// The bias of (batch b, query head h); i and j are positions local to the sequence.
__device__ __forceinline__ ElemBias make_bias(const void* bias, int kind, index_t sb, index_t sh, index_t sq,
                                              index_t sk, int b, int h, int seqlen_q, int seqlen_k) {
    if constexpr (!BIAS) return ElemBias{nullptr, 0, 0, 0, 0, 0};
    if (bias == nullptr || kind == 0) return ElemBias{nullptr, 0, 0, 0, 0, 0};
    const index_t off = b * sb + h * sh;
    const void* p = kind == 3 ? static_cast<const void*>(static_cast<const float*>(bias) + off)
                              : static_cast<const void*>(static_cast<const uint16_t*>(bias) + off);
    return ElemBias{p, sq, sk, kind, seqlen_q, seqlen_k};
}

// The forward's keep bits of one key block for this thread: word [r][a] holds tiles
// KEEP_TILES a .. KEEP_TILES (a + 1) - 1 of row slot r (row row0 + f.row(SLOT_ELEMS r); row0 the
// first row of the fragment's 16-row tile), SLOT_ELEMS bits per tile (AccFrag::fwd_keep_words).
// They depend only on coordinates, so the sm90 kernels compute them while the S = Q K^T wgmma runs
// (the Philox ALU work then hides under the tensor cores); the mma.sync kernel right before
// online_softmax.
template <int NS>
struct KeepBits {
    uint32_t w[AccFrag::ROW_SLOTS][(NS + AccFrag::KEEP_TILES - 1) / AccFrag::KEEP_TILES];
};

template <int NS>
__device__ __forceinline__ KeepBits<NS> fwd_keep_bits(const Dropout& drop, int row0, int k0, const AccFrag& f) {
    KeepBits<NS> kb;
    f.template fwd_keep_words<NS>(drop, row0, k0, kb.w);
    return kb;
}

// Forward: S (NS accumulator tiles of AccFrag::N columns; rows row0 + f.row(e), columns
// k0 + f.col(n, e)) -> P in place, with the running row max / sum (one per row slot: AccFrag::
// ROW_SLOTS) advanced; corr[r] receives the factor by which O's row slot r must be rescaled
// (exp2(old max - new max)). With RESCALE, O (NO tiles) is rescaled here, row slot by row slot
// (online_softmax); without, the caller applies corr with rescale_o once O is its to touch
// (fmha_fwd_sm90_ws's PV_OVERLAP pipeline: after the P V GEMM of the previous block, which still
// adds into O while this runs, has completed). Scores are scaled to log2 units first (plus the
// elementwise bias or ALiBi when on); the window test runs only when `edge` (the tile crosses a
// mask or sequence edge). With DROPOUT, the row sums take the undropped P and then the dropped
// elements of P are zeroed (P * keep feeds the O GEMM; rp_keep, 256 / threshold, is folded into finish_rows),
// with the bits of fwd_keep_bits (on sm80 one Philox call covers a thread's 16 scores of a 16-row,
// 32-key span).
// FOLDED (no bias or ALiBi; the warp-specialized forward's FOLD build, bench/NOTES.md step 37, with
// dropout since step 114): the same step by softmax_p_folded below.
//
// softmax_row: the step both forms share for row slot r once the row's new maximum mx (log2 units,
// -inf for a row that saw nothing yet) is known: P = exp2(s * mul - max) in place (mul 1 for scores
// already scaled, the scale itself for FOLDED: one FFMA), the running sum, the correction of O.
// LAZY_RESCALE (without RESCALE, as online_softmax calls it then; FlashAttention-4's conditional
// rescaling): the running maximum moves
// only when the block's exceeds it by more than LAZY_RESCALE, so most blocks' corr is exactly 1 and
// the caller skips O's rescale (rescale_o_lazy); P then reaches at most 2^(LAZY_RESCALE + 1/4), and
// O and the LSE (max + log2 of the sum, both taken against the same stale maximum) are unchanged in
// exact arithmetic.
template <int NS, int NO, bool RESCALE>
__device__ __forceinline__ void softmax_row(float* s, float* acc_o, float row_max[2], float row_sum[2], float corr[2],
                                            int r, float mx, float mul) {
    constexpr int E = AccFrag::SLOT_ELEMS;
    constexpr bool LAZY = LAZY_RESCALE > 0 && !RESCALE;
    // LAZY: the old maximum stays while mx is at most LAZY_RESCALE above it and small enough (below
    // 2^22) that the folded form's exact FFMA cannot add more than a quarter to an exponent
    if constexpr (LAZY)
        mx = row_max[r] != -FMHA_INF && mx - row_max[r] <= static_cast<float>(LAZY_RESCALE) && fabsf(mx) < 0x1p22f ? row_max[r]
                                                                                                                : mx;
    const float m_use = mx == -FMHA_INF ? 0.f : mx;  // a row that saw nothing yet stays at 0
    // (LAZY: exactly 1 where the maximum stayed, also for a row that still saw nothing: its O and sum are 0)
    const float cr = LAZY && row_max[r] == mx ? 1.f : fast_exp2(row_max[r] - m_use);
    corr[r] = cr;
    row_max[r] = mx;
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
        for (int c = 0; c < E; c += 2) {
            if (n % 8 >= 8 - EXP_EMU) {  // (EXP_EMU: these tiles' exponentials on the FMA pipes)
                s[4 * n + E * r + c] = poly_exp2(s[4 * n + E * r + c] * mul - m_use);
                s[4 * n + E * r + c + 1] = poly_exp2(s[4 * n + E * r + c + 1] * mul - m_use);
            } else {
                s[4 * n + E * r + c] = fast_exp2(s[4 * n + E * r + c] * mul - m_use);
                s[4 * n + E * r + c + 1] = fast_exp2(s[4 * n + E * r + c + 1] * mul - m_use);
            }
            sum += s[4 * n + E * r + c] + s[4 * n + E * r + c + 1];
        }
    row_sum[r] = row_sum[r] * cr + sum;
    if constexpr (RESCALE) {
#pragma unroll
        for (int n = 0; n < NO; ++n)
#pragma unroll
            for (int c = 0; c < E; ++c) acc_o[4 * n + E * r + c] *= cr;
    }
}

// The mask test of a tile that crosses a mask or sequence edge: each score (rows row0 + f.row(e),
// columns k0 + f.col(n, e)) the window or the sequence's end hides becomes `masked`. MASK_ROWS: from
// each row slot's visible columns [lo, hi) counted from the thread's first column, so each element is
// one compare with a constant offset per bound (1: both bounds everywhere; 2: the lower one only where
// a warp vote says it crosses the warp's columns, which a causal diagonal never does: two copies of
// the loop, and 4 bytes of spill at hdim 256); else Window::visible per element. The same elements
// either way.
template <int NS>
__device__ __forceinline__ void mask_tile(float* s, float masked, const Window& win, int row0, int k0, const AccFrag& f,
                                          int seqlen_k) {
    if constexpr (MASK_ROWS > 0) {
        constexpr int E = AccFrag::SLOT_ELEMS;
        const int jb = k0 + f.col(0, 0);  // (f.col(n, e) - f.col(0, 0) folds to a constant)
        // visible: j >= i - y + 1, j < i + x, j < seqlen_k
        int lo[AccFrag::ROW_SLOTS], hi[AccFrag::ROW_SLOTS];
        bool lower = false;
#pragma unroll
        for (int r = 0; r < AccFrag::ROW_SLOTS; ++r) {
            lo[r] = row0 + f.row(E * r) - win.y + 1 - jb;
            hi[r] = min(row0 + f.row(E * r) + win.x, seqlen_k) - jb;
            lower |= lo[r] > 0;
        }
        if (MASK_ROWS == 1 || f.any(lower)) {  // (uniform over the warp)
#pragma unroll
            for (int n = 0; n < NS; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int c = f.col(n, e) - f.col(0, 0), r = e / E;
                    s[4 * n + e] = c >= lo[r] && c < hi[r] ? s[4 * n + e] : masked;
                }
        } else {
#pragma unroll
            for (int n = 0; n < NS; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int c = f.col(n, e) - f.col(0, 0), r = e / E;
                    s[4 * n + e] = c < hi[r] ? s[4 * n + e] : masked;
                }
        }
    } else {
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = row0 + f.row(e), j = k0 + f.col(n, e);
                s[4 * n + e] = win.visible(i, j, seqlen_k) ? s[4 * n + e] : masked;
            }
    }
}

// DROPOUT: P's dropped elements zeroed after the softmax step (whose row sums include them: the LSE is
// the undropped softmax's), from the keep bits (all ones where the caller drops them later, as the ws
// forward's KEEP_MSB does when it packs P: then the compiler folds this away). Without dropout: nothing.
template <int NS>
__device__ __forceinline__ void apply_keep(float* s, const KeepBits<NS>& keep) {
    if constexpr (DROPOUT) {
        constexpr int E = AccFrag::SLOT_ELEMS, T = AccFrag::KEEP_TILES;
        // groups of T tiles; with fewer tiles (sm80: BLOCK_N = 16, NS = 2) the upper bits go unused
#pragma unroll
        for (int r = 0; r < AccFrag::ROW_SLOTS; ++r)
#pragma unroll
            for (int a = 0; a < (NS + T - 1) / T; ++a) {
                const uint32_t bits = keep.w[r][a];
#pragma unroll
                for (int m = 0; m < T; ++m) {
                    const int n = T * a + m;
                    if (n >= NS) break;
#pragma unroll
                    for (int c = 0; c < E; ++c)
                        if (!((bits >> (E * m + c)) & 1u)) s[4 * n + E * r + c] = 0.f;
                }
            }
    }
}

// SMAX_TREE: the extreme (MAX: largest, else smallest) of row slot r's scores of this thread (its
// NS * SLOT_ELEMS values) by a pairwise tree, about log2 of that many dependent steps instead of one
// per pair; the result is the chain's (a maximum does not round, whatever the order).
template <int NS, bool MAX>
__device__ __forceinline__ float slot_extreme_tree(const float* s, int r) {
    constexpr int E = AccFrag::SLOT_ELEMS, K = NS * E;
    float v[K];
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
        for (int c = 0; c < E; ++c) v[n * E + c] = s[4 * n + E * r + c];
#pragma unroll
    for (int w = 1; w < K; w *= 2)
#pragma unroll
        for (int i = 0; i + w < K; i += 2 * w) v[i] = MAX ? fmaxf(v[i], v[i + w]) : fminf(v[i], v[i + w]);
    return v[0];
}

// softmax_p's `gen` hook: work the caller runs inside the softmax, after the mask test, in the basic block
// of the maxima, shuffles and exponentials, where ptxas may interleave it with them (the ws forward's
// KEEP_SINK: the next keep decisions); by default nothing.
struct NoGen {
    __device__ __forceinline__ void operator()() const {}
};

// softmax_p's FOLDED form: the scores stay unscaled; the row's extreme is taken over them (the
// maximum, or the minimum when scale_log2 < 0, masked elements set to the value that scales to
// -inf) and scaled once, and each exponent is one FFMA, s * scale_log2 - max, instead of a
// multiply per element and a subtract. POS: the sign of scale_log2 (SMAX_TREE: one copy of the
// whole step per sign, so that neither row slot's code is split by the test).
template <int NS, int NO, bool RESCALE, bool POS, class Gen = NoGen>
__device__ __forceinline__ void softmax_p_folded_signed(float* s, float* acc_o, float row_max[2], float row_sum[2], float corr[2],
                                                        float scale_log2, bool edge, const Window& win, int row0, int k0,
                                                        const AccFrag& f, int seqlen_k, const KeepBits<NS>& keep,
                                                        const Gen& gen = Gen{}) {
    if (edge) mask_tile<NS>(s, POS ? -FMHA_INF : FMHA_INF, win, row0, k0, f, seqlen_k);  // (masked: scales to -inf)
    gen();
    float ext[AccFrag::ROW_SLOTS];  // each row's largest scaled score, in unscaled units
#pragma unroll
    for (int r = 0; r < AccFrag::ROW_SLOTS; ++r) ext[r] = slot_extreme_tree<NS, POS>(s, r);
#pragma unroll
    for (int r = 0; r < AccFrag::ROW_SLOTS; ++r) ext[r] = POS ? f.reduce_max(ext[r]) : -f.reduce_max(-ext[r]);
#pragma unroll
    for (int r = 0; r < AccFrag::ROW_SLOTS; ++r)
        softmax_row<NS, NO, RESCALE>(s, acc_o, row_max, row_sum, corr, r, fmaxf(row_max[r], ext[r] * scale_log2), scale_log2);
    apply_keep<NS>(s, keep);
}

template <int NS, int NO, bool RESCALE, class Gen = NoGen>
__device__ __forceinline__ void softmax_p_folded(float* s, float* acc_o, float row_max[2], float row_sum[2], float corr[2],
                                                 float scale_log2, bool edge, const Window& win, int row0, int k0,
                                                 const AccFrag& f, int seqlen_k, const KeepBits<NS>& keep, const Gen& gen = Gen{}) {
    const bool pos = scale_log2 > 0.f;  // (uniform: the launch's scale)
    if constexpr (SMAX_TREE) {
        if (pos) softmax_p_folded_signed<NS, NO, RESCALE, true>(s, acc_o, row_max, row_sum, corr, scale_log2, edge, win, row0, k0, f, seqlen_k, keep, gen);
        else softmax_p_folded_signed<NS, NO, RESCALE, false>(s, acc_o, row_max, row_sum, corr, scale_log2, edge, win, row0, k0, f, seqlen_k, keep, gen);
        return;
    }
    if (edge) mask_tile<NS>(s, pos ? -FMHA_INF : FMHA_INF, win, row0, k0, f, seqlen_k);  // (masked: scales to -inf)
    gen();
    constexpr int E = AccFrag::SLOT_ELEMS;
#pragma unroll
    for (int r = 0; r < AccFrag::ROW_SLOTS; ++r) {
        float ext;  // the row's largest scaled score, in unscaled units
        if (pos) {
            ext = -FMHA_INF;
#pragma unroll
            for (int n = 0; n < NS; ++n)
#pragma unroll
                for (int c = 0; c < E; c += 2) ext = fmaxf(ext, fmaxf(s[4 * n + E * r + c], s[4 * n + E * r + c + 1]));
            ext = f.reduce_max(ext);
        } else {
            ext = FMHA_INF;
#pragma unroll
            for (int n = 0; n < NS; ++n)
#pragma unroll
                for (int c = 0; c < E; c += 2) ext = fminf(ext, fminf(s[4 * n + E * r + c], s[4 * n + E * r + c + 1]));
            ext = -f.reduce_max(-ext);
        }
        softmax_row<NS, NO, RESCALE>(s, acc_o, row_max, row_sum, corr, r, fmaxf(row_max[r], ext * scale_log2), scale_log2);
    }
    apply_keep<NS>(s, keep);
}

// softmax_p's form with the scale, bias and ALiBi applied per element first. The bias is an
// ElemBias (read from global memory element by element), or a tile already in shared memory whose
// type has PAIRS set (the architecture layer's SwBiasTile: fmha_fwd_sm90_ws), added by its add()
// after the scaling (row0: the fragment's first row inside the tile).
template <int NS, int NO, bool RESCALE, class Bias, class Gen = NoGen>
__device__ __forceinline__ void softmax_p_scaled(float* s, float* acc_o, float row_max[2], float row_sum[2], float corr[2],
                                                 float scale_log2, bool edge, const Window& win, const Alibi& alibi,
                                                 const Bias& bias, int row0, int k0, const AccFrag& f, int seqlen_k,
                                                 const KeepBits<NS>& keep, int tile_row0 = 0, const Gen& gen = Gen{}) {
    // One branch per tile, selects inside: with the test inside the element loop, NVRTC emitted
    // a branch per element (PTX), and the forward ran 10-25% slower on the H200.
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[4 * n + e] *= scale_log2;
            if constexpr (BIAS && !Bias::PAIRS)
                if (bias.kind) s[4 * n + e] += bias(row0 + f.row(e), k0 + f.col(n, e));
            if constexpr (ALIBI) s[4 * n + e] += alibi(row0 + f.row(e), k0 + f.col(n, e));
        }
    if constexpr (BIAS && Bias::PAIRS) bias.template add<NS>(s, row0 - tile_row0, f);
    if (edge) mask_tile<NS>(s, -FMHA_INF, win, row0, k0, f, seqlen_k);
    gen();
    constexpr int E = AccFrag::SLOT_ELEMS;
    if constexpr (SMAX_TREE) {  // (both slots' trees, then both slots' shuffles: the same maxima)
        float mx[AccFrag::ROW_SLOTS];
#pragma unroll
        for (int r = 0; r < AccFrag::ROW_SLOTS; ++r) mx[r] = fmaxf(row_max[r], slot_extreme_tree<NS, true>(s, r));
#pragma unroll
        for (int r = 0; r < AccFrag::ROW_SLOTS; ++r) mx[r] = f.reduce_max(mx[r]);
#pragma unroll
        for (int r = 0; r < AccFrag::ROW_SLOTS; ++r) softmax_row<NS, NO, RESCALE>(s, acc_o, row_max, row_sum, corr, r, mx[r], 1.f);
    } else {
#pragma unroll
        for (int r = 0; r < AccFrag::ROW_SLOTS; ++r) {
            float mx = row_max[r];
#pragma unroll
            for (int n = 0; n < NS; ++n)
#pragma unroll
                for (int c = 0; c < E; c += 2) mx = fmaxf(mx, fmaxf(s[4 * n + E * r + c], s[4 * n + E * r + c + 1]));
            softmax_row<NS, NO, RESCALE>(s, acc_o, row_max, row_sum, corr, r, f.reduce_max(mx), 1.f);
        }
    }
    apply_keep<NS>(s, keep);
}

template <int NS, int NO, bool RESCALE, bool FOLDED = false, class Bias, class Gen = NoGen>
__device__ __forceinline__ void softmax_p(float* s, float* acc_o, float row_max[2], float row_sum[2], float corr[2],
                                          float scale_log2, bool edge, const Window& win, const Alibi& alibi,
                                          const Bias& bias, int row0, int k0, const AccFrag& f, int seqlen_k,
                                          const KeepBits<NS>& keep, int tile_row0 = 0, const Gen& gen = Gen{}) {
    static_assert(!FOLDED || (!BIAS && !ALIBI), "softmax_p<FOLDED>: scores without a bias or ALiBi term only");
    if constexpr (FOLDED) softmax_p_folded<NS, NO, RESCALE>(s, acc_o, row_max, row_sum, corr, scale_log2, edge, win, row0, k0, f, seqlen_k, keep, gen);
    else softmax_p_scaled<NS, NO, RESCALE>(s, acc_o, row_max, row_sum, corr, scale_log2, edge, win, alibi, bias, row0, k0, f, seqlen_k, keep, tile_row0, gen);
}

// O (NO accumulator tiles) times corr[r] in row slot r (softmax_p's factors).
template <int NO>
__device__ __forceinline__ void rescale_o(float* acc_o, const float corr[2]) {
    constexpr int E = AccFrag::SLOT_ELEMS;
#pragma unroll
    for (int r = 0; r < AccFrag::ROW_SLOTS; ++r)
#pragma unroll
        for (int n = 0; n < NO; ++n)
#pragma unroll
            for (int c = 0; c < E; ++c) acc_o[4 * n + E * r + c] *= corr[r];
}

// rescale_o, skipped by the whole warp when every corr of its rows is 1 (LAZY_RESCALE: the maxima stayed)
template <int NO>
__device__ __forceinline__ void rescale_o_lazy(float* acc_o, const float corr[2], const AccFrag& f) {
    if constexpr (LAZY_RESCALE > 0) {
        bool moved = false;
#pragma unroll
        for (int r = 0; r < AccFrag::ROW_SLOTS; ++r) moved |= corr[r] != 1.f;
        if (!f.any(moved)) return;
    }
    rescale_o<NO>(acc_o, corr);
}

// Forward, one key block: softmax_p with O rescaled at once (LAZY_RESCALE: right after it, by
// rescale_o_lazy, so the serial pipeline skips it too where no maximum of the warp moved).
template <int NS, int NO, class Bias>
__device__ __forceinline__ void online_softmax(float* s, float* acc_o, float row_max[2], float row_sum[2],
                                               float scale_log2, bool edge, const Window& win, const Alibi& alibi,
                                               const Bias& bias, int row0, int k0, const AccFrag& f, int seqlen_k,
                                               const KeepBits<NS>& keep, int tile_row0 = 0) {
    float corr[2];
    if constexpr (LAZY_RESCALE > 0) {
        softmax_p<NS, NO, false>(s, acc_o, row_max, row_sum, corr, scale_log2, edge, win, alibi, bias, row0, k0, f,
                                 seqlen_k, keep, tile_row0);
        rescale_o_lazy<NO>(acc_o, corr, f);
    } else {
        softmax_p<NS, NO, true>(s, acc_o, row_max, row_sum, corr, scale_log2, edge, win, alibi, bias, row0, k0, f,
                                seqlen_k, keep, tile_row0);
    }
}

// Forward epilogue per row slot r (AccFrag::ROW_SLOTS of them): 1/l for O (0 for a row that saw no key; times rp_keep with
// DROPOUT) and the natural-log LSE (of the undropped softmax).
__device__ __forceinline__ void finish_rows(const float row_max[2], const float row_sum[2], float inv[2], float lse[2],
                                            const Dropout& drop, const AccFrag& f) {
#pragma unroll
    for (int r = 0; r < AccFrag::ROW_SLOTS; ++r) {
        const float l = f.reduce_sum(row_sum[r]);
        if constexpr (DROPOUT) inv[r] = l > 0.f ? drop.rp_keep / l : 0.f;
        else inv[r] = l > 0.f ? 1.f / l : 0.f;
        lse[r] = l > 0.f ? (row_max[r] + __log2f(l)) * 0.6931471805599453f : -FMHA_INF;
    }
}

// Backward: a row's natural-log LSE in log2 units, the form backward_p_ds subtracts from the scaled
// score; a row that saw no key (-inf) becomes +inf, so that its P is exp2(-inf) = 0.
__device__ __forceinline__ float lse_log2(float l) { return l == -FMHA_INF ? FMHA_INF : l * FMHA_LOG2E; }

// The backward's keep bits of one tile, as backward_p_ds reads them: fill_keep_words' word tile in
// shared memory (words: the tile's; key0l: the first key of the warp's rows inside it, a multiple
// of 16), read through AccFrag::keep_bit.
struct KeepTile {
    const uint16_t* words;
    int key0l;
};
template <int NQ>
__device__ __forceinline__ bool keep_at(const KeepTile& k, const AccFrag& f, int n, int e) {
    return f.keep_bit(k.words, AccFrag::N * NQ, k.key0l, n, e);
}

// Backward: S^T, dP^T (NQ accumulator tiles; rows = keys key0 + f.row(e), columns = query rows q0 + f.col(n, e))
// -> P^T and dS^T = P^T (dP^T - D) in place. Rows that saw no key (LSE = -inf) get P = 0.
// With a bias, the score is formed in the forward's order (scale * S + bias, then - LSE); the bias
// is an ElemBias, or with Bias::PAIRS a tile in shared memory (SwBiasTile::at_t, the ws backward).
// With DROPOUT (Z = keep * rp_keep): s <- (P Z)^T for the dV GEMM and dS^T = P^T (dP^T Z - D);
// the keep bits come from the tile's word tile in shared memory (fill_keep_words with M = AccFrag::N * NQ
// query rows; KeepTile, keep_at).
// EDGE: 2 (the default) tests `edge` at run time inside the one loop; 1 / 0 fix it at compile time,
// for a caller that branches once per tile itself. (The default is kept as one loop, unlike the
// forward: the compiler unswitched it in the mma.sync and first wgmma kernels, and splitting it
// there by hand pushed the ALiBi instance of the wgmma kernel, at the 255-register cap, into
// spills. In the warp-specialized backward it did not unswitch it: a branch per element, about
// 10 instructions each; that kernel calls EDGE 0 / 1, bench/NOTES.md step 31.)
// LOG2_LSE: `lse` holds lse_log2 of each row (log2 units, -inf as +inf), converted once per block by
// whoever filled it, instead of natural-log LSEs converted here per column (the warp-specialized
// backward's LSE2 build: its producer converts, bench/NOTES.md step 36).
// P_ONLY (no dropout): only P^T in place of S^T; dP^T is left for backward_ds_from_p (the ws backward's
// SPLIT_PDS build forms P while the dP GEMM still runs).
template <int NQ, int EDGE = 2, bool LOG2_LSE = false, bool P_ONLY = false, class Bias>
__device__ __forceinline__ void backward_p_ds(float* s, float* dp, const float* lse, const float* d, float scale_log2,
                                              bool edge, const Window& win, const Alibi& alibi, const Bias& bias,
                                              int key0, int q0, const AccFrag& f, int seqlen_q, int seqlen_k,
                                              const Dropout& drop, const KeepTile& keep, int key_row0 = 0) {
    // a bias tile in shared memory (Bias::PAIRS: SwBiasTile): this thread's 4 element addresses once
    // (key_row0: key0's row in the tile)
    unsigned boff[4] = {0u, 0u, 0u, 0u}, bstep = 0u;
    if constexpr (BIAS && Bias::PAIRS) bstep = bias.t_offsets(boff, key_row0, f);
#pragma unroll
    for (int n = 0; n < NQ; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int c = f.col(n, e);  // query row inside the block
            const int j = key0 + f.row(e), i = q0 + c;
            float l = lse[c];
            if constexpr (!LOG2_LSE) l = lse_log2(l);
            float x;
            if constexpr (BIAS && Bias::PAIRS) x = (s[4 * n + e] * scale_log2 + bias.at_t(boff, bstep, n, e)) - l;
            else if constexpr (BIAS) x = bias.kind ? (s[4 * n + e] * scale_log2 + bias(i, j)) - l : s[4 * n + e] * scale_log2 - l;
            else x = s[4 * n + e] * scale_log2 - l;
            if constexpr (ALIBI) x += alibi(i, j);
            float p = fast_exp2(x);
            if ((EDGE == 1 || (EDGE == 2 && edge)) && (i >= seqlen_q || !win.visible(i, j, seqlen_k))) p = 0.f;
            if constexpr (DROPOUT) {
                const float z = keep_at<NQ>(keep, f, n, e) ? drop.rp_keep : 0.f;
                s[4 * n + e] = p * z;
                dp[4 * n + e] = p * (dp[4 * n + e] * z - d[c]);
            } else {
                s[4 * n + e] = p;
                if constexpr (!P_ONLY) dp[4 * n + e] = p * (dp[4 * n + e] - d[c]);
            }
        }
}

// Backward, second half of backward_p_ds<..., P_ONLY = true> (no dropout): dS^T = P^T (dP^T - D) in
// place of dP^T, from the P^T that call left in `p`.
template <int NQ>
__device__ __forceinline__ void backward_ds_from_p(const float* p, float* dp, const float* d, const AccFrag& f) {
    static_assert(!DROPOUT, "backward_ds_from_p: dropout's dS needs P before the keep scaling");
#pragma unroll
    for (int n = 0; n < NQ; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) dp[4 * n + e] = p[4 * n + e] * (dp[4 * n + e] - d[f.col(n, e)]);
}

// Backward with dBias: dS^T (fp32, layout as in backward_p_ds) into ds_g, the row-major
// [seqlen_q][ld] plane of one (batch, query head); plain stores, each element written once.
template <int NQ>
__device__ __forceinline__ void store_ds(const float* ds, void* ds_g, int kind, index_t ld, int key0, int q0,
                                         const AccFrag& f, int seqlen_q, int seqlen_k) {
    // kind (BiasArg::ds_kind, uniform): 0 fp32, 1 fp16, 2 bf16
#pragma unroll
    for (int n = 0; n < NQ; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = q0 + f.col(n, e), j = key0 + f.row(e);
            if (i < seqlen_q && j < seqlen_k) {
                const index_t at = (index_t)i * ld + j;
                const float x = ds[4 * n + e];
                if (kind == 0) static_cast<float*>(ds_g)[at] = x;
                else static_cast<uint16_t*>(ds_g)[at] = kind == 1 ? float_to_f16_bits(x) : float_to_bf16_bits(x);
            }
        }
}

// Backward epilogue: this thread's rows key0 + f.row(e) of dK (scaled) and dV, columns from dk_col0
// (NDK accumulator tiles) and dv_col0 (NDV), into the outputs (input dtype, K/V head hk) or,
// for GQA, into fp32 workspaces per query head h; each row slot's SLOT_ELEMS adjacent columns in
// one store (AccFrag::store_slot_*).
template <int NDK, int NDV>
__device__ __forceinline__ void store_dk_dv(const float* acc_dk, const float* acc_dv, float scale, int key0, const AccFrag& f,
                                            int seqlen_k, int hdim_q, int hdim_v, int dk_col0, int dv_col0,
                                            bool fp32, void* dk, void* dv, int b, int head,
                                            index_t dk_sb, index_t dk_sh, index_t dk_ss,
                                            index_t dv_sb, index_t dv_sh, index_t dv_ss) {
    constexpr int E = AccFrag::SLOT_ELEMS;
#pragma unroll
    for (int r = 0; r < AccFrag::ROW_SLOTS; ++r) {
        const int j = key0 + f.row(E * r);
        if (j >= seqlen_k) continue;
        const index_t dk_off = b * dk_sb + head * dk_sh + (index_t)j * dk_ss;
        const index_t dv_off = b * dv_sb + head * dv_sh + (index_t)j * dv_ss;
#pragma unroll
        for (int n = 0; n < NDK; ++n) {
            const int col = dk_col0 + f.col(n, E * r);
            if (col >= hdim_q) continue;
            const AccFrag::Slot x = AccFrag::scaled_slot(acc_dk + 4 * n + E * r, scale);
            if (fp32) AccFrag::store_slot_f32(reinterpret_cast<float*>(dk) + dk_off, col, x);
            else AccFrag::store_slot_16bit(reinterpret_cast<uint16_t*>(dk) + dk_off, col, x);
        }
#pragma unroll
        for (int n = 0; n < NDV; ++n) {
            const int col = dv_col0 + f.col(n, E * r);
            if (col >= hdim_v) continue;
            const float* x = acc_dv + 4 * n + E * r;
            if (fp32) AccFrag::store_slot_f32(reinterpret_cast<float*>(dv) + dv_off, col, x);
            else AccFrag::store_slot_16bit(reinterpret_cast<uint16_t*>(dv) + dv_off, col, x);
        }
    }
}

}  // namespace fmha

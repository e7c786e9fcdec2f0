// Attention forward for Hopper (sm_90a), warp-specialized (issue 11): the algorithm of
// fmha_fwd_sm90.cu (FlashAttention-2's online softmax, both GEMMs on wgmma) with the loads taken
// off the MMA warps, as the backward's fmha_bwd_dq_dk_dv_sm90_ws.cu does.
//
// NWG + 1 warpgroups. Warpgroup 0 is the producer: its first thread issues TMA tensor loads, Q once
// (BLOCK_M = 64 * NWG rows), then per key block K and V into a ring of STAGES buffers, each with its
// own `full` mbarrier (K's lets S = Q K^T start before V has landed). The NWG MMA warpgroups (two,
// or three at hdim 64 with 160 registers each, as FlashAttention-3 there) own 64 query rows each:
//   S = Q K^T     wgmma A = Q (smem, K-major),   B = K (smem, K-major)
//   O += P V      wgmma A = P (registers),       B = V (smem, MN-major)
// and hand a stage back through its `empty` mbarrier once their P V has completed. Registers move
// from the producer to the MMA warpgroups with setmaxnreg.
//
// Compile-time variants (config.cuh; the library's default is the first of each):
//   SWIZZLE=0   tiles column-blocked ([D/8][R][8], desc_cb_* in arch/sm90/tile.cuh): one TMA box per
//               tile whose rows are 16 bytes (R * D / 8 of them for the TMA unit)
//   SWIZZLE=1   tiles 128-byte swizzled ([D/64][R][64], desc_sw_* in arch/sm90/tma.cuh): one TMA box
//               of 64 columns (128-byte rows) per 64-column slab, 8x fewer rows per tile
//   PV_OVERLAP=1  inside each MMA warpgroup, block j's S = Q K_j^T and block j-1's O += P_{j-1} V_{j-1}
//               are issued together, and the softmax of S_j runs while P V still occupies the tensor
//               cores (wgmma.wait_group 1); O is rescaled after P V completes (softmax_p / rescale_o).
//               K is handed back as soon as S has been computed (k_empty), V after its P V (empty).
//   PINGPONG=1  (with PV_OVERLAP) the MMA warpgroups take turns issuing their GEMMs (named
//               barriers 2 + w, round robin), so one warpgroup's GEMMs run while the others do their
//               softmax
//   FOLD=1      (no ALiBi; the overlapped pipeline) softmax_p_folded: the scale folded into one FFMA per
//               exponent; on at hdim 64 since step 37, at 128 and 256 with SMAX_TREE and LAZY_RESCALE since
//               step 113 (cupy_fmha.backends.cuda.FWD_WS_SOFTMAX); with dropout (step 114) a variant
//
//   BIAS=1      the elementwise bias, loaded by the producer like K and V: per key block one tile of
//               BLOCK_M x BLOCK_N bias elements (BIAS_TMA bytes each: 2 for fp16/bf16, 4 for fp32) in
//               128-byte-swizzled boxes (SwBiasTile in arch/sm90/tma_tile.cuh) into a ring of
//               BIAS_STAGES tiles with full / empty mbarriers of its own; the MMA warpgroups add it
//               from shared memory in the softmax and hand the tile back right after. A bias broadcast
//               along the query rows (BiasArg.sq = 0) comes as one row per tile. The 4th tensor map.
//   BIAS_ACC=1  (a variant, with BIAS and PV_OVERLAP, not with dropout; bench/NOTES.md step 77) the
//               tile goes into S's accumulator instead, as bias / softmax_scale, before the S GEMM
//               (which then adds Q K^T to it rather than starting from zero), so the softmax is the
//               plain builds' folded one (softmax_p_folded: one FFMA per exponent) with no bias work
//               left in it; (s + b / scale) * scale_log2 = s * scale_log2 + b * log2(e). A -inf in
//               the bias stays -inf (any scale sign).
//
//   DROPOUT=1   the Philox keep test (philox.cuh, the keep mask of every other kernel): each MMA thread
//               computes the keep decisions of its scores of a key block (one Philox call per 32-key span for
//               both its rows, ceil(BLOCK_N / 32) independent calls, one more where a block starts mid-span:
//               keep_bits, KEEP_MSB) right after issuing that block's S GEMM and
//               before waiting for it, so the integer work runs while the tensor cores compute S (and,
//               with PINGPONG, the other warpgroup's GEMMs); with KEEP_SINK (the table's at hdim 64, step
//               116: there the work outlasted S by ~1,000 cycles a block) inside the softmax instead, where
//               ptxas interleaves it with the exponentials (KEEP_SINK=2, a variant: the second half of the
//               32-key spans there, the first under S); FOLD off in the table's builds (FOLD=1 in
//               CUPY_FMHA_FWD_WS_TILES folds them, step 114).
//
//   O_IN_Q=1    (where O has no stage of its own; the table's choice at hdim 256, built at 64 too; step 86) each warp stages
//               its 16 rows of O in the rows of the Q buffer its warpgroup's S GEMMs read (128-byte
//               swizzled like Q: conflict-free 4-byte writes, 16-byte reads) and sends them in 16-byte
//               stores of whole rows, instead of 4-byte stores of 8 partial rows per instruction; the
//               row block hands Q back (q_empty) after that, not after its last S GEMM
//   O_IN_KV=1   (a variant for hdim 192 / 256, where O has no stage of its own; the overlapped pipeline, two MMA
//               warpgroups, not with O_IN_Q) each warp stages its 16 rows of O as O_IN_Q does, but in the last key
//               block's ring stage: MMA warpgroup 0's 64 rows in its K tile, 1's in its V tile (64-row slabs of 64
//               columns, 128-byte swizzled). Q goes back right after the last S GEMM, so the next row block's Q
//               (PERSIST) loads under the last P V and the epilogue; that stage's K and V hand-backs (k_empty,
//               empty) wait until O has left it, after both warpgroups' last GEMMs (a named barrier)
//   SMAX_TREE, MASK_ROWS, EXP_EMU, LAZY_RESCALE  (variants of the softmax in attention.cuh; bench/NOTES.md step 87)
//   TIMING=1    diagnostics only (bench/probe/fwd_timeline.py): thread 0 of each MMA warpgroup stamps
//               clock64 at six phases of each of its first TL_ROWS row blocks and sums the cycles of
//               seven phases of every loop iteration (PV_OVERLAP; the boundaries approximate: clock64
//               does not fence independent arithmetic), and the CTA's entry and exit (%globaltimer
//               too) go into the module's `fmha_fwd_timeline`, one row per CTA.
//
//   WG_SKIP=1   (the overlapped pipeline, not with BIAS or O_IN_KV) each MMA warpgroup
//               computes only the key blocks some of its own 64 rows see (wg_key_blocks): under a causal mask the
//               first warpgroups of a row block stop before the diagonal's last blocks, and with ALIGN_END the
//               warpgroups of the partial first block whose rows all lie before the sequence compute none. For the
//               others it only meets the ring and the turns (skip_block). Every block it leaves out is masked for
//               all of its rows, so O and LSE are bit-identical to the build without it. Batch mode (wg_key_blocks);
//               the table's at hdim 64 and 256 (bench/NOTES.md row 130)
//
// Group mode: a key
// block past a sequence's end holds the next sequence's keys (TMA zero-fills only past the tensor);
// their scores are masked to -inf, but P V would still meet their values (0 * Inf is NaN), so the
// MMA warpgroups zero those rows of K and V first.
//
// Parameters: four tensor maps (Q, K, V: column-blocked 5-D views, or with SWIZZLE the plain 4-D
// (batch, rows, heads, hdim) tensors with boxes of 64 columns; zeros for an empty tensor; the bias as
// a 4-D (batch, heads, rows, keys) map, 1 along broadcast dimensions, in builds with BIAS, else
// zeros, unread), then FwdParams by value, as fmha_fwd_sm90.
#include "common.cuh"
#include "arch/arch.cuh"
#include "attention.cuh"
#include "block.cuh"

using namespace fmha;

static_assert(!BIAS_ACC || (BIAS && PV_OVERLAP && !DROPOUT && !ALIBI),
              "fmha_fwd_sm90_ws: BIAS_ACC is a variant of the bias build's overlapped pipeline");
static_assert((NWG == 2 || NWG == 3) && BLOCK_M == 64 * NWG && NTHREADS == 128 * (NWG + 1),
              "fmha_fwd_sm90_ws: a producer and two or three MMA warpgroups of 64 query rows (spec.py)");
static_assert(!BIAS || ((BIAS_TMA == 2 || BIAS_TMA == 4) && BIAS_STAGES >= 1 && SWIZZLE),
              "fmha_fwd_sm90_ws: the bias tile is 16-bit or fp32 (BIAS_TMA), in a ring of BIAS_STAGES, with SWIZZLE");
static_assert(!PINGPONG || PV_OVERLAP, "fmha_fwd_sm90_ws: PINGPONG takes turns over the PV_OVERLAP pipeline");
static_assert(!KEEP_SINK || (DROPOUT && PV_OVERLAP && BLOCK_N % 32 == 0 && KEEP_SINK <= 2),
              "fmha_fwd_sm90_ws: KEEP_SINK (1: all, 2: the second half of the spans) moves the overlapped pipeline's "
              "KEEP_MSB keep decisions into the softmax");
static_assert(!SWIZZLE || (HDIM_Q % 64 == 0 && HDIM_V % 64 == 0), "fmha_fwd_sm90_ws: swizzled tiles are slabs of 64 columns");
static_assert(!O_IN_Q || (!O_STAGE && SWIZZLE && HDIM_Q == HDIM_V),
              "fmha_fwd_sm90_ws: O_IN_Q stages O in Q's buffer (swizzled, as wide as O) where O_STAGE does not fit");
static_assert(!O_IN_KV || (PV_OVERLAP && NWG == 2 && !O_STAGE && !O_IN_Q && SWIZZLE && HDIM_Q == HDIM_V && BLOCK_N >= 64),
              "fmha_fwd_sm90_ws: O_IN_KV stages each MMA warpgroup's 64 rows of O in the last key block's K or V tile "
              "(the overlapped pipeline's two warpgroups, swizzled tiles of at least 64 rows as wide as O)");

// WG_SKIP (config.cuh's constant is fmha_fwd_sm90's, on there by default; here only where the instance sets it)
enum : bool { WS_WG_SKIP = config_detail::wg_skip > 0 };
static_assert(!WS_WG_SKIP || (PV_OVERLAP && !BIAS && !O_IN_KV),
              "fmha_fwd_sm90_ws: WG_SKIP belongs to the overlapped pipeline without the bias ring or O in the K / V stage");

constexpr int MMA_THREADS = 128 * NWG;
// named barriers: 0 is __syncthreads; 1 the MMA warpgroups after zeroing a tile's tail; 2 + w the
// turn of MMA warpgroup w (PINGPONG: the warpgroup that waits and the one before it, 256 threads);
// 5 (O_IN_KV) the MMA warpgroups after their row block's last GEMMs, before O goes into the last
// key block's stage (an enumerator: a constexpr variable would appear in every build's PTX); 15 the
// TIMING build's
constexpr int BAR_ZERO = 1, BAR_TURN = 2, TURN_THREADS = 256;
enum : int { BAR_LAST_GEMM = 5 };
// registers per MMA thread after setmaxnreg (240 with two MMA warpgroups, 160 with three)
constexpr int MMA_REGS = ws_mma_regs<NWG>;
// the swizzled layout starts at the first 1024-byte boundary of the dynamic shared memory (the
// swizzle pattern follows address bits 4-9); the launcher passes this much more (SMEM_BYTES)
constexpr int SMEM_ALIGN = SWIZZLE ? 1024 : 0;

struct Smem {
    uint16_t q[BLOCK_M * HDIM_Q];  // column-blocked or swizzled tiles (SWIZZLE)
    uint16_t k[STAGES][BLOCK_N * HDIM_Q];
    uint16_t v[STAGES][BLOCK_N * HDIM_V];
    // full: the stage's TMA copy landed. empty: every MMA thread has read the stage's K and V (with
    // PV_OVERLAP: its V; K is handed back earlier through k_empty, unused otherwise). O_IN_KV: a row
    // block's last stage goes back through both once O has left it too
    // q_empty: every MMA thread's S GEMMs of the row block are complete (O_IN_Q: and O has left
    // through Q's buffer), so the next row block's Q may land
    unsigned long long q_full, q_empty, k_full[STAGES], v_full[STAGES], empty[STAGES], k_empty[STAGES];
    // (no bias ring: the BIAS builds' SmemBias has one; these let code common to both compile)
    __device__ __forceinline__ unsigned char* bias_tile(int) { return nullptr; }
    __device__ __forceinline__ unsigned long long* bias_full(int) { return nullptr; }
    __device__ __forceinline__ unsigned long long* bias_empty(int) { return nullptr; }
};
// With BIAS: the bias ring after them, from the next 1024-byte boundary; bias_full: the tile landed,
// bias_empty: every MMA thread has added it to its scores
enum : int { BIAS_TILE_BYTES = BLOCK_M * BLOCK_N * (BIAS ? BIAS_TMA : 2) };  // (an enumerator: a constexpr
// variable at namespace scope would appear in every build's PTX)
struct SmemBias : Smem {
    unsigned char pad_[1024 - sizeof(Smem) % 1024];  // (Smem ends in its mbarriers: never a multiple of 1024)
    unsigned char bias[BIAS_STAGES][BIAS_TILE_BYTES];
    unsigned long long bias_full_[BIAS_STAGES], bias_empty_[BIAS_STAGES];
    __device__ __forceinline__ unsigned char* bias_tile(int s) { return bias[s]; }
    __device__ __forceinline__ unsigned long long* bias_full(int s) { return &bias_full_[s]; }
    __device__ __forceinline__ unsigned long long* bias_empty(int s) { return &bias_empty_[s]; }
};
template <bool B> struct SmemOf { using type = Smem; };
template <> struct SmemOf<true> { using type = SmemBias; };
using SmemAll = SmemOf<BIAS>::type;
// O_STAGE: O's stage after the layout, from the next 16-byte boundary: BLOCK_M rows of HDIM_V + 8
// elements (a warp's 4-byte stores of 8 rows x 4 column pairs fall on 32 different banks), MMA
// warpgroup w's 64 rows from row 64 w (fwd_ws_store_o)
enum : int { O_PITCH = HDIM_V + 8, O_STAGE_AT = (sizeof(SmemAll) + 15) / 16 * 16 };
static_assert((O_STAGE ? O_STAGE_AT + 2 * BLOCK_M * O_PITCH : sizeof(SmemAll)) + SMEM_ALIGN == SMEM_BYTES,
              "fmha_fwd_sm90_ws: shared-memory layout and spec.py's SMEM_BYTES disagree");
static_assert(sizeof(SmemBias) == sizeof(Smem) + (1024 - sizeof(Smem) % 1024) + BIAS_STAGES * (BIAS_TILE_BYTES + 16),
              "SmemBias: no padding, so the bias tiles start on a 1024-byte boundary");
static_assert(sizeof(uint16_t) * BLOCK_M * HDIM_Q % 1024 == 0 && sizeof(uint16_t) * BLOCK_N * HDIM_Q % 1024 == 0 &&
              sizeof(uint16_t) * BLOCK_N * HDIM_V % 1024 == 0, "TMA destinations must stay 1024-byte aligned");

// S = Q K^T of this warpgroup's 64 rows (one commit group).
// ACC: S added to what sacc holds (BIAS_ACC: the bias), else S alone.
// (the tiles as pointers or, DESC_ADDR, shared-memory addresses: the descriptor helpers take either)
template <bool ACC = false, class TQ, class TK>
__device__ __forceinline__ void gemm_s(float* sacc, TQ sQ, TK sK, int wg) {
#pragma unroll
    for (int kk = 0; kk < HDIM_Q / 16; ++kk)
        wgmma_ss<BLOCK_N, 0, 0>(sacc, desc_tile_kmajor<SWIZZLE, BLOCK_M>(sQ, wg * 64, kk * 16),
                                desc_tile_kmajor<SWIZZLE, BLOCK_N>(sK, 0, kk * 16), ACC || kk > 0);
    wgmma_commit();
}
// O += P V (one commit group); P as register A fragments, one per 16 keys.
template <class TV>
__device__ __forceinline__ void gemm_pv(float* acc_o, uint32_t (*pa)[4], TV sV) {
#pragma unroll
    for (int kk = 0; kk < BLOCK_N / 16; ++kk) wgmma_rs<HDIM_V, 1>(acc_o, pa[kk], desc_tile_mnmajor<SWIZZLE, BLOCK_N>(sV, kk * 16, 0), 1);
    wgmma_commit();
}

// DROPOUT: this thread's keep decisions of the key block at k0 (rows row0 + frag rows), made between
// the issue of the block's S GEMM and the wait for it. KEEP_MSB (key blocks of whole 32-key spans:
// BLOCK_N 96 and 128): as the top bits of the draws' bytes (AccFrag::fwd_keep_msb), which zero the
// dropped elements of P's A operand when it is packed for the P V GEMM (keep_msb_apply: a PRMT and a
// LOP3 per pair of elements; the softmax then gets all-ones bits, which the compiler folds away);
// else (BLOCK_N 80) as keep bits the softmax applies (fwd_keep_bits). Without dropout: nothing.
enum : int { KEEP_MSB = DROPOUT && BLOCK_N % 32 == 0 };
struct KeepMsb {
    uint32_t w[BLOCK_N / 32][4];
};
template <bool MSB> struct FwdKeepOf { using type = KeepBits<BLOCK_N / 8>; };
template <> struct FwdKeepOf<true> { using type = KeepMsb; };
using FwdKeep = FwdKeepOf<KEEP_MSB>::type;
// The words' xor through one shuffle, from which the first word is recovered, then a register fence: holds the
// keep work above the S GEMM's wait (keep_bits, keep_msb_spans)
template <int WORDS>
__device__ __forceinline__ void anchor_words(uint32_t* w) {
    uint32_t rest = 0u;
#pragma unroll
    for (int x = 1; x < WORDS; ++x) rest ^= w[x];
    w[0] = __shfl_sync(0xffffffffu, w[0] ^ rest, lane_of(threadIdx.x)) ^ rest;
    fence_operand<WORDS>(w);
}
template <bool MSB = KEEP_MSB>  // (templates, so that if constexpr discards the other form)
__device__ __forceinline__ typename FwdKeepOf<MSB>::type keep_bits(const FwdBlock& blk, int row0, int k0, const AccFrag& f) {
    typename FwdKeepOf<MSB>::type kb{};
    if constexpr (DROPOUT) {
        // Anchored between the S GEMM's issue and its wait: the calls' coordinates pass through a
        // register fence first (fence_operand; else NVVM may hoist the Philox work above the issue), and
        // the words' xor through one shuffle, from which the first word is recovered (else ptxas sinks the work below
        // the wait, WARPGROUP.DEPBAR, where it no longer hides under the tensor cores; the keying before
        // bench/NOTES.md step 96 had its quad exchange's shuffles, which ptxas keeps in place)
        // KEEP_SINK: no anchors; the call sits inside the softmax (its gen hook), for ptxas to interleave
        uint32_t at[2] = {(uint32_t)row0, (uint32_t)k0};
        if constexpr (!KEEP_SINK) fence_operand<2>(at);
        constexpr int WORDS = sizeof(kb) / 4;
        if constexpr (MSB) f.template fwd_keep_msb<BLOCK_N / 8>(blk.drop, (int)at[0], (int)at[1], kb.w);
        else kb = fwd_keep_bits<BLOCK_N / 8>(blk.drop, (int)at[0], (int)at[1], f);
        if constexpr (!KEEP_SINK) anchor_words<WORDS>(&kb.w[0][0]);
    }
    return kb;
}
// KEEP_SINK=2 (KEEP_MSB builds): the keep decisions of the 32-key spans [Q0, Q1) of the key block at k0 into their
// words of kb, anchored under the S GEMM as keep_bits is (ANCHOR) or free (inside the softmax)
enum : int { KEEP_SPANS = BLOCK_N / 32, KEEP_UNDER_S = KEEP_SPANS / 2 };  // (KEEP_SINK=2: the spans made under S)
template <int Q0, int Q1, bool ANCHOR, class K>  // (K: FwdKeep, KeepMsb where this does anything)
__device__ __forceinline__ void keep_msb_spans(K& kb, const FwdBlock& blk, int row0, int k0, const AccFrag& f) {
    if constexpr (DROPOUT && KEEP_MSB && Q1 > Q0) {
        uint32_t at[2] = {(uint32_t)row0, (uint32_t)k0};
        if constexpr (ANCHOR) fence_operand<2>(at);
        uint32_t(&w)[Q1 - Q0][4] = *reinterpret_cast<uint32_t(*)[Q1 - Q0][4]>(&kb.w[Q0][0]);
        f.template fwd_keep_msb<4 * (Q1 - Q0)>(blk.drop, (int)at[0], (int)at[1] + 32 * Q0, w);
        if constexpr (ANCHOR) anchor_words<4 * (Q1 - Q0)>(&w[0][0]);
    }
}
// KEEP_SINK: the keep decisions of the key block at k0 into *out, run by the softmax (its gen hook): all of them
// (KEEP_SINK=1), or the spans keep_msb_spans did not make under S (2)
struct KeepGen {
    FwdKeep* out;
    const FwdBlock* blk;
    int row0, k0;
    const AccFrag* f;
    __device__ __forceinline__ void operator()() const {
        if constexpr (KEEP_SINK == 1) *out = keep_bits(*blk, row0, k0, *f);
        else if constexpr (KEEP_SINK == 2 && KEEP_MSB) keep_msb_spans<KEEP_UNDER_S, KEEP_SPANS, false>(*out, *blk, row0, k0, *f);
    }
};
// the softmax's gen hook: KeepGen with KEEP_SINK, else nothing (NoGen: the default builds' code as before it)
template <bool SINK> struct KeepGenOf { using type = NoGen; };
template <> struct KeepGenOf<true> { using type = KeepGen; };
using SoftmaxGen = KeepGenOf<KEEP_SINK != 0>::type;
// The bits the softmax applies: KEEP_MSB's all ones (nothing dropped there), else the keep bits
template <bool MSB = KEEP_MSB>
__device__ __forceinline__ KeepBits<BLOCK_N / 8> softmax_keep(const typename FwdKeepOf<MSB>::type& k) {
    if constexpr (MSB) {
        KeepBits<BLOCK_N / 8> ones;
#pragma unroll
        for (int r = 0; r < AccFrag::ROW_SLOTS; ++r)
#pragma unroll
            for (int a = 0; a < (BLOCK_N / 8 + AccFrag::KEEP_TILES - 1) / AccFrag::KEEP_TILES; ++a) ones.w[r][a] = 0xffffffffu;
        return ones;
    } else {
        return k;
    }
}
// P's A operand of the P V GEMM from the softmax's P (sacc), the dropped elements zeroed (KEEP_MSB)
template <bool MSB = KEEP_MSB>
__device__ __forceinline__ void pv_operands(uint32_t (*pa)[4], const float* sacc, const typename FwdKeepOf<MSB>::type& keep,
                                            uint32_t keep_all) {
#pragma unroll
    for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
        c_to_a(pa[kk], sacc + 8 * kk, sacc + 8 * kk + 4);
        if constexpr (MSB) AccFrag::keep_msb_apply<BLOCK_N / 32>(pa[kk], keep.w, kk, keep_all);
    }
}

// The state of row block x (rows from q0) for NT threads from t (fwd_block_state); false when the CTA skips
// it. ALIGN_END: in group mode each x first writes -inf to the LSE rows sq_b + x BLOCK_M .. of those past its
// sequence (sq_b: the sequence's length; the blocks' union reaches the pitch, the longest's length), and a
// block wholly before the sequence's start has nothing else to do; the first block's key range is its rows'
// from row 0 (a window's lower bound would otherwise reach back for rows that are not stored).
template <int NT>
__device__ __forceinline__ bool fwd_ws_block_state(const FwdParams& p, int b, int h, int x, int q0, int sq_b, int t,
                                                   FwdBlock& blk) {
    if constexpr (ALIGN_END) {
        if (p.seq.cu_seqlens_q) {
            lse_fill_tail(fwd_lse_row(p, b, h, p.seq.seqlen_q), sq_b + x * BLOCK_M, BLOCK_M, sq_b, p.seq.seqlen_q, t, NT);
            if (q0 + BLOCK_M <= 0) return false;
        }
        if (!fwd_block_state<BLOCK_M, BLOCK_N, NT>(p, b, h, q0, t, blk)) return false;
        if (q0 < 0)
            key_block_range(blk.win, 0, q0 + BLOCK_M, BLOCK_N, blk.seqlen_q, blk.seqlen_k, blk.kb_begin, blk.kb_end);
        return true;
    } else {
        return fwd_block_state<BLOCK_M, BLOCK_N, NT>(p, b, h, q0, t, blk);
    }
}

// WG_SKIP: of the row block's n key blocks from blk.kb_begin, those [ib, ie) that some row of the MMA warpgroup's 64
// from wq0 sees (key_block_range over its rows inside the sequence; none where it has none: ALIGN_END's rows before
// the start, rows past the end). Every other block is masked for all of its rows.
// Batch mode only: in group mode a row block's last key block may cross the sequence's end, and its tiles' tails are
// zeroed by every MMA thread between two named-barrier syncs (zero_tail_of); a warpgroup that skips the block would
// reach them from skip_block, the others from the pipeline's waits, and compute-sanitizer's synccheck reports a
// barrier reached from two places as divergent (bench/NOTES.md row 130), though the turns model
// (tests/test_fwd_turns_model_cpu.py) finds the order deadlock-free where a warpgroup with blocks computes that one.
__device__ __forceinline__ void wg_key_blocks(const FwdBlock& blk, int wq0, int n, int& ib, int& ie) {
    const int r0 = max(wq0, 0), r1 = min(wq0 + 64, blk.seqlen_q);
    int wb = blk.kb_begin, we = blk.kb_begin;
    if (r1 > r0) key_block_range(blk.win, r0, r1 - r0, BLOCK_N, blk.seqlen_q, blk.seqlen_k, wb, we);
    ib = min(max(wb - blk.kb_begin, 0), n);
    ie = min(max(we - blk.kb_begin, ib), n);
}

// Whether row r of the rows row0 + 0 .. rows - 1 the caller found inside the sequence's end is sent (with ALIGN_END not
// one before its start either)
__device__ __forceinline__ bool sent_row(int row0, int r, int rows) {
    if constexpr (ALIGN_END)
        return row0 + r >= 0 && r < rows;
    else
        return r < rows;
}

// Whether O's rows can leave in 16-byte pieces (the API's outputs always can; else 4-byte stores)
__device__ __forceinline__ bool o_rows_aligned(const FwdParams& p, const uint16_t* og) {
    return ((reinterpret_cast<unsigned long long>(og) | static_cast<unsigned long long>(2 * (p.o.ss | p.hdim_v))) & 15) == 0;
}
// A warp's `rows` (of 16) staged O rows to global memory in 16-byte pieces, whole rows per store
// instruction: all the warp's pieces read first (`at(r, j)`: piece j of staged row r), then stored
// where the row is in the sequence and the piece inside hdim_v (O_IN_Q, O_IN_KV). FRESH: the lane
// made opaque first, so its pieces' offsets are formed here, not hoisted out of the row-block loop to
// live (or spill) across it
template <bool FRESH = false, typename At>
__device__ __forceinline__ void fwd_send_rows(const FwdParams& p, uint16_t* og, int row0, int rows, At at) {
    constexpr int PIECES = HDIM_V / 8;  // per row
    int lane = lane_of(threadIdx.x);
    if constexpr (FRESH) {
        unsigned u = lane;
        opaque_u32(u);
        lane = u;
    }
    uint4 got[HDIM_V / 16];
#pragma unroll
    for (int t = 0; t < HDIM_V / 16; ++t) got[t] = *at((lane + 32 * t) / PIECES, (lane + 32 * t) % PIECES);
#pragma unroll
    for (int t = 0; t < HDIM_V / 16; ++t) {
        const int r = (lane + 32 * t) / PIECES, j = (lane + 32 * t) % PIECES;
        if (sent_row(row0, r, rows) && 8 * j < p.hdim_v) *reinterpret_cast<uint4*>(og + (index_t)(row0 + r) * p.o.ss + 8 * j) = got[t];
    }
}

// O_STAGE epilogue of one warp's 16 rows from row0 (wi: the warp in its warpgroup, whose rows of
// the stage are wi * 16 ..): O scaled by 1/l and rounded into the stage, then lane 0 sends the rows
// to global memory with one cp.async.bulk each (rows past the sequence skipped), instead of every
// thread storing 4-byte pieces of 8 rows per warp instruction (fwd_store_rows, which stays for
// outputs whose rows are not 16-byte aligned; the API's outputs always are). A warp writes and sends
// only its own rows, so a __syncwarp orders them, and lane 0 read-waits its copies of the previous
// row block (PERSIST) before the warp writes the stage again. The backward's dK/dV epilogue does the
// same per key row (bwd_ws_store_dk_dv; bench/NOTES.md steps 60 and 63).
template <int NO>
__device__ __forceinline__ void fwd_ws_store_o(const FwdParams& p, const FwdBlock& blk, int b, int h, int row0, int wi,
                                               const float* acc_o, const float row_max[2], const float row_sum[2],
                                               const AccFrag& f, uint16_t* stage) {
    uint16_t* og = fwd_out_rows(p, b, h);
    if (!o_rows_aligned(p, og)) {
        fwd_store_rows<NO>(p, blk, b, h, row0 + wi * 16, acc_o, row_max, row_sum, f);  // (uniform)
        return;
    }
    const bool lead = lane_of(threadIdx.x) == 0;
    float* lse_g = fwd_lse_row(p, b, h, blk.lse_pitch);
    float inv[2], row_lse[2];
    finish_rows(row_max, row_sum, inv, row_lse, blk.drop, f);
    stage += wi * 16 * O_PITCH;
    row0 += wi * 16;
    if (lead) bulk_wait_read<0>();  // the warp's row copies of the previous row block have read the stage
    __syncwarp();
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int rl = f.row(2 * r);
        if constexpr (ALIGN_END) {  // (written out twice: one expression for both changed the PTX of some builds without it)
            if (f.row_leader() && row_stored(row0 + rl, blk.seqlen_q)) lse_g[row0 + rl] = row_lse[r];
        } else {
            if (f.row_leader() && row0 + rl < blk.seqlen_q) lse_g[row0 + rl] = row_lse[r];
        }
#pragma unroll
        for (int n = 0; n < NO; ++n)
            *reinterpret_cast<uint32_t*>(stage + rl * O_PITCH + f.col(n, 0)) =
                pack2(acc_o[4 * n + 2 * r] * inv[r], acc_o[4 * n + 2 * r + 1] * inv[r]);
    }
    const int rows = min(16, blk.seqlen_q - row0);
    fence_proxy_async();
    __syncwarp();
    if (lead) {
        for (int r = ALIGN_END ? max(0, -row0) : 0; r < rows; ++r)  // (ALIGN_END: not the rows before the sequence)
            bulk_store(og + (index_t)(row0 + r) * p.o.ss, smem_u32(stage + r * O_PITCH), 2u * p.hdim_v);
        bulk_commit();
    }
}

// O_IN_Q / O_IN_KV epilogue of one warp's 16 rows from row0 (wi: the warp in its warpgroup): O scaled
// by 1/l, rounded and written into the warp's rows of `tile` (128-byte swizzled slabs of 64 columns,
// SLAB bytes apart; this warpgroup's rows from `trow`), then read back in 16-byte pieces and stored as
// whole rows (rows past the sequence skipped). O_IN_Q: the Q buffer (BLOCK_M-row slabs, the
// warpgroup's rows from 64 wg, which only its own S GEMMs read, all complete by now); O_IN_KV: the
// last key block's K or V tile (64-row slabs from row 0; every GEMM of both warpgroups that reads
// it complete by now). The caller hands the buffer back after it (every lane's reads are done once
// its stores have issued). FRESH: the warp's row and lane offsets formed here (fwd_send_rows), not
// hoisted out of the row-block loop (the O_IN_KV builds at hdim 192 spilled 36-44 bytes of them)
template <int NO, int SLAB = BLOCK_M * 128, bool FRESH = false>
__device__ __forceinline__ void fwd_ws_store_o_swz(const FwdParams& p, const FwdBlock& blk, int b, int h, int row0, int wi,
                                                   int trow, const float* acc_o, const float row_max[2],
                                                   const float row_sum[2], const AccFrag& f, uint16_t* tile) {
    uint16_t* og = fwd_out_rows(p, b, h);
    if (!o_rows_aligned(p, og)) {
        fwd_store_rows<NO>(p, blk, b, h, row0 + wi * 16, acc_o, row_max, row_sum, f);  // (uniform)
        return;
    }
    float* lse_g = fwd_lse_row(p, b, h, blk.lse_pitch);
    float inv[2], row_lse[2];
    finish_rows(row_max, row_sum, inv, row_lse, blk.drop, f);
    unsigned char* base = reinterpret_cast<unsigned char*>(tile);
    unsigned tr0u = trow + wi * 16;  // the warp's first row of the tile
    if constexpr (FRESH) opaque_u32(tr0u);
    const int tr0 = tr0u;
    row0 += wi * 16;
    // (byte of 16-byte piece j of tile row tr: slab j / 8, piece j % 8 swizzled by the row)
    auto piece = [&](int tr, int j) { return (j >> 3) * SLAB + tr * 128 + (((j & 7) ^ (tr & 7)) << 4); };
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int rl = f.row(2 * r);
        if constexpr (ALIGN_END) {  // (written out twice: one expression for both changed the PTX of some builds without it)
            if (f.row_leader() && row_stored(row0 + rl, blk.seqlen_q)) lse_g[row0 + rl] = row_lse[r];
        } else {
            if (f.row_leader() && row0 + rl < blk.seqlen_q) lse_g[row0 + rl] = row_lse[r];
        }
#pragma unroll
        for (int n = 0; n < NO; ++n) {
            const int col = f.col(n, 0);
            *reinterpret_cast<uint32_t*>(base + piece(tr0 + rl, col >> 3) + 2 * (col & 7)) =
                pack2(acc_o[4 * n + 2 * r] * inv[r], acc_o[4 * n + 2 * r + 1] * inv[r]);
        }
    }
    __syncwarp();
    fwd_send_rows<FRESH>(p, og, row0, min(16, blk.seqlen_q - row0),
                         [&](int r, int j) { return reinterpret_cast<const uint4*>(base + piece(tr0 + r, j)); });
    // (the next row block's Q, or K / V, comes by TMA into these bytes after the caller's hand-back:
    // order this thread's generic accesses of them before it)
    fence_proxy_async();
}

#if defined(TIMING) && TIMING
// per CTA: [0] entry and [1] exit (%globaltimer, ns), [2] the SM, [3] row blocks, [4] entry and [5]
// exit (clock64), [6] unused, [7] NWG; [8 + r] the key blocks of row block r < TL_ROWS; then from
// TL_AT, per MMA warpgroup w and row block r, TL_EVENTS clock64 stamps at [TL_AT + (w TL_ROWS + r)
// TL_EVENTS + e]: e = 0 the row block's start, 1 its Q landed, 2 S_0 and its softmax done, 3 the last
// softmax done, 4 the last P V done, 5 O's stores issued (0: not reached). Then from TL_PH_AT, per
// MMA warpgroup w, the cycles its thread 0 spent in each phase of the overlapped pipeline's loop
// iterations (key blocks i >= 1 of every row block; bench/NOTES.md step 87), summed, at
// [TL_PH_AT + w (TL_PHASES + 1) + k]: k = 0 waiting for K_i and V_{i-1} to land, 1 for P_{i-2} V_{i-2}
// (wgmma.wait_group 0), 2 V's hand-back, O's rescale and P_{i-1} packed, 3 the turn (and BIAS_ACC's
// bias tile), 4 issuing S_i and P_{i-1} V_{i-1} (and the keep bits), 5 waiting for S_i, 6 K's
// hand-back and the softmax; [.. + TL_PHASES] the iterations counted
enum : int { TL_ROWS = 4, TL_EVENTS = 6, TL_AT = 8 + TL_ROWS, TL_PHASES = 7, TL_PH_AT = TL_AT + 3 * TL_ROWS * TL_EVENTS,
             TL_WORDS = TL_PH_AT + 3 * (TL_PHASES + 1), TL_CTAS = 1 << 14 };
__device__ unsigned long long fmha_fwd_timeline[TL_CTAS][TL_WORDS];
#endif
extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
fmha_fwd_sm90_ws(const __grid_constant__ TmaMap tm_q, const __grid_constant__ TmaMap tm_k,
                 const __grid_constant__ TmaMap tm_v, const __grid_constant__ TmaMap tm_bias,
                 const __grid_constant__ FwdParams p) {
    constexpr int NS = BLOCK_N / 8, NO = HDIM_V / 8;
    // the boxes' bytes, rows and columns past the tensor included (TMA counts its zero fill)
    constexpr unsigned Q_BYTES = 2u * BLOCK_M * HDIM_Q, K_BYTES = 2u * BLOCK_N * HDIM_Q, V_BYTES = 2u * BLOCK_N * HDIM_V;

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem_base = smem_raw;
    if constexpr (SWIZZLE) smem_base += (1024u - (smem_u32(smem_raw) & 1023u)) & 1023u;
    SmemAll& sm = *reinterpret_cast<SmemAll*>(smem_base);
    const int h = blockIdx.y, b = blockIdx.z;
    // Row blocks of this CTA: blockIdx.x, + gridDim.x, ... of the nqb blocks of (b, h), last row
    // blocks first (under causal masks they see the most keys, so the tail is short). One per CTA
    // when the grid covers them all; with PERSIST (the launcher's grid.x = ceil(nqb / PERSIST)) up
    // to PERSIST, and the next block's Q and first K, V load while this one finishes its last
    // P V and writes O. The ring (stages, phases) runs on across the row blocks.
    // ALIGN_END: counted back from the sequence's own length (sq_b; group mode's grid covers the longest) rounded
    // up to 16 rows, so the partial block is the one of the first rows and may start before row 0. (Rounded: each
    // warp's 16 rows must start at a multiple of 16, where the dropout keying's row pairs i, i + 8 begin, so that a
    // thread's two rows are one Philox call's, philox.cuh; the rows past the end are not stored, as without it.)
    const int nqb = (p.seq.seqlen_q + BLOCK_M - 1) / BLOCK_M;
    // the sequence's first token row in the packed tensors (group mode), as block.cuh found it
    const int tq = p.seq.cu_seqlens_q ? p.seq.cu_seqlens_q[b] : 0;
    int sq_b = p.seq.seqlen_q;
    if constexpr (ALIGN_END)
        if (p.seq.cu_seqlens_q) sq_b = p.seq.cu_seqlens_q[b + 1] - tq;
    auto row0_of = [&](int x) { return ALIGN_END ? ((sq_b + 15) & ~15) - (x + 1) * BLOCK_M : (nqb - 1 - x) * BLOCK_M; };
    const int tk = p.seq.cu_seqlens_k ? p.seq.cu_seqlens_k[b] : 0;
    const int bq = p.seq.cu_seqlens_q ? 0 : b;  // the batch coordinate of the maps
    const int hk = h / p.group;

#if defined(TIMING) && TIMING
    __shared__ unsigned long long tl_[TL_WORDS];
    if (threadIdx.x == 0) {  // (the stamps first: the zeroing is not the gap between CTAs)
        const unsigned long long t0 = global_timer_ns(), c0 = clock64();
        for (int n = 0; n < TL_WORDS; ++n) tl_[n] = 0;
        tl_[0] = t0;
        tl_[4] = c0;
    }
#endif
    if (threadIdx.x == 0) {
        mbarrier_init(smem_u32(&sm.q_full), 1);
        mbarrier_init(smem_u32(&sm.q_empty), MMA_THREADS);
        for (int s = 0; s < STAGES; ++s) {
            mbarrier_init(smem_u32(&sm.k_full[s]), 1);
            mbarrier_init(smem_u32(&sm.v_full[s]), 1);
            mbarrier_init(smem_u32(&sm.empty[s]), MMA_THREADS);
            mbarrier_init(smem_u32(&sm.k_empty[s]), MMA_THREADS);
        }
        if constexpr (BIAS)
            for (int s = 0; s < BIAS_STAGES; ++s) {
                mbarrier_init(smem_u32(sm.bias_full(s)), 1);
                mbarrier_init(smem_u32(sm.bias_empty(s)), MMA_THREADS);
            }
        mbarrier_init_fence();
    }
    __syncthreads();

    if (threadIdx.x < 128) {  // ------------------------------------------------------ producer
        setmaxnreg_dec<WS_PRODUCER_REGS>();
        if (threadIdx.x != 0) return;
        // the bias plane's coordinates in its map (0 along a broadcast dimension, the rows' too) and
        // a tile's bytes (boxes of one row for a bias broadcast along the rows)
        const int bias_h = p.bias.sh ? h : 0, bias_b = p.bias.sb ? b : 0;
        const unsigned bias_bytes = (p.bias.sq ? BLOCK_M : 1) * BLOCK_N * (BIAS ? BIAS_TMA : 0);
        int i = 0, j = 0;  // key blocks (ring position) and row blocks loaded so far
        for (int x = blockIdx.x; x < nqb; x += gridDim.x) {
            const int q0 = row0_of(x);
            FwdBlock blk;  // (tid BLOCK_M: the MMA threads write the LSE tail rows, not this one)
            if (!fwd_ws_block_state<NTHREADS>(p, b, h, x, q0, sq_b, BLOCK_M, blk)) continue;  // (as theirs)
            // Q once every MMA thread is done with the previous row block's (its S GEMMs are complete;
            // O_IN_Q: O left through it)
            if (j > 0) mbarrier_wait(smem_u32(&sm.q_empty), (j - 1) & 1);
            mbarrier_arrive_expect_tx(smem_u32(&sm.q_full), Q_BYTES);
            tma_load_tile<SWIZZLE, BLOCK_M, HDIM_Q>(sm.q, tm_q, smem_u32(&sm.q_full), h, tq + q0, bq);
            for (int kb = blk.kb_begin; kb < blk.kb_end; ++kb, ++i) {
                const int s = i % STAGES;
                const unsigned parity = ((i / STAGES) & 1) ^ 1;
                // (O_IN_KV: a row block's last stage comes back only after its O has left it, so with two
                // stages the next row block's second key block waits for that, its first does not)
                if (i >= STAGES) mbarrier_wait(smem_u32(PV_OVERLAP ? &sm.k_empty[s] : &sm.empty[s]), parity);
                mbarrier_arrive_expect_tx(smem_u32(&sm.k_full[s]), K_BYTES);
                tma_load_tile<SWIZZLE, BLOCK_N, HDIM_Q>(sm.k[s], tm_k, smem_u32(&sm.k_full[s]), hk, tk + kb * BLOCK_N, bq);
                if constexpr (BIAS) {  // the bias tile of (q0, key block kb), wanted by the softmax after S
                    const int bs = i % BIAS_STAGES;
                    if (i >= BIAS_STAGES) mbarrier_wait(smem_u32(sm.bias_empty(bs)), ((i / BIAS_STAGES) & 1) ^ 1);
                    mbarrier_arrive_expect_tx(smem_u32(sm.bias_full(bs)), bias_bytes);
                    tma_load_bias<BLOCK_M, BLOCK_N, BIAS_TMA>(sm.bias_tile(bs), tm_bias, smem_u32(sm.bias_full(bs)),
                                                              p.bias.sq ? q0 : 0, kb * BLOCK_N, bias_h, bias_b);
                }
                if (PV_OVERLAP && i >= STAGES) mbarrier_wait(smem_u32(&sm.empty[s]), parity);
                mbarrier_arrive_expect_tx(smem_u32(&sm.v_full[s]), V_BYTES);
                tma_load_tile<SWIZZLE, BLOCK_N, HDIM_V>(sm.v[s], tm_v, smem_u32(&sm.v_full[s]), hk, tk + kb * BLOCK_N, bq);
            }
            ++j;
        }
        return;
    }

    // ------------------------------------------------------------------------- MMA warpgroups
    setmaxnreg_inc<MMA_REGS>();
    const int tid = threadIdx.x - 128, warp = warp_of(tid);
    // warpgroup (of the NWG; broadcast from lane 0 so that the compiler sees it warp-uniform and keeps
    // the Q descriptors in uniform registers, as the ws backward: bench/NOTES.md step 31), warp
    // inside it (16 rows each)
    const int wg = __shfl_sync(0xffffffffu, warp >> 2, 0), wi = warp & 3;
    const AccFrag frag(tid);
    const bool packed = p.seq.cu_seqlens_q != nullptr;  // group mode
    // the ring stage of block i, broadcast from lane 0 (its tiles' descriptors in uniform registers)
    auto uniform_stage = [](int i) { return __shfl_sync(0xffffffffu, i % STAGES, 0); };
    // The GEMMs' tiles (DESC_ADDR, bench/NOTES.md step 103; the default at hdim 192 and 256, step 104): as
    // shared-memory addresses formed from one 32-bit value, desc_base, plus the tile's constant offset in the
    // layout (and the stage's as a multiple of the uniform index), so ptxas forms every descriptor with
    // uniform arithmetic; the opaque_u32 on desc_base at each key block keeps it from holding all of them in
    // registers across the loop. From the pointers (DESC_ADDR=0), the hdim-192 and 256 builds form their Q and K
    // descriptors in vector registers and move them over with R2UR (34-112 in the loop), as the ws
    // backward's dQ-writer builds did (step 102). The same descriptor values either way.
    unsigned desc_base = smem_u32(smem_base) & 0x3FFFFu;
    auto layout_off = [&](const void* t) {  // (a constant: the layout's member against its start)
        return (unsigned)(reinterpret_cast<const unsigned char*>(t) - smem_base);
    };
    auto opaque_base = [&]() {
        if constexpr (DESC_ADDR) opaque_u32(desc_base);
    };
    auto q_tile = [&]() { return pick<DESC_ADDR>(desc_base + layout_off(sm.q), static_cast<const uint16_t*>(sm.q)); };
    auto k_tile = [&](int s) {
        return pick<DESC_ADDR>(desc_base + layout_off(sm.k) + s * (unsigned)sizeof(sm.k[0]), static_cast<const uint16_t*>(sm.k[s]));
    };
    auto v_tile = [&](int s) {
        return pick<DESC_ADDR>(desc_base + layout_off(sm.v) + s * (unsigned)sizeof(sm.v[0]), static_cast<const uint16_t*>(sm.v[s]));
    };
    // BIAS: the bias tile of key block i (ring count) once it has landed, and its hand-back after the
    // softmax has added it
    using BiasTile = SwBiasTile<BLOCK_M, BLOCK_N, BIAS ? BIAS_TMA : 2>;
    auto bias_tile = [&](int i) {
        const int bs = i % BIAS_STAGES;
        mbarrier_wait(smem_u32(sm.bias_full(bs)), (i / BIAS_STAGES) & 1);
        return BiasTile{smem_u32(sm.bias_tile(bs)), p.bias.sq ? 1 : 0, p.bias.kind};
    };
    auto bias_done = [&](int i) { mbarrier_arrive(smem_u32(sm.bias_empty(i % BIAS_STAGES))); };
    // BIAS_ACC: the softmax's scale (log2 units; a scale that underflowed float32 taken as a tiny one
    // of its sign, so that the bias still counts and 1 / scale stays finite), and the factor that
    // turns a bias element into S's starting value, log2(e) / scale_log2 = 1 / softmax_scale
    const float acc_scale = fabsf(p.scale_log2) >= 1e-30f ? p.scale_log2 : copysignf(1e-30f, p.scale_log2);
    const float bias_mul = FMHA_LOG2E / acc_scale;

    int it = 0, j = 0;  // key blocks and row blocks consumed so far (the producer's counts)
#if defined(TIMING) && TIMING
    auto stamp = [&](int e) {
        if ((tid & 127) == 0 && j < TL_ROWS) tl_[TL_AT + (wg * TL_ROWS + j) * TL_EVENTS + e] = clock64();
    };
    // the loop's phase sums (every thread keeps them, thread 0 of the warpgroup reports: no branch)
    unsigned long long ph_[TL_PHASES + 1] = {}, ph_t = 0;
    bool ph_on = false;
    auto phase = [&](int k) {
        if (ph_on) {
            const unsigned long long t = clock64();
            ph_[k] += t - ph_t;
            ph_t = t;
        }
    };
    auto phases = [&](bool on) {
        ph_on = on;
        if (on) {
            ph_t = clock64();
            ++ph_[TL_PHASES];
        }
    };
#else
    auto stamp = [](int) {};
    auto phase = [](int) {};
    auto phases = [](bool) {};
#endif
    for (int x = blockIdx.x; x < nqb; x += gridDim.x) {
        const int q0 = row0_of(x);
        FwdBlock blk;
        if (!fwd_ws_block_state<MMA_THREADS>(p, b, h, x, q0, sq_b, tid, blk)) continue;  // uniform
        stamp(0);
        const int wq0 = q0 + wg * 64;
        float acc_o[NO * 4];
#pragma unroll
        for (int i = 0; i < NO * 4; ++i) acc_o[i] = 0.f;
        float row_max[2] = {-FMHA_INF, -FMHA_INF}, row_sum[2] = {0.f, 0.f};
        const uint16_t* sq = sm.q;
        unsigned long long* q_empty = &sm.q_empty;
        mbarrier_wait(smem_u32(&sm.q_full), j & 1);
        stamp(1);
        const int n = blk.kb_end - blk.kb_begin;  // key blocks of this row block (uniform over the CTA)
#if defined(TIMING) && TIMING
        if (tid == 0 && j < TL_ROWS) tl_[8 + j] = n;
#endif
        // Group mode: the rows of key block k0 (stage s) past the sequence's end hold the next
        // sequence's keys and values: zeros, before any MMA warpgroup reads them (uniform over the CTA;
        // only the block that crosses the end).
        auto zero_tail = [&](int s, int k0, unsigned phase) {
            mbarrier_wait(smem_u32(&sm.v_full[s]), phase);
            zero_tile_rows<SWIZZLE, BLOCK_N, HDIM_Q, MMA_THREADS>(sm.k[s], blk.seqlen_k - k0, tid);
            zero_tile_rows<SWIZZLE, BLOCK_N, HDIM_V, MMA_THREADS>(sm.v[s], blk.seqlen_k - k0, tid);
            fence_proxy_async();
            named_barrier_sync(BAR_ZERO, MMA_THREADS);
        };

        if constexpr (!PV_OVERLAP) {
            for (int kb = blk.kb_begin, i = 0; kb < blk.kb_end; ++kb, ++i) {
                const int s = (it + i) % STAGES;
                const unsigned phase = ((it + i) / STAGES) & 1;
                const int k0 = kb * BLOCK_N;
                mbarrier_wait(smem_u32(&sm.k_full[s]), phase);
                if (packed && k0 + BLOCK_N > blk.seqlen_k) zero_tail(s, k0, phase);

                float sacc[NS * 4];
                wgmma_fence();
                opaque_base();
                gemm_s(sacc, q_tile(), k_tile(s), wg);
                const FwdKeep keep = keep_bits(blk, wq0 + wi * 16, k0, frag);  // (while S runs)
                wgmma_wait0();
                fence_operand<NS * 4>(sacc);

                const bool edge = blk.win.tile_needs_test(wq0, 64, k0, BLOCK_N, blk.seqlen_q, blk.seqlen_k);
                if constexpr (BIAS) {
                    online_softmax<NS, NO>(sacc, acc_o, row_max, row_sum, p.scale_log2, edge, blk.win, blk.alibi,
                                           bias_tile(it + i), wq0 + wi * 16, k0, frag, blk.seqlen_k, softmax_keep(keep), q0);
                    bias_done(it + i);
                } else {
                    online_softmax<NS, NO>(sacc, acc_o, row_max, row_sum, p.scale_log2, edge, blk.win, blk.alibi, blk.bias,
                                           wq0 + wi * 16, k0, frag, blk.seqlen_k, softmax_keep(keep));
                }
                uint32_t pa[BLOCK_N / 16][4];
                pv_operands(pa, sacc, keep, blk.drop.keep_all());

                mbarrier_wait(smem_u32(&sm.v_full[s]), phase);
                wgmma_fence();
                gemm_pv(acc_o, pa, v_tile(s));
                wgmma_wait0();
                fence_operand<NO * 4>(acc_o);
                fence_operand<BLOCK_N / 4>(&pa[0][0]);
                mbarrier_arrive(smem_u32(&sm.empty[s]));  // K and V of this stage are read
            }
            if (!O_IN_Q) mbarrier_arrive(smem_u32(q_empty));  // every S GEMM of this row block is complete
        } else {
            // Iteration i: wait for P_{i-2} V_{i-2}, rescale O to block i-1's maxima and make P_{i-1}
            // the A operand; issue S_i = Q K_i^T and O += P_{i-1} V_{i-1} back to back (two commit
            // groups); wait for S_i only and run its softmax while P V is on the tensor cores. Block 0's
            // S before the loop, the last P V after it, so every wgmma in the loop is issued and waited
            // for unconditionally (with a conditional P V, ptxas could not tell which group a wait
            // completes and added waits of its own: C7517/C7519).
            //
            // The wait for P V comes at the top of the next iteration, after the wait for K: ptxas
            // schedules a wgmma wait at the top of its basic block, and placed right after the
            // softmax (one block with it) it was hoisted above the exp2s (SASS), serializing them
            // behind P V. The mbarrier wait's loop ends the softmax's block.
            // PINGPONG: warpgroup w waits for its turn (barrier 2 + w) before issuing and passes the
            // turn on after, to w + 1 (round robin over the NWG warpgroups); the last warpgroup gives
            // warpgroup 0 the first, and skips passing its last so every arrival is matched by a wait
            auto turn_begin = [&]() {
                if constexpr (PINGPONG) named_barrier_sync(BAR_TURN + wg, TURN_THREADS);
            };
            auto turn_end = [&](bool last) {
                if constexpr (PINGPONG)
                    if (!(last && wg == NWG - 1)) named_barrier_arrive(BAR_TURN + (NWG == 2 ? wg ^ 1 : (wg + 1) % NWG), TURN_THREADS);
            };
            // Group mode: rows of the block that crosses the sequence's end are zeroed, K's before
            // S is issued, V's before its P V (each outside the turns: all MMA warpgroups meet at the
            // barrier)
            auto zero_tail_of = [&](uint16_t* tile, int cols, int i) {
                const int k0 = (blk.kb_begin + i) * BLOCK_N;
                if (!(packed && k0 + BLOCK_N > blk.seqlen_k)) return;
                if (cols == HDIM_Q) zero_tile_rows<SWIZZLE, BLOCK_N, HDIM_Q, MMA_THREADS>(tile, blk.seqlen_k - k0, tid);
                else zero_tile_rows<SWIZZLE, BLOCK_N, HDIM_V, MMA_THREADS>(tile, blk.seqlen_k - k0, tid);
                fence_proxy_async();
                named_barrier_sync(BAR_ZERO, MMA_THREADS);
            };
            auto wait_k = [&](int i) {
                mbarrier_wait(smem_u32(&sm.k_full[(it + i) % STAGES]), ((it + i) / STAGES) & 1);
                zero_tail_of(sm.k[(it + i) % STAGES], HDIM_Q, i);
            };
            auto wait_v = [&](int i) {
                mbarrier_wait(smem_u32(&sm.v_full[(it + i) % STAGES]), ((it + i) / STAGES) & 1);
                zero_tail_of(sm.v[(it + i) % STAGES], HDIM_V, i);
            };
            // (gen: KEEP_SINK's keep decisions of block i, made inside the softmax; else nothing)
            auto softmax = [&](float* sacc, int i, float* corr, const KeepBits<NS>& keep, const SoftmaxGen& gen) {  // (softmax_keep's bits)
                const int k0 = (blk.kb_begin + i) * BLOCK_N;
                const bool edge = blk.win.tile_needs_test(wq0, 64, k0, BLOCK_N, blk.seqlen_q, blk.seqlen_k);
                if constexpr (BIAS_ACC) {  // (the bias is in sacc already: bias_into_s)
                    softmax_p_folded<NS, NO, false>(sacc, acc_o, row_max, row_sum, corr, acc_scale, edge, blk.win,
                                                    wq0 + wi * 16, k0, frag, blk.seqlen_k, keep, gen);
                } else if constexpr (BIAS) {
                    softmax_p<NS, NO, false>(sacc, acc_o, row_max, row_sum, corr, p.scale_log2, edge, blk.win, blk.alibi,
                                             bias_tile(it + i), wq0 + wi * 16, k0, frag, blk.seqlen_k, keep, q0, gen);
                    bias_done(it + i);
                } else {
                    softmax_p<NS, NO, false, FOLD && !ALIBI>(sacc, acc_o, row_max, row_sum, corr, p.scale_log2, edge,
                                                             blk.win, blk.alibi, blk.bias, wq0 + wi * 16, k0, frag,
                                                             blk.seqlen_k, keep, 0, gen);
                }
            };
            // WG_SKIP: this warpgroup's key blocks [ib, ie) (wg_key_blocks; batch mode), the whole row block's
            // otherwise. A block outside them it only meets (skip_block): its tiles landed (so that its hand-backs
            // count in their own phase) and handed back, and its turn, so that every warpgroup takes n + 1 turns a
            // row block
            int wb = 0, we = n;
            if constexpr (WS_WG_SKIP)
                if (!packed) wg_key_blocks(blk, wq0, n, wb, we);
            const int ib = WS_WG_SKIP ? wb : 0, ie = WS_WG_SKIP ? we : n;  // (without it 0 and n, as before it)
            // P V of block i - 2 has completed: hand its V back, O to block i-1's maxima (corr; block 0
            // leaves O at 0 and corr finite), P_{i-1} (in sacc) as the A operand
            float sacc[NS * 4], corr[2];
            uint32_t pa[BLOCK_N / 16][4];
            // BIAS_ACC: block i's bias tile into sacc (free once P_{i-1} is packed), as S's starting
            // value, and the tile handed back at once; the writes pinned before the wgmma fence (left
            // free, the compiler sank them below it, where PTX forbids ordinary writes to a wgmma's
            // accumulator)
            auto bias_into_s = [&](int i) {
                if constexpr (BIAS_ACC) {
                    bias_tile(it + i).template set<NS>(sacc, wq0 + wi * 16 - q0, frag, bias_mul);
                    bias_done(it + i);
                    fence_operand<NS * 4>(sacc);
                }
            };
            FwdKeep keep_prev{};  // the keep decisions of the block whose P waits in sacc (KEEP_MSB)
            // the keep decisions of block i into keep_prev: under its S GEMM (keep_under_s), or with KEEP_SINK inside
            // its softmax (keep_in_softmax, the softmax's gen hook)
            auto keep_under_s = [&](int i) {
                if constexpr (!KEEP_SINK) keep_prev = keep_bits(blk, wq0 + wi * 16, (blk.kb_begin + i) * BLOCK_N, frag);
                else if constexpr (KEEP_SINK == 2 && KEEP_MSB)
                    keep_msb_spans<0, KEEP_UNDER_S, true>(keep_prev, blk, wq0 + wi * 16, (blk.kb_begin + i) * BLOCK_N, frag);
            };
            auto keep_in_softmax = [&](int i) {
                if constexpr (KEEP_SINK) return KeepGen{&keep_prev, &blk, wq0 + wi * 16, (blk.kb_begin + i) * BLOCK_N, &frag};
                else return NoGen{};
            };
            auto next_pv_operands = [&](int i) {
                wgmma_wait0();
                fence_operand<NO * 4>(acc_o);
                fence_operand<BLOCK_N / 4>(&pa[0][0]);
                phase(1);
                if (i >= ib + 2) mbarrier_arrive(smem_u32(&sm.empty[(it + i - 2) % STAGES]));  // V of block i-2 is read
                rescale_o_lazy<NO>(acc_o, corr, frag);
                pv_operands(pa, sacc, keep_prev, blk.drop.keep_all());  // (block i - 1's P and keep decisions)
                // (pinned here: left free, the compiler sank the rescale below the next wgmma fence)
                fence_operand<NO * 4>(acc_o);
                fence_operand<BLOCK_N / 4>(&pa[0][0]);
                phase(2);
            };
            // (a block outside [ib, ie): its K landed, K back, the turn, then V likewise, in the pipeline's order:
            // tests/test_fwd_turns_model_cpu.py)
            auto skip_block = [&](int i, bool last) {
                wait_k(i);
                mbarrier_arrive(smem_u32(&sm.k_empty[(it + i) % STAGES]));
                turn_begin();
                turn_end(last);
                wait_v(i);
                mbarrier_arrive(smem_u32(&sm.empty[(it + i) % STAGES]));
            };
            if (n > 0) {
                if (PINGPONG && wg == NWG - 1) named_barrier_arrive(BAR_TURN, TURN_THREADS);
                if constexpr (WS_WG_SKIP)
                    for (int i = 0; i < ib; ++i) skip_block(i, false);
                if (!WS_WG_SKIP || ie > ib) {
                    wait_k(ib);  // block ib (0 without WG_SKIP): its S and softmax
                    bias_into_s(ib);
                    turn_begin();
                    wgmma_fence();
                    opaque_base();
                    gemm_s<BIAS_ACC>(sacc, q_tile(), k_tile(uniform_stage(it + ib)), wg);
                    turn_end(false);
                    keep_under_s(ib);
                    wgmma_wait0();
                    fence_operand<NS * 4>(sacc);
                    // K of block ib is read (O_IN_KV: unless it is the last, whose stage O takes)
                    if (!O_IN_KV || n > 1) mbarrier_arrive(smem_u32(&sm.k_empty[(it + ib) % STAGES]));
                    softmax(sacc, ib, corr, softmax_keep(keep_prev), keep_in_softmax(ib));
                    stamp(2);
                    for (int i = ib + 1; i < ie; ++i) {
                        phases(true);
                        wait_k(i);
                        wait_v(i - 1);
                        phase(0);
                        next_pv_operands(i);
                        bias_into_s(i);
                        turn_begin();
                        phase(3);
                        wgmma_fence();
                        opaque_base();
                        gemm_s<BIAS_ACC>(sacc, q_tile(), k_tile(uniform_stage(it + i)), wg);
                        gemm_pv(acc_o, pa, v_tile(uniform_stage(it + i - 1)));
                        turn_end(false);
                        keep_under_s(i);  // (block i - 1's are used)
                        phase(4);
                        wgmma_wait<1>();  // S_i done; P_{i-1} V_{i-1} may still run
                        fence_operand<NS * 4>(sacc);
                        phase(5);
                        // K of this stage is read (O_IN_KV: the last block's goes back after O)
                        if (!O_IN_KV || i < n - 1) mbarrier_arrive(smem_u32(&sm.k_empty[(it + i) % STAGES]));
                        softmax(sacc, i, corr, softmax_keep(keep_prev), keep_in_softmax(i));
                        phase(6);
                    }
                    phases(false);
                    stamp(3);
                    if (!O_IN_Q) mbarrier_arrive(smem_u32(q_empty));  // every S GEMM of this row block is complete
                    wait_v(ie - 1);  // the last block's P V
                    next_pv_operands(ie);
                    turn_begin();
                    wgmma_fence();
                    gemm_pv(acc_o, pa, v_tile(uniform_stage(it + ie - 1)));
                    turn_end(!WS_WG_SKIP || ie == n);
                    wgmma_wait0();
                    fence_operand<NO * 4>(acc_o);
                    fence_operand<BLOCK_N / 4>(&pa[0][0]);
                    stamp(4);
                    if constexpr (!O_IN_KV) {
                        mbarrier_arrive(smem_u32(&sm.empty[(it + ie - 1) % STAGES]));  // V of the last block is read
                    } else {
                        // O goes into the last block's K and V tiles: every MMA warpgroup's GEMMs that read them
                        // (its last S, its last P V) complete first (the turns pass on issue, not completion)
                        named_barrier_sync(BAR_LAST_GEMM, MMA_THREADS);
                    }
                } else {
                    if (!O_IN_Q) mbarrier_arrive(smem_u32(q_empty));  // (WG_SKIP: no block this warpgroup sees; Q unread)
                }
                if constexpr (WS_WG_SKIP) {
                    for (int i = ie; i < n; ++i) skip_block(i, i == n - 1 && ie > ib);
                    if (ie == ib) {  // (the turn of the last P V)
                        turn_begin();
                        turn_end(true);
                    }
                }
            } else {
                if (!O_IN_Q) mbarrier_arrive(smem_u32(q_empty));  // (no key block: Q unread)
            }
        }

        if constexpr (O_STAGE)
            fwd_ws_store_o<NO>(p, blk, b, h, q0 + wg * 64, wi, acc_o, row_max, row_sum, frag,
                               reinterpret_cast<uint16_t*>(smem_base + O_STAGE_AT) + wg * 64 * O_PITCH);
        else if constexpr (O_IN_Q)
            fwd_ws_store_o_swz<NO>(p, blk, b, h, q0 + wg * 64, wi, wg * 64, acc_o, row_max, row_sum, frag, const_cast<uint16_t*>(sq));
        else if constexpr (O_IN_KV) {
            // (the last key block's stage: warpgroup 0's rows in its K tile, 1's in its V tile; a row block
            // without key blocks has no stage, and its O, zero, leaves from the registers)
            const int s_last = (it + n - 1) % STAGES;
            if (n > 0)
                fwd_ws_store_o_swz<NO, 64 * 128, true>(p, blk, b, h, q0 + wg * 64, wi, 0, acc_o, row_max, row_sum, frag,
                                                       wg == 0 ? sm.k[s_last] : sm.v[s_last]);
            else
                fwd_store_rows<NO>(p, blk, b, h, q0 + wg * 64 + wi * 16, acc_o, row_max, row_sum, frag);
        } else
            fwd_store_rows<NO>(p, blk, b, h, q0 + wg * 64 + wi * 16, acc_o, row_max, row_sum, frag);
        if constexpr (O_IN_Q) mbarrier_arrive(smem_u32(q_empty));  // (Q's buffer held this row block's O until now)
        if constexpr (O_IN_KV)
            if (n > 0) {  // (the last key block's stage held this row block's O until now: its K and V go back)
                mbarrier_arrive(smem_u32(&sm.k_empty[(it + n - 1) % STAGES]));
                mbarrier_arrive(smem_u32(&sm.empty[(it + n - 1) % STAGES]));
            }
        stamp(5);
        it += n;
        ++j;
    }
    if constexpr (O_STAGE)
        if (lane_of(tid) == 0) bulk_wait_read<0>();  // the last row copies have read the stage before the CTA exits
#if defined(TIMING) && TIMING
    if ((tid & 127) == 0)
#pragma unroll
        for (int k = 0; k <= TL_PHASES; ++k) tl_[TL_PH_AT + wg * (TL_PHASES + 1) + k] = ph_[k];
    named_barrier_sync(15, MMA_THREADS);  // (every warpgroup's stamps are in)
    if (tid == 0) {
        tl_[1] = global_timer_ns();
        tl_[5] = clock64();
        tl_[2] = sm_index();
        tl_[3] = j;
        tl_[7] = NWG;
    }
    // the row out by every MMA thread, a word each (thread 0 alone, 27 rounds of two loads and four
    // stores, kept the CTA ~0.7 us past its exit stamp: bench/NOTES.md step 88)
    named_barrier_sync(15, MMA_THREADS);
    const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    if (cta < TL_CTAS)
        for (int n = tid; n < TL_WORDS; n += MMA_THREADS) fmha_fwd_timeline[cta][n] = tl_[n];
#endif
}

// Attention backward, main kernel: dQ, dK, dV, structured as CK's FMHA backward
// (ck_tile fmha_bwd_kernel.hpp, the dq_dk_dv pipeline).
//
// A CTA owns BLOCK_N = 16 * NWARPS keys of one (batch, query head); warp w owns keys
// [16w, 16w + 16) of that block. K and V stay in shared memory; Q, dO, LSE and D blocks of
// BLOCK_M rows stream past them, double-buffered with cp.async (plain loads on AMD), over the rows
// the mask lets see this key block (CK's GetTileRangeAlongY). Per Q block, on tensor cores:
//   GEMM0  S^T  = K Q^T                       (A: K from smem, B: Q)
//   GEMM2  dP^T = V dO^T                      (A: V from smem, B: dO)
//          P^T  = exp2(S^T * scale*log2e - LSE*log2e), masked entries 0 (edge tiles only)
//   GEMM1  dV  += P^T dO                      (A: P^T straight from registers)
//          dS^T = P^T * (dP^T - D)
//   GEMM3  dK  += dS^T Q                      (A: dS^T from registers)
//   GEMM4  dQ   = dS K  -> fp32 atomic adds   (A: dS^T from smem, transposed loads), or with
//                          dq_split_stride != 0 (deterministic) plain stores into slab kb
// After the loop dK is scaled by softmax_scale and dK, dV are written once.
//
// Head dims above 128 would need more accumulator registers than a thread has, so NSPLIT > 1
// splits the output columns (dK/dQ over hdim_q, dV over hdim_v) across NSPLIT CTAs; each CTA
// recomputes S and dP in full (GEMM0/GEMM2) and does its share of GEMM1/3/4.
//
// Constants (config.cuh): FMHA_BF16, HDIM_Q, HDIM_V (padded, multiples of 16), BLOCK_M, NWARPS, NSPLIT,
//            MIN_BLOCKS (CTAs per SM for __launch_bounds__), BIAS (elementwise bias; dS for dBias),
//            DROPOUT (0/1).
// Dropout (DROPOUT=1): the CTA computes the keep bits of each (Q block, key block) tile into
// shared memory, one Philox call per (query row pair, call of 32 keys), one Q block ahead (fill_keep_words);
// backward_p_ds reads them: dV += (P Z)^T dO, dS = P (dP Z - D), Z = keep * rp_keep.
// Grid (ceil(seqlen_k / BLOCK_N) * NSPLIT, nhead_q, batch), block NWARPS * WARP_LANES.
// The same source builds for sm80 (mma.sync, warps of 32) and gfx9 (MFMA, wavefronts of 64,
// "warp" here): fragment layouts, loads, stores and the matrix instructions come from the
// architecture layer (AccFrag: tiles of N columns, ROW_SLOTS row slots of SLOT_ELEMS adjacent
// columns per thread, keep_bit, the row-slot stores; FragA, load_a, load_a_t, store_a, acc_to_a,
// mma_row_nmajor / kmajor; arch/arch.cuh). On gfx9 the products run transposed (arch/gfx9/
// fragment.cuh), so a lane holds one key and 4 adjacent query rows per tile of S^T.
// dq_acc: fp32 [batch, nhead_q, seqlen_q, hdim_q], zeroed by the caller, when dq_split_stride == 0
//         (atomic adds). Deterministic mode: dq_split_stride = batch * nhead_q * seqlen_q * hdim_q
//         and dq_acc is [nsplit = ceil(seqlen_k / BLOCK_N), batch, nhead_q, seqlen_q, hdim_q],
//         not zeroed: the CTAs of key block kb store (no atomics) every row of every query block
//         in their query_block_range into slab kb (the NSPLIT column-split CTAs of one key block
//         write disjoint columns of it); convert_dq sums the slabs that were written, kb ascending.
// dk/dv: when dkdv_fp32 == 0, outputs in the input dtype (nhead_q == nhead_k);
//        otherwise fp32 workspaces [batch, nhead_q, seqlen_k, hdim], summed per GQA group later.
// Parameters: BwdParams (params.cuh). Group mode (cu_seqlens_q/k non-null; varlen.cuh): seqlen_q/seqlen_k are the max lengths (dq_acc,
// LSE and D are [batch, nhead_q, max_seqlen_q(, hdim_q)]); q/dO/k/v/dk/dv rows are packed tokens
// (batch strides 0; api.py packs GQA workspaces as [nhead_q, total_k, hdim]).
// dbias_acc (BIAS=1, may be null): [batch, nhead_q, seqlen_q, seqlen_k] (group mode: the max
//        lengths), zeroed by the caller where the mask skips blocks; receives dS: in fp32 (before
//        any 16-bit rounding) for the caller to reduce to dBias's shape, or (bias.ds_kind 1 / 2)
//        rounded to the bias's 16-bit dtype as dBias itself, when the bias broadcasts along nothing.
#include "common.cuh"
#include "arch/arch.cuh"
#include "attention.cuh"
#include "block.cuh"

using namespace fmha;

static_assert(BLOCK_N == 16 * NWARPS && NTHREADS == WARP_LANES * NWARPS, "fmha_bwd_dq_dk_dv: one warp per 16 keys (spec.py)");

// Shared memory: K, V; Q, dO, LSE and D double-buffered; dS^T ([BLOCK_N][BLOCK_M], for GEMM4);
// row-major tiles with pitch smem_pitch(D). DROPOUT: the keep bits of the Q block being processed
// and of the next one.
struct SmemTiles {
    uint16_t k[BLOCK_N * smem_pitch(HDIM_Q)];
    uint16_t v[BLOCK_N * smem_pitch(HDIM_V)];
    uint16_t q[2][BLOCK_M * smem_pitch(HDIM_Q)];
    uint16_t dout[2][BLOCK_M * smem_pitch(HDIM_V)];
    uint16_t ds[BLOCK_N * smem_pitch(BLOCK_M)];
    float lse[2][BLOCK_M];
    float d[2][BLOCK_M];
};
// DROPOUT: two word tiles (fill_keep_words) of at least one 32-key call span: a key block of 16 keys
// (gfx9's one-wavefront tiles) takes the span that holds it, of which it reads half
enum : int { KEEP_N = BLOCK_N < 32 ? 32 : BLOCK_N };
static_assert(BLOCK_N % 32 == 0 || 32 % BLOCK_N == 0, "fmha_bwd_dq_dk_dv: key blocks of whole 32-key spans, or parts of one");
constexpr int KEEP_SMEM = DROPOUT ? 2 * (KEEP_N / 8) * BLOCK_M : 0;  // bytes
struct Smem : SmemTiles, KeepBitsSmem<KEEP_SMEM> {};
static_assert(sizeof(Smem) == SMEM_BYTES, "fmha_bwd_dq_dk_dv: shared-memory layout and spec.py's SMEM_BYTES disagree");
static_assert(sizeof(Smem) == sizeof(SmemTiles) + KEEP_SMEM, "fmha_bwd_dq_dk_dv: the keep bits must follow the tiles");

extern "C" __global__ void __launch_bounds__(NTHREADS, MIN_BLOCKS)
fmha_bwd_dq_dk_dv(FMHA_BWD_PARAMS_ARGS) {
    const BwdParams p = FMHA_BWD_PARAMS_STRUCT;  // flattened ABI: see params.cuh
    constexpr int PQ = smem_pitch(HDIM_Q), PV = smem_pitch(HDIM_V), PS = smem_pitch(BLOCK_M);
    constexpr int DQ_OUT = HDIM_Q / NSPLIT, DV_OUT = HDIM_V / NSPLIT;
    // accumulator tiles (AccFrag::N columns each); each thread holds ROW_SLOTS row slots of E
    // adjacent columns per tile
    constexpr int N = AccFrag::N, E = AccFrag::SLOT_ELEMS;
    constexpr int NT_M = BLOCK_M / N;            // tiles of S^T / dP^T along the query rows
    constexpr int NT_DQ = DQ_OUT / N, NT_DV = DV_OUT / N;
    constexpr int MT4 = BLOCK_M / 16;            // GEMM4: m-tiles of dQ
    constexpr int WC4 = NWARPS / MT4;            // GEMM4: warps sharing one m-tile
    constexpr int NT4 = (DQ_OUT / N + WC4 - 1) / WC4;  // GEMM4: tiles per warp (the last warp
                                                        // of a row may compute unused columns)
    static_assert(NWARPS % MT4 == 0, "NWARPS must be a multiple of BLOCK_M / 16");
    static_assert(DQ_OUT % 16 == 0 && DV_OUT % 16 == 0, "split head dims must be multiples of 16");

    extern __shared__ __align__(16) unsigned char smem_raw[];
    Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
    uint16_t* sK = sm.k;
    uint16_t* sV = sm.v;
    uint16_t* sQ = &sm.q[0][0];
    uint16_t* sdO = &sm.dout[0][0];
    uint16_t* sdS = sm.ds;
    float* sLse = &sm.lse[0][0];
    float* sD = &sm.d[0][0];
    uint16_t* sKeep = reinterpret_cast<uint16_t*>(smem_raw + sizeof(SmemTiles));  // [2][KEEP_N / 8][BLOCK_M / 2] (DROPOUT; block.cuh)
    constexpr int KEEP_WORDS = (KEEP_N / 8) * (BLOCK_M / 2);

    const int tid = threadIdx.x, lane = lane_of(tid), warp = warp_of(tid);
    const AccFrag frag(tid);  // this thread's accumulator elements (arch layer)
    const int kb = blockIdx.x / NSPLIT, split = blockIdx.x % NSPLIT;
    const int h = blockIdx.y, b = blockIdx.z;
    const int k0 = kb * BLOCK_N;
    BwdBlock blk;
    if (!bwd_block_state<BLOCK_M, BLOCK_N>(p, b, h, gridDim.y, kb, k0, blk)) return;

    load_tile_async<BLOCK_N, HDIM_Q, NTHREADS>(sK, blk.kg, p.k.ss, k0, blk.seqlen_k, p.hdim_q, tid);
    load_tile_async<BLOCK_N, HDIM_V, NTHREADS>(sV, blk.vg, p.v.ss, k0, blk.seqlen_k, p.hdim_v, tid);
    if (blk.qb_begin < blk.qb_end) {
        const int r0 = blk.qb_begin * BLOCK_M;
        load_tile_async<BLOCK_M, HDIM_Q, NTHREADS>(sQ, blk.qg, p.q.ss, r0, blk.seqlen_q, p.hdim_q, tid);
        load_tile_async<BLOCK_M, HDIM_V, NTHREADS>(sdO, blk.dog, p.dout.ss, r0, blk.seqlen_q, p.hdim_v, tid);
        load_vec_async<BLOCK_M, NTHREADS>(sLse, blk.lse_g, r0, blk.seqlen_q, tid);
        load_vec_async<BLOCK_M, NTHREADS>(sD, blk.d_g, r0, blk.seqlen_q, tid);
        if constexpr (DROPOUT) fill_keep_words<BLOCK_M, KEEP_N, NTHREADS>(sKeep, blk.drop, r0, k0 & ~31, tid);
    }
    cp_async_commit();

    float acc_dk[NT_DQ][4], acc_dv[NT_DV][4];
    zero<NT_DQ>(acc_dk);
    zero<NT_DV>(acc_dv);
    const int n0 = warp * 16;                     // this warp's keys inside the block
    const int mt4 = warp % MT4, wc4 = warp / MT4;  // GEMM4 partition

    for (int qb = blk.qb_begin; qb < blk.qb_end; ++qb) {
        const int buf = (qb - blk.qb_begin) & 1;
        const int q0 = qb * BLOCK_M;
        cp_async_wait<0>();
        __syncthreads();
        if (qb + 1 < blk.qb_end) {  // prefetch the next Q block
            const int r0 = q0 + BLOCK_M, nb = buf ^ 1;
            load_tile_async<BLOCK_M, HDIM_Q, NTHREADS>(sQ + nb * BLOCK_M * PQ, blk.qg, p.q.ss, r0, blk.seqlen_q, p.hdim_q, tid);
            load_tile_async<BLOCK_M, HDIM_V, NTHREADS>(sdO + nb * BLOCK_M * PV, blk.dog, p.dout.ss, r0, blk.seqlen_q, p.hdim_v, tid);
            load_vec_async<BLOCK_M, NTHREADS>(sLse + nb * BLOCK_M, blk.lse_g, r0, blk.seqlen_q, tid);
            load_vec_async<BLOCK_M, NTHREADS>(sD + nb * BLOCK_M, blk.d_g, r0, blk.seqlen_q, tid);
        }
        cp_async_commit();
        const uint16_t* sQb = sQ + buf * BLOCK_M * PQ;
        const uint16_t* sdOb = sdO + buf * BLOCK_M * PV;
        const float* sLseb = sLse + buf * BLOCK_M;
        const float* sDb = sD + buf * BLOCK_M;

        // GEMM0: S^T = K Q^T ; GEMM2: dP^T = V dO^T
        float s[NT_M][4], dp[NT_M][4];
        zero<NT_M>(s);
        zero<NT_M>(dp);
#pragma unroll
        for (int kk = 0; kk < HDIM_Q / 16; ++kk) {
            FragA a;
            load_a(a, sK, PQ, n0, kk * 16, lane);
            mma_row_nmajor<NT_M>(s, a, sQb, PQ, 0, kk * 16, lane);
        }
#pragma unroll
        for (int kk = 0; kk < HDIM_V / 16; ++kk) {
            FragA a;
            load_a(a, sV, PV, n0, kk * 16, lane);
            mma_row_nmajor<NT_M>(dp, a, sdOb, PV, 0, kk * 16, lane);
        }

        // P^T and dS^T, element by element; the window test only on edge tiles
        const bool edge = blk.win.tile_needs_test(q0, BLOCK_M, k0, BLOCK_N, blk.seqlen_q, blk.seqlen_k);
        backward_p_ds<NT_M>(&s[0][0], &dp[0][0], sLseb, sDb, p.scale_log2, edge, blk.win, blk.alibi, blk.bias, k0 + n0, q0, frag,
                            blk.seqlen_q, blk.seqlen_k, blk.drop, KeepTile{sKeep + buf * KEEP_WORDS, n0 + (k0 & 31)});
        if constexpr (BIAS)
            if (p.dbias_acc != nullptr && split == 0)  // dS in fp32 for dBias (the other splits repeat it)
                bwd_store_ds<NT_M>(p, blk, &dp[0][0], k0 + n0, q0, frag);

        // GEMM1: dV += P^T dO ; GEMM3: dK += dS^T Q ; dS^T to shared memory for GEMM4
#pragma unroll
        for (int kk = 0; kk < BLOCK_M / 16; ++kk) {
            FragA a;
            acc_to_a(a, s, kk);
            mma_row_kmajor<NT_DV>(acc_dv, a, sdOb, PV, split * DV_OUT, kk * 16, lane);
        }
#pragma unroll
        for (int kk = 0; kk < BLOCK_M / 16; ++kk) {
            FragA a;
            acc_to_a(a, dp, kk);
            mma_row_kmajor<NT_DQ>(acc_dk, a, sQb, PQ, split * DQ_OUT, kk * 16, lane);
            store_a(sdS, PS, n0, kk * 16, a, frag);  // dS^T rows n0 .. n0 + 15, query rows of k-step kk
        }
        __syncthreads();

        // GEMM4: dQ[q0 + 16*mt4 .., cols] += dS K, added into the fp32 workspace (or stored
        // into this key block's slab, deterministic mode)
        {
            float acc_dq[NT4][4];
            zero<NT4>(acc_dq);
            const int c0 = split * DQ_OUT + wc4 * NT4 * N;
            const int c_end = min(p.hdim_q, (split + 1) * DQ_OUT);
#pragma unroll
            for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
                FragA a;
                load_a_t(a, sdS, PS, mt4 * 16, kk * 16, lane);
                mma_row_kmajor<NT4>(acc_dq, a, sK, PQ, c0, kk * 16, lane);
            }
#pragma unroll
            for (int r = 0; r < AccFrag::ROW_SLOTS; ++r) {
                const int i = q0 + mt4 * 16 + frag.row(E * r);
                if (i < blk.seqlen_q) {
                    float* row = blk.dq_g + (index_t)i * p.hdim_q;
#pragma unroll
                    for (int n = 0; n < NT4; ++n) {
                        const int col = c0 + frag.col(n, E * r);
                        if (col >= c_end) continue;
                        if (p.dq_split_stride) AccFrag::store_slot_f32(row, col, &acc_dq[n][E * r]);
                        else AccFrag::add_slot_f32(row, col, &acc_dq[n][E * r]);
                    }
                }
            }
        }
        // the next block's keep bits (read after the next iteration's barrier; the buffer's last
        // readers, in the previous iteration, are past this iteration's barrier). At the end of
        // the iteration, where S, dP and dQ are dead: at its start the Philox state spills.
        if constexpr (DROPOUT)
            if (qb + 1 < blk.qb_end) fill_keep_words<BLOCK_M, KEEP_N, NTHREADS>(sKeep + (buf ^ 1) * KEEP_WORDS, blk.drop,
                                                                           q0 + BLOCK_M, k0 & ~31, tid);
    }

    // epilogue: dK *= scale; write dK, dV (input dtype, or fp32 per query head for GQA)
    bwd_store_dk_dv<NT_DQ, NT_DV>(p, blk, b, h, h / p.group, &acc_dk[0][0], &acc_dv[0][0], k0 + n0, frag, split * DQ_OUT,
                                  split * DV_OUT);
}

// Attention forward: O = softmax(scale * Q K^T + mask) V and LSE, FlashAttention-2's algorithm
// (Dao, "FlashAttention-2", 2023, Algorithm 1): one CTA owns BLOCK_M query rows (16 per warp),
// streams K/V blocks of BLOCK_N keys through double-buffered shared memory (cp.async on NVIDIA,
// plain loads on AMD), keeps the running row max and sum in registers and rescales O once at the
// end. The same source builds for sm80 (mma.sync, warps of 32) and gfx9 (MFMA, wavefronts of 64,
// "warp" below): the fragment layouts, loads and matrix instructions come from the architecture
// layer (AccFrag, FragA, load_a, mma_row_nmajor / kmajor, acc_to_a; arch/arch.cuh).
//
// Constants (config.cuh): FMHA_BF16, HDIM_Q, HDIM_V (padded head dims, multiples of 16), BLOCK_N, NWARPS,
//            Q_IN_REGS (keep Q's fragments in registers for the whole loop), MIN_BLOCKS,
//            BIAS (1: add the elementwise bias given by p.bias).
//            DROPOUT (0/1: Philox keep test in online_softmax, rp_keep folded into 1 / l).
// Grid (ceil(seqlen_q / BLOCK_M), nhead_q, batch), block NWARPS * WARP_LANES, dynamic shared memory
// SMEM_BYTES (spec.py; the Smem struct below).
// Parameters: FwdParams (params.cuh). Group mode (p.seq.cu_seqlens_q/k non-null; varlen.cuh):
// p.seq.seqlen_q/k are the max lengths, the window comes in top-left form (+ p.mask.bottom_right),
// and LSE rows past a sequence are -inf.
#include "common.cuh"
#include "arch/arch.cuh"
#include "attention.cuh"
#include "block.cuh"

using namespace fmha;

static_assert(BLOCK_M == 16 * NWARPS && NTHREADS == WARP_LANES * NWARPS, "fmha_fwd: one warp per 16 query rows (spec.py)");

// Shared memory: Q (O's staging area in the epilogue), then K and V, double-buffered; row-major
// tiles with pitch smem_pitch(D).
struct Smem {
    uint16_t q[BLOCK_M * (HDIM_Q > HDIM_V ? smem_pitch(HDIM_Q) : smem_pitch(HDIM_V))];
    uint16_t k[2][BLOCK_N * smem_pitch(HDIM_Q)];
    uint16_t v[2][BLOCK_N * smem_pitch(HDIM_V)];
};
static_assert(sizeof(Smem) == SMEM_BYTES, "fmha_fwd: shared-memory layout and spec.py's SMEM_BYTES disagree");

extern "C" __global__ void __launch_bounds__(NTHREADS, MIN_BLOCKS)
fmha_fwd(const __grid_constant__ FwdParams p) {
    constexpr int PQ = smem_pitch(HDIM_Q), PV = smem_pitch(HDIM_V);
    // accumulator tiles of S and O (AccFrag::N columns each), k-steps of 16 over the head dim;
    // each thread holds R row slots of E adjacent columns per tile
    constexpr int NT_S = BLOCK_N / AccFrag::N, NT_O = HDIM_V / AccFrag::N, KQ = HDIM_Q / 16;
    constexpr int R = AccFrag::ROW_SLOTS, E = AccFrag::SLOT_ELEMS;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
    uint16_t* sQ = sm.q;  // doubles as O's staging area
    uint16_t* sK = &sm.k[0][0];
    uint16_t* sV = &sm.v[0][0];

    const int tid = threadIdx.x, lane = lane_of(tid), warp = warp_of(tid);
    const AccFrag frag(tid);  // this thread's accumulator elements (arch layer)
    const int h = blockIdx.y, b = blockIdx.z;
    // last row blocks first: under causal masks they see the most keys, so the tail is short
    const int q0 = (gridDim.x - 1 - blockIdx.x) * BLOCK_M;
    FwdBlock blk;
    if (!fwd_block_state<BLOCK_M, BLOCK_N, NTHREADS>(p, b, h, q0, tid, blk)) return;

    load_tile_async<BLOCK_M, HDIM_Q, NTHREADS>(sQ, blk.qg, p.q.ss, q0, blk.seqlen_q, p.hdim_q, tid);
    if (blk.kb_begin < blk.kb_end) {
        load_tile_async<BLOCK_N, HDIM_Q, NTHREADS>(sK, blk.kg, p.k.ss, blk.kb_begin * BLOCK_N, blk.seqlen_k, p.hdim_q, tid);
        load_tile_async<BLOCK_N, HDIM_V, NTHREADS>(sV, blk.vg, p.v.ss, blk.kb_begin * BLOCK_N, blk.seqlen_k, p.hdim_v, tid);
    }
    cp_async_commit();

    float acc_o[NT_O][4];
    zero<NT_O>(acc_o);
    float row_max[R], row_sum[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        row_max[r] = -FMHA_INF;
        row_sum[r] = 0.f;
    }
    FragA qf[KQ];  // Q_IN_REGS: Q's fragments, loaded once
    const int m0 = warp * 16;

    for (int kb = blk.kb_begin; kb < blk.kb_end; ++kb) {
        const int buf = (kb - blk.kb_begin) & 1;
        cp_async_wait<0>();
        __syncthreads();
        if constexpr (Q_IN_REGS) {
            if (kb == blk.kb_begin) {
#pragma unroll
                for (int kk = 0; kk < KQ; ++kk) load_a(qf[kk], sQ, PQ, m0, kk * 16, lane);
            }
        }
        if (kb + 1 < blk.kb_end) {  // prefetch the next K/V block into the other buffer
            load_tile_async<BLOCK_N, HDIM_Q, NTHREADS>(sK + (buf ^ 1) * BLOCK_N * PQ, blk.kg, p.k.ss, (kb + 1) * BLOCK_N,
                                                       blk.seqlen_k, p.hdim_q, tid);
            load_tile_async<BLOCK_N, HDIM_V, NTHREADS>(sV + (buf ^ 1) * BLOCK_N * PV, blk.vg, p.v.ss, (kb + 1) * BLOCK_N,
                                                       blk.seqlen_k, p.hdim_v, tid);
        }
        cp_async_commit();
        const uint16_t* sKb = sK + buf * BLOCK_N * PQ;
        const uint16_t* sVb = sV + buf * BLOCK_N * PV;

        // S = Q K^T (this warp's 16 rows x BLOCK_N keys)
        float s[NT_S][4];
        zero<NT_S>(s);
#pragma unroll
        for (int kk = 0; kk < KQ; ++kk) {
            if constexpr (Q_IN_REGS) {
                mma_row_nmajor<NT_S>(s, qf[kk], sKb, PQ, 0, kk * 16, lane);
            } else {
                FragA a;
                load_a(a, sQ, PQ, m0, kk * 16, lane);
                mma_row_nmajor<NT_S>(s, a, sKb, PQ, 0, kk * 16, lane);
            }
        }

        const int k0 = kb * BLOCK_N;
        const bool edge = blk.win.tile_needs_test(q0, BLOCK_M, k0, BLOCK_N, blk.seqlen_q, blk.seqlen_k);
        KeepBits<NT_S> keep;
        if constexpr (DROPOUT) keep = fwd_keep_bits<NT_S>(blk.drop, q0 + m0, k0, frag);
        online_softmax<NT_S, NT_O>(&s[0][0], &acc_o[0][0], row_max, row_sum, p.scale_log2, edge, blk.win, blk.alibi, blk.bias,
                                   q0 + m0, k0,
                                   frag, blk.seqlen_k, keep);

        // O += P V
#pragma unroll
        for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
            FragA a;
            acc_to_a(a, s, kk);
            mma_row_kmajor<NT_O>(acc_o, a, sVb, PV, 0, kk * 16, lane);
        }
    }

    // epilogue: normalize, LSE (natural log), stage O through shared memory for 16-byte stores
    float* lse_g = fwd_lse_row(p, b, h, blk.lse_pitch);
    float inv[R], row_lse[R];
    finish_rows(row_max, row_sum, inv, row_lse, blk.drop, frag);
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int i = q0 + m0 + frag.row(E * r);
        if (frag.row_leader() && i < blk.seqlen_q) lse_g[i] = row_lse[r];
#pragma unroll
        for (int n = 0; n < NT_O; ++n)
#pragma unroll
            for (int c = 0; c < E; ++c) acc_o[n][E * r + c] *= inv[r];
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done reading sQ / sK
    uint16_t* sO = sQ;
    frag.store_16bit<NT_O>(sO, PV, m0, acc_o);
    warp_sync();
    uint16_t* og = fwd_out_rows(p, b, h);
    constexpr int CH = HDIM_V / 8;
    for (int c = lane; c < 16 * CH; c += WARP_LANES) {
        const int r = c / CH, ch = c % CH, i = q0 + m0 + r;
        if (i < blk.seqlen_q && ch * 8 < p.hdim_v)
            *reinterpret_cast<uint4*>(og + (index_t)i * p.o.ss + ch * 8) =
                *reinterpret_cast<const uint4*>(sO + (m0 + r) * PV + ch * 8);
    }
}

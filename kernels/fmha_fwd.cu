// Attention forward: O = softmax(scale * Q K^T + mask) V and LSE, FlashAttention-2's algorithm
// (Dao, "FlashAttention-2", 2023, Algorithm 1): one CTA owns BLOCK_M query rows (16 per warp),
// streams K/V blocks of BLOCK_N keys through double-buffered shared memory (cp.async), keeps the
// running row max and sum in registers and rescales O once at the end.
//
// -D macros: FMHA_BF16, HDIM_Q, HDIM_V (padded head dims, multiples of 16), BLOCK_N, NWARPS,
//            Q_IN_REGS (keep Q's fragments in registers for the whole loop), MIN_BLOCKS,
//            BIAS (1: add the elementwise bias given by p.bias).
//            DROPOUT (0/1: Philox keep test in online_softmax, 1 / (1 - p) folded into 1 / l).
// Grid (ceil(seqlen_q / BLOCK_M), nhead_q, batch), block NWARPS * 32, dynamic shared memory
// given by cupy_fmha/launch.py (fwd_smem_bytes).
// Parameters: FwdParams (params.cuh). Group mode (p.seq.cu_seqlens_q/k non-null; varlen.cuh):
// p.seq.seqlen_q/k are the max lengths, the window comes in top-left form (+ p.mask.bottom_right),
// and LSE rows past a sequence are -inf.
#include "common.cuh"
#include "arch_sm80.cuh"
#include "tile.cuh"
#include "attention.cuh"
#include "varlen.cuh"
#include "params.cuh"

#ifndef Q_IN_REGS
#define Q_IN_REGS 1
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1
#endif
#define NTHREADS (NWARPS * 32)
#define BLOCK_M (NWARPS * 16)

using namespace fmha;

extern "C" __global__ void __launch_bounds__(NTHREADS, MIN_BLOCKS)
fmha_fwd(const __grid_constant__ FwdParams p) {
    // the fields under the names the body uses (group mode moves q/k/v and the lengths)
    const uint16_t* __restrict__ q = static_cast<const uint16_t*>(p.q.ptr);
    const uint16_t* __restrict__ k = static_cast<const uint16_t*>(p.k.ptr);
    const uint16_t* __restrict__ v = static_cast<const uint16_t*>(p.v.ptr);
    uint16_t* __restrict__ o = static_cast<uint16_t*>(p.o.ptr);
    float* __restrict__ lse = p.lse;
    const index_t q_sb = p.q.sb, q_sh = p.q.sh, q_ss = p.q.ss, k_sb = p.k.sb, k_sh = p.k.sh, k_ss = p.k.ss;
    const index_t v_sb = p.v.sb, v_sh = p.v.sh, v_ss = p.v.ss, o_sb = p.o.sb, o_sh = p.o.sh, o_ss = p.o.ss;
    int seqlen_q = p.seq.seqlen_q, seqlen_k = p.seq.seqlen_k;
    const int hdim_q = p.hdim_q, hdim_v = p.hdim_v, group = p.group;
    const float scale_log2 = p.scale_log2;
    int win_y = p.mask.win_y, win_x = p.mask.win_x;
    const int* __restrict__ cu_seqlens_q = p.seq.cu_seqlens_q;
    const int* __restrict__ cu_seqlens_k = p.seq.cu_seqlens_k;
    constexpr int PQ = smem_pitch(HDIM_Q), PV = smem_pitch(HDIM_V);
    constexpr int NT_S = BLOCK_N / 8, NT_O = HDIM_V / 8, KQ = HDIM_Q / 16;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    uint16_t* sQ = reinterpret_cast<uint16_t*>(smem_raw);
    uint16_t* sK = sQ + BLOCK_M * (PQ > PV ? PQ : PV);  // sQ doubles as O's staging area
    uint16_t* sV = sK + 2 * BLOCK_N * PQ;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int h = blockIdx.y, b = blockIdx.z, hk = h / group;
    // last row blocks first: under causal masks they see the most keys, so the tail is short
    const int q0 = (gridDim.x - 1 - blockIdx.x) * BLOCK_M;
    // group mode (varlen.cuh): this sequence's tokens and lengths; seqlen_q stays the LSE pitch
    const int lse_pitch = seqlen_q;
    if (cu_seqlens_q) {
        const int tq = varlen_start(cu_seqlens_q, b, seqlen_q), tk = varlen_start(cu_seqlens_k, b, seqlen_k);
        q += tq * q_ss;
        k += tk * k_ss;
        v += tk * v_ss;
        lse_fill_tail(lse + ((index_t)b * gridDim.y + h) * lse_pitch, q0, BLOCK_M, seqlen_q, lse_pitch, tid, NTHREADS);
        if (q0 >= seqlen_q) return;  // past this sequence's end
    }
    window_for_sequence(win_y, win_x, p.mask.bottom_right, seqlen_q, seqlen_k);
    const uint16_t* qg = q + b * q_sb + h * q_sh;
    const uint16_t* kg = k + b * k_sb + hk * k_sh;
    const uint16_t* vg = v + b * v_sb + hk * v_sh;
    const Window win{win_y, win_x};
    const Alibi alibi = make_alibi(p.alibi.slopes, p.alibi.sb, b, h, seqlen_q, seqlen_k);
    const ElemBias ebias = make_bias(p.bias.ptr, p.bias.kind, p.bias.sb, p.bias.sh, p.bias.sq, p.bias.sk, b, h, seqlen_q, seqlen_k);
    const Dropout drop = make_dropout(p.dropout.seed, p.dropout.offset, b, gridDim.y, h, p.dropout.keep_threshold, p.dropout.rp_keep);

    int kb_begin, kb_end;  // key blocks this row block can see (none: o = 0, lse = -inf)
    key_block_range(win, q0, BLOCK_M, BLOCK_N, seqlen_q, seqlen_k, kb_begin, kb_end);

    load_tile_async<BLOCK_M, HDIM_Q, NTHREADS>(sQ, qg, q_ss, q0, seqlen_q, hdim_q, tid);
    if (kb_begin < kb_end) {
        load_tile_async<BLOCK_N, HDIM_Q, NTHREADS>(sK, kg, k_ss, kb_begin * BLOCK_N, seqlen_k, hdim_q, tid);
        load_tile_async<BLOCK_N, HDIM_V, NTHREADS>(sV, vg, v_ss, kb_begin * BLOCK_N, seqlen_k, hdim_v, tid);
    }
    cp_async_commit();

    float acc_o[NT_O][4];
    zero<NT_O>(acc_o);
    float row_max[2] = {-FMHA_INF, -FMHA_INF}, row_sum[2] = {0.f, 0.f};
#if Q_IN_REGS
    uint32_t qf[KQ][4];
#endif
    const int m0 = warp * 16;

    for (int kb = kb_begin; kb < kb_end; ++kb) {
        const int buf = (kb - kb_begin) & 1;
        cp_async_wait<0>();
        __syncthreads();
#if Q_IN_REGS
        if (kb == kb_begin) {
#pragma unroll
            for (int kk = 0; kk < KQ; ++kk) load_a(qf[kk], sQ, PQ, m0, kk * 16, lane);
        }
#endif
        if (kb + 1 < kb_end) {  // prefetch the next K/V block into the other buffer
            load_tile_async<BLOCK_N, HDIM_Q, NTHREADS>(sK + (buf ^ 1) * BLOCK_N * PQ, kg, k_ss, (kb + 1) * BLOCK_N,
                                                       seqlen_k, hdim_q, tid);
            load_tile_async<BLOCK_N, HDIM_V, NTHREADS>(sV + (buf ^ 1) * BLOCK_N * PV, vg, v_ss, (kb + 1) * BLOCK_N,
                                                       seqlen_k, hdim_v, tid);
        }
        cp_async_commit();
        const uint16_t* sKb = sK + buf * BLOCK_N * PQ;
        const uint16_t* sVb = sV + buf * BLOCK_N * PV;

        // S = Q K^T (this warp's 16 rows x BLOCK_N keys)
        float s[NT_S][4];
        zero<NT_S>(s);
#pragma unroll
        for (int kk = 0; kk < KQ; ++kk) {
#if Q_IN_REGS
            mma_row_nmajor<NT_S>(s, qf[kk], sKb, PQ, 0, kk * 16, lane);
#else
            uint32_t a[4];
            load_a(a, sQ, PQ, m0, kk * 16, lane);
            mma_row_nmajor<NT_S>(s, a, sKb, PQ, 0, kk * 16, lane);
#endif
        }

        const int k0 = kb * BLOCK_N;
        const bool edge = win.tile_needs_test(q0, BLOCK_M, k0, BLOCK_N, seqlen_q, seqlen_k);
        KeepBits<NT_S> keep;
        if constexpr (DROPOUT != 0) keep = fwd_keep_bits<NT_S>(drop, q0 + m0, k0, g, t);
        online_softmax<NT_S, NT_O>(&s[0][0], &acc_o[0][0], row_max, row_sum, scale_log2, edge, win, alibi, ebias, q0 + m0, k0,
                                   g, t, seqlen_k, keep);

        // O += P V
#pragma unroll
        for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
            uint32_t a[4];
            c_to_a(a, s[2 * kk], s[2 * kk + 1]);
            mma_row_kmajor<NT_O>(acc_o, a, sVb, PV, 0, kk * 16, lane);
        }
    }

    // epilogue: normalize, LSE (natural log), stage O through shared memory for 16-byte stores
    float* lse_g = lse + ((index_t)b * gridDim.y + h) * lse_pitch;
    float inv[2], row_lse[2];
    finish_rows(row_max, row_sum, inv, row_lse, drop);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int i = q0 + m0 + g + r * 8;
        if (t == 0 && i < seqlen_q) lse_g[i] = row_lse[r];
#pragma unroll
        for (int n = 0; n < NT_O; ++n) {
            acc_o[n][2 * r] *= inv[r];
            acc_o[n][2 * r + 1] *= inv[r];
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done reading sQ / sK
    uint16_t* sO = sQ;
#pragma unroll
    for (int n = 0; n < NT_O; ++n) {
        *reinterpret_cast<uint32_t*>(sO + (m0 + g) * PV + n * 8 + 2 * t) = pack2(acc_o[n][0], acc_o[n][1]);
        *reinterpret_cast<uint32_t*>(sO + (m0 + g + 8) * PV + n * 8 + 2 * t) = pack2(acc_o[n][2], acc_o[n][3]);
    }
    __syncwarp();
    uint16_t* og = o + b * o_sb + h * o_sh;
    if (cu_seqlens_q) og += (index_t)cu_seqlens_q[b] * o_ss;  // group mode: not kept live through the loop
    constexpr int CH = HDIM_V / 8;
    for (int c = lane; c < 16 * CH; c += 32) {
        const int r = c / CH, ch = c % CH, i = q0 + m0 + r;
        if (i < seqlen_q && ch * 8 < hdim_v)
            *reinterpret_cast<uint4*>(og + (index_t)i * o_ss + ch * 8) =
                *reinterpret_cast<const uint4*>(sO + (m0 + r) * PV + ch * 8);
    }
}

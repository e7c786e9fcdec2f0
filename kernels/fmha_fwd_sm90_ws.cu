// Attention forward for Hopper (sm_90a), warp-specialized (issue 11, first step): the algorithm
// of fmha_fwd_sm90.cu (FlashAttention-2's online softmax, both GEMMs on wgmma) with the loads
// taken off the MMA warps, as the backward's fmha_bwd_dq_dk_dv_sm90_ws.cu does.
//
// Three warpgroups. Warpgroup 0 is the producer: its first thread issues TMA tensor loads, Q once
// (BLOCK_M = 128 rows), then per key block K and V into a ring of STAGES buffers, each with its
// own `full` mbarrier (K's lets S = Q K^T start before V has landed). Warpgroups 1 and 2 own 64
// query rows each:
//   S = Q K^T     wgmma A = Q (smem, K-major),   B = K (smem, K-major)
//   O += P V      wgmma A = P (registers),       B = V (smem, MN-major)
// and hand a stage back through its `empty` mbarrier once their P V has completed. Registers move
// from the producer to the MMA warpgroups with setmaxnreg. Tiles are column-blocked ([D/8][R][8],
// desc_cb_* in arch/sm90/tile.cuh), one TMA box per tile (cupy_fmha/backends/tma.py).
//
// Not yet here: dropout and the elementwise bias (static_assert; the library routes them to
// fmha_fwd_sm90), per-warpgroup skipping of key blocks (fmha_fwd_sm90's WG_SKIP), and the
// overlap of one block's softmax with the next block's S GEMM (FlashAttention-3's intra-warpgroup
// pipelining). Group mode: a key block past a sequence's end holds the next sequence's keys (TMA
// zero-fills only past the tensor); their scores are masked to -inf, but P V would still meet
// their values (0 * Inf is NaN), so the MMA warpgroups zero those rows of K and V first.
//
// Parameters: three tensor maps (Q, K, V as column-blocked views; zeros for an empty tensor),
// then FwdParams by value, as fmha_fwd_sm90.
#include "common.cuh"
#include "arch/arch.cuh"
#include "attention.cuh"
#include "block.cuh"

using namespace fmha;

static_assert(NWG == 2 && BLOCK_M == 64 * NWG && NTHREADS == 128 * (NWG + 1),
              "fmha_fwd_sm90_ws: a producer and two MMA warpgroups of 64 query rows (spec.py)");
static_assert(!DROPOUT && !BIAS, "fmha_fwd_sm90_ws: dropout and bias run on fmha_fwd_sm90");

constexpr int MMA_THREADS = 128 * NWG;

struct Smem {
    uint16_t q[BLOCK_M * HDIM_Q];              // column-blocked
    uint16_t k[STAGES][BLOCK_N * HDIM_Q];
    uint16_t v[STAGES][BLOCK_N * HDIM_V];
    unsigned long long q_full, k_full[STAGES], v_full[STAGES], empty[STAGES];
};
static_assert(sizeof(Smem) == SMEM_BYTES, "fmha_fwd_sm90_ws: shared-memory layout and spec.py's SMEM_BYTES disagree");
static_assert(sizeof(uint16_t) * BLOCK_M * HDIM_Q % 1024 == 0 && sizeof(uint16_t) * BLOCK_N * HDIM_Q % 1024 == 0 &&
              sizeof(uint16_t) * BLOCK_N * HDIM_V % 1024 == 0, "TMA destinations must stay 1024-byte aligned");

extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
fmha_fwd_sm90_ws(const __grid_constant__ TmaMap tm_q, const __grid_constant__ TmaMap tm_k,
                 const __grid_constant__ TmaMap tm_v, const __grid_constant__ FwdParams p) {
    constexpr int NS = BLOCK_N / 8, NO = HDIM_V / 8;
    constexpr unsigned Q_BYTES = 2u * BLOCK_M * HDIM_Q, K_BYTES = 2u * BLOCK_N * HDIM_Q, V_BYTES = 2u * BLOCK_N * HDIM_V;

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
    const int h = blockIdx.y, b = blockIdx.z;
    // last row blocks first: under causal masks they see the most keys, so the tail is short
    const int q0 = (gridDim.x - 1 - blockIdx.x) * BLOCK_M;
    FwdBlock blk;
    if (!fwd_block_state<BLOCK_M, BLOCK_N, NTHREADS>(p, b, h, q0, threadIdx.x, blk)) return;  // uniform

    // the sequence's first token row in the packed tensors (group mode), as block.cuh found it
    const int tq = p.seq.cu_seqlens_q ? p.seq.cu_seqlens_q[b] : 0;
    const int tk = p.seq.cu_seqlens_k ? p.seq.cu_seqlens_k[b] : 0;
    const int bq = p.seq.cu_seqlens_q ? 0 : b;  // the batch coordinate of the maps
    const int hk = h / p.group;

    if (threadIdx.x == 0) {
        mbarrier_init(smem_u32(&sm.q_full), 1);
        for (int s = 0; s < STAGES; ++s) {
            mbarrier_init(smem_u32(&sm.k_full[s]), 1);
            mbarrier_init(smem_u32(&sm.v_full[s]), 1);
            mbarrier_init(smem_u32(&sm.empty[s]), MMA_THREADS);
        }
        mbarrier_init_fence();
    }
    __syncthreads();

    if (threadIdx.x < 128) {  // ------------------------------------------------------ producer
        setmaxnreg_dec<WS_PRODUCER_REGS>();
        if (threadIdx.x != 0) return;
        mbarrier_arrive_expect_tx(smem_u32(&sm.q_full), Q_BYTES);
        tma_load_5d(smem_u32(sm.q), tm_q, smem_u32(&sm.q_full), 0, h, tq + q0, 0, bq);
        for (int kb = blk.kb_begin, i = 0; kb < blk.kb_end; ++kb, ++i) {
            const int s = i % STAGES;
            if (i >= STAGES) mbarrier_wait(smem_u32(&sm.empty[s]), ((i / STAGES) & 1) ^ 1);
            mbarrier_arrive_expect_tx(smem_u32(&sm.k_full[s]), K_BYTES);
            tma_load_5d(smem_u32(sm.k[s]), tm_k, smem_u32(&sm.k_full[s]), 0, hk, tk + kb * BLOCK_N, 0, bq);
            mbarrier_arrive_expect_tx(smem_u32(&sm.v_full[s]), V_BYTES);
            tma_load_5d(smem_u32(sm.v[s]), tm_v, smem_u32(&sm.v_full[s]), 0, hk, tk + kb * BLOCK_N, 0, bq);
        }
        return;
    }

    // ------------------------------------------------------------------------- MMA warpgroups
    setmaxnreg_inc<WS_MMA_REGS>();
    const int tid = threadIdx.x - 128, warp = warp_of(tid);
    const int wg = warp >> 2, wi = warp & 3;  // warpgroup (of the two), warp inside it (16 rows each)
    const AccFrag frag(tid);
    const int wq0 = q0 + wg * 64;
    const bool packed = p.seq.cu_seqlens_q != nullptr;  // group mode

    float acc_o[NO * 4];
#pragma unroll
    for (int i = 0; i < NO * 4; ++i) acc_o[i] = 0.f;
    float row_max[2] = {-FMHA_INF, -FMHA_INF}, row_sum[2] = {0.f, 0.f};
    mbarrier_wait(smem_u32(&sm.q_full), 0);

    for (int kb = blk.kb_begin, i = 0; kb < blk.kb_end; ++kb, ++i) {
        const int s = i % STAGES;
        const unsigned phase = (i / STAGES) & 1;
        const int k0 = kb * BLOCK_N;
        uint16_t* sK = sm.k[s];
        uint16_t* sV = sm.v[s];
        mbarrier_wait(smem_u32(&sm.k_full[s]), phase);
        if (packed && k0 + BLOCK_N > blk.seqlen_k) {  // the next sequence's keys: zeros (uniform over the CTA)
            mbarrier_wait(smem_u32(&sm.v_full[s]), phase);
            cb_zero_rows<BLOCK_N, HDIM_Q, MMA_THREADS>(sK, blk.seqlen_k - k0, tid);
            cb_zero_rows<BLOCK_N, HDIM_V, MMA_THREADS>(sV, blk.seqlen_k - k0, tid);
            fence_proxy_async();
            named_barrier_sync(1, MMA_THREADS);
        }

        float sacc[NS * 4];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < HDIM_Q / 16; ++kk)
            wgmma_ss<BLOCK_N, 0, 0>(sacc, desc_cb_kmajor<BLOCK_M>(sm.q, wg * 64, kk * 16),
                                    desc_cb_kmajor<BLOCK_N>(sK, 0, kk * 16), kk > 0);
        wgmma_commit();
        wgmma_wait0();
        fence_operand<NS * 4>(sacc);

        const bool edge = blk.win.tile_needs_test(wq0, 64, k0, BLOCK_N, blk.seqlen_q, blk.seqlen_k);
        const KeepBits<NS> keep{};  // (no dropout here)
        online_softmax<NS, NO>(sacc, acc_o, row_max, row_sum, p.scale_log2, edge, blk.win, blk.alibi, blk.bias,
                               wq0 + wi * 16, k0, frag, blk.seqlen_k, keep);
        uint32_t pa[BLOCK_N / 16][4];
#pragma unroll
        for (int kk = 0; kk < BLOCK_N / 16; ++kk) c_to_a(pa[kk], sacc + 8 * kk, sacc + 8 * kk + 4);

        mbarrier_wait(smem_u32(&sm.v_full[s]), phase);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BLOCK_N / 16; ++kk)
            wgmma_rs<HDIM_V, 1>(acc_o, pa[kk], desc_cb_mnmajor<BLOCK_N>(sV, kk * 16, 0), 1);
        wgmma_commit();
        wgmma_wait0();
        fence_operand<NO * 4>(acc_o);
        fence_operand<BLOCK_N / 4>(&pa[0][0]);
        mbarrier_arrive(smem_u32(&sm.empty[s]));  // K and V of this stage are read
    }

    fwd_store_rows<NO>(p, blk, b, h, q0 + wg * 64 + wi * 16, acc_o, row_max, row_sum, frag);
}

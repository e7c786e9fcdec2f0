// Attention backward, main kernel for Hopper (sm_90a), warp-specialized, for wide head dims (256;
// issue 10): the five GEMMs of fmha_bwd_dq_dk_dv_sm90_ws.cu with the work split between the two MMA
// warpgroups so that dK and dV of a key block fit in their registers.
//
// At hdim 256 the ws kernel's split (each MMA warpgroup 64 keys, all head-dim columns of its dK and
// dV: 2 x 128 fp32 registers per thread) cannot hold its accumulators. Here a CTA owns BLOCK_N = 64
// keys, and the warpgroups split
//   GEMM0/2  S^T, dP^T [64 keys x 64 query rows]        by query rows: warpgroup w the 32 rows 32w..
//   GEMM1    dV [64 keys x HDIM_V] += P^T dO            by columns:    warpgroup w the half w
//   GEMM3    dK [64 keys x HDIM_Q] += dS^T Q            by columns
//   GEMM4    dQ [64 rows x HDIM_Q]  = dS K              by columns
// so each thread holds half of dK and of dV (64 + 64 registers at 256) and a half-width dQ (64). P^T
// and dS^T go through shared memory (bwd_store_p_ds, arch/sm90/tile.cuh: blocked [64 keys][64 rows]
// tiles, double-buffered so one named barrier per query block suffices), where GEMM1/3 read them as
// K-major A operands and GEMM4 reads dS^T as its MN-major A. Shared memory at hdim 256: K, V 32 KB
// each, Q and dO 32 KB each per stage (2 stages), P^T and dS^T 2 x 8 KB each: 231,464 bytes.
//
// The producer warpgroup is the ws kernel's: its first thread issues the TMA loads (K and V once, Q
// and dO per query block into the ring), its first warp copies LSE and D rows. Tiles are 128-byte
// swizzled (the ws kernels' SWIZZLE layout, boxes of 64 columns), so each warpgroup's half of the
// columns starts on a slab (HDIM_Q and HDIM_V multiples of 128).
//
// dQ (DQ_TILED, where HDIM_Q <= HDIM_V): a 64 x HDIM_Q fp32 tile (64 KB at 256) does not fit beside
// the rest, but the block's own Q and dO buffers do hold it once GEMM1/3/4 have read them: rows 0-31
// of the tile go into the Q buffer, rows 32-63 into the dO buffer (the layout of the tiled workspace,
// dq_tile_chunk), and MMA thread 0 adds them with two bulk reduce-adds (the TMA engine) instead of
// 32 red.global.add.v2 per thread per block (those throttled the load/store unit: lg_throttle was
// the first stall reason, bench/NOTES.md step 48; 1.18-1.28x faster, step 56). The buffer goes back
// to the producer when the bulk copies have read it: the other MMA threads arrive on `empty` after
// staging, thread 0 one block later, after issuing the next block's GEMM0/2 (every reader of the
// buffer arrives itself, which is what racecheck follows; so STAGES >= 2). Deterministic mode adds in
// order as the ws kernel does (DQ_ORDERED: per-tile semaphores, no slabs; thread 0 waits for its adds
// to complete anyway and arrives at once).
// DQ_WRITER (a variant, bench/NOTES.md step 75): thread 0's waits above hold up the other MMA warps
// at the next block's named barrier (ncu: 23% of the stall samples). With it the producer
// warpgroup's second warp adds the tiles instead: every MMA thread arrives on the stage's `dq_full`
// after staging its part (thread 0 first writes the tile's destination and semaphore, DqJob), the
// writer issues the two reduce-adds (deterministic: after the semaphore, complete before releasing
// it), waits for their reads and arrives on `empty`, which then counts every MMA thread and the
// writer. The MMA threads wait for the last block's `empty` phase before staging dK and dV.
// With HDIM_Q > HDIM_V (the padded head dims, e.g. 256 / 128) the dO buffer is
// too small: dQ leaves by per-thread fp32 atomics into the untiled workspace, and deterministic mode
// stores the block's rows into its own slab (dq_split_stride) as fmha_bwd_dq_dk_dv_sm90.cu does.
//
// TIMING=1 (diagnostics only, bench/probe/wide_timeline.py): thread 0 of each MMA warpgroup sums the
// clock64 time of each phase of its query-block loop (the stage's wait, GEMM0/2, P and dS, barrier 1,
// GEMM1/3/4, barrier 2, the dQ staging and hand-over) into `fmha_wide_timeline`, one row per CTA,
// with the CTA's entry, K/V landed, loop end and exit.
//
// Not here: dropout, the elementwise bias (the library routes those to fmha_bwd_dq_dk_dv.cu).
// Group mode: rows past a sequence's end are zeroed in the edge tiles, as in the ws kernel.
//
// Parameters: four tensor maps (Q, K, V, dO: the plain 4-D (batch, rows, heads, hdim) tensors,
// boxes of 64 columns; zeros for an empty tensor), then BwdParams flattened as
// fmha_bwd_dq_dk_dv_sm90_ws takes it.
#include "common.cuh"
#include "arch/arch.cuh"
#include "attention.cuh"
#include "block.cuh"
#include "bwd_ws.cuh"

using namespace fmha;

static_assert(NWG == 2 && BLOCK_N == 64 && BLOCK_M == 64 && NTHREADS == 128 * (NWG + 1),
              "fmha_bwd_dq_dk_dv_sm90_ws_wide: a producer and two MMA warpgroups, 64 keys, 64 query rows per step");
static_assert(HDIM_Q % 128 == 0 && HDIM_V % 128 == 0, "fmha_bwd_dq_dk_dv_sm90_ws_wide: each warpgroup's half of the columns is whole slabs");
static_assert(!DROPOUT && !BIAS, "fmha_bwd_dq_dk_dv_sm90_ws_wide: no dropout or bias");
static_assert((!DQ_TILED || HDIM_Q <= HDIM_V) && DQ_ORDERED == DQ_TILED,
              "fmha_bwd_dq_dk_dv_sm90_ws_wide: dQ staged in the Q and dO buffers exactly where they hold it (backends/cuda.py)");
static_assert(!DQ_TILED || STAGES >= 2,
              "fmha_bwd_dq_dk_dv_sm90_ws_wide: a stage goes back a block late, so the producer needs a second one");
static_assert(SWIZZLE, "fmha_bwd_dq_dk_dv_sm90_ws_wide: swizzled tiles only (the launcher encodes the maps by SWIZZLE)");

constexpr int MMA_THREADS = 128 * NWG;
// (an enumerator, not a constexpr variable: those would appear in the PTX)
enum : bool { WRITER = DQ_WRITER && DQ_TILED };

struct Smem {
    uint16_t k[BLOCK_N * HDIM_Q];              // 128-byte swizzled slabs
    uint16_t v[BLOCK_N * HDIM_V];
    uint16_t q[STAGES][BLOCK_M * HDIM_Q];
    uint16_t dout[STAGES][BLOCK_M * HDIM_V];
    uint16_t pt[2][BLOCK_N * BLOCK_M];         // P^T, blocked (tile.cuh), double-buffered
    uint16_t ds[2][BLOCK_N * BLOCK_M];         // dS^T, the same
    float lse[STAGES][BLOCK_M];
    float d[STAGES][BLOCK_M];
    unsigned long long full[STAGES], empty[STAGES], kv;
};
// DQ_WRITER: after Smem, only in the writer builds (the others' layout is unchanged); DqJob: bwd_ws.cuh
struct WriterSmem {
    unsigned long long dq_full[STAGES];  // stage s's dQ tile staged (MMA_THREADS arrivals)
    DqJob job[STAGES];
};
// the swizzled layout starts at the first 1024-byte boundary of the dynamic shared memory: the launcher
// passes 1024 bytes more (SMEM_BYTES)
#if defined(TIMING) && TIMING
enum : int { TIMING_BYTES = 8 * (8 + 2 * 7) };  // (WT_WORDS words after the layout: derived_macros)
#else
enum : int { TIMING_BYTES = 0 };
#endif
static_assert(sizeof(Smem) + (WRITER ? sizeof(WriterSmem) : 0) + TIMING_BYTES + 1024 == SMEM_BYTES, "fmha_bwd_dq_dk_dv_sm90_ws_wide: shared-memory layout and backends/cuda.py's SMEM_BYTES (derived_macros) disagree");
static_assert(sizeof(uint16_t) * BLOCK_N * HDIM_Q % 1024 == 0 && sizeof(uint16_t) * BLOCK_N * HDIM_V % 1024 == 0 &&
              sizeof(uint16_t) * BLOCK_M * HDIM_Q % 1024 == 0 && sizeof(uint16_t) * BLOCK_M * HDIM_V % 1024 == 0,
              "TMA destinations must stay 1024-byte aligned");

// The dQ writer (DQ_WRITER; the producer warpgroup's thread 32) over the CTA's n query blocks: the
// tile of block i, staged in stage i % STAGES's Q (rows 0-31) and dO (rows 32-63) buffers, added to
// the workspace with one bulk reduce-add per half; then the stage goes back to the producer once the
// copies have read it (deterministic: once they have completed and the semaphore is released).
__device__ __forceinline__ void bwd_wide_dq_writer(Smem& sm, WriterSmem& wsm, int n) {
    for (int i = 0; i < n; ++i) {
        const int s = i % STAGES;
        mbarrier_wait(smem_u32(&wsm.dq_full[s]), (i / STAGES) & 1);
        const unsigned src[2] = {smem_u32(sm.q[s]), smem_u32(sm.dout[s])};
        bwd_ws_add_dq<2>(wsm.job[s], src, 4u * (BLOCK_M / 2) * HDIM_Q);
        mbarrier_arrive(smem_u32(&sm.empty[s]));
    }
}

#if defined(TIMING) && TIMING
// per CTA: [0] entry and [1] exit (%globaltimer, ns), [2] the SM, [3] query blocks, [4] entry, [5] K/V
// landed, [6] loop end, [7] exit (clock64, MMA thread 0); from [8], per MMA warpgroup w, WT_PHASES sums
// of clock64 cycles at [8 + w WT_PHASES + phase]: 0 the stage's wait, 1 GEMM0/2 issued and waited, 2 P
// and dS formed and stored, 3 barrier 1, 4 GEMM1/3/4 issued and waited, 5 barrier 2, 6 the dQ tile
// staged and handed over (or added by thread 0)
enum : int { WT_PHASES = 7, WT_WORDS = 8 + 2 * WT_PHASES, WT_CTAS = 1 << 14 };
__device__ unsigned long long fmha_wide_timeline[WT_CTAS][WT_WORDS];
#endif
extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
fmha_bwd_dq_dk_dv_sm90_ws_wide(const __grid_constant__ TmaMap tm_q, const __grid_constant__ TmaMap tm_k,
                               const __grid_constant__ TmaMap tm_v, const __grid_constant__ TmaMap tm_do,
                               FMHA_BWD_PARAMS_ARGS) {
    const BwdParams p = FMHA_BWD_PARAMS_STRUCT;
    // per warpgroup: NQ n8 tiles of S^T / dP^T (its 32 query rows), half the dK / dV / dQ columns
    constexpr int ROWS_WG = BLOCK_M / NWG, NQ = ROWS_WG / 8;
    constexpr int DK_HALF = HDIM_Q / 2, DV_HALF = HDIM_V / 2, NDK = DK_HALF / 8, NDV = DV_HALF / 8;

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    Smem& sm = *reinterpret_cast<Smem*>(smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u));
#if defined(TIMING) && TIMING
    static_assert(TIMING_BYTES == 8 * WT_WORDS, "the timing words after the layout");
    unsigned long long* tl_ = reinterpret_cast<unsigned long long*>(reinterpret_cast<unsigned char*>(&sm) + sizeof(Smem) +
                                                                    (WRITER ? sizeof(WriterSmem) : 0));
    if (threadIdx.x == 0) {
        for (int n = 0; n < WT_WORDS; ++n) tl_[n] = 0;
        tl_[0] = global_timer_ns();
        tl_[4] = clock64();
    }
#endif
    WriterSmem& wsm = *reinterpret_cast<WriterSmem*>(reinterpret_cast<unsigned char*>(&sm) + sizeof(Smem));  // (WRITER only)
    int kb, h, b, nhead_q;
    bwd_ws_tile<HEADS_X>(kb, h, b, nhead_q);  // (kb: the key block; heavy ones first under causal masks)
    const int k0 = kb * BLOCK_N;
    BwdBlock blk;
    if (!bwd_block_state<BLOCK_M, BLOCK_N>(p, b, h, nhead_q, kb, k0, blk)) return;  // uniform over the CTA

    const int tq = p.seq.cu_seqlens_q ? p.seq.cu_seqlens_q[b] : 0;
    const int tk = p.seq.cu_seqlens_k ? p.seq.cu_seqlens_k[b] : 0;
    const int bq = p.seq.cu_seqlens_q ? 0 : b;  // the batch coordinate of the maps

    if (threadIdx.x == 0) {
        bwd_ws_init_barriers<STAGES, MMA_THREADS + WRITER>(sm);
        if constexpr (WRITER)
            for (int s = 0; s < STAGES; ++s) mbarrier_init(smem_u32(&wsm.dq_full[s]), MMA_THREADS);
        mbarrier_init_fence();
    }
    __syncthreads();

    if (threadIdx.x < 128) {  // ------------------------------------------------------ producer
        setmaxnreg_dec<WS_PRODUCER_REGS>();
        if constexpr (WRITER) {
            // (the warp index broadcast from lane 0: ptxas then keeps the producer's block state in
            // uniform registers, as without the writer; with a per-thread test it spilled 12 bytes)
            const int pwarp = __shfl_sync(0xffffffffu, threadIdx.x >> 5, 0);
            if (pwarp == 0)
                bwd_ws_produce<SWIZZLE, BLOCK_M, BLOCK_N, HDIM_Q, HDIM_V, STAGES, false>(sm, tm_q, tm_k, tm_v, tm_do, blk, h,
                                                                                       k0, tq, tk, bq, threadIdx.x);
            else if (pwarp == 1 && threadIdx.x == 32)
                bwd_wide_dq_writer(sm, wsm, blk.qb_end - blk.qb_begin);
            return;
        }
        if (threadIdx.x >= 32) return;
        bwd_ws_produce<SWIZZLE, BLOCK_M, BLOCK_N, HDIM_Q, HDIM_V, STAGES, false>(sm, tm_q, tm_k, tm_v, tm_do, blk, h, k0, tq,
                                                                               tk, bq, threadIdx.x);
        return;
    }

    // ------------------------------------------------------------------------- MMA warpgroups
    setmaxnreg_inc<WS_MMA_REGS>();
    const int tid = threadIdx.x - 128, warp = warp_of(tid);
    // (broadcast from lane 0: warp-uniform, so the descriptors that depend on it stay in uniform registers)
    const int wg = __shfl_sync(0xffffffffu, warp >> 2, 0), wi = warp & 3;
    const AccFrag frag(tid);
    const int warp_key0 = wi * 16;   // this warp's 16 keys of the block (GEMM0-3 accumulator rows)
    const int row_wg = wg * ROWS_WG;  // this warpgroup's query rows of a block (GEMM0/2)

    float acc_dk[NDK * 4], acc_dv[NDV * 4];
#pragma unroll
    for (int i = 0; i < NDK * 4; ++i) acc_dk[i] = 0.f;
#pragma unroll
    for (int i = 0; i < NDV * 4; ++i) acc_dv[i] = 0.f;
    mbarrier_wait(smem_u32(&sm.kv), 0);
#if defined(TIMING) && TIMING
    // (thread 0 of each warpgroup: the time since its last mark into phase ph's sum, in shared memory)
    unsigned long long t_mark = clock64();
    auto mark = [&](int ph) {
        if ((tid & 127) == 0) {
            const unsigned long long t = clock64();
            tl_[8 + wg * WT_PHASES + ph] += t - t_mark;
            t_mark = t;
        }
    };
    if (tid == 0) tl_[5] = t_mark;
#else
    auto mark = [](int) {};
#endif
    const bool packed = p.seq.cu_seqlens_q != nullptr;  // group mode
    if (packed && k0 + BLOCK_N > blk.seqlen_k)  // the next sequence's keys: zeros (uniform over the CTA)
        bwd_ws_zero_tails<SWIZZLE, BLOCK_N, HDIM_Q, HDIM_V, MMA_THREADS>(sm.k, sm.v, blk.seqlen_k - k0, tid, 3);

    int kb_first = kb;  // deterministic ordered dQ (thread 0): the first key block of the current tile
    for (int qb = blk.qb_begin, i = 0; qb < blk.qb_end; ++qb, ++i) {
        const int s = __shfl_sync(0xffffffffu, i % STAGES, 0);
        const int q0 = qb * BLOCK_M;
        const int buf = __shfl_sync(0xffffffffu, i & 1, 0);
        uint16_t* sP = sm.pt[buf];
        uint16_t* sdS = sm.ds[buf];
        const uint16_t* sQb = sm.q[s];
        const uint16_t* sdOb = sm.dout[s];
        mbarrier_wait(smem_u32(&sm.full[s]), (i / STAGES) & 1);
        if (packed && q0 + BLOCK_M > blk.seqlen_q)  // the next sequence's query rows: zeros
            bwd_ws_zero_tails<SWIZZLE, BLOCK_M, HDIM_Q, HDIM_V, MMA_THREADS>(sm.q[s], sm.dout[s], blk.seqlen_q - q0, tid, 3);
        mark(0);

        // GEMM0 and GEMM2 over this warpgroup's query rows, issued together
        float sacc[NQ * 4], dp[NQ * 4];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < HDIM_Q / 16; ++kk)
            wgmma_ss<ROWS_WG, 0, 0>(sacc, desc_tile_kmajor<SWIZZLE, BLOCK_N>(sm.k, 0, kk * 16),
                                    desc_tile_kmajor<SWIZZLE, BLOCK_M>(sQb, row_wg, kk * 16), kk > 0);
#pragma unroll
        for (int kk = 0; kk < HDIM_V / 16; ++kk)
            wgmma_ss<ROWS_WG, 0, 0>(dp, desc_tile_kmajor<SWIZZLE, BLOCK_N>(sm.v, 0, kk * 16),
                                    desc_tile_kmajor<SWIZZLE, BLOCK_M>(sdOb, row_wg, kk * 16), kk > 0);
        wgmma_commit();
        // DQ_TILED: the previous block's dQ tile has left its Q and dO buffers: hand them back
        if (DQ_TILED && !WRITER && tid == 0 && i > 0 && !p.dq_sem) {
            bulk_wait_read<0>();
            mbarrier_arrive(smem_u32(&sm.empty[(i + STAGES - 1) % STAGES]));
        }
        wgmma_wait0();
        fence_operand<NQ * 4>(sacc);
        fence_operand<NQ * 4>(dp);
        mark(1);

        // P^T and dS^T of these rows (one branch per tile, as in the ws kernel), into shared memory
        // (P while GEMM2 still runs, as the ws kernel's SPLIT_PDS, measured 0.98-0.99x here: step 57)
        const bool edge = blk.win.tile_needs_test(q0 + row_wg, ROWS_WG, k0, BLOCK_N, blk.seqlen_q, blk.seqlen_k);
        bwd_ws_p_ds<NQ, false>(sacc, dp, sm.lse[s] + row_wg, sm.d[s] + row_wg, p, blk, edge, k0 + warp_key0, q0 + row_wg,
                               frag, KeepTile{nullptr, 0});
        bwd_store_p_ds<NQ, BLOCK_M>(sacc, dp, sP, sdS, warp_key0, row_wg, frag);
        fence_proxy_async();
        mark(2);
        named_barrier_sync(1, MMA_THREADS);  // both warpgroups' rows of P^T and dS^T visible
        mark(3);

        // GEMM1, GEMM3 (A = P^T, dS^T from shared memory, K-major; B = dO, Q MN-major, this warpgroup's
        // columns), then GEMM4 (A = dS, the MN-major reading of dS^T; B = K MN-major, this warpgroup's columns)
        float acc_dq[DK_HALF / 2];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BLOCK_M / 16; ++kk) {
            wgmma_ss<DV_HALF, 0, 1>(acc_dv, desc_kmajor<BLOCK_M>(sP, 0, kk * 16),
                                    desc_tile_mnmajor<SWIZZLE, BLOCK_M>(sdOb, kk * 16, wg * DV_HALF), 1);
            wgmma_ss<DK_HALF, 0, 1>(acc_dk, desc_kmajor<BLOCK_M>(sdS, 0, kk * 16),
                                    desc_tile_mnmajor<SWIZZLE, BLOCK_M>(sQb, kk * 16, wg * DK_HALF), 1);
        }
#pragma unroll
        for (int kk = 0; kk < BLOCK_N / 16; ++kk)
            wgmma_ss<DK_HALF, 1, 1>(acc_dq, desc_mnmajor<BLOCK_M>(sdS, kk * 16, 0),
                                    desc_tile_mnmajor<SWIZZLE, BLOCK_N>(sm.k, kk * 16, wg * DK_HALF), kk > 0);
        wgmma_commit();
        wgmma_wait0();
        fence_operand<DK_HALF / 2>(acc_dq);
        fence_operand<NDV * 4>(acc_dv);
        fence_operand<NDK * 4>(acc_dk);
        mark(4);
        if constexpr (DQ_TILED) {
            // the tile into this block's Q (rows 0-31) and dO (rows 32-63) buffers once both warpgroups'
            // GEMM1/3 have read them; then thread 0 adds it (the other warps go on at once)
            named_barrier_sync(2, MMA_THREADS);
            mark(5);
            float* sdQ = reinterpret_cast<float*>(wi < 2 ? sm.q[s] : sm.dout[s]);
            stage_dq_tile<NDK, HDIM_Q, true>(sdQ, acc_dq, (wi & 1) * 16, wg * DK_HALF, frag);
            fence_proxy_async();
            if constexpr (WRITER) {  // the writer adds it: thread 0 says where, everyone that its part is staged
                if (tid == 0) bwd_dq_job<BLOCK_M, BLOCK_N, HDIM_Q>(wsm.job[s], p, blk, qb, kb, kb_first);
                mbarrier_arrive(smem_u32(&wsm.dq_full[s]));
                mbarrier_arrive(smem_u32(&sm.empty[s]));  // (this thread's reads and writes of the stage are done)
            } else if (warp == 0) {
                named_barrier_sync(4, MMA_THREADS);  // (3 is bwd_ws_zero_tails')
                if (tid == 0) {
                    constexpr unsigned HALF = 4u * (BLOCK_M / 2) * HDIM_Q;
                    float* dst = blk.dq_g + (index_t)q0 * HDIM_Q;
                    if (p.dq_sem) {  // deterministic, ordered (as the ws kernel)
                        int* sem = p.dq_sem + blk.bh * ((blk.pitch_q + BLOCK_M - 1) / BLOCK_M) + qb;
                        kb_first = first_key_block(blk.win, qb, kb_first, qb == blk.qb_begin, BLOCK_N, BLOCK_M,
                                                   blk.seqlen_q, blk.seqlen_k);
                        sem_wait(sem, kb - kb_first);
                    }
                    bulk_reduce_add_f32(dst, smem_u32(sm.q[s]), HALF);
                    bulk_reduce_add_f32(dst + (BLOCK_M / 2) * HDIM_Q, smem_u32(sm.dout[s]), HALF);
                    bulk_commit();
                    if (p.dq_sem) {
                        bulk_wait<0>();  // complete in global memory before the next key block is admitted
                        sem_release(p.dq_sem + blk.bh * ((blk.pitch_q + BLOCK_M - 1) / BLOCK_M) + qb);
                        mbarrier_arrive(smem_u32(&sm.empty[s]));
                    }
                }
            } else {
                named_barrier_arrive(4, MMA_THREADS);
            }
            // every thread but 0 has read this block's LSE, D, Q and dO rows and written its dQ rows;
            // thread 0 arrives once the bulk copies have read the buffers
            if (!WRITER && tid != 0) mbarrier_arrive(smem_u32(&sm.empty[s]));
        } else {
            mbarrier_arrive(smem_u32(&sm.empty[s]));  // this stage's Q and dO are read
            // dQ rows q0 + wi * 16 + f.row(..), this warpgroup's columns: atomics, or (deterministic) the slab
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int row = q0 + wi * 16 + frag.row(2 * r);
                if (row < blk.seqlen_q) {
                    float* dst = blk.dq_g + (index_t)row * p.hdim_q + wg * DK_HALF + frag.col(0, 0);
                    const int ncol = p.hdim_q - wg * DK_HALF - frag.col(0, 0);
#pragma unroll
                    for (int n = 0; n < NDK; ++n)
                        if (n * 8 < ncol) {
                            if (p.dq_split_stride)
                                *reinterpret_cast<float2*>(dst + n * 8) =
                                    make_float2(acc_dq[4 * n + 2 * r], acc_dq[4 * n + 2 * r + 1]);
                            else
                                red_add_f32x2(dst + n * 8, acc_dq[4 * n + 2 * r], acc_dq[4 * n + 2 * r + 1]);
                        }
                }
            }
        }
        mark(6);
    }
#if defined(TIMING) && TIMING
    if (tid == 0) tl_[6] = clock64();
#endif
    // dK and dV staged through the K/V/Q/dO buffers (bwd_ws_store_dk_dv): once the last dQ tile's adds
    // have read it out of the Q/dO buffers and both warpgroups' last wgmma are done
    static_assert(2 * BLOCK_N * (HDIM_Q + HDIM_V + 16) <= sizeof(Smem::k) + sizeof(Smem::v) + sizeof(Smem::q) + sizeof(Smem::dout),
                  "the dK/dV stage fits the K/V/Q/dO buffers (Smem's first members)");
    if constexpr (WRITER) {  // the writer's last adds have read their stage (it adds the blocks in order)
        const int last = blk.qb_end - blk.qb_begin - 1;
        if (last >= 0) mbarrier_wait(smem_u32(&sm.empty[last % STAGES]), (last / STAGES) & 1);
    } else if (DQ_TILED && tid == 0) {
        bulk_wait_read<0>();
    }
    named_barrier_sync(3, MMA_THREADS);
    bwd_ws_store_dk_dv<BLOCK_N, HDIM_Q, HDIM_V, MMA_THREADS, NDK, NDV>(p, blk, b, h, k0, acc_dk, acc_dv, warp_key0, frag,
                                                                      wg * DK_HALF, wg * DV_HALF, sm.k, tid, 3);
    bulk_wait_read<0>();  // (the rows' copies have read the stage; their writes complete with the grid)
#if defined(TIMING) && TIMING
    named_barrier_sync(3, MMA_THREADS);  // (both warpgroups' sums are in)
    if (tid == 0) {
        tl_[1] = global_timer_ns();
        tl_[7] = clock64();
        tl_[2] = sm_index();
        tl_[3] = blk.qb_end - blk.qb_begin;
        const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        if (cta < WT_CTAS)
            for (int n = 0; n < WT_WORDS; ++n) fmha_wide_timeline[cta][n] = tl_[n];
    }
#endif
}

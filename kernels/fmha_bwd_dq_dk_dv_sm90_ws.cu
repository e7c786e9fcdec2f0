// Attention backward, main kernel for Hopper (sm_90a), warp-specialized (issue 10, first step; the
// default where cupy_fmha.backends.cuda.use_ws says):
// the same five GEMMs as fmha_bwd_dq_dk_dv_sm90.cu, with the loads taken off the MMA warps.
//
// Three warpgroups. Warpgroup 0 is the producer: its first thread issues TMA tensor loads (K and V
// once; then per query block Q and dO into a ring of STAGES buffers), its first warp copies the
// block's LSE and D rows into shared memory, and each buffer's `full` mbarrier completes when all
// of it has landed. Warpgroups 1 and 2 are the MMA warpgroups (64 keys each of BLOCK_N = 128), as
// in fmha_bwd_dq_dk_dv_sm90.cu, stepping BLOCK_M query rows at a time (64; 128 at hdim 64, bench/NOTES.md
// step 35; 80 at hdim 128 with GEMM4 transposed, DQ_T below, step 100: cupy_fmha.backends.cuda.BWD_WS_BY_HDIM), and hand a buffer back through
// its `empty` mbarrier once the block's last wgmma (GEMM4, after GEMM1/3, which read the buffer) has completed. Registers move
// from the producer to the MMA warpgroups with setmaxnreg.
//
// Tiles from TMA (K, V, Q, dO), one compile-time choice (SWIZZLE, as fmha_fwd_sm90_ws; on by default, NOTES step 30):
//   SWIZZLE=0   column-blocked ([D/8][rows][8]: desc_cb_* in arch/sm90/tile.cuh), one box per tile
//               (cupy_fmha/backends/tma.py, column_blocked_view) whose rows are 16 bytes
//   SWIZZLE=1   128-byte swizzled ([D/64][rows][64]: desc_sw_* in arch/sm90/tma.cuh), one box of 64
//               columns (128-byte rows) per slab of the plain 4-D map, 8x fewer box rows per tile;
//               the tiles start at the first 1024-byte boundary of the dynamic shared memory.
//               GEMM4 reads K MN-major over this warpgroup's half of the columns (BLOCK_M = 64): at
//               hdim 64 that half starts mid-slab (column 32), a start address 64 bytes into the
//               swizzle atom (desc_sw_mnmajor); with BLOCK_M = 128 it reads all columns
// dS^T is written by the MMA warps in the blocked layout of tile.cuh (both builds), double-buffered
// so that one barrier per query block suffices.
// SPLIT_PDS=1 (plain and ALiBi builds; on at hdim 128, cupy_fmha.backends.cuda.BWD_WS_BY_HDIM):
// GEMM0 and GEMM2 are committed as two groups; P is formed after the first wait, while GEMM2 runs,
// and GEMM1 (dV) issued behind GEMM2; dS after the second wait, then GEMM3 (1.02-1.03x at hdim 128;
// at 64, with 128 rows, it spills; bench/NOTES.md step 57). SPLIT_PDS=2: P formed while GEMM2 runs
// as well, but GEMM1 and GEMM3 issued together once dS is formed, as without the split: no P^T
// fragments live beside S^T and dP^T (at 80 query rows SPLIT_PDS=1 spilled 108 bytes and ptxas
// serialized its wgmmas; bench/NOTES.md step 100).
// LSE2=1: the producer stores each row's LSE in log2 units (lse_log2) and backward_p_ds<..., LOG2_LSE>
// uses it as is; on at hdim 64 only (cupy_fmha.backends.cuda.BWD_WS_BY_HDIM: 1.01-1.03x there,
// 0.96-1.0x at 128, bench/NOTES.md step 36).
//
// BIAS=1: the elementwise bias, per query block one tile of BLOCK_M query rows x BLOCK_N keys of
// BIAS_TMA-byte elements in 128-byte-swizzled boxes (the 5th tensor map; one-row boxes for a bias
// broadcast along the rows) into a ring of BIAS_STAGES tiles with `full` mbarriers of its own. MMA
// thread 0 issues those loads (load_bias: the producer warp, at 24 registers, spilled with them);
// the MMA warpgroups read the tile element by element in backward_p_ds (SwBiasTile::at_t,
// arch/sm90/tma_tile.cuh). dS for dBias (p.dbias_acc): these builds keep the dS tile K-major and
// swizzled (bwd_p_ds_operands_sw, GEMM4 reads it so), and when dBias is an array in the inputs' 16-bit
// dtype whose rows TMA can address (p.bias.ds_kind == DS_KIND_TMA; cupy_fmha.api._dbias_store) MMA
// thread 0 stores that tile into it with two TMA stores per query block (tm_dbias, 64-key boxes),
// asynchronous, coalesced and clipped at the tensor's edges, and before the main loop writes zeros
// into the query blocks the key block does not see (so dBias needs no zero fill; bench/NOTES.md step
// 53); otherwise each thread stores its dS elements as fmha_bwd_dq_dk_dv_sm90 does (bwd_store_ds:
// scattered 2- or 4-byte stores). 64 query rows per step (at 128 the bias tile no longer fits beside
// the rest); hdim 64 and 128 (at 128 the MMA warpgroups spill 76 bytes and it still runs 3.8x faster
// than fmha_bwd_dq_dk_dv_sm90: cupy_fmha.backends.cuda.BWD_WS_BIAS_HDIMS; an fp32 bias tile does not
// fit there).
//
// DROPOUT=1 (not with BIAS): the MMA threads make the keep bits of each BLOCK_M x BLOCK_N block while
// the GEMMs run (at hdim 64 a block ahead, under GEMM1/3; at 128 under GEMM0/2: KEEP_AHEAD), one
// Philox call per (query row pair, call of 32 keys), into a word tile in shared memory
// (fill_keep_words, philox.cuh); backward_p_ds reads them (KeepTile, AccFrag::keep_bit). Until
// bench/NOTES.md step 96 each warp made its own keys' bits in registers (the keying then gave a call
// 16 consecutive keys of one row) and handed them to their lanes by sixteen ballots per call round.
// Group mode: rows past a sequence's end are the next sequence's (TMA zero-fills only past the tensor); they are masked like any row past seqlen, but their values
// still meet zeros in GEMM1/3/4 (0 * Inf is NaN), so the MMA warpgroups zero them in the edge
// tiles (K/V once, Q/dO in a sequence's last query block) before the GEMMs read them.
//
// Deterministic dQ (p.dq_sem non-null): each query tile's semaphore admits the key blocks that see
// the tile one at a time in ascending order (first_key_block, common.cuh, finds the first, so key
// block kb waits for the count kb - first); each adds its tile with the bulk reduce-add, waits for it to
// complete and releases the next. The sum's order is fixed, so dQ is bit-identical run to run;
// memory is the ordinary workspace plus one int per tile. CTAs wait only on lower key blocks of
// their (batch, head), which the grid (key blocks fastest) launches earlier. (No dQ slabs here:
// dq_split_stride is 0; the launcher asks for DQ_ORDERED's workspace.)
//
// DQ_WRITER=1 (a variant, CUPY_FMHA_BWD_WS_TILES; not with BIAS or DROPOUT; bench/NOTES.md step
// 76): the producer warpgroup's thread 32 adds the dQ tiles (bwd_ws_add_dq, bwd_ws.cuh), so that
// the ordered adds' waits (the tile's turn, the add's completion) no longer hold MMA thread 0 and,
// through named barrier 1, every MMA warp. The MMA threads arrive on `dq_full` after staging (thread
// 0 fills the DqJob first) and, before staging the next tile, wait on `dq_empty`, which the writer
// arrives on once its add has read sdQ (deterministic: completed): the writer has a block's time
// for each tile. Registers stay 24 / 240 (at 40 / 232 the MMA warpgroups spilled 16-20 bytes and at
// hdim 128 ptxas serialized the wgmmas, C7512).
//
// Parameters: six tensor maps (Q, K, V, dO as column-blocked 5-D views, or with SWIZZLE the plain
// 4-D (batch, rows, heads, hdim) tensors with boxes of 64 columns; zeros for an empty tensor; the
// bias's as the forward's, zeros in builds without BIAS, unread; dBias's, 4-D (batch, heads, rows,
// keys) in swizzled boxes of 64 keys x BLOCK_M rows, zeros unless p.bias.ds_kind == DS_KIND_TMA),
// then BwdParams flattened as fmha_bwd_dq_dk_dv_sm90 takes it.
#include "common.cuh"
#include "arch/arch.cuh"
#include "attention.cuh"
#include "block.cuh"
#include "bwd_ws.cuh"

using namespace fmha;

static_assert(NWG == 2 && BLOCK_N == 64 * NWG && NTHREADS == 128 * (NWG + 1) && (BLOCK_M == 64 || BLOCK_M == 128 || BLOCK_M == 80),
              "fmha_bwd_dq_dk_dv_sm90_ws: a producer and two MMA warpgroups of 64 keys, 64, 80 or 128 query rows per step");
static_assert(BLOCK_M != 80 || (HDIM_Q == 128 && !BIAS && !DROPOUT && SWIZZLE),
              "fmha_bwd_dq_dk_dv_sm90_ws: 80 query rows (dQ^T) at hdim_q 128, swizzled, without the bias or dropout");
static_assert(DQ_TILED && HDIM_Q % 64 == 0, "fmha_bwd_dq_dk_dv_sm90_ws: dQ leaves as whole workspace tiles (spec.py sets DQ_TILED)");
static_assert(!DROPOUT || !BIAS, "fmha_bwd_dq_dk_dv_sm90_ws: dropout or the bias, not both (no such build)");
static_assert(!BIAS || ((BIAS_TMA == 2 || BIAS_TMA == 4) && BIAS_STAGES >= 1 && SWIZZLE && BLOCK_M == 64),
              "fmha_bwd_dq_dk_dv_sm90_ws: the bias tile is 16-bit or fp32 (BIAS_TMA), with SWIZZLE, at 64 query rows");
static_assert(!SWIZZLE || (HDIM_Q % 64 == 0 && HDIM_V % 64 == 0), "fmha_bwd_dq_dk_dv_sm90_ws: swizzled tiles are slabs of 64 columns");

constexpr int MMA_THREADS = 128 * NWG;
static_assert(!DQ_WRITER || (!BIAS && !DROPOUT), "fmha_bwd_dq_dk_dv_sm90_ws: the dQ writer is built without the bias or dropout");

struct Smem {
    uint16_t k[BLOCK_N * HDIM_Q];              // column-blocked or swizzled (SWIZZLE)
    uint16_t v[BLOCK_N * HDIM_V];
    uint16_t q[STAGES][BLOCK_M * HDIM_Q];      // column-blocked or swizzled
    uint16_t dout[STAGES][BLOCK_M * HDIM_V];
    uint16_t ds[2][BLOCK_N * BLOCK_M];         // dS^T blocked (tile.cuh) or (BIAS) dS swizzled; 2 buffers
    float dq[BLOCK_M * HDIM_Q];                // dQ staging: the workspace tile (common.cuh)
    float lse[STAGES][BLOCK_M];
    float d[STAGES][BLOCK_M];
    unsigned long long full[STAGES], empty[STAGES], kv;
    // (no bias ring: the BIAS builds' SmemBias has one; these let code common to both compile)
    __device__ __forceinline__ unsigned char* bias_tile(int) { return nullptr; }
    __device__ __forceinline__ unsigned long long* bias_full(int) { return nullptr; }
    __device__ __forceinline__ uint16_t* keep_words(int) { return nullptr; }
};
// With BIAS: the bias ring after them, from the next 1024-byte boundary (Smem ends in its mbarriers,
// never on one); bias_full: the tile landed (no `empty` barrier: the MMA warpgroups' own named
// barrier 1 tells when a tile is read, see load_bias)
enum : int { BIAS_TILE_BYTES = BLOCK_M * BLOCK_N * (BIAS ? BIAS_TMA : 2) };  // (an enumerator: a constexpr
// variable at namespace scope would appear in every build's PTX)
struct SmemBias : Smem {
    unsigned char pad_[1024 - sizeof(Smem) % 1024];
    unsigned char bias[BIAS_STAGES][BIAS_TILE_BYTES];
    unsigned long long bias_full_[BIAS_STAGES];
    __device__ __forceinline__ unsigned char* bias_tile(int s) { return bias[s]; }
    __device__ __forceinline__ unsigned long long* bias_full(int s) { return &bias_full_[s]; }
};
// With DROPOUT: two buffers of a query block's keep words after them (fill_keep_words' tile: the
// BLOCK_M x BLOCK_N block's calls, BLOCK_M * BLOCK_N / 8 bytes each)
struct SmemDrop : Smem {
    uint16_t keep[2][(BLOCK_N / 8) * (BLOCK_M / 2)];
    __device__ __forceinline__ uint16_t* keep_words(int buf) { return keep[buf]; }
};
template <int K> struct SmemOf { using type = Smem; };
template <> struct SmemOf<1> { using type = SmemBias; };
template <> struct SmemOf<2> { using type = SmemDrop; };
using SmemAll = SmemOf<BIAS ? 1 : DROPOUT ? 2 : 0>::type;
static_assert(sizeof(SmemBias) == sizeof(Smem) + (1024 - sizeof(Smem) % 1024) + BIAS_STAGES * (BIAS_TILE_BYTES + 8),
              "SmemBias: no padding, so the bias tiles start on a 1024-byte boundary");
// the swizzled layout starts at the first 1024-byte boundary of the dynamic shared memory (the
// swizzle pattern follows address bits 4-9): the launcher passes 1024 bytes more (SMEM_BYTES). (A
// constant for it at namespace scope would appear in the PTX of every build.)
// DQ_WRITER: the writer's mbarriers and job after Smem (only in those builds)
struct WriterSmem {
    unsigned long long dq_full, dq_empty;  // sdQ staged (MMA_THREADS arrivals) / read by the writer's add (1)
    DqJob job;
};
static_assert(sizeof(SmemAll) + (DQ_WRITER ? sizeof(WriterSmem) : 0) + (SWIZZLE ? 1024 : 0) == SMEM_BYTES, "fmha_bwd_dq_dk_dv_sm90_ws: shared-memory layout and backends/cuda.py's SMEM_BYTES (derived_macros) disagree");
static_assert(sizeof(uint16_t) * BLOCK_N * HDIM_Q % 1024 == 0 && sizeof(uint16_t) * BLOCK_M * HDIM_Q % 1024 == 0 &&
              sizeof(uint16_t) * BLOCK_M * HDIM_V % 1024 == 0, "TMA destinations must stay 1024-byte aligned");

#if defined(TIMING) && TIMING
__device__ unsigned long long fmha_timeline[1 << 15][16];
#endif
extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
fmha_bwd_dq_dk_dv_sm90_ws(const __grid_constant__ TmaMap tm_q, const __grid_constant__ TmaMap tm_k,
                          const __grid_constant__ TmaMap tm_v, const __grid_constant__ TmaMap tm_do,
                          const __grid_constant__ TmaMap tm_bias, const __grid_constant__ TmaMap tm_dbias,
                          FMHA_BWD_PARAMS_ARGS) {
    const BwdParams p = FMHA_BWD_PARAMS_STRUCT;
#if defined(TIMING) && TIMING  // (bench/probe/timeline58.py: MMA thread 0's times, per CTA)
    __shared__ unsigned long long tl_[16];
    auto stamp = [&](int n) {
        tl_[n] = global_timer_ns();
        tl_[8 + n] = clock64();
    };
    if (threadIdx.x == 128) stamp(0);
#endif
    constexpr int NQ = BLOCK_M / 8, NDQ = HDIM_Q / 8, NDV = HDIM_V / 8, DQ_HALF = HDIM_Q / 2;
    // GEMM4's split between the warpgroups: at BLOCK_M = 64 each takes half of dQ's columns (all 64
    // rows); at BLOCK_M = 128 each its 64 query rows (all columns), so that N stays 64 at hdim 64
    // (an N = 32 SS wgmma runs at 2/3 of the tensor rate, bench/NOTES.md step 34)
    constexpr bool DQ_BY_ROWS = BLOCK_M == 128;
    constexpr int DQ_COLS = DQ_BY_ROWS ? HDIM_Q : DQ_HALF;
    // DQ_T (BLOCK_M = 80, hdim 128; FlashAttention-3's 80-row non-causal step, dQ_swapAB): 80 is no
    // multiple of wgmma's M, so GEMM4 forms dQ^T = K^T dS^T, M = this warpgroup's 64 columns of dQ,
    // N = BLOCK_M query rows; A = K read MN-major, B = the dS^T tile read MN-major, as it is stored
    // (stage_dq_tile_t stages the transposed fragments; the workspace's chunks are dq_tile_chunk kind 2)
    constexpr bool DQ_T = BLOCK_M % 64 != 0;
    constexpr int DQ_ACC = DQ_T ? BLOCK_M / 2 : DQ_COLS / 2;
    // the dS tile: BIAS builds keep it K-major and swizzled (the layout of dBias's TMA store), the
    // others dS^T in the blocked layout (GEMM4 reads it MN-major)
    constexpr bool DS_KMAJOR = BIAS;
    // SPLIT_PDS (no dropout or bias): GEMM0 and GEMM2 in separate groups; P is formed while GEMM2 runs
    // and GEMM1 (dV) issued behind it, then dS once GEMM2 is done, then GEMM3 (bench/NOTES.md step 57)
    constexpr bool SPLIT = SPLIT_PDS == 1 && !DROPOUT && !BIAS;
    constexpr bool SPLIT_P = SPLIT_PDS == 2 && !DROPOUT && !BIAS;  // (P under GEMM2 only)

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem_base = smem_raw;
    if constexpr (SWIZZLE) smem_base += (1024u - (smem_u32(smem_raw) & 1023u)) & 1023u;
    SmemAll& sm = *reinterpret_cast<SmemAll*>(smem_base);
    WriterSmem& wsm = *reinterpret_cast<WriterSmem*>(smem_base + sizeof(SmemAll));  // (DQ_WRITER only)
    int kb, h, b, nhead_q;
    bwd_ws_tile<HEADS_X>(kb, h, b, nhead_q);  // (kb: the key block; heavy ones first under causal masks)
    const int k0 = kb * BLOCK_N;
    BwdBlock blk;
    if (!bwd_block_state<BLOCK_M, BLOCK_N>(p, b, h, nhead_q, kb, k0, blk)) return;  // uniform over the CTA

    // the sequence's first token row in the packed tensors (group mode), as block.cuh found it
    const int tq = p.seq.cu_seqlens_q ? p.seq.cu_seqlens_q[b] : 0;
    const int tk = p.seq.cu_seqlens_k ? p.seq.cu_seqlens_k[b] : 0;
    const int bq = p.seq.cu_seqlens_q ? 0 : b;  // the batch coordinate of the maps

    if (threadIdx.x == 0) {
        bwd_ws_init_barriers<STAGES, MMA_THREADS>(sm);
        if constexpr (BIAS)
            for (int s = 0; s < BIAS_STAGES; ++s) {
                mbarrier_init(smem_u32(sm.bias_full(s)), 1);
            }
        if constexpr (DQ_WRITER) {
            mbarrier_init(smem_u32(&wsm.dq_full), MMA_THREADS);
            mbarrier_init(smem_u32(&wsm.dq_empty), 1);
        }
        mbarrier_init_fence();
    }
    __syncthreads();

    if (threadIdx.x < 128) {  // ------------------------------------------------------ producer
        setmaxnreg_dec<WS_PRODUCER_REGS>();
        if constexpr (DQ_WRITER) {
            // (the warp index broadcast from lane 0: ptxas then keeps the producer's block state in
            // uniform registers, as without the writer; with a per-thread test it spilled 12-20 bytes)
            const int pwarp = __shfl_sync(0xffffffffu, threadIdx.x >> 5, 0);
            if (pwarp == 0)
                bwd_ws_produce<SWIZZLE, BLOCK_M, BLOCK_N, HDIM_Q, HDIM_V, STAGES, LSE2>(sm, tm_q, tm_k, tm_v, tm_do, blk, h,
                                                                                      k0, tq, tk, bq, threadIdx.x);
            else if (pwarp == 1 && threadIdx.x == 32)  // the dQ writer: tile i once staged, into the workspace
                for (int i = 0, n = blk.qb_end - blk.qb_begin; i < n; ++i) {
                    mbarrier_wait(smem_u32(&wsm.dq_full), i & 1);
                    const unsigned src[1] = {smem_u32(sm.dq)};
                    bwd_ws_add_dq<1>(wsm.job, src, 4u * BLOCK_M * HDIM_Q);
                    mbarrier_arrive(smem_u32(&wsm.dq_empty));
                }
            return;
        }
        if (threadIdx.x >= 32) return;
        bwd_ws_produce<SWIZZLE, BLOCK_M, BLOCK_N, HDIM_Q, HDIM_V, STAGES, LSE2>(sm, tm_q, tm_k, tm_v, tm_do, blk, h, k0, tq,
                                                                              tk, bq, threadIdx.x);
        return;
    }

    // ------------------------------------------------------------------------- MMA warpgroups
    setmaxnreg_inc<WS_MMA_REGS>();
    const int tid = threadIdx.x - 128, warp = warp_of(tid);
    // the warpgroup index broadcast from lane 0: the compiler then knows it is warp-uniform and keeps
    // the wgmma descriptors that depend on it (K/V rows, GEMM4's columns) in uniform registers
    // instead of building them per instruction in vector registers (bench/NOTES.md step 31)
    const int wg = __shfl_sync(0xffffffffu, warp >> 2, 0), wi = warp & 3;
    const AccFrag frag(tid);
    const int key_row0 = wg * 64, warp_key0 = key_row0 + wi * 16;
    float* sdQ = sm.dq;
    // DESC_ADDR (the default since bench/NOTES.md step 104, step 102; not in the dropout and bias builds): the
    // main loop's wgmma descriptors start from one 32-bit address, desc_base, plus each tile's constant offset
    // in the layout (the stage's and dS buffer's as a multiple of the uniform index): uniform arithmetic
    // only, and the same descriptors. Formed from the tile pointers (DESC_ADDR=0), the Q, dO and dS^T
    // descriptors of the dQ-writer builds are built in vector registers (ptxas keeps the layout
    // pointer in one there) and moved over with 2 R2UR per HGMMA (60-67 per query block), and the
    // 80-row build spills 4 bytes. The mask (the descriptor keeps
    // only these address bits anyway) makes desc_base a value of its own, not the pointer's copy
    // (without it: 112 R2UR); opaque_u32 at the top of each block hides that the value does not
    // change, so the K/V descriptors are formed per block from it with an add each instead of 24
    // of them held in uniform registers across the loop (with them held: 4 bytes of spill at 80
    // rows). The dropout and bias builds keep the pointers (there the addresses spilled 4-68 bytes
    // more).
    constexpr bool FROM_ADDR = DESC_ADDR && !BIAS && !DROPOUT;
    unsigned desc_base = smem_u32(smem_base) & 0x3FFFFu;
    auto layout_off = [&](const void* t) {  // (a constant: the layout's member against its start)
        return (unsigned)(reinterpret_cast<const unsigned char*>(t) - smem_base);
    };

    float acc_dk[NDQ * 4], acc_dv[NDV * 4];
#pragma unroll
    for (int i = 0; i < NDQ * 4; ++i) acc_dk[i] = 0.f;
#pragma unroll
    for (int i = 0; i < NDV * 4; ++i) acc_dv[i] = 0.f;
    mbarrier_wait(smem_u32(&sm.kv), 0);
#if defined(TIMING) && TIMING
    if (threadIdx.x == 128) stamp(1);
#endif
    const bool packed = p.seq.cu_seqlens_q != nullptr;  // group mode
    if (packed && k0 + BLOCK_N > blk.seqlen_k)  // the next sequence's keys: zeros (uniform over the CTA)
        bwd_ws_zero_tails<SWIZZLE, BLOCK_N, HDIM_Q, HDIM_V, MMA_THREADS>(sm.k, sm.v, blk.seqlen_k - k0, tid, 3);

    // BIAS: MMA thread 0 loads the bias tiles (the producer warp, at 24 registers, had none to spare):
    // block i's into stage i % BIAS_STAGES, the first BIAS_STAGES before the loop, block i + BIAS_STAGES
    // once every MMA thread has read block i's (named barrier 1, after the fence.proxy.async that
    // orders those reads before the copy); rows from 0 when the bias broadcasts along them
    auto load_bias = [&](int i) {
        if constexpr (BIAS) {
            const int bs = i % BIAS_STAGES, rows = p.bias.sq ? BLOCK_M : 0;
            mbarrier_arrive_expect_tx(smem_u32(sm.bias_full(bs)), (rows ? BLOCK_M : 1) * BLOCK_N * BIAS_TMA);
            tma_load_bias<BLOCK_M, BLOCK_N, BIAS ? BIAS_TMA : 2>(sm.bias_tile(bs), tm_bias, smem_u32(sm.bias_full(bs)),
                                                                 (blk.qb_begin + i) * rows, k0, p.bias.sh ? h : 0,
                                                                 p.bias.sb ? b : 0);
        }
    };
    if (BIAS && tid == 0)
        for (int i = 0; i < BIAS_STAGES && blk.qb_begin + i < blk.qb_end; ++i) load_bias(i);

    // BIAS, dBias through TMA: zeros into the query blocks this key block does not see (the mask's), so
    // that dBias needs no zero fill before the launch (cupy_fmha.api._direct_dbias); from dS buffer 1,
    // zeroed, which the loop's first block does not use and its second rewrites only after the first
    // block's bulk_wait_read (here, not after the loop: there the MMA warpgroups spilled 72 bytes more)
    if constexpr (BIAS) {
        const int nqb = (blk.seqlen_q + BLOCK_M - 1) / BLOCK_M;
        if (p.bias.ds_kind == DS_KIND_TMA && (blk.qb_begin > 0 || blk.qb_end < nqb)) {  // (uniform over the CTA)
            for (int u = tid; u < BLOCK_N * BLOCK_M / 8; u += MMA_THREADS)
                reinterpret_cast<uint4*>(sm.ds[1])[u] = make_uint4(0u, 0u, 0u, 0u);
            fence_proxy_async();
            named_barrier_sync(1, MMA_THREADS);
            if (tid == 0) {
                for (int qb = 0; qb < nqb; ++qb)
                    if (qb < blk.qb_begin || qb >= blk.qb_end)
#pragma unroll
                        for (int c = 0; c < BLOCK_N / 64; ++c)
                            if (k0 + 64 * c < blk.seqlen_k)
                                tma_store_4d(tm_dbias, smem_u32(sm.ds[1]) + c * (BLOCK_M * 128), k0 + 64 * c,
                                             qb * BLOCK_M, h, b);
                bulk_commit();
            }
        }
    }

    int kb_first = kb;  // deterministic ordered dQ (thread 0): the first key block of the current tile
    // DROPOUT: the keep bits of a query block, made by all the MMA threads together into a word tile in
    // shared memory (fill_keep_words: the block's calls, two per thread at 64 query rows; a call's
    // bits belong to warps of both halves of a 32-key span, so they cannot stay in the warp that made
    // them), which backward_p_ds reads (KeepTile). KEEP_AHEAD (hdim 64): those of the query block to
    // come, into the other of two buffers, the first one's here and each next one's while the current
    // block's GEMM1 and GEMM3 run, where S and dP are dead (named barrier 1 then publishes them); at
    // hdim 128 those of the current block while GEMM0 and GEMM2 run, then a barrier 1 of their own
    // (a block ahead, with dK and dV live, the older per-warp keep words spilled 68-112 bytes)
    constexpr bool KEEP_AHEAD = HDIM_Q <= 64 && HDIM_V <= 64;
    if constexpr (DROPOUT && KEEP_AHEAD)
        if (blk.qb_begin < blk.qb_end) {  // (uniform over the CTA)
            fill_keep_words<BLOCK_M, BLOCK_N, MMA_THREADS>(sm.keep_words(0), blk.drop, blk.qb_begin * BLOCK_M, k0, tid);
            named_barrier_sync(1, MMA_THREADS);
        }
    for (int qb = blk.qb_begin, i = 0; qb < blk.qb_end; ++qb, ++i) {
        // (the stage and dS buffer broadcast from lane 0, as wg above: the descriptors of the Q, dO
        // and dS^T tiles then live in uniform registers)
        const int s = __shfl_sync(0xffffffffu, i % STAGES, 0);
        if constexpr (FROM_ADDR) opaque_u32(desc_base);
        const unsigned phase = (i / STAGES) & 1;
        const int q0 = qb * BLOCK_M;
        const int dsb = __shfl_sync(0xffffffffu, i & 1, 0);
        uint16_t* sdS = sm.ds[dsb];
        mbarrier_wait(smem_u32(&sm.full[s]), phase);
        if (packed && q0 + BLOCK_M > blk.seqlen_q)  // the next sequence's query rows: zeros
            bwd_ws_zero_tails<SWIZZLE, BLOCK_M, HDIM_Q, HDIM_V, MMA_THREADS>(sm.q[s], sm.dout[s], blk.seqlen_q - q0, tid, 3);
        const uint16_t* sQb = sm.q[s];
        const uint16_t* sdOb = sm.dout[s];
        // the wgmma operands' tiles: shared-memory addresses (FROM_ADDR) or pointers
        const auto t_k = pick<FROM_ADDR>(desc_base + layout_off(sm.k), sm.k);
        const auto t_v = pick<FROM_ADDR>(desc_base + layout_off(sm.v), sm.v);
        const auto t_q = pick<FROM_ADDR>(desc_base + layout_off(sm.q) + s * (unsigned)sizeof(sm.q[0]), sQb);
        const auto t_do = pick<FROM_ADDR>(desc_base + layout_off(sm.dout) + s * (unsigned)sizeof(sm.dout[0]), sdOb);
        const auto t_ds = pick<FROM_ADDR>(desc_base + layout_off(sm.ds) + dsb * (unsigned)sizeof(sm.ds[0]),
                                          static_cast<const uint16_t*>(sdS));

        // GEMM0 and GEMM2, issued together (SPLIT: committed apart, so that P is formed while GEMM2 runs)
        float sacc[NQ * 4], dp[NQ * 4];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < HDIM_Q / 16; ++kk)
            wgmma_ss<BLOCK_M, 0, 0>(sacc, desc_tile_kmajor<SWIZZLE, BLOCK_N>(t_k, key_row0, kk * 16),
                                    desc_tile_kmajor<SWIZZLE, BLOCK_M>(t_q, 0, kk * 16), kk > 0);
        if constexpr (SPLIT || SPLIT_P) wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < HDIM_V / 16; ++kk)
            wgmma_ss<BLOCK_M, 0, 0>(dp, desc_tile_kmajor<SWIZZLE, BLOCK_N>(t_v, key_row0, kk * 16),
                                    desc_tile_kmajor<SWIZZLE, BLOCK_M>(t_do, 0, kk * 16), kk > 0);
        wgmma_commit();
        if constexpr (DROPOUT && !KEEP_AHEAD) {  // (the buffer's last reads, the previous block's, are before its barrier 1)
            fill_keep_words<BLOCK_M, BLOCK_N, MMA_THREADS>(sm.keep_words(0), blk.drop, q0, k0, tid);
            named_barrier_sync(1, MMA_THREADS);
        }
        const KeepTile keep{DROPOUT ? sm.keep_words(KEEP_AHEAD ? i & 1 : 0) : nullptr, warp_key0};
        if constexpr (SPLIT || SPLIT_P) {
            wgmma_wait<1>();  // GEMM0
            fence_operand<NQ * 4>(sacc);
        } else {
            wgmma_wait0();
            fence_operand<NQ * 4>(sacc);
            fence_operand<NQ * 4>(dp);
        }

        // P^T and dS^T
        const bool edge = blk.win.tile_needs_test(q0, BLOCK_M, k0, BLOCK_N, blk.seqlen_q, blk.seqlen_k);
        // one branch per tile: the mask test inside only where the tile crosses it (ALiBi builds keep
        // the run-time test in one copy of the loop: the two copies spilled at hdim 128)
        if constexpr (BIAS) {  // the bias tile from shared memory (reloaded only after barrier 1: load_bias); one loop, as ALiBi
            const int bs = i % BIAS_STAGES;
            mbarrier_wait(smem_u32(sm.bias_full(bs)), (i / BIAS_STAGES) & 1);
            const SwBiasTile<BLOCK_M, BLOCK_N, BIAS ? BIAS_TMA : 2> tile{smem_u32(sm.bias_tile(bs)), p.bias.sq ? 1 : 0,
                                                                      p.bias.kind};
            backward_p_ds<NQ, 2, LSE2>(sacc, dp, sm.lse[s], sm.d[s], p.scale_log2, edge, blk.win, blk.alibi, tile,
                                       k0 + warp_key0, q0, frag, blk.seqlen_q, blk.seqlen_k, blk.drop, KeepTile{nullptr, 0},
                                       warp_key0);
            if (p.dbias_acc)  // (null when dBias leaves through TMA, below)
                bwd_store_ds<NQ>(p, blk, dp, k0 + warp_key0, q0, frag);  // dS for dBias, element by element
        } else if constexpr (SPLIT_P) {  // P while GEMM2 runs, dS once it is done
            bwd_ws_p_ds<NQ, LSE2, true>(sacc, dp, sm.lse[s], sm.d[s], p, blk, edge, k0 + warp_key0, q0, frag, keep);
            wgmma_wait0();
            fence_operand<NQ * 4>(dp);
            backward_ds_from_p<NQ>(sacc, dp, sm.d[s], frag);
        } else if constexpr (!SPLIT) {
            bwd_ws_p_ds<NQ, LSE2>(sacc, dp, sm.lse[s], sm.d[s], p, blk, edge, k0 + warp_key0, q0, frag, keep);
        }
        uint32_t pa[BLOCK_M / 16][4], dsa[BLOCK_M / 16][4];
        if constexpr (SPLIT) {
            // P (GEMM2 still running), then GEMM1 behind GEMM2; dS once GEMM2 is done, then GEMM3
            bwd_ws_p_ds<NQ, LSE2, true>(sacc, dp, sm.lse[s], sm.d[s], p, blk, edge, k0 + warp_key0, q0, frag, keep);
            bwd_p_operands<BLOCK_M>(sacc, pa);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BLOCK_M / 16; ++kk)
                wgmma_rs<HDIM_V, 1>(acc_dv, pa[kk], desc_tile_mnmajor<SWIZZLE, BLOCK_M>(t_do, kk * 16, 0), 1);
            wgmma_commit();
            wgmma_wait<1>();  // GEMM2 (the groups complete in order)
            fence_operand<NQ * 4>(dp);
            backward_ds_from_p<NQ>(sacc, dp, sm.d[s], frag);
            bwd_ds_operands<BLOCK_M>(dp, dsa, sdS, warp_key0, frag);  // (+ dS^T for GEMM4)
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BLOCK_M / 16; ++kk)
                wgmma_rs<HDIM_Q, 1>(acc_dk, dsa[kk], desc_tile_mnmajor<SWIZZLE, BLOCK_M>(t_q, kk * 16, 0), 1);
            wgmma_commit();
        } else {
            if constexpr (DS_KMAJOR)
                bwd_p_ds_operands_sw<BLOCK_M>(sacc, dp, pa, dsa, sdS, warp_key0, frag);  // (+ dS for GEMM4)
            else
                bwd_p_ds_operands<BLOCK_M>(sacc, dp, pa, dsa, sdS, warp_key0, frag);  // (+ dS^T for GEMM4)

            // GEMM1 and GEMM3 (A from registers; B = dO, Q MN-major)
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BLOCK_M / 16; ++kk) {
                wgmma_rs<HDIM_V, 1>(acc_dv, pa[kk], desc_tile_mnmajor<SWIZZLE, BLOCK_M>(t_do, kk * 16, 0), 1);
                wgmma_rs<HDIM_Q, 1>(acc_dk, dsa[kk], desc_tile_mnmajor<SWIZZLE, BLOCK_M>(t_q, kk * 16, 0), 1);
            }
            wgmma_commit();
        }
        if constexpr (DROPOUT && KEEP_AHEAD)  // (into the buffer the previous block read before its barrier 1)
            if (qb + 1 < blk.qb_end)
                fill_keep_words<BLOCK_M, BLOCK_N, MMA_THREADS>(sm.keep_words((i + 1) & 1), blk.drop, q0 + BLOCK_M, k0, tid);
        fence_proxy_async();
        if constexpr (!DQ_WRITER) bulk_wait_read<0>();  // the previous block's dQ rows have left sdQ
        named_barrier_sync(1, MMA_THREADS);        // dS^T of both warpgroups visible; sdQ free (DQ_WRITER: dq_empty)
        if (BIAS && tid == 0 && qb + BIAS_STAGES < blk.qb_end) load_bias(i + BIAS_STAGES);  // (this block's tile is read)

        // GEMM4: dQ[q0 .. q0 + 64, this warpgroup's half of the columns] = dS K (SWIZZLE at hdim 64:
        // the second half starts 64 bytes into K's one slab, inside the swizzle atom: desc_sw_mnmajor);
        // DQ_BY_ROWS: dQ[this warpgroup's 64 rows, all columns]
        // DQ_T: dQ^T[this warpgroup's 64 columns, q0 .. q0 + BLOCK_M] = K^T dS^T, issued once GEMM1/3
        // are done, so that their register operands (P^T, dS^T) are free before its accumulator is live
        // (with both, ptxas serialized the wgmmas: C7512)
        if constexpr (DQ_T) {
            wgmma_wait0();
            fence_operand<BLOCK_M / 4>(&pa[0][0]);
            fence_operand<BLOCK_M / 4>(&dsa[0][0]);
        }
        float acc_dq[DQ_ACC];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BLOCK_N / 16; ++kk)
            if constexpr (DQ_T)
                wgmma_ss<BLOCK_M, 1, 1>(acc_dq, desc_tile_mnmajor<SWIZZLE, BLOCK_N>(t_k, kk * 16, wg * DQ_HALF),
                                        desc_mnmajor<BLOCK_M>(t_ds, kk * 16, 0), kk > 0);
            else
                wgmma_ss<DQ_COLS, DS_KMAJOR ? 0 : 1, 1>(
                    acc_dq, DS_KMAJOR ? desc_sw_kmajor<BLOCK_M>(t_ds, DQ_BY_ROWS ? wg * 64 : 0, kk * 16)
                                      : desc_mnmajor<BLOCK_M>(t_ds, kk * 16, DQ_BY_ROWS ? wg * 64 : 0),
                    desc_tile_mnmajor<SWIZZLE, BLOCK_N>(t_k, kk * 16, DQ_BY_ROWS ? 0 : wg * DQ_HALF), kk > 0);
        wgmma_commit();
        wgmma_wait0();  // GEMM1/3 too: the buffer's Q and dO are read
        fence_operand<DQ_ACC>(acc_dq);
        fence_operand<NDV * 4>(acc_dv);
        fence_operand<NDQ * 4>(acc_dk);
        if constexpr (!DQ_T) {
            fence_operand<BLOCK_M / 4>(&pa[0][0]);
            fence_operand<BLOCK_M / 4>(&dsa[0][0]);
        }
        mbarrier_arrive(smem_u32(&sm.empty[s]));

        // this warpgroup's columns of the tile into sdQ, then one bulk add of the tile (in order when deterministic)
        if (DQ_WRITER && i > 0) mbarrier_wait(smem_u32(&wsm.dq_empty), (i - 1) & 1);  // the writer has read the last one
        if constexpr (DQ_T)
            stage_dq_tile_t<BLOCK_M / 8, HDIM_Q>(sdQ, acc_dq, wg * DQ_HALF + wi * 16, frag);
        else
            stage_dq_tile<DQ_COLS / 8, HDIM_Q, true>(sdQ, acc_dq, (DQ_BY_ROWS ? wg * 64 : 0) + wi * 16,
                                                     DQ_BY_ROWS ? 0 : wg * DQ_HALF, frag);
        fence_proxy_async();
        if constexpr (DQ_WRITER) {
            if (tid == 0) bwd_dq_job<BLOCK_M, BLOCK_N, HDIM_Q>(wsm.job, p, blk, qb, kb, kb_first);
            mbarrier_arrive(smem_u32(&wsm.dq_full));
        } else {
            named_barrier_sync(2, MMA_THREADS);
        }
        if (!DQ_WRITER && tid == 0) {
            // BIAS: dBias[q0 .., k0 ..] = the dS tile (sdS is rewritten two blocks on, after the next
            // block's bulk_wait_read)
            if (BIAS && p.bias.ds_kind == DS_KIND_TMA) {
#pragma unroll
                for (int c = 0; c < BLOCK_N / 64; ++c)
                    if (k0 + 64 * c < blk.seqlen_k)
                        tma_store_4d(tm_dbias, smem_u32(sdS) + c * (BLOCK_M * 128), k0 + 64 * c, q0, h, b);
                bulk_commit();
            }
            float* dst = blk.dq_g + (index_t)q0 * HDIM_Q;
            if (p.dq_sem) {  // deterministic, ordered: the key blocks seeing this tile add it in ascending order
                int* sem = p.dq_sem + blk.bh * ((blk.pitch_q + BLOCK_M - 1) / BLOCK_M) + qb;
                kb_first = first_key_block(blk.win, qb, kb_first, qb == blk.qb_begin, BLOCK_N, BLOCK_M, blk.seqlen_q,
                                           blk.seqlen_k);
                sem_wait(sem, kb - kb_first);
                bulk_reduce_add_f32(dst, smem_u32(sdQ), 4u * BLOCK_M * HDIM_Q);
                bulk_commit();
                bulk_wait<0>();  // complete in global memory before the next key block is admitted
                sem_release(sem);
            } else {
                bulk_reduce_add_f32(dst, smem_u32(sdQ), 4u * BLOCK_M * HDIM_Q);
                bulk_commit();
            }
        }
#if defined(TIMING) && TIMING
        if (i == 0 && threadIdx.x == 128) stamp(2);
#endif
    }
#if defined(TIMING) && TIMING
    if (threadIdx.x == 128) stamp(3);
#endif

    // dK and dV, staged through the K/V/Q/dO buffers (bwd_ws_store_dk_dv; free now: both warpgroups
    // passed the last block's barrier 2 after their last wgmma), then a wait until this thread's last
    // bulk copies (dQ adds, dK/dV rows) have read shared memory before the CTA frees it; their global
    // writes complete with the grid (CUTLASS's TMA-store epilogues end the same way), and the last
    // block's dQ add overlaps the stores. DROPOUT, BIAS and column-blocked builds wait for the copies
    // (dBias's TMA stores too) first and store from the accumulators: the staging spilled them
    // (dropout hdim 128: 144 bytes instead of 48; bias hdim 128: 244 and 168 instead of 76 and 96;
    // column-blocked hdim 128: 4 instead of 0), as did the .read wait after the stores (bias: 84
    // instead of 76). bench/NOTES.md steps 59-60.
    static_assert(2 * BLOCK_N * (HDIM_Q + HDIM_V + 16) <= sizeof(Smem::k) + sizeof(Smem::v) + sizeof(Smem::q) + sizeof(Smem::dout),
                  "the dK/dV stage fits the K/V/Q/dO buffers (Smem's first members)");
    if constexpr (DQ_WRITER) named_barrier_sync(2, MMA_THREADS);  // (no barrier 2 per block: both warpgroups' last wgmma done)
    if constexpr (DROPOUT || BIAS || !SWIZZLE) {
        bulk_wait<0>();
        bwd_store_dk_dv<NDQ, NDV>(p, blk, b, h, blk.hk, acc_dk, acc_dv, k0 + warp_key0, frag, 0, 0);
    } else {
        bwd_ws_store_dk_dv<BLOCK_N, HDIM_Q, HDIM_V, MMA_THREADS, NDQ, NDV>(p, blk, b, h, k0, acc_dk, acc_dv, warp_key0,
                                                                          frag, 0, 0, sm.k, tid, 3);
#if defined(TIMING) && TIMING
        if (threadIdx.x == 128) stamp(4);
#endif
        bulk_wait_read<0>();
    }
#if defined(TIMING) && TIMING
    if (tid == 0) {
        stamp(5);
        const unsigned smid = sm_index();
        unsigned long long* o = fmha_timeline[blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)];
        for (int n = 0; n < 6; ++n) o[n] = tl_[n];
        for (int n = 0; n < 6; ++n) o[8 + n] = tl_[8 + n];
        o[6] = smid;
        o[7] = blk.qb_end - blk.qb_begin;
    }
#endif
}

// Compile-time configuration of one kernel instance: the only place that reads the -D macros
// cupy_fmha/spec.py passes (KernelSpec.defines). Each macro becomes a constexpr constant of the
// same name in namespace fmha, with its default when the instance does not set it, and the macro
// is then undefined, so kernels and headers switch on constants only (`if constexpr (BIAS)`,
// never `#if BIAS` or `if (ALIBI)` on a macro).
//
//   FMHA_BF16    16-bit element type: 1 bfloat16, 0 float16
//   HDIM_Q/V     padded head dims (register arrays are shaped by them)
//   BLOCK_M/N    query rows / keys per block; NWARPS, NWG: warps / warpgroups; NTHREADS: threads
//   SMEM_BYTES   dynamic shared memory the launcher passes (each kernel's Smem struct matches it)
//   MIN_BLOCKS   CTAs per SM for __launch_bounds__
//   ALIBI, BIAS, DROPOUT   features compiled in (0: none of their code)
//   Q_IN_REGS    fmha_fwd: Q's fragments stay in registers for the whole loop
//   WG_SKIP      fmha_fwd_sm90: warpgroups skip key blocks none of their rows sees
//                (default: at 2 warpgroups without ALiBi; see fmha_fwd_sm90.cu); fmha_fwd_sm90_ws: the same, only
//                where the instance sets it to 1 (a variant of the overlapped pipeline; WS_WG_SKIP there)
//   NSPLIT       fmha_bwd_dq_dk_dv: CTAs sharing one key block's output columns
//   OVERLAP, DQ_BULK   fmha_bwd_dq_dk_dv_sm90: GEMM4 issued under GEMM1/3; dQ by bulk reduce-adds
//   STAGES       the warp-specialized kernels: buffers in the producer's ring
//   SWIZZLE      fmha_fwd_sm90_ws: Q, K, V as 128-byte-swizzled tiles loaded in boxes of 64 columns
//                (0: column-blocked tiles, one box of 16-byte rows per tile)
//   PV_OVERLAP   fmha_fwd_sm90_ws: block j's softmax runs while P_{j-1} V_{j-1} is on the tensor cores
//   PINGPONG     fmha_fwd_sm90_ws (with PV_OVERLAP): the MMA warpgroups take turns issuing GEMMs
//   DQ_TILED     the dq_dk_dv kernels writing dQ a query block at a time with one bulk copy: the dQ
//                workspace is tiled (dq_tile_chunk in common.cuh; set by the launcher, never by hand)
//   ROWS         fmha_bwd_dot_do_o / fmha_bwd_convert_dq: rows per block
//   DQ_SPLIT     fmha_bwd_convert_dq: sum the deterministic dQ slabs
//   LSE2         fmha_bwd_dq_dk_dv_sm90_ws: the producer stores the LSE in log2 units (lse_log2)
//   SPLIT_PDS    fmha_bwd_dq_dk_dv_sm90_ws (no dropout or bias): P while GEMM2 runs, dS while GEMM1 runs
//   HEADS_X      the ws backwards: 0 the grid is (key blocks, nhead_q, batch); 1 it is (nhead_q, key
//                blocks, batch), so every head's key block 0 starts first; G >= 2 the same grid, its
//                CTAs taken as groups of G heads, key block 0 of a group's heads first (bwd_ws_tile in
//                bwd_ws.cuh; launch.dq_dk_dv_launch follows the spec's macro)
//   FOLD         fmha_fwd_sm90_ws (no ALiBi): the softmax scale folded into one FFMA per exponent
//   BIAS_TMA     fmha_fwd_sm90_ws with BIAS: bytes per bias element of its TMA-loaded tiles (2: fp16
//                or bf16, 4: fp32)
//   BIAS_STAGES  fmha_fwd_sm90_ws with BIAS: tiles in the bias ring
//   BIAS_ACC     fmha_fwd_sm90_ws with BIAS (and PV_OVERLAP, no dropout): the bias tile is S's
//                accumulator's starting value (bias / softmax_scale) instead of an add in the softmax
//   DQ_WRITER    the ws backwards (fmha_bwd_dq_dk_dv_sm90_ws without bias or dropout; the wide one
//                where dQ is staged): a thread of the producer warpgroup's second warp adds the staged
//                dQ tiles (bulk reduce-adds, the ordered wait in deterministic mode) instead of MMA
//                thread 0
//   DESC_ADDR    fmha_bwd_dq_dk_dv_sm90_ws (no bias or dropout) and fmha_fwd_sm90_ws (the table's default in the
//                backward and the forward at hdim 192/256, bench/NOTES.md steps 102-104): the main loop's wgmma
//                descriptors formed from one 32-bit shared-memory
//                address plus each tile's constant offset, instead of from the tile pointers (the same values)
//   O_IN_Q       fmha_fwd_sm90_ws (no O_STAGE, HDIM_Q == HDIM_V, swizzled): O staged in its warpgroup's rows of
//                the Q buffer and sent in 16-byte stores; Q handed back after that instead of after the last S
//   O_IN_KV      fmha_fwd_sm90_ws (a variant; PV_OVERLAP, NWG == 2, no O_STAGE or O_IN_Q, HDIM_Q == HDIM_V, BLOCK_N >= 64,
//                swizzled): O staged in the last key block's ring stage (MMA warpgroup 0's rows in its K tile, 1's
//                in its V tile) and sent in 16-byte stores, that stage handed back after that; Q handed back
//                after the last S GEMM, so the next row block's Q loads under the last P V and the epilogue
//   SMAX_TREE    the forward softmax (attention.cuh, softmax_p): each row slot's maximum by a pairwise
//                tree over the thread's scores instead of one chain, both slots before their quad
//                shuffles, and the folded form's sign test around the whole step (the same values)
//   MASK_ROWS    the forward softmax (attention.cuh, mask_tile): the mask test of an edge tile from each
//                row's visible columns, one compare per bound (1), the lower only where it crosses (2)
//   LAZY_RESCALE the forward softmax (softmax_row without RESCALE: the overlapped pipeline, and the serial
//                one through online_softmax): a row keeps its running maximum while a block's is at most
//                this much larger (log2 units; P up to 2^(LAZY_RESCALE + 1/4)), and O is rescaled only
//                when a row of the warp moved it (0: always)
//   KEEP_SINK    the ws forward's dropout builds (fmha_fwd_sm90_ws.cu, KEEP_MSB): the keep decisions made inside
//                the softmax (its `gen` hook, after the mask test), where ptxas can interleave the Philox
//                work with the maxima, shuffles and exponentials, instead of under the S GEMM (0); 2: the second
//                half of each key block's 32-key spans there, the first under S
//   ALIGN_END    fmha_fwd_sm90_ws: row blocks counted back from each sequence's last query row, so the
//                one partial block (seqlen_q not a multiple of BLOCK_M) holds the first rows, the ones a
//                causal mask gives the fewest keys, instead of the last, which see the most; its rows
//                before the sequence load as zeros (TMA) or the previous sequence's (group mode) and are
//                not stored. (0: from row 0, the partial block last)
//   EXP_EMU      the forward softmax (attention.cuh, softmax_row): of every 8 tiles of a row slot's
//                scores, this many take their exponentials from poly_exp2 (FMA pipes) instead of
//                MUFU.EX2 (0: none)
//   O_STAGE      fmha_fwd_sm90_ws: O leaves through a shared-memory stage and bulk row copies (set by
//                the launcher where the stage fits, never by hand; O_REG=1 in CUPY_FMHA_FWD_WS_TILES
//                keeps the register stores, for comparisons)
//   (PERSIST, fmha_fwd_sm90_ws's row blocks per CTA, is the launcher's alone: launch.fwd_launch sets
//   the grid from it and the kernel strides over whatever grid it gets; not read here)
// Plain C++: it also compiles on the host (tests/test_philox_cuh.py, through philox.cuh).
#pragma once

#ifndef FMHA_BF16
#define FMHA_BF16 0
#endif
#ifndef HDIM_Q
#define HDIM_Q 0
#endif
#ifndef HDIM_V
#define HDIM_V 0
#endif
#ifndef BLOCK_M
#define BLOCK_M 0
#endif
#ifndef BLOCK_N
#define BLOCK_N 0
#endif
#ifndef NWARPS
#define NWARPS 0
#endif
#ifndef NWG
#define NWG 2
#endif
#ifndef NTHREADS
#define NTHREADS 0
#endif
#ifndef SMEM_BYTES
#define SMEM_BYTES 0
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1
#endif
#ifndef ALIBI
#define ALIBI 0
#endif
#ifndef BIAS
#define BIAS 0
#endif
#ifndef DROPOUT
#define DROPOUT 0
#endif
#ifndef Q_IN_REGS
#define Q_IN_REGS 1
#endif
#ifndef WG_SKIP
#define WG_SKIP -1
#endif
#ifndef NSPLIT
#define NSPLIT 1
#endif
#ifndef OVERLAP
#define OVERLAP 1
#endif
#ifndef DQ_BULK
#define DQ_BULK 1
#endif
#ifndef DQ_TILED
#define DQ_TILED 0
#endif
#ifndef STAGES
#define STAGES 2
#endif
#ifndef SWIZZLE
#define SWIZZLE 0
#endif
#ifndef PV_OVERLAP
#define PV_OVERLAP 0
#endif
#ifndef PINGPONG
#define PINGPONG 0
#endif
#ifndef ROWS
#define ROWS 0
#endif
#ifndef DQ_SPLIT
#define DQ_SPLIT 0
#endif
#ifndef LSE2
#define LSE2 0
#endif
#ifndef FOLD
#define FOLD 0
#endif
#ifndef SPLIT_PDS
#define SPLIT_PDS 0
#endif
#ifndef HEADS_X
#define HEADS_X 0
#endif
#ifndef BIAS_TMA
#define BIAS_TMA 0
#endif
#ifndef BIAS_STAGES
#define BIAS_STAGES 2
#endif
#ifndef O_STAGE
#define O_STAGE 0
#endif
#ifndef O_REG
#define O_REG 0
#endif
#ifndef DQ_WRITER
#define DQ_WRITER 0
#endif
#ifndef BIAS_ACC
#define BIAS_ACC 0
#endif
#ifndef DESC_ADDR
#define DESC_ADDR 0
#endif
#ifndef O_IN_Q
#define O_IN_Q 0
#endif
#ifndef O_IN_KV
#define O_IN_KV 0
#endif
#ifndef SMAX_TREE
#define SMAX_TREE 0
#endif
#ifndef EXP_EMU
#define EXP_EMU 0
#endif
#ifndef MASK_ROWS
#define MASK_ROWS 0
#endif
#ifndef LAZY_RESCALE
#define LAZY_RESCALE 0
#endif
#ifndef KEEP_SINK
#define KEEP_SINK 0
#endif
#ifndef ALIGN_END
#define ALIGN_END 0
#endif

// The PTX name of the 16-bit element type, for instruction strings (mma, wgmma, cvt).
#if FMHA_BF16
#define FMHA_PTX_ELEM "bf16"
#else
#define FMHA_PTX_ELEM "f16"
#endif

namespace fmha {
namespace config_detail {
inline constexpr int bf16 = FMHA_BF16, hdim_q = HDIM_Q, hdim_v = HDIM_V, block_m = BLOCK_M, block_n = BLOCK_N;
inline constexpr int nwarps = NWARPS, nwg = NWG, nthreads = NTHREADS, smem_bytes = SMEM_BYTES, min_blocks = MIN_BLOCKS;
inline constexpr int alibi = ALIBI, bias = BIAS, dropout = DROPOUT, q_in_regs = Q_IN_REGS, wg_skip = WG_SKIP;
inline constexpr int nsplit = NSPLIT, overlap = OVERLAP, dq_bulk = DQ_BULK, dq_tiled = DQ_TILED, stages = STAGES, rows = ROWS, dq_split = DQ_SPLIT;
inline constexpr int swizzle = SWIZZLE, pv_overlap = PV_OVERLAP, pingpong = PINGPONG, lse2 = LSE2, fold = FOLD,
                     split_pds = SPLIT_PDS, heads_x = HEADS_X;
inline constexpr int bias_tma = BIAS_TMA, bias_stages = BIAS_STAGES, o_stage = O_STAGE, dq_writer = DQ_WRITER, bias_acc = BIAS_ACC;
// (enumerators from here on: a constexpr variable at namespace scope appears in every build's PTX)
enum : int { desc_addr = DESC_ADDR, o_in_q = O_IN_Q, smax_tree = SMAX_TREE, exp_emu = EXP_EMU, mask_rows = MASK_ROWS,
             lazy_rescale = LAZY_RESCALE, keep_sink = KEEP_SINK, align_end = ALIGN_END, o_in_kv = O_IN_KV };
}  // namespace config_detail
}  // namespace fmha

#undef FMHA_BF16
#undef HDIM_Q
#undef HDIM_V
#undef BLOCK_M
#undef BLOCK_N
#undef NWARPS
#undef NWG
#undef NTHREADS
#undef SMEM_BYTES
#undef MIN_BLOCKS
#undef ALIBI
#undef BIAS
#undef DROPOUT
#undef Q_IN_REGS
#undef WG_SKIP
#undef NSPLIT
#undef OVERLAP
#undef DQ_BULK
#undef DQ_TILED
#undef STAGES
#undef SWIZZLE
#undef PV_OVERLAP
#undef PINGPONG
#undef ROWS
#undef DQ_SPLIT
#undef LSE2
#undef FOLD
#undef SPLIT_PDS
#undef HEADS_X
#undef BIAS_TMA
#undef BIAS_STAGES
#undef O_STAGE
#undef DQ_WRITER
#undef BIAS_ACC
#undef DESC_ADDR
#undef O_IN_Q
#undef O_IN_KV
#undef SMAX_TREE
#undef EXP_EMU
#undef MASK_ROWS
#undef LAZY_RESCALE
#undef KEEP_SINK
#undef ALIGN_END
#undef O_REG  // (the launcher's switch: O_STAGE says what it chose)

namespace fmha {
inline constexpr bool FMHA_BF16 = config_detail::bf16 != 0;
inline constexpr int HDIM_Q = config_detail::hdim_q;
inline constexpr int HDIM_V = config_detail::hdim_v;
inline constexpr int BLOCK_M = config_detail::block_m;
inline constexpr int BLOCK_N = config_detail::block_n;
inline constexpr int NWARPS = config_detail::nwarps;
inline constexpr int NWG = config_detail::nwg;
inline constexpr int NTHREADS = config_detail::nthreads;
inline constexpr int SMEM_BYTES = config_detail::smem_bytes;
inline constexpr int MIN_BLOCKS = config_detail::min_blocks;
inline constexpr bool ALIBI = config_detail::alibi != 0;
inline constexpr bool BIAS = config_detail::bias != 0;
inline constexpr bool DROPOUT = config_detail::dropout != 0;
inline constexpr bool Q_IN_REGS = config_detail::q_in_regs != 0;
inline constexpr bool WG_SKIP = config_detail::wg_skip >= 0 ? config_detail::wg_skip != 0 : (NWG == 2 && !ALIBI);
inline constexpr int NSPLIT = config_detail::nsplit;
inline constexpr bool OVERLAP = config_detail::overlap != 0;
inline constexpr bool DQ_BULK = config_detail::dq_bulk != 0;
inline constexpr bool DQ_TILED = config_detail::dq_tiled != 0;
inline constexpr int STAGES = config_detail::stages;
inline constexpr bool SWIZZLE = config_detail::swizzle != 0;
inline constexpr bool PV_OVERLAP = config_detail::pv_overlap != 0;
inline constexpr bool PINGPONG = config_detail::pingpong != 0;
inline constexpr int ROWS = config_detail::rows;
inline constexpr bool DQ_SPLIT = config_detail::dq_split != 0;
inline constexpr bool LSE2 = config_detail::lse2 != 0;
inline constexpr bool FOLD = config_detail::fold != 0;
inline constexpr int SPLIT_PDS = config_detail::split_pds;
inline constexpr int HEADS_X = config_detail::heads_x;
inline constexpr int BIAS_TMA = config_detail::bias_tma;
inline constexpr int BIAS_STAGES = config_detail::bias_stages;
inline constexpr bool O_STAGE = config_detail::o_stage != 0;
inline constexpr bool DQ_WRITER = config_detail::dq_writer != 0;
inline constexpr bool BIAS_ACC = config_detail::bias_acc != 0;
enum : bool { DESC_ADDR = config_detail::desc_addr != 0, O_IN_Q = config_detail::o_in_q != 0, SMAX_TREE = config_detail::smax_tree != 0,
              ALIGN_END = config_detail::align_end != 0, O_IN_KV = config_detail::o_in_kv != 0 };
enum : int { EXP_EMU = config_detail::exp_emu,
             LAZY_RESCALE = config_detail::lazy_rescale, MASK_ROWS = config_detail::mask_rows,
             KEEP_SINK = config_detail::keep_sink };
}  // namespace fmha

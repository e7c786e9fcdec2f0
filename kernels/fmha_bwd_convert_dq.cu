// Attention backward, last kernel (CK's convert_dq): out = cast(scale * sum_g acc[g]) where acc
// is an fp32 workspace [batch, nhead_out * nsum, seqlen, hdim]. It turns the dQ accumulator into
// dQ (nsum = 1, scale = softmax_scale), and sums the per-query-head dK/dV of a GQA group
// (nsum = nhead_q / nhead_k, scale = 1), always in the same order.
//
// Deterministic dQ (instance DQ_SPLIT=1, nsplit > 0): acc is [nsplit, batch, nhead_out, seqlen,
// hdim] (slab stride split_stride), slab kb written by the dq_dk_dv CTAs of key block kb, and
// only for the query blocks in that key block's range. Row i sums slab kb, kb ascending, exactly
// when its query block (i / block_m) lies in query_block_range(window, kb * block_n, ...), the
// maths the main kernel uses, so no slab is read where it was not written (the workspace is not
// zero-filled). A row that no key block sees is 0.
// DQ_SPLIT=0 (atomic mode and the GQA sums): one accumulator; nsplit, split_stride, seqlen_k,
// the window and the block sizes are passed but unused. The split loop lives only in the
// DQ_SPLIT=1 instance because it costs registers (48 vs 34 on sm_90a: fewer resident CTAs),
// which the default path's convert should not pay.
//
// acc rows: acc_pitch per (batch, head) plane, acc_cols floats each; acc_tiled = 1 or 2: the dQ
// workspace of the bulk-copy kernels (whole tiles, chunks placed by dq_tile_chunk of that kind, common.cuh).
// Grid (ceil(seqlen / ROWS), nhead_out, batch), block NTHREADS (256). Output rows are strided (unit last
// stride); each thread converts 8 elements at a time. Parameters: ConvertParams (params.cuh;
// seq.seqlen_q is `seqlen`, seq.cu_seqlens_q `cu_seqlens`). Group mode (cu_seqlens non-null, see
// varlen.cuh): seqlen is the max length (acc's row pitch), output rows are packed tokens (batch
// stride 0) and only each sequence's own rows are written.
#include "common.cuh"
#include "arch/arch.cuh"
#include "varlen.cuh"
#include "params.cuh"


using namespace fmha;

extern "C" __global__ void __launch_bounds__(NTHREADS)
fmha_bwd_convert_dq(const __grid_constant__ ConvertParams p) {
    const float* __restrict__ acc = p.acc;
    uint16_t* __restrict__ out = static_cast<uint16_t*>(p.out.ptr);
    const index_t o_sb = p.out.sb, o_sh = p.out.sh, o_ss = p.out.ss, split_stride = p.split_stride;
    int seqlen = p.seq.seqlen_q, seqlen_k = p.seq.seqlen_k;
    const int hdim = p.hdim, nsum = p.nsum, nsplit = p.nsplit, block_n = p.block_n, block_m = p.block_m;
    const float scale = p.scale;
    int win_y = p.mask.win_y, win_x = p.mask.win_x;
    const int* __restrict__ cu_seqlens = p.seq.cu_seqlens_q;
    const int* __restrict__ cu_seqlens_k = p.seq.cu_seqlens_k;
    const int h = blockIdx.y, b = blockIdx.z, nhead_out = gridDim.y;
    const int pitch = p.acc_pitch, acc_cols = p.acc_cols;  // group mode: from the max sequence length
    const bool tiled = p.acc_tiled != 0;
    if (cu_seqlens) out += (index_t)varlen_start(cu_seqlens, b, seqlen) * o_ss;
    if constexpr (DQ_SPLIT) {
        if (cu_seqlens_k) {  // the key blocks and window of this sequence, as dq_dk_dv sees them
            varlen_start(cu_seqlens_k, b, seqlen_k);
            window_for_sequence(win_y, win_x, p.mask.bottom_right, seqlen, seqlen_k);
        }
    }
    const int ch_per_row = hdim / 8;
    const Window win{win_y, win_x};
    for (int c = threadIdx.x; c < ROWS * ch_per_row; c += NTHREADS) {
        const int i = blockIdx.x * ROWS + c / ch_per_row, col = (c % ch_per_row) * 8;
        if (i >= seqlen) continue;
        float x[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        const int qb = DQ_SPLIT ? i / block_m : 0;
        for (int kb = 0; kb < (DQ_SPLIT ? nsplit : 1); ++kb) {
            if constexpr (DQ_SPLIT) {  // deterministic dQ: only slabs whose key block wrote this row
                if (kb * block_n >= seqlen_k) break;  // key blocks past the sequence exit early
                int qb_begin, qb_end;
                query_block_range(win, kb * block_n, block_n, block_m, seqlen, seqlen_k, qb_begin, qb_end);
                if (qb < qb_begin || qb >= qb_end) continue;
            }
            const float* slab = acc + kb * split_stride;
            for (int s = 0; s < nsum; ++s) {
                // (tiled: the chunk pair of columns [col, col + 8) stays adjacent under the even XOR)
                const float* src = slab + ((((index_t)b * nhead_out + h) * nsum + s) * pitch + i) * acc_cols +
                                   (tiled ? 4 * dq_tile_chunk(i, col / 4, p.acc_tiled) : col);
                const float4 u = *reinterpret_cast<const float4*>(src);
                const float4 w = *reinterpret_cast<const float4*>(src + 4);
                x[0] += u.x; x[1] += u.y; x[2] += u.z; x[3] += u.w;
                x[4] += w.x; x[5] += w.y; x[6] += w.z; x[7] += w.w;
            }
        }
        uint4 r;
        r.x = pack2(x[0] * scale, x[1] * scale);
        r.y = pack2(x[2] * scale, x[3] * scale);
        r.z = pack2(x[4] * scale, x[5] * scale);
        r.w = pack2(x[6] * scale, x[7] * scale);
        *reinterpret_cast<uint4*>(out + b * o_sb + h * o_sh + (index_t)i * o_ss + col) = r;
    }
}

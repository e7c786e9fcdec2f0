// Attention backward, last kernel (CK's convert_dq): out = cast(scale * sum_g acc[g]) where acc
// is an fp32 workspace [batch, nhead_out * nsum, seqlen, hdim]. It turns the dQ accumulator into
// dQ (nsum = 1, scale = softmax_scale), and sums the per-query-head dK/dV of a GQA group
// (nsum = nhead_q / nhead_k, scale = 1), always in the same order.
// Grid (ceil(seqlen / ROWS), nhead_out, batch), block 256. Output rows are strided (unit last
// stride); each thread converts 8 elements at a time. Group mode (cu_seqlens non-null, see
// varlen.cuh): seqlen is the max length (acc's row pitch), output rows are packed tokens (batch
// stride 0) and only each sequence's own rows are written.
#include "common.cuh"
#include "arch_sm80.cuh"
#include "varlen.cuh"

#ifndef ROWS
#define ROWS 16
#endif

using namespace fmha;

extern "C" __global__ void __launch_bounds__(256)
fmha_bwd_convert_dq(const float* __restrict__ acc, uint16_t* __restrict__ out, index_t o_sb, index_t o_sh,
                    index_t o_ss, int seqlen, int hdim, int nsum, float scale,
                    const int* __restrict__ cu_seqlens) {
    const int h = blockIdx.y, b = blockIdx.z, nhead_out = gridDim.y;
    const int pitch = seqlen;  // group mode: the max sequence length, the row pitch of acc
    if (cu_seqlens) out += (index_t)varlen_start(cu_seqlens, b, seqlen) * o_ss;
    const int ch_per_row = hdim / 8;
    for (int c = threadIdx.x; c < ROWS * ch_per_row; c += 256) {
        const int i = blockIdx.x * ROWS + c / ch_per_row, col = (c % ch_per_row) * 8;
        if (i >= seqlen) continue;
        float x[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int s = 0; s < nsum; ++s) {
            const float* src = acc + ((((index_t)b * nhead_out + h) * nsum + s) * pitch + i) * hdim + col;
            const float4 u = *reinterpret_cast<const float4*>(src);
            const float4 w = *reinterpret_cast<const float4*>(src + 4);
            x[0] += u.x; x[1] += u.y; x[2] += u.z; x[3] += u.w;
            x[4] += w.x; x[5] += w.y; x[6] += w.z; x[7] += w.w;
        }
        uint4 r;
        r.x = pack2(x[0] * scale, x[1] * scale);
        r.y = pack2(x[2] * scale, x[3] * scale);
        r.z = pack2(x[4] * scale, x[5] * scale);
        r.w = pack2(x[6] * scale, x[7] * scale);
        *reinterpret_cast<uint4*>(out + b * o_sb + h * o_sh + (index_t)i * o_ss + col) = r;
    }
}

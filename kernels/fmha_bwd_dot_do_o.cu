// Attention backward, kernel 1 (CK's dot_do_o): D[b, h, i] = sum_c dO[b, i, h, c] * O[b, i, h, c],
// in fp32. One warp per query row, 16-byte loads (8 elements per lane per step).
// Grid (ceil(seqlen_q / ROWS), nhead_q, batch), block ROWS * 32. D is [batch, nhead_q, seqlen_q].
// Group mode (cu_seqlens_q non-null, see varlen.cuh): seqlen_q is max_seqlen_q, the pitch of D;
// dO and O rows are packed tokens, batch strides 0.
// dq_acc (optional, atomic-mode dQ workspace [batch, nhead_q, dq_pitch, dq_cols], fp32: rows of
// hdim_q, or the tiled layout of common.cuh): the warp of row i also zero-fills dQ row i, whose
// place the two layouts share, so the workspace needs no separate memset (one pass less
// over memory; FlashAttention-2's preprocessing kernel clears its dQ accumulator the same way).
#include "common.cuh"
#include "arch/arch.cuh"
#include "varlen.cuh"
#include "params.cuh"

using namespace fmha;

static_assert(NTHREADS == ROWS * WARP_LANES, "fmha_bwd_dot_do_o: one warp per row (spec.py)");

extern "C" __global__ void __launch_bounds__(NTHREADS)
fmha_bwd_dot_do_o(const __grid_constant__ DotDoOParams p) {
    const uint16_t* __restrict__ dout = static_cast<const uint16_t*>(p.dout.ptr);
    const uint16_t* __restrict__ o = static_cast<const uint16_t*>(p.o.ptr);
    float* __restrict__ delta = p.delta;
    const index_t do_sb = p.dout.sb, do_sh = p.dout.sh, do_ss = p.dout.ss, o_sb = p.o.sb, o_sh = p.o.sh, o_ss = p.o.ss;
    int seqlen_q = p.seq.seqlen_q;
    const int hdim_q = p.hdim_q, hdim_v = p.hdim_v;
    const int* __restrict__ cu_seqlens_q = p.seq.cu_seqlens_q;
    float* __restrict__ dq_acc = p.dq_acc;
    const int lane = lane_of(threadIdx.x), warp = warp_of(threadIdx.x);
    const int i = blockIdx.x * ROWS + warp, h = blockIdx.y, b = blockIdx.z;
    const int pitch = seqlen_q;  // group mode: max_seqlen_q, the row pitch of D
    if (cu_seqlens_q) {
        const int tq = varlen_start(cu_seqlens_q, b, seqlen_q);
        dout += tq * do_ss;
        o += tq * o_ss;
    }
    if (i >= seqlen_q) return;
    const uint16_t* dr = dout + b * do_sb + h * do_sh + (index_t)i * do_ss;
    const uint16_t* orow = o + b * o_sb + h * o_sh + (index_t)i * o_ss;
    float acc = 0.f;
    for (int c = lane * 8; c < hdim_v; c += 8 * WARP_LANES) {
        const uint4 x = *reinterpret_cast<const uint4*>(dr + c);
        const uint4 y = *reinterpret_cast<const uint4*>(orow + c);
        const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            acc += to_float(xs[e] & 0xffff) * to_float(ys[e] & 0xffff);
            acc += to_float(xs[e] >> 16) * to_float(ys[e] >> 16);
        }
    }
    acc = warp_reduce_sum(acc);
    const index_t row = ((index_t)b * gridDim.y + h) * pitch + i;
    if (lane == 0) delta[row] = acc;
    if (dq_acc) {  // row i of the workspace (tiled: rows < seqlen_q are a prefix of the tiles)
        const int dq_cols = p.dq_cols;
        float* dq_row = dq_acc + (((index_t)b * gridDim.y + h) * p.dq_pitch + i) * dq_cols;
        for (int c = lane * 4; c < dq_cols; c += 4 * WARP_LANES)  // a multiple of 8: 16-byte stores
            *reinterpret_cast<float4*>(dq_row + c) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

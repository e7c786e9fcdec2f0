// Dropout keep mask, for callers that want it (attention_forward(..., return_dropout_mask=True))
// and for tests: keep[b, h, i, j] = 1 iff the attention kernels keep element (b, h, i, j). It
// calls the same Philox function (philox.cuh, Dropout::keep16) with the same keying as the forward
// and backward kernels, so the mask is exactly the one they apply.
//
// One thread per (query row, group of 8 keys): the 4 calls that hold its keys' draws (2 of each
// call's 16 used: the mask is a debugging and test aid, not a hot path), up to 8 bytes written.
// Grid (ceil(seqlen_q * ceil(seqlen_k / 8) / NTHREADS), nhead_q, batch), block NTHREADS (256).
// keep: uint8 (0/1; a bool array) [batch, nhead_q, seqlen_q, seqlen_k], contiguous.
#include "common.cuh"
#include "philox.cuh"
#include "params.cuh"

using namespace fmha;

extern "C" __global__ void __launch_bounds__(NTHREADS)
fmha_dropout_mask(const __grid_constant__ DropoutMaskParams p) {
    unsigned char* __restrict__ keep = p.keep;
    const int seqlen_q = p.seqlen_q, seqlen_k = p.seqlen_k;
    const int h = blockIdx.y, b = blockIdx.z, nhead_q = gridDim.y;
    const int groups = (seqlen_k + 7) >> 3;
    const long long c = (long long)blockIdx.x * NTHREADS + threadIdx.x;
    if (c >= (long long)seqlen_q * groups) return;
    const int i = (int)(c / groups), jg = (int)(c % groups);
    const Dropout drop = make_dropout(p.dropout.seed, p.dropout.offset, b, nhead_q, h, p.dropout.keep_threshold, 1.f);
    // key 8 jg + 2u + e is draw 8 ((i >> 3) & 1) + 2 (jg & 3) + e of call 4 (jg >> 2) + u (philox.cuh)
    const int shift = 8 * ((i >> 3) & 1) + 2 * (jg & 3);
    unsigned char* row = keep + (((index_t)b * nhead_q + h) * seqlen_q + i) * (index_t)seqlen_k;
#pragma unroll 1
    for (int u = 0; u < 4; ++u) {
        const uint32_t bits = drop.keep16(i & ~8, 4 * (jg >> 2) + u) >> shift;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int j = jg * 8 + 2 * u + e;
            if (j < seqlen_k) row[j] = (unsigned char)((bits >> e) & 1u);
        }
    }
}

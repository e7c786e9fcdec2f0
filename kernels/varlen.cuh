// Group mode ("varlen"): sequences packed along the token axis; sequence b owns tokens
// [cu_seqlens[b], cu_seqlens[b + 1]) of its tensor. A null cu_seqlens pointer means batch mode.
//
// Conventions shared by every kernel (cupy_fmha/api.py sets the arguments accordingly):
//   * the seqlen_q / seqlen_k fields of SeqArg (params.cuh) carry max_seqlen_q / max_seqlen_k: the pitch of
//     the [batch, nhead_q, max_seqlen_q] rows of LSE, D and the dQ workspace, and the grid size;
//   * batch strides of token-indexed tensors are 0; the kernel moves each such pointer by
//     cu_seqlens[b] rows (token offset = cu[b] * seq stride);
//   * after that the kernel works with the sequence's own lengths and local (per-sequence) row
//     and column indices everywhere: masks, ALiBi, and whatever else keys on (b, h, i, j);
//   * CTAs whose block starts past their sequence's end exit before any barrier (the ws forward with ALIGN_END
//     skips, in both its producer and its MMA warpgroups, the row blocks wholly before its sequence's start).
// No architecture-specific code here.
#pragma once
#include "common.cuh"

// "Unlimited" window edge, as cupy_fmha/launch.py's WINDOW_INF.
#define FMHA_WINDOW_INF (1 << 30)

namespace fmha {

// First token of sequence b; seqlen becomes its length. cu must be non-null.
__device__ __forceinline__ int varlen_start(const int* cu, int b, int& seqlen) {
    const int start = cu[b];
    seqlen = cu[b + 1] - start;
    return start;
}

__device__ __forceinline__ int clamp_window_edge(long long v) {
    return (int)max(min(v, (long long)FMHA_WINDOW_INF), -(long long)FMHA_WINDOW_INF);
}

// A window given in top-left form (y, x) -> the window of a sequence of these lengths. With
// bottom_right, y gains seqlen_q - seqlen_k and x gains seqlen_k - seqlen_q (MaskSpec.window in
// mask.py); unlimited edges (|v| >= FMHA_WINDOW_INF) stay unlimited, others are clamped so that
// q0 + x and k0 + y cannot overflow.
__device__ __forceinline__ void window_for_sequence(int& y, int& x, int bottom_right, int seqlen_q, int seqlen_k) {
    if (!bottom_right) return;
    const long long d = (long long)seqlen_q - seqlen_k;
    if (y < FMHA_WINDOW_INF && y > -FMHA_WINDOW_INF) y = clamp_window_edge(y + d);
    if (x < FMHA_WINDOW_INF && x > -FMHA_WINDOW_INF) x = clamp_window_edge(x - d);
}

// A pointer to fp32 (fp32 != 0) or 16-bit elements, moved by n elements.
__device__ __forceinline__ void* advance_elems(void* p, int fp32, index_t n) {
    return fp32 ? static_cast<void*>(static_cast<float*>(p) + n) : static_cast<void*>(static_cast<uint16_t*>(p) + n);
}

// Forward: LSE rows [max(q0, seqlen_q), min(q0 + m, pitch)) of one (b, h) row, i.e. the rows of
// this CTA's block that lie beyond the sequence, are -inf.
__device__ __forceinline__ void lse_fill_tail(float* lse_row, int q0, int m, int seqlen_q, int pitch, int tid,
                                              int nthreads) {
    const int end = min(q0 + m, pitch);
    for (int i = max(q0, seqlen_q) + tid; i < end; i += nthreads) lse_row[i] = -FMHA_INF;
}

}  // namespace fmha

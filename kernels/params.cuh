// Kernel parameters: one struct per kernel pass, passed by value, composed of small feature
// groups (as CK's Kargs and FlashAttention's Params are). This header is the only declaration;
// cupy_fmha/params.py mirrors it as NumPy structured dtypes (the Python side builds one
// one-element array per launch), and tests/test_params_layout.py compiles static_asserts
// generated from those dtypes against this header, so the two layouts cannot drift apart.
//
// Rules that keep the mirror simple: fields are 8-byte pointers / 64-bit integers first, then
// 4-byte ints and floats, padded by hand to a multiple of 8 bytes (no implicit padding anywhere).
// Plain C++ (no CUDA keywords), so the layout test compiles it on the host too.
#pragma once
#include "types.cuh"

namespace fmha {

// A strided 16-bit (or, for workspaces, fp32) tensor: element (b, h, s, :) at
// ptr + b * sb + h * sh + s * ss (strides in elements). Group mode: sb = 0 and s counts packed
// tokens (the kernels move ptr by cu_seqlens[b] rows).
struct TensorArg {
    void* ptr;
    index_t sb, sh, ss;
};

// Sequence lengths. Batch mode: cu_seqlens_* are null and seqlen_* are the lengths. Group mode
// (varlen.cuh): cu_seqlens_* are int32 [batch + 1] offsets and seqlen_* the max lengths (the row
// pitch of LSE, D and the dQ workspace).
struct SeqArg {
    const int* cu_seqlens_q;
    const int* cu_seqlens_k;
    int seqlen_q, seqlen_k;
};

// CK's generic window (common.cuh Window), in top-left form; bottom_right = 1 shifts it by each
// sequence's own lengths (group mode, window_for_sequence in varlen.cuh).
struct MaskArg {
    int win_y, win_x, bottom_right, pad_;
};

// ALiBi slopes, float32 [nhead_q] (sb = 0) or [batch, nhead_q] (sb = nhead_q); read only by
// ALIBI=1 instances.
struct AlibiArg {
    const float* slopes;
    index_t sb;
};

// Elementwise bias broadcastable to [batch, nhead_q, seqlen_q, seqlen_k], element strides (0
// along broadcast dimensions); kind 1 fp16, 2 bf16, 3 fp32, 0 none. Read only by BIAS=1 instances.
struct BiasArg {
    const void* ptr;
    index_t sb, sh, sq, sk;
    int kind;
    // the backward's dS store for dBias (dbias_acc): 0 fp32 (the workspace the host reduces, or dBias
    // itself for an fp32 bias), 1 fp16 / 2 bf16 (dBias itself, a bias that broadcasts along nothing),
    // DS_KIND_TMA (dBias itself in the inputs' 16-bit dtype, stored by the ws backward's BIAS build
    // from its dS tile in shared memory through its 6th tensor map; set only for that build)
    int ds_kind;
};
enum : int { DS_KIND_TMA = 3 };

// Philox dropout (philox.cuh): keep iff 8 random bits < keep_threshold (0..256); rp_keep = 256 / keep_threshold.
// Read only by DROPOUT=1 instances.
struct DropoutArg {
    unsigned long long seed, offset;
    unsigned int keep_threshold;
    float rp_keep;
};

// fmha_fwd / fmha_fwd_sm90: O = softmax(scale * Q K^T (+ bias | ALiBi), masked) V, LSE.
struct FwdParams {
    TensorArg q, k, v, o;
    float* lse;  // [batch, nhead_q, seqlen_q] (group mode: max_seqlen_q)
    SeqArg seq;
    int hdim_q, hdim_v, group;  // group = nhead_q / nhead_k
    float scale_log2;           // softmax_scale * log2(e)
    MaskArg mask;
    AlibiArg alibi;
    BiasArg bias;
    DropoutArg dropout;
};

// fmha_bwd_dot_do_o: D = rowsum(dO * O); also zero-fills the atomic-mode dQ workspace.
struct DotDoOParams {
    TensorArg dout, o;
    float* delta;   // [batch, nhead_q, seqlen_q]
    float* dq_acc;  // fp32 dQ workspace to zero-fill, or null: [batch, nhead_q, dq_pitch, dq_cols]
    SeqArg seq;     // cu_seqlens_k, seqlen_k unused
    int hdim_q, hdim_v;
    int dq_pitch, dq_cols;  // rows per (batch, head) and floats per row of dq_acc (seqlen_q and hdim_q, or tiled)
};

// fmha_bwd_dq_dk_dv / fmha_bwd_dq_dk_dv_sm90: dQ (into dq_acc), dK, dV.
struct BwdParams {
    TensorArg q, k, v, dout;
    TensorArg dk, dv;          // 16-bit outputs, or fp32 [batch, nhead_q, seqlen_k, hdim] workspaces (dkdv_fp32)
    const float* lse;          // [batch, nhead_q, seqlen_q]
    const float* delta;        // D, same shape
    float* dq_acc;             // fp32 dQ workspace (see the kernels)
    void* dbias_acc;           // dS for dBias [batch, nhead_q, seqlen_q, seqlen_k] (bias.ds_kind: its type), or null
                               // (also with ds_kind DS_KIND_TMA: dBias through the ws kernel's tensor map)
    int* dq_sem;               // deterministic dQ by ordered adds: int32 [batch, nhead_q, query tiles], zeros; or null
    index_t dq_split_stride;   // elements between dQ slabs (deterministic mode), 0: atomic adds
    SeqArg seq;
    int hdim_q, hdim_v, group, dkdv_fp32;
    float scale_log2, scale;   // softmax_scale * log2(e), softmax_scale
    MaskArg mask;
    AlibiArg alibi;
    BiasArg bias;
    DropoutArg dropout;
};

// fmha_bwd_convert_dq: out = cast(scale * sum acc) (dQ, or the GQA group sums of dK / dV).
struct ConvertParams {
    const float* acc;          // fp32 [(nsplit,) batch, nhead_out * nsum, acc_pitch, acc_cols]
    TensorArg out;             // 16-bit output, head count nhead_out
    index_t split_stride;      // elements between dQ slabs (DQ_SPLIT=1)
    SeqArg seq;                // seqlen_q: rows of acc (and of out); seqlen_k: keys (DQ_SPLIT=1)
    int hdim, nsum, nsplit, block_n, block_m;
    int acc_pitch, acc_cols, acc_tiled;  // rows per (batch, head), floats per row of acc; 1, 2: chunks as dq_tile_chunk of that kind
    float scale;
    int pad_;
    MaskArg mask;              // the dq_dk_dv window (DQ_SPLIT=1)
};

// fmha_dropout_mask: the keep mask as bytes [batch, nhead_q, seqlen_q, seqlen_k].
struct DropoutMaskParams {
    unsigned char* keep;
    int seqlen_q, seqlen_k;
    DropoutArg dropout;
};

}  // namespace fmha

// The backward's main kernels take BwdParams flattened into separate arguments (the fields in
// order, group names joined by '_') and rebuild the struct locally. Measured on the H200 (bench/
// NOTES.md, issue 9): taking the struct itself by value made fmha_bwd_dq_dk_dv_sm90 10% slower
// (9.72 against 8.79 ms, fp16 hdim 128 seqlen 8192), with or without __grid_constant__; with
// the same fields as separate kernel parameters it runs as before. cupy_fmha/params.py flattens
// the NumPy mirror the same way (flat_args); tests/test_params_layout.py checks the two lists.
#define FMHA_BWD_PARAMS_ARGS \
    void* q_ptr,\
    index_t q_sb,\
    index_t q_sh,\
    index_t q_ss,\
    void* k_ptr,\
    index_t k_sb,\
    index_t k_sh,\
    index_t k_ss,\
    void* v_ptr,\
    index_t v_sb,\
    index_t v_sh,\
    index_t v_ss,\
    void* dout_ptr,\
    index_t dout_sb,\
    index_t dout_sh,\
    index_t dout_ss,\
    void* dk_ptr,\
    index_t dk_sb,\
    index_t dk_sh,\
    index_t dk_ss,\
    void* dv_ptr,\
    index_t dv_sb,\
    index_t dv_sh,\
    index_t dv_ss,\
    const float* lse,\
    const float* delta,\
    float* dq_acc,\
    void* dbias_acc,\
    int* dq_sem,\
    index_t dq_split_stride,\
    const int* seq_cu_seqlens_q,\
    const int* seq_cu_seqlens_k,\
    int seq_seqlen_q,\
    int seq_seqlen_k,\
    int hdim_q,\
    int hdim_v,\
    int group,\
    int dkdv_fp32,\
    float scale_log2,\
    float scale,\
    int mask_win_y,\
    int mask_win_x,\
    int mask_bottom_right,\
    int mask_pad_,\
    const float* alibi_slopes,\
    index_t alibi_sb,\
    const void* bias_ptr,\
    index_t bias_sb,\
    index_t bias_sh,\
    index_t bias_sq,\
    index_t bias_sk,\
    int bias_kind,\
    int bias_ds_kind,\
    unsigned long long dropout_seed,\
    unsigned long long dropout_offset,\
    unsigned int dropout_keep_threshold,\
    float dropout_rp_keep
#define FMHA_BWD_PARAMS_STRUCT \
    BwdParams{TensorArg{q_ptr, q_sb, q_sh, q_ss}, TensorArg{k_ptr, k_sb, k_sh, k_ss}, TensorArg{v_ptr, v_sb, v_sh, v_ss}, TensorArg{dout_ptr, dout_sb, dout_sh, dout_ss}, TensorArg{dk_ptr, dk_sb, dk_sh, dk_ss}, TensorArg{dv_ptr, dv_sb, dv_sh, dv_ss}, lse, delta, dq_acc, dbias_acc, dq_sem, dq_split_stride, SeqArg{seq_cu_seqlens_q, seq_cu_seqlens_k, seq_seqlen_q, seq_seqlen_k}, hdim_q, hdim_v, group, dkdv_fp32, scale_log2, scale, MaskArg{mask_win_y, mask_win_x, mask_bottom_right, mask_pad_}, AlibiArg{alibi_slopes, alibi_sb}, BiasArg{bias_ptr, bias_sb, bias_sh, bias_sq, bias_sk, bias_kind, bias_ds_kind}, DropoutArg{dropout_seed, dropout_offset, dropout_keep_threshold, dropout_rp_keep}}

// Per-block state: what every mainloop needs, built once per CTA from the kernel's parameter
// struct (params.cuh), for the mma.sync and the wgmma kernels alike: this sequence's lengths
// (group mode: varlen.cuh), the pointers of this batch / head (moved by cu_seqlens in group
// mode), the resolved mask window and the block range it lets this CTA see, the ALiBi, bias and
// dropout state, and the row pitch of LSE / D / the dQ workspace. The kernels keep only their
// mainloops and epilogues. No architecture-specific code here.
#pragma once
#include "common.cuh"
#include "params.cuh"
#include "varlen.cuh"
#include "attention.cuh"
#include "philox.cuh"

namespace fmha {

// Forward: the CTA of query rows [q0, q0 + M) of head h of sequence b (M = BLOCK_M, N = BLOCK_N,
// NT threads).
struct FwdBlock {
    const uint16_t* qg;  // Q rows of (b, h), K and V rows of (b, h / group)
    const uint16_t* kg;
    const uint16_t* vg;
    int seqlen_q, seqlen_k;  // this sequence's lengths
    int lse_pitch;           // row pitch of LSE (group mode: the max length)
    Window win;
    Alibi alibi;
    ElemBias bias;
    Dropout drop;
    int kb_begin, kb_end;  // key blocks these rows can see (none: O = 0, LSE = -inf)
};

// False when the CTA has nothing to do (group mode: its rows lie past its sequence; it has
// written their LSE rows, -inf, and must exit before any barrier).
template <int M, int N, int NT>
__device__ __forceinline__ bool fwd_block_state(const FwdParams& p, int b, int h, int q0, int tid, FwdBlock& s) {
    const int hk = h / p.group;
    const uint16_t* q = static_cast<const uint16_t*>(p.q.ptr);
    const uint16_t* k = static_cast<const uint16_t*>(p.k.ptr);
    const uint16_t* v = static_cast<const uint16_t*>(p.v.ptr);
    int seqlen_q = p.seq.seqlen_q, seqlen_k = p.seq.seqlen_k;
    s.lse_pitch = seqlen_q;
    if (p.seq.cu_seqlens_q) {
        const int tq = varlen_start(p.seq.cu_seqlens_q, b, seqlen_q), tk = varlen_start(p.seq.cu_seqlens_k, b, seqlen_k);
        q += tq * p.q.ss;
        k += tk * p.k.ss;
        v += tk * p.v.ss;
        lse_fill_tail(p.lse + ((index_t)b * gridDim.y + h) * s.lse_pitch, q0, M, seqlen_q, s.lse_pitch, tid, NT);
        if (q0 >= seqlen_q) return false;
    }
    int win_y = p.mask.win_y, win_x = p.mask.win_x;
    window_for_sequence(win_y, win_x, p.mask.bottom_right, seqlen_q, seqlen_k);
    s.qg = q + b * p.q.sb + h * p.q.sh;
    s.kg = k + b * p.k.sb + hk * p.k.sh;
    s.vg = v + b * p.v.sb + hk * p.v.sh;
    s.seqlen_q = seqlen_q;
    s.seqlen_k = seqlen_k;
    s.win = Window{win_y, win_x};
    s.alibi = make_alibi(p.alibi.slopes, p.alibi.sb, b, h, seqlen_q, seqlen_k);
    s.bias = make_bias(p.bias.ptr, p.bias.kind, p.bias.sb, p.bias.sh, p.bias.sq, p.bias.sk, b, h, seqlen_q, seqlen_k);
    s.drop = make_dropout(p.dropout.seed, p.dropout.offset, b, gridDim.y, h, p.dropout.keep_threshold,
                          p.dropout.rp_keep);
    key_block_range(s.win, q0, M, N, seqlen_q, seqlen_k, s.kb_begin, s.kb_end);
    return true;
}

// Forward epilogue: the LSE row of (b, h) and the O rows of (b, h). Group mode moves O by the
// sequence's first token only here, so the offset is not kept live through the mainloop.
__device__ __forceinline__ float* fwd_lse_row(const FwdParams& p, int b, int h, int lse_pitch) {
    return p.lse + ((index_t)b * gridDim.y + h) * lse_pitch;
}
__device__ __forceinline__ uint16_t* fwd_out_rows(const FwdParams& p, int b, int h) {
    uint16_t* og = static_cast<uint16_t*>(p.o.ptr) + b * p.o.sb + h * p.o.sh;
    if (p.seq.cu_seqlens_q) og += (index_t)p.seq.cu_seqlens_q[b] * p.o.ss;
    return og;
}

// Whether the forward stores query row i of a sequence of seqlen_q rows: one before its end, and with ALIGN_END (the
// ws forward's row blocks counted back from the end, fmha_fwd_sm90_ws.cu) not one before its start either.
__device__ __forceinline__ bool row_stored(int i, int seqlen_q) {
    if constexpr (ALIGN_END)
        return static_cast<unsigned>(i) < static_cast<unsigned>(seqlen_q);
    else
        return i < seqlen_q;
}

// Forward epilogue of a warp's rows row0 + f.row(e) (NO n8 tiles of O): 1/l and LSE from the
// running max and sum (finish_rows), then O in the input dtype and the LSE row, rows past the
// sequence skipped (and with ALIGN_END those before it).
template <int NO>
__device__ __forceinline__ void fwd_store_rows(const FwdParams& p, const FwdBlock& blk, int b, int h, int row0,
                                               const float* acc_o, const float row_max[2], const float row_sum[2],
                                               const AccFrag& f) {
    float* lse_g = fwd_lse_row(p, b, h, blk.lse_pitch);
    uint16_t* og = fwd_out_rows(p, b, h);
    float inv[2], row_lse[2];
    finish_rows(row_max, row_sum, inv, row_lse, blk.drop, f);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int i = row0 + f.row(2 * r);
        if (row_stored(i, blk.seqlen_q)) {
            if (f.row_leader()) lse_g[i] = row_lse[r];
            uint16_t* orow = og + (index_t)i * p.o.ss;
#pragma unroll
            for (int n = 0; n < NO; ++n) {
                const int col = f.col(n, 0);
                if (col < p.hdim_v)
                    *reinterpret_cast<uint32_t*>(orow + col) = pack2(acc_o[4 * n + 2 * r] * inv[r], acc_o[4 * n + 2 * r + 1] * inv[r]);
            }
        }
    }
}

// Optional parts at the end of a kernel's shared-memory layout (the dropout keep bits of the
// backward kernels, the sm90 backward's dQ staging block): bases of the layout struct, empty (no
// bytes) when unused, so sizeof(layout) is what the launcher passes. Kernels address them by
// constant offsets from their extern __shared__ array (smem_raw + sizeof(the tiles) + ...), not
// as members: reached through a base-class subobject the compiler lost the shared address space
// and issued generic loads and stores (LD/ST.E instead of LDS/STS; bench/NOTES.md step 19).
template <int N> struct KeepBitsSmem { unsigned char keep[N]; };
template <> struct KeepBitsSmem<0> {};

// Backward (dq_dk_dv): the CTA of keys [k0, k0 + N) (key block kb) of query head h of sequence b
// (query blocks of M rows).
struct BwdBlock {
    const uint16_t* qg;   // Q and dO rows of (b, h)
    const uint16_t* dog;
    const uint16_t* kg;   // K and V rows of (b, h / group)
    const uint16_t* vg;
    void* dk;             // dK / dV outputs, moved by the sequence's first key (group mode)
    void* dv;
    const float* lse_g;   // LSE and D rows of (b, h)
    const float* d_g;
    float* dq_g;          // dQ workspace rows of (b, h) (deterministic mode: in slab kb)
    index_t bh;           // b * nhead_q + h
    int hk;               // K/V head (h / group)
    int seqlen_q, seqlen_k;  // this sequence's lengths
    int pitch_q, pitch_k;    // row pitches of LSE, D, dQ and the dS workspace (the max lengths)
    Window win;
    Alibi alibi;
    ElemBias bias;
    Dropout drop;
    int qb_begin, qb_end;  // query blocks that can see this key block
};

// False when the CTA has nothing to do (group mode: its keys lie past its sequence).
template <int M, int N>
__device__ __forceinline__ bool bwd_block_state(const BwdParams& p, int b, int h, int nhead_q, int kb, int k0,
                                                BwdBlock& s) {
    const int hk = h / p.group;
    const uint16_t* q = static_cast<const uint16_t*>(p.q.ptr);
    const uint16_t* dout = static_cast<const uint16_t*>(p.dout.ptr);
    const uint16_t* k = static_cast<const uint16_t*>(p.k.ptr);
    const uint16_t* v = static_cast<const uint16_t*>(p.v.ptr);
    void* dk = p.dk.ptr;
    void* dv = p.dv.ptr;
    int seqlen_q = p.seq.seqlen_q, seqlen_k = p.seq.seqlen_k;
    s.pitch_q = seqlen_q;
    s.pitch_k = seqlen_k;
    if (p.seq.cu_seqlens_q) {
        const int tq = varlen_start(p.seq.cu_seqlens_q, b, seqlen_q), tk = varlen_start(p.seq.cu_seqlens_k, b, seqlen_k);
        if (k0 >= seqlen_k) return false;
        q += tq * p.q.ss;
        dout += tq * p.dout.ss;
        k += tk * p.k.ss;
        v += tk * p.v.ss;
        dk = advance_elems(dk, p.dkdv_fp32, tk * p.dk.ss);
        dv = advance_elems(dv, p.dkdv_fp32, tk * p.dv.ss);
    }
    int win_y = p.mask.win_y, win_x = p.mask.win_x;
    window_for_sequence(win_y, win_x, p.mask.bottom_right, seqlen_q, seqlen_k);
    s.win = Window{win_y, win_x};
    s.alibi = make_alibi(p.alibi.slopes, p.alibi.sb, b, h, seqlen_q, seqlen_k);
    s.bias = make_bias(p.bias.ptr, p.bias.kind, p.bias.sb, p.bias.sh, p.bias.sq, p.bias.sk, b, h, seqlen_q, seqlen_k);
    s.drop = make_dropout(p.dropout.seed, p.dropout.offset, b, nhead_q, h, p.dropout.keep_threshold,
                          p.dropout.rp_keep);
    s.qg = q + b * p.q.sb + h * p.q.sh;
    s.dog = dout + b * p.dout.sb + h * p.dout.sh;
    s.hk = hk;
    s.dk = dk;
    s.dv = dv;
    s.bh = (index_t)b * nhead_q + h;
    s.lse_g = p.lse + s.bh * s.pitch_q;
    s.d_g = p.delta + s.bh * s.pitch_q;
    if constexpr (DQ_TILED)  // whole tiles of M rows and HDIM_Q columns (common.cuh)
        s.dq_g = p.dq_acc + kb * p.dq_split_stride + s.bh * (index_t)((s.pitch_q + M - 1) / M * M) * HDIM_Q;
    else
        s.dq_g = p.dq_acc + kb * p.dq_split_stride + s.bh * s.pitch_q * p.hdim_q;  // slab kb (deterministic)
    s.seqlen_q = seqlen_q;
    s.seqlen_k = seqlen_k;
    query_block_range(s.win, k0, N, M, seqlen_q, seqlen_k, s.qb_begin, s.qb_end);
    // K/V last, right before the kernel loads them (computed earlier, hdim 96 spilled on sm80)
    s.kg = k + b * p.k.sb + hk * p.k.sh;
    s.vg = v + b * p.v.sb + hk * p.v.sh;
    return true;
}

// Backward with dBias: dS^T of keys key0.. x query rows q0.. into the plane of (b, h) of dbias_acc:
// the fp32 workspace, or dBias itself in the bias's dtype (p.bias.ds_kind).
template <int NQ>
__device__ __forceinline__ void bwd_store_ds(const BwdParams& p, const BwdBlock& s, const float* ds, int key0, int q0,
                                             const AccFrag& f) {
    const int kind = p.bias.ds_kind;
    void* plane = static_cast<char*>(p.dbias_acc) + s.bh * s.pitch_q * s.pitch_k * (kind ? 2 : 4);
    store_ds<NQ>(ds, plane, kind, s.pitch_k, key0, q0, f, s.seqlen_q, s.seqlen_k);
}

// Backward epilogue: dK (times softmax_scale) and dV of this thread's keys (key0 + f.row(e)) into the
// outputs (input dtype, K/V head hk = h / group) or, for GQA, the fp32 workspaces of query head h.
// The caller passes hk: the sm90 kernel keeps BwdBlock::hk (recomputing it here, with the
// accumulators live, spilled its dropout instances), the sm80 kernel recomputes it (keeping it
// live through the mainloop spilled hdim 64 with dropout).
template <int NDK, int NDV>
__device__ __forceinline__ void bwd_store_dk_dv(const BwdParams& p, const BwdBlock& s, int b, int h, int hk,
                                                const float* acc_dk, const float* acc_dv, int key0, const AccFrag& f,
                                                int dk_col0, int dv_col0) {
    store_dk_dv<NDK, NDV>(acc_dk, acc_dv, p.scale, key0, f, s.seqlen_k, p.hdim_q, p.hdim_v, dk_col0, dv_col0,
                          p.dkdv_fp32, s.dk, s.dv, b, p.dkdv_fp32 ? h : hk, p.dk.sb, p.dk.sh, p.dk.ss,
                          p.dv.sb, p.dv.sh, p.dv.ss);
}

}  // namespace fmha

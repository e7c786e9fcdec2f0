// Dropout's random numbers: Philox-4x32 (Salmon et al., SC'11) with 7 rounds, as the dropout of
// FlashAttention-2 and of CK (ck_tile's philox) uses it (bench/NOTES.md step 73; the paper's
// crush-resistant round count; 10 is its default with a safety margin), and the keep test,
// bit-exact with the host replica cupy_fmha/philox.py (whose docstring is the specification).
// Plain C++ (no PTX): one 32x32 -> 64-bit product per word pair through __umulhi and a plain
// multiply.
//
// Keying, for the attention element (b, h, i, j) -- b the batch index (the sequence index in
// varlen mode), h the query head, i the query row and j the key column, both local to the
// sequence (bench/NOTES.md step 96; cupy_fmha/philox.py's docstring is the specification):
//     key     = (seed lo, seed hi)
//     t       = offset + b * nhead_q + h                            (64-bit, wrapping)
//     counter = (4 (j >> 5) + ((j >> 1) & 3), i & ~8, t lo, t hi)
//     draw    = 8 ((i >> 3) & 1) + 2 ((j >> 3) & 3) + (j & 1)        (byte k of word w is draw 4 w + k)
// One call serves rows ip and ip + 8 (ip = i & ~8, the call's "row pair") and the keys
// 32 s + 8 m + 2 u + e (m = 0..3, e = 0..1) of call index c = 4 s + u: the 16 scores one thread
// of an mma.sync / wgmma accumulator holds in a 16-row, 32-key span (rows g, g + 8; columns
// 8 m + 2 u + e for quad thread u), in the order the forward applies them, so that no bits move
// between threads. An element is kept iff its draw < threshold, threshold = floor((1 - p) * 256
// + 0.5) (256 keeps everything), and a kept element is scaled by rp_keep = 256 / threshold.
//
// Every dropout path calls these functions: the forward kernels (keep16 through
// AccFrag::fwd_keep_words; the warp-specialized forward keep_msb through AccFrag::fwd_keep_msb), the backward kernels (fill_keep_words into a word tile in shared
// memory, read by AccFrag::keep_bit) and the keep-mask kernel fmha_dropout_mask.cu.
#pragma once
#include "common.cuh"

namespace fmha {

// The rounds of the dropout generator (an enumerator: a namespace-scope constant would be emitted
// as a global into every instance).
enum : int { DROPOUT_PHILOX_ROUNDS = 7 };

// Philox-4x32 with ROUNDS rounds of counter c under key (k0, k1).
template <int ROUNDS>
__device__ __forceinline__ uint4 philox4x32(uint4 c, uint32_t k0, uint32_t k1) {
    // local constants: namespace-scope ones would be emitted as globals into every instance
    constexpr uint32_t PHILOX_M0 = 0xD2511F53u, PHILOX_M1 = 0xCD9E8D57u;
    constexpr uint32_t PHILOX_W0 = 0x9E3779B9u, PHILOX_W1 = 0xBB67AE85u;
#pragma unroll
    for (int r = 0; r < ROUNDS; ++r) {
        if (r > 0) {
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        const uint32_t lo0 = PHILOX_M0 * c.x, hi0 = __umulhi(PHILOX_M0, c.x);
        const uint32_t lo1 = PHILOX_M1 * c.z, hi1 = __umulhi(PHILOX_M1, c.z);
        c = make_uint4(hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0);
    }
    return c;
}

// Dropout state of one (batch, query head): the Philox key, the high counter words, the keep
// threshold and rp_keep = 256 / threshold.
struct Dropout {
    uint32_t k0, k1;  // key: the seed
    uint32_t t0, t1;  // counter words 2, 3: offset + b * nhead_q + h
    uint32_t threshold;
    float rp_keep;

    // The call index of key j and the draw index of element (i, j) inside its call (see the keying above).
    __device__ __forceinline__ static int call_of(int j) { return 4 * (j >> 5) + ((j >> 1) & 3); }
    __device__ __forceinline__ static int draw_of(int i, int j) { return 8 * ((i >> 3) & 1) + 2 * ((j >> 3) & 3) + (j & 1); }
    // The 4 output words of call c of the row pair ip (ip = i & ~8: rows ip and ip + 8).
    __device__ __forceinline__ uint4 random16(int ip, int c) const {
        return philox4x32<DROPOUT_PHILOX_ROUNDS>(make_uint4((uint32_t)c, (uint32_t)ip, t0, t1), k0, k1);
    }
    // Keep bits of call c of row pair ip: bit d set iff draw d's element is kept. SWAR, per output
    // word x (draws 4w + k at byte k): with H the bytes' top bits and
    // t the threshold in every byte, d = (x | H) - (t & ~H) has bit 7 of byte k set iff the low 7
    // bits of x_k are >= those of t_k (no borrow crosses a byte), so x_k < t_k is bit 7 of
    // (~x & t) | (~(x ^ t) & ~d) (one LOP3). The four top bits then go to bits 28..31 by one
    // multiply by 2^0 + 2^7 + 2^14 + 2^21 (bit 7 + 21, 15 + 14, 23 + 7, 31 + 0; the other partial
    // products land on distinct bits below 28 or beyond 31, so nothing carries), and a shift puts
    // them at bits 4w..4w + 3 (bench/NOTES.md step 73: 4 + 2 operations a word, against 10 + 2
    // before). A threshold of 256 (nothing dropped) does not fit a byte: every bit set, or'd in
    // without a branch (an early return made the compiler keep a branch around every call and cost
    // the sm90 forward's key-block loop 110 instructions).
    __device__ __forceinline__ uint32_t keep16(int ip, int c) const { return keep_bits16(random16(ip, c), threshold); }
    // keep_bits16's byte compare of one output word x against `threshold` (< 256) without the
    // gathering: bit 7 of byte k is set iff x_k < threshold (the other bits are not defined). Three
    // operations a word (bench/NOTES.md step 96).
    __device__ __forceinline__ static uint32_t keep_msb_word(uint32_t x, uint32_t threshold) {
        constexpr uint32_t H = 0x80808080u;
        const uint32_t t = threshold * 0x01010101u, tl = t & ~H;
        const uint32_t d = (x | H) - tl;
        return (~x & t) | (~(x ^ t) & ~d);
    }
    // Call c of row pair ip as keep_msb_word of its four output words: bit 7 of byte k of word w is
    // the keep decision of draw 4w + k, for a caller that makes masks of the top bits itself
    // (AccFrag::keep_msb_apply). A threshold of 256 (nothing dropped) is not expressed: keep_all().
    __device__ __forceinline__ uint4 keep_msb(int ip, int c) const {
        const uint4 r = random16(ip, c);
        return make_uint4(keep_msb_word(r.x, threshold), keep_msb_word(r.y, threshold), keep_msb_word(r.z, threshold),
                          keep_msb_word(r.w, threshold));
    }
    // All ones when nothing is dropped (threshold 256), else 0: or'd into keep_msb's masks.
    __device__ __forceinline__ uint32_t keep_all() const { return threshold > 255u ? 0xffffffffu : 0u; }
    // Whether element (i, j) is kept (one call for one element: the cold paths).
    __device__ __forceinline__ bool keep(int i, int j) const { return (keep16(i & ~8, call_of(j)) >> draw_of(i, j)) & 1u; }
    // keep16's compare of the 16 draws in r against `threshold` (0..256), on its own for the tests
    // (tests/test_philox_cuh.py: every draw at every threshold in every byte position).
    __device__ __forceinline__ static uint32_t keep_bits16(const uint4& r, uint32_t threshold) {
        constexpr uint32_t H = 0x80808080u, G = 0x00204081u;
        auto top4 = [&](uint32_t x) {  // bits 28..31: x_k < t_k, k = 0..3 (below: garbage)
            return (keep_msb_word(x, threshold) & H) * G;
        };
        const uint32_t all = threshold > 255u ? 0xffffu : 0u;
        return (top4(r.x) >> 28) | (top4(r.y) >> 28 << 4) | (top4(r.z) >> 28 << 8) | (top4(r.w) >> 28 << 12) | all;
    }
};

__device__ __forceinline__ Dropout make_dropout(unsigned long long seed, unsigned long long offset, int b,
                                                int nhead_q, int h, uint32_t threshold, float rp_keep) {
    const unsigned long long t = offset + (unsigned long long)b * (unsigned long long)nhead_q + (unsigned long long)h;
    return Dropout{(uint32_t)seed, (uint32_t)(seed >> 32), (uint32_t)t, (uint32_t)(t >> 32), threshold, rp_keep};
}

// The backward's keep bits of the tile [q0, q0 + M) x [k0, k0 + N) (q0 a multiple of 16, k0 of 32),
// computed cooperatively by NT threads, one Philox call per (row pair, call): the word tile
// words[c * (M / 2) + P] = keep16(q0 + 16 (P >> 3) + (P & 7), 4 (k0 >> 5) + c), c = 0 .. N / 8 - 1
// (the tile's calls), P = 0 .. M / 2 - 1 (its row pairs), M N / 8 bytes. Element (il, jl) of the tile
// is bit draw_of(il, jl) of word [call_of(jl)][8 (il >> 4) + (il & 7)] (keep_word_bit; the
// architecture layer's AccFrag::keep_bit reads its own elements).
template <int M, int N, int NT>
__device__ __forceinline__ void fill_keep_words(uint16_t* words, const Dropout& d, int q0, int k0, int tid) {
    static_assert(M % 16 == 0 && N % 32 == 0, "fill_keep_words: whole row pairs of 16-row tiles, whole 32-key calls");
    constexpr int CALLS = (M / 2) * (N / 8);
#pragma unroll 1  // one Philox chain at a time: the callers run at their register limit
    for (int s = 0; s < (CALLS + NT - 1) / NT; ++s) {
        const int x = tid + s * NT;
        if (CALLS % NT == 0 || x < CALLS) {
            const int P = x % (M / 2), c = x / (M / 2);
            words[x] = (uint16_t)d.keep16(q0 + 16 * (P >> 3) + (P & 7), 4 * (k0 >> 5) + c);
        }
    }
}
// Element (il, jl) (inside the tile) of fill_keep_words' tile of M query rows, by the keying's formula.
__device__ __forceinline__ bool keep_word_bit(const uint16_t* words, int M, int il, int jl) {
    return (words[Dropout::call_of(jl) * (M / 2) + 8 * (il >> 4) + (il & 7)] >> Dropout::draw_of(il, jl)) & 1u;
}

}  // namespace fmha

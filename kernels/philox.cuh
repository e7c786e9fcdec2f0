// Dropout's random numbers: Philox-4x32 (Salmon et al., SC'11) with 7 rounds, as the dropout of
// FlashAttention-2 and of CK (ck_tile's philox) uses it (bench/NOTES.md step 73; the paper's
// crush-resistant round count; 10 is its default with a safety margin), and the keep test,
// bit-exact with the host replica cupy_fmha/philox.py (whose docstring is the specification).
// Plain C++ (no PTX): one 32x32 -> 64-bit product per word pair through __umulhi and a plain
// multiply.
//
// Keying, for the attention element (b, h, i, j) -- b the batch index (the sequence index in
// varlen mode), h the query head, i the query row and j the key column, both local to the
// sequence:
//     key     = (seed lo, seed hi)
//     t       = offset + b * nhead_q + h            (64-bit, wrapping)
//     counter = (j >> 4, i, t lo, t hi)
// One call gives 16 uint8 draws u[0..15] for the columns 16 * (j >> 4) + 0..15 (byte k of word w
// is u[4 w + k]); an element is kept iff u[j & 15] < threshold, threshold = floor((1 - p) * 256
// + 0.5) (256 keeps everything), and a kept element is scaled by rp_keep = 256 / threshold.
//
// Every dropout path calls these functions: the forward kernels (keep16 through
// AccFrag::row_keep_bits), the backward kernels (keep16 into a per-tile bit mask in shared memory,
// or through AccFrag::keep_bits_t) and the keep-mask kernel fmha_dropout_mask.cu (keep8).
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

    // The 4 output words for query row i and key group jg16 (keys 16 jg16 .. 16 jg16 + 15).
    __device__ __forceinline__ uint4 random16(int i, int jg16) const {
        return philox4x32<DROPOUT_PHILOX_ROUNDS>(make_uint4((uint32_t)jg16, (uint32_t)i, t0, t1), k0, k1);
    }
    // Keep bits of keys 16 jg16 + c, c = 0..15, for query row i: bit c set iff key 16 jg16 + c is
    // kept. SWAR, per output word x (draws of keys 4w + k at byte k): with H the bytes' top bits and
    // t the threshold in every byte, d = (x | H) - (t & ~H) has bit 7 of byte k set iff the low 7
    // bits of x_k are >= those of t_k (no borrow crosses a byte), so x_k < t_k is bit 7 of
    // (~x & t) | (~(x ^ t) & ~d) (one LOP3). The four top bits then go to bits 28..31 by one
    // multiply by 2^0 + 2^7 + 2^14 + 2^21 (bit 7 + 21, 15 + 14, 23 + 7, 31 + 0; the other partial
    // products land on distinct bits below 28 or beyond 31, so nothing carries), and a shift puts
    // them at bits 4w..4w + 3 (bench/NOTES.md step 73: 4 + 2 operations a word, against 10 + 2
    // before). A threshold of 256 (nothing dropped) does not fit a byte: every bit set, or'd in
    // without a branch (an early return made the compiler keep a branch around every call and cost
    // the sm90 forward's key-block loop 110 instructions).
    __device__ __forceinline__ uint32_t keep16(int i, int jg16) const { return keep_bits16(random16(i, jg16), threshold); }
    // keep16's compare of the 16 draws in r against `threshold` (0..256), on its own for the tests
    // (tests/test_philox_cuh.py: every draw at every threshold in every byte position).
    __device__ __forceinline__ static uint32_t keep_bits16(const uint4& r, uint32_t threshold) {
        constexpr uint32_t H = 0x80808080u, G = 0x00204081u;
        const uint32_t t = threshold * 0x01010101u, tl = t & ~H;
        auto top4 = [&](uint32_t x) {  // bits 28..31: x_k < t_k, k = 0..3 (below: garbage)
            const uint32_t d = (x | H) - tl;
            return (((~x & t) | (~(x ^ t) & ~d)) & H) * G;
        };
        const uint32_t all = threshold > 255u ? 0xffffu : 0u;
        return (top4(r.x) >> 28) | (top4(r.y) >> 28 << 4) | (top4(r.z) >> 28 << 8) | (top4(r.w) >> 28 << 12) | all;
    }
    // Keep bits of keys 8 jg + c, c = 0..7 (half of a call: for the cold paths, the keep-mask kernel).
    __device__ __forceinline__ uint32_t keep8(int i, int jg) const { return (keep16(i, jg >> 1) >> (8 * (jg & 1))) & 0xffu; }
};

__device__ __forceinline__ Dropout make_dropout(unsigned long long seed, unsigned long long offset, int b,
                                                int nhead_q, int h, uint32_t threshold, float rp_keep) {
    const unsigned long long t = offset + (unsigned long long)b * (unsigned long long)nhead_q + (unsigned long long)h;
    return Dropout{(uint32_t)seed, (uint32_t)(seed >> 32), (uint32_t)t, (uint32_t)(t >> 32), threshold, rp_keep};
}

// Keep bits of the tile [q0, q0 + M) x [k0, k0 + N) (k0 a multiple of 16, N of 16), computed
// cooperatively by the CTA's NT threads, one Philox call per (row, 16 keys): byte [jg * M + il]
// holds the keep bits of keys k0 + 8 jg + 0..7 for query row q0 + il.
template <int M, int N, int NT>
__device__ __forceinline__ void fill_keep_bits(unsigned char* bits, const Dropout& d, int q0, int k0, int tid) {
    static_assert(N % 16 == 0, "fill_keep_bits: whole Philox calls of 16 keys");
    constexpr int CALLS = M * (N / 16);
#pragma unroll 1  // one Philox chain at a time: the callers run at their register limit
    for (int s = 0; s < (CALLS + NT - 1) / NT; ++s) {
        const int c = tid + s * NT;
        if (CALLS % NT == 0 || c < CALLS) {
            const int il = c % M, jg = c / M;
            const uint32_t b16 = d.keep16(q0 + il, (k0 >> 4) + jg);
            bits[2 * jg * M + il] = (unsigned char)b16;
            bits[(2 * jg + 1) * M + il] = (unsigned char)(b16 >> 8);
        }
    }
}

}  // namespace fmha

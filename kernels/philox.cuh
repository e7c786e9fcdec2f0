// Dropout's random numbers: Philox-4x32-10 (Salmon et al., SC'11) and the keep test, bit-exact
// with the host replica cupy_fmha/philox.py (whose docstring is the specification). Plain C++
// (no PTX): one 32x32 -> 64-bit product per word pair through __umulhi and a plain multiply.
//
// Keying, for the attention element (b, h, i, j) -- b the batch index (the sequence index in
// varlen mode), h the query head, i the query row and j the key column, both local to the
// sequence:
//     key     = (seed lo, seed hi)
//     t       = offset + b * nhead_q + h            (64-bit, wrapping)
//     counter = (j >> 3, i, t lo, t hi)
// One call gives 8 uint16 draws u[0..7] for the columns 8 * (j >> 3) + 0..7 (word w holds
// u[2w] in its low half and u[2w + 1] in its high half); an element is kept iff
// u[j & 7] < threshold, threshold = floor((1 - p) * 65536 + 0.5) (65536 keeps everything).
//
// Every dropout path calls these functions: the forward kernels (random8, inside online_softmax),
// the backward kernels (keep8, into a per-tile bit mask in shared memory) and the keep-mask
// kernel fmha_dropout_mask.cu (keep8).
#pragma once
#include "common.cuh"

namespace fmha {

// Philox-4x32 with 10 rounds of counter c under key (k0, k1).
__device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint32_t k0, uint32_t k1) {
    // local constants: namespace-scope ones would be emitted as globals into every instance
    constexpr uint32_t PHILOX_M0 = 0xD2511F53u, PHILOX_M1 = 0xCD9E8D57u;
    constexpr uint32_t PHILOX_W0 = 0x9E3779B9u, PHILOX_W1 = 0xBB67AE85u;
#pragma unroll
    for (int r = 0; r < 10; ++r) {
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
// threshold and 1 / (1 - p).
struct Dropout {
    uint32_t k0, k1;  // key: the seed
    uint32_t t0, t1;  // counter words 2, 3: offset + b * nhead_q + h
    uint32_t threshold;
    float rp_keep;

    // The 4 output words for query row i and key group jg (keys 8 jg .. 8 jg + 7).
    __device__ __forceinline__ uint4 random8(int i, int jg) const {
        return philox4x32_10(make_uint4((uint32_t)jg, (uint32_t)i, t0, t1), k0, k1);
    }
    // Keep bits of keys 8 jg + c, c = 0..7, for query row i: bit c set iff key 8 jg + c is kept.
    __device__ __forceinline__ uint32_t keep8(int i, int jg) const {
        const uint4 r = random8(i, jg);
        const uint32_t w[4] = {r.x, r.y, r.z, r.w};
        uint32_t bits = 0;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            bits |= (uint32_t)((w[c] & 0xffffu) < threshold) << (2 * c);
            bits |= (uint32_t)((w[c] >> 16) < threshold) << (2 * c + 1);
        }
        return bits;
    }
    // Keep bits of the two uint16 draws in word x (bit 0: low half, bit 1: high half).
    __device__ __forceinline__ uint32_t keep_word(uint32_t x) const {
        return (uint32_t)((x & 0xffffu) < threshold) | ((uint32_t)((x >> 16) < threshold) << 1);
    }
};

__device__ __forceinline__ Dropout make_dropout(unsigned long long seed, unsigned long long offset, int b,
                                                int nhead_q, int h, uint32_t threshold, float rp_keep) {
    const unsigned long long t = offset + (unsigned long long)b * (unsigned long long)nhead_q + (unsigned long long)h;
    return Dropout{(uint32_t)seed, (uint32_t)(seed >> 32), (uint32_t)t, (uint32_t)(t >> 32), threshold, rp_keep};
}

// Keep bits of the tile [q0, q0 + M) x [k0, k0 + N) (k0 a multiple of 8), computed cooperatively
// by the CTA's NT threads, one Philox call per (row, key group): byte [jg * M + il] holds the
// keep bits of keys k0 + 8 jg + 0..7 for query row q0 + il.
template <int M, int N, int NT>
__device__ __forceinline__ void fill_keep_bits(unsigned char* bits, const Dropout& d, int q0, int k0, int tid) {
    constexpr int CALLS = M * (N / 8);
#pragma unroll 1  // one Philox chain at a time: the callers run at their register limit
    for (int s = 0; s < (CALLS + NT - 1) / NT; ++s) {
        const int c = tid + s * NT;
        if (CALLS % NT == 0 || c < CALLS) {
            const int il = c % M, jg = c / M;
            bits[c] = (unsigned char)d.keep8(q0 + il, (k0 >> 3) + jg);
        }
    }
}

}  // namespace fmha

"""kernels/philox.cuh compiled as host C++ (g++, through a small shim for the CUDA built-ins)
against the NumPy replica cupy_fmha.philox: the generator, the keying (64-bit offset wrap,
seeds above 2^32) and the keep bits are bit-exact. Skipped without a C++ compiler."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from cupy_fmha import philox
from cupy_fmha.compile import kernel_dir

CXX = shutil.which("g++") or shutil.which("clang++")
pytestmark = pytest.mark.skipif(CXX is None, reason="needs a host C++ compiler")

SHIM = r"""
#define __device__
#define __host__
#define __forceinline__ inline
struct uint4 { unsigned int x, y, z, w; };
inline uint4 make_uint4(unsigned int a, unsigned int b, unsigned int c, unsigned int d) { return {a, b, c, d}; }
inline unsigned int __umulhi(unsigned int a, unsigned int b) {
    return (unsigned int)(((unsigned long long)a * b) >> 32);
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
#include "philox.cuh"
#include <cstdio>
int main(int argc, char**) {
    if (argc > 1) {  // Dropout::keep_bits16 alone, one "x y z w threshold" per line
        unsigned int x, y, z, w, thr;
        while (std::scanf("%u %u %u %u %u", &x, &y, &z, &w, &thr) == 5)
            std::printf("%u\n", fmha::Dropout::keep_bits16(make_uint4(x, y, z, w), thr));
        return 0;
    }
    unsigned long long seed, offset;
    int b, nhead, h, i, j;
    unsigned int thr;
    while (std::scanf("%llu %llu %d %d %d %d %d %u", &seed, &offset, &b, &nhead, &h, &i, &j, &thr) == 8) {
        const fmha::Dropout d = fmha::make_dropout(seed, offset, b, nhead, h, thr, 1.f);
        const int c = fmha::Dropout::call_of(j);
        const uint4 r = d.random16(i & ~8, c);
        std::printf("%u %u %u %u %u %u %d\n", r.x, r.y, r.z, r.w, d.keep16(i & ~8, c), (unsigned)d.keep(i, j),
                    fmha::Dropout::draw_of(i, j));
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def host_philox(tmp_path_factory):
    d = tmp_path_factory.mktemp("philox")
    (d / "main.cpp").write_text(SHIM)
    exe = d / "philox_host"
    subprocess.run([CXX, "-O1", "-std=c++17", f"-I{kernel_dir()}", str(d / "main.cpp"), "-o", str(exe)],
                   check=True, capture_output=True, text=True)

    def run(rows, *args):
        text = "".join(" ".join(str(x) for x in r) + "\n" for r in rows)
        res = subprocess.run([str(exe), *args], input=text, check=True, capture_output=True, text=True)
        return np.array([[int(x) for x in line.split()] for line in res.stdout.splitlines()], dtype=np.uint64)

    return run


def test_philox_cuh_matches_numpy_replica(host_philox):
    rng = np.random.default_rng(7)
    U64 = 2**64
    rows = []
    for n in range(300):
        seed = int(rng.integers(0, 2**63)) * 2 + int(rng.integers(0, 2)) if n % 3 else int(rng.integers(0, 2**32))
        offset = [0, U64 - 1, U64 - 5, 2**32 - 1, int(rng.integers(0, 2**63))][n % 5]
        nhead = int(rng.integers(1, 40))
        b, h = int(rng.integers(0, 9)), int(rng.integers(0, nhead))
        i, j = int(rng.integers(0, 70000)), int(rng.integers(0, 70000))
        p = [0.0, 0.1, 0.2, 0.5, 0.9, 0.999, 0.3, 0.002][n % 8]
        rows.append((seed, offset, b, nhead, h, i, j, philox.keep_threshold(p)))
    got = host_philox(rows)
    for (seed, offset, b, nhead, h, i, j, thr), out in zip(rows, got):
        counter, key = philox.dropout_counter_key(seed, offset, b, nhead, h, i, j)
        words = philox.philox4x32(counter, key, philox.DROPOUT_ROUNDS)
        assert [int(w) for w in words] == [int(x) for x in out[:4]], (seed, offset, b, nhead, h, i, j)
        # keep16: the call's 16 elements (rows i & ~8, + 8; its keys), each at its draw index
        ip, c = i & ~8, int(philox.call_index(j))
        ii = ip + 8 * (np.arange(16) >> 3)
        jj = 32 * (c >> 2) + 8 * ((np.arange(16) >> 1) & 3) + 2 * (c & 3) + (np.arange(16) & 1)
        assert list(philox.draw_index(ii, jj)) == list(range(16))
        u16 = philox.dropout_random(seed, offset, b, nhead, h, ii, jj)
        assert sum(int(x < thr) << d for d, x in enumerate(u16)) == int(out[4])  # (keep16's byte compares)
        assert int(out[5]) == int(philox.dropout_random(seed, offset, b, nhead, h, i, j) < thr)  # keep(i, j)
        assert int(out[6]) == int(philox.draw_index(i, j))


def test_philox_cuh_offset_wraps_mod_2_64(host_philox):
    # t = offset + b * nhead_q + h crosses 2^64: the counter's high words wrap to 0
    rows = [(2**40 + 3, 2**64 - 2, 1, 4, 3, 13, 37, 256)]  # t = 2^64 + 5 -> 5; row pair 5, call 4 + 2
    got = host_philox(rows)[0]
    counter = np.array([6, 5, 5, 0], dtype=np.uint32)
    key = np.array([3, 2**8], dtype=np.uint32)
    assert [int(w) for w in philox.philox4x32(counter, key, philox.DROPOUT_ROUNDS)] == [int(x) for x in got[:4]]
    assert int(got[4]) == 0xFFFF and int(got[5]) == 1  # threshold 256 keeps all


def test_philox_cuh_keep_bits_every_draw_at_every_threshold(host_philox):
    # keep16's SWAR byte compare (Dropout::keep_bits16, bench/NOTES.md step 73) exhaustively: every
    # draw value at every threshold 0..256 in each of the 16 byte positions (byte k of the row for
    # value v holds (v + 37 k) mod 256, so each position sees all 256 values), against u < threshold
    k = np.arange(16)
    rows, want = [], []
    for thr in range(257):
        for v in range(256):
            u = (v + 37 * k) % 256
            words = [int(sum(int(u[4 * w + b]) << (8 * b) for b in range(4))) for w in range(4)]
            rows.append((*words, thr))
            want.append(sum(int(x < thr) << c for c, x in enumerate(u)))
    got = host_philox(rows, "bits")[:, 0]
    np.testing.assert_array_equal(got, np.array(want, dtype=np.uint64))

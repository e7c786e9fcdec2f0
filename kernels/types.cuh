// Scalar types of every cupy-fmha kernel and of the parameter structs (params.cuh). Plain C++:
// it also compiles on the host (tests/test_params_layout.py checks the struct layouts with g++).
#pragma once

typedef unsigned int uint32_t;
typedef unsigned short uint16_t;
typedef long long index_t;  // 64-bit offsets: tensors may hold more than 2^31 elements

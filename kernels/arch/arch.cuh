// The architecture layer, selected here. Everything that knows the GPU family lives under
// kernels/arch/<family>/: instructions (inline PTX), fragment layouts (which rows and columns of an
// accumulator tile a thread holds, lanes per warp, row reductions), and tile movement between
// global and shared memory. The rest of the kernels include only this header.
//
//   sm80/  mma.sync, ldmatrix, cp.async, conversions, the m16n8 fragment layout (AccFrag) and the
//          ldmatrix-based tile loaders: sm_80 and newer (also the base of the Hopper kernels)
//   sm90/  wgmma (descriptors, fences), the blocked tile layout wgmma reads, bulk copies and named
//          barriers, TMA tensor loads with mbarriers and setmaxnreg (tma.cuh): only when compiling
//          for sm_90a
// A later AMD family (gfx9: MFMA, wave64) plugs in here as arch/gfx9/, behind the same names.
#pragma once
// common.cuh first, outside the conditional blocks: cupy_fmha.compile expands each local include
// once, where it first appears, without evaluating #if
#include "../common.cuh"
#if defined(__HIP__)  // AMD gfx9 (issue 12, in progress: the MMA-free kernels only)
#include "gfx9/instr.cuh"
#include "gfx9/elem.cuh"
#else
#include "sm80/instr.cuh"
#include "sm80/fragment.cuh"
#include "sm80/tile.cuh"
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#include "sm90/wgmma.cuh"
#include "sm90/async.cuh"
#include "sm90/tile.cuh"
#include "sm90/tma.cuh"
#endif
#endif  // __HIP__

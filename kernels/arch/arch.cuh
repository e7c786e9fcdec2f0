// The architecture layer, selected here. Everything that knows the GPU family lives under
// kernels/arch/<family>/: instructions (inline PTX), fragment layouts (which rows and columns of an
// accumulator tile a thread holds, lanes per warp, row reductions), and tile movement between
// global and shared memory. The rest of the kernels include only this header.
//
//   sm80/  mma.sync, ldmatrix, cp.async, conversions, the m16n8 fragment layout (AccFrag) and the
//          ldmatrix-based tile loaders: sm_80 and newer (also the base of the Hopper kernels)
//   sm90/  wgmma (descriptors, fences), the blocked tile layout wgmma reads, bulk copies and named
//          barriers, TMA tensor loads with mbarriers and setmaxnreg (tma.cuh), the ws kernels' tiles
//          in either layout (tma_tile.cuh): only when compiling for sm_90a
//   gfx9/  AMD CDNA (gfx90a, gfx942, gfx950; wave64): MFMA wrappers, gfx950's transposed LDS read
//          and their layouts (instr.cuh, layout.cuh), wavefront pieces (elem.cuh), and the sm80
//          names over MFMA for the mma.sync-family forward and backward (fragment.cuh: AccFrag;
//          tile.cuh: loads, stores and products)
#pragma once
// common.cuh first, outside the conditional blocks: cupy_fmha.compile expands each local include
// once, where it first appears, without evaluating #if (philox.cuh too: gfx9's fragment reads the
// dropout keying's word tile through it)
#include "../common.cuh"
#include "../philox.cuh"
#if defined(__HIP__)  // AMD gfx9 (issue 12: the MMA-free kernels, fmha_fwd, fmha_bwd_dq_dk_dv)
#include "gfx9/instr.cuh"
#include "gfx9/elem.cuh"
#include "gfx9/fragment.cuh"
#include "gfx9/tile.cuh"
#else
#include "sm80/instr.cuh"
#include "sm80/fragment.cuh"
#include "sm80/tile.cuh"
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#include "sm90/wgmma.cuh"
#include "sm90/async.cuh"
#include "sm90/tile.cuh"
#include "sm90/tma.cuh"
#include "sm90/tma_tile.cuh"
#endif
#endif  // __HIP__

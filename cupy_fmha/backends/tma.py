"""Tensor maps for the Hopper tensor memory accelerator (TMA), encoded on the host.

A TMA load copies a box of a tensor from global to shared memory described by a 128-byte
``CUtensorMap`` that the CUDA driver's ``cuTensorMapEncodeTiled`` fills (it needs the driver, so
only on a machine with a GPU); the kernel takes it by value as a ``const __grid_constant__``
``TmaMap`` (kernels/arch/sm90/tma.cuh). CuPy has no binding for the call: it goes through NVIDIA's
``cuda-bindings`` package (``cuda.bindings.driver``).

:func:`tile_map_args` turns an array view (pointer, shape, strides) and a box into the encoder's
arguments, checking the driver's rules first (so a bad view is refused with a named reason, not
a CUDA error code); :func:`encode_tile_map` calls the driver and returns the map's bytes as a
one-element NumPy array of dtype ``void128``, ready to pass as a kernel argument.

Dimensions follow NumPy's order here (outermost first); the driver's order (innermost first) is
this reversed. Facts: the CUDA driver API documentation of ``cuTensorMapEncodeTiled``.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

__all__ = ["TileMapArgs", "tile_map_args", "tile_map_for", "column_blocked_view", "encode_tile_map", "SWIZZLES"]

#: supported swizzle widths in bytes (0: none)
SWIZZLES = (0, 32, 64, 128)

_DATA_TYPES = ("float16", "bfloat16", "uint16", "float32")


@dataclass(frozen=True)
class TileMapArgs:
    """The arguments of ``cuTensorMapEncodeTiled`` for one tensor view, in NumPy order.

    Attributes:
        data_type: "float16", "bfloat16", "uint16" or "float32".
        address: device address of element (0, ..., 0), 16-byte aligned.
        shape: elements per dimension, outermost first (rank 1 to 5).
        strides: bytes between consecutive elements of each dimension, outermost first; the last
            (innermost) is the element size (contiguous rows).
        box: elements per dimension of one copy, outermost first.
        swizzle: 0, 32, 64 or 128 (bytes; the shared-memory layout of the box, see tma.cuh).
    """

    data_type: str
    address: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    swizzle: int

    @property
    def itemsize(self) -> int:
        return 4 if self.data_type == "float32" else 2

    @property
    def box_bytes(self) -> int:
        """Bytes one load writes to shared memory (the mbarrier's transaction count)."""
        return int(np.prod(self.box)) * self.itemsize


def tile_map_args(data_type: str, address: int, shape, strides, box, swizzle: int = 128) -> TileMapArgs:
    """Check a view against the TMA encoder's rules and return its :class:`TileMapArgs`.

    Args:
        data_type: "float16", "bfloat16", "uint16" or "float32".
        address: device address of the view's first element.
        shape, strides: the view's shape and its strides in bytes (NumPy order and units).
        box: the box shape, one entry per dimension (NumPy order).
        swizzle: shared-memory swizzle width in bytes, one of :data:`SWIZZLES`.

    Raises:
        ValueError: naming the rule the view or box breaks (rank above 5, a non-contiguous
            innermost dimension, an address or stride not a multiple of 16 bytes, a stride of
            2**40 bytes or more, a dimension outside [1, 2**32], a box entry outside [1, 256], a
            box row not a multiple of 16 bytes or wider than the swizzle).
    """
    if data_type not in _DATA_TYPES:
        raise ValueError(f"data_type: expected one of {_DATA_TYPES}, got {data_type!r}")
    if swizzle not in SWIZZLES:
        raise ValueError(f"swizzle: expected one of {SWIZZLES} (bytes), got {swizzle!r}")
    shape, strides, box = (tuple(int(x) for x in t) for t in (shape, strides, box))
    rank = len(shape)
    if not 1 <= rank <= 5:
        raise ValueError(f"shape: TMA takes 1 to 5 dimensions, got {rank}")
    if len(strides) != rank or len(box) != rank:
        raise ValueError(f"strides, box: expected {rank} entries each (the rank of shape), got {len(strides)} and {len(box)}")
    item = 4 if data_type == "float32" else 2
    if strides[-1] != item:
        raise ValueError(f"strides: the innermost dimension must be contiguous ({item} bytes), got {strides[-1]}")
    if address % 16:
        raise ValueError(f"address: must be 16-byte aligned, got {address:#x}")
    for d, s in enumerate(strides[:-1]):
        if s % 16 or not 0 < s < 2**40:
            raise ValueError(f"strides[{d}]: must be a positive multiple of 16 bytes below 2**40, got {s}")
    for d, n in enumerate(shape):
        if not 1 <= n <= 2**32:
            raise ValueError(f"shape[{d}]: must be in [1, 2**32], got {n}")
    for d, n in enumerate(box):
        if not 1 <= n <= 256:
            raise ValueError(f"box[{d}]: must be in [1, 256], got {n}")
    row = box[-1] * item
    if row % 16:
        raise ValueError(f"box[-1]: a box row must be a multiple of 16 bytes, got {box[-1]} x {item} B")
    if swizzle and row > swizzle:
        raise ValueError(f"box[-1]: a box row may not be wider than the {swizzle}-byte swizzle, got {row} B")
    return TileMapArgs(data_type, int(address), shape, strides, box, swizzle)


def tile_map_for(array, box, swizzle: int = 128) -> TileMapArgs:
    """:func:`tile_map_args` for a CuPy array (its pointer, shape, byte strides and dtype;
    bfloat16 as CuPy's native dtype, or as uint16 bits); ``box`` as there, one entry per axis.

    Raises:
        ValueError: a dtype other than float16, bfloat16, uint16 or float32, or any rule of
            :func:`tile_map_args`.
    """
    name = str(array.dtype)
    if name not in _DATA_TYPES:
        raise ValueError(f"array: TMA maps here take {_DATA_TYPES}, got dtype {name}")
    return tile_map_args(name, array.data.ptr, array.shape, array.strides, box, swizzle)


def column_blocked_view(shape, strides, itemsize: int, row_axis: int):
    """The same memory as a view with the last axis split into 8-element (16-byte) column
    blocks moved in front of ``row_axis``: ``(..., rows, ..., d)`` becomes
    ``(..., d // 8, rows, ..., 8)`` (shape and byte strides, NumPy order).

    A TMA box of this view that spans all ``d // 8`` column blocks and R rows lands in shared
    memory as ``[d // 8][R][8]``: the 8x8 core matrices of 128 contiguous bytes that wgmma reads
    without swizzle (kernels/arch/sm90/tile.cuh), column block by column block, in one copy
    instead of one per column block. The view is only valid where the rows axis is the
    second-to-last after the move, i.e. ``row_axis`` is the axis just before the other non-unit
    axes the box spans (for a bshd tensor with a box of one batch and one head: rows = axis 1;
    the result is ``(b, d // 8, s, h, 8)``).

    Raises:
        ValueError: ``d`` not a multiple of 8, or ``row_axis`` not an axis before the last.
    """
    shape, strides = list(int(x) for x in shape), list(int(x) for x in strides)
    d = shape[-1]
    if d % 8:
        raise ValueError(f"shape[-1]: column blocks of 8 elements need a multiple of 8, got {d}")
    if not 0 <= row_axis < len(shape) - 1:
        raise ValueError(f"row_axis: expected an axis in [0, {len(shape) - 1}), got {row_axis}")
    new_shape = shape[:row_axis] + [d // 8] + shape[row_axis:-1] + [8]
    new_strides = strides[:row_axis] + [8 * itemsize] + strides[row_axis:-1] + [itemsize]
    return tuple(new_shape), tuple(new_strides)


def encode_tile_map(args: TileMapArgs) -> np.ndarray:
    """Encode ``args`` with the driver: the 128-byte map as a one-element ``void128`` NumPy array
    (pass it where the kernel takes a ``TmaMap``; CuPy copies the bytes). Needs the
    ``cuda-bindings`` package and a CUDA context on the current device (CuPy makes one).

    Raises:
        RuntimeError: ``cuda-bindings`` missing, or the driver refused the arguments (with its
            error name).
    """
    try:
        from cuda.bindings import driver as drv
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise RuntimeError("TMA tensor maps need NVIDIA's cuda-bindings package (pip install cuda-bindings)") from exc
    dtypes = {"float16": drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
              "bfloat16": drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
              "uint16": drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT16,
              "float32": drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32}
    swizzles = {0: drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
                32: drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B,
                64: drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B,
                128: drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B}
    rank = len(args.shape)
    err, tmap = drv.cuTensorMapEncodeTiled(
        dtypes[args.data_type], rank, args.address,
        [drv.cuuint64_t(n) for n in reversed(args.shape)],
        [drv.cuuint64_t(s) for s in reversed(args.strides[:-1])],
        [drv.cuuint32_t(n) for n in reversed(args.box)],
        [drv.cuuint32_t(1)] * rank,
        drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        swizzles[args.swizzle],
        drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled refused {args}: {err.name}")
    raw = ctypes.string_at(tmap.getPtr(), 128)
    return np.frombuffer(bytearray(raw), dtype=np.dtype((np.void, 128)))

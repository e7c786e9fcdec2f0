"""GPU families. One module per family owns its instance table (tile sizes per head dim and
feature), compile options and device limits: :mod:`cupy_fmha.backends.cuda` for NVIDIA sm_80+
(mma.sync) and sm_90a (wgmma). :func:`cupy_fmha.spec.backend_for` picks the module for a device.
A ROCm module (gfx90a/gfx942/gfx950 through hiprtc) will sit beside it with the same functions.
"""

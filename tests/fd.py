"""Central finite differences for the CPU tests of the reference's gradients."""

import numpy as np


def fd_grad(f, x, eps=1e-6):
    """d f() / d x by central differences, perturbing ``x`` (a float64 array) in place one element
    at a time and restoring it; ``f`` reads ``x`` and returns a float."""
    g = np.zeros_like(x)
    flat, gf = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        fp = f()
        flat[i] = old - eps
        fm = f()
        flat[i] = old
        gf[i] = (fp - fm) / (2 * eps)
    return g

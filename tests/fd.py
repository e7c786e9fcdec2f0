"""Central finite differences for the CPU tests of the reference's gradients."""

import numpy as np

from cupy_fmha import reference as R


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


def lse_term(lse, dlse) -> float:
    """sum(lse * dlse) over the rows that see a key (lse = -inf elsewhere: the loss ignores them,
    and a perturbation of the inputs never gives such a row a key)."""
    fin = np.isfinite(lse)
    return float(np.sum(np.where(fin, lse, 0.0) * np.where(fin, dlse, 0.0)))


def check_fd(q, k, v, do, bias=None, dlse=None, **kw):
    """The reference backward (and dbias) vs central finite differences of L = sum(O * dO), plus
    sum(LSE * dLSE) when ``dlse`` is given (passed to the backward as its ``dlse``). Returns the
    gradients."""

    def loss():
        o, lse = R.attention_forward(q, k, v, bias=bias, **kw)
        return float(np.sum(o * do)) + (0.0 if dlse is None else lse_term(lse, dlse))

    extra = {} if dlse is None else {"dlse": dlse}
    grads = R.attention_backward(do, q, k, v, bias=bias, return_dbias=bias is not None, **extra, **kw)
    named = [("q", q), ("k", k), ("v", v)] + ([("bias", bias)] if bias is not None else [])
    assert len(grads) == len(named)
    for (name, x), g in zip(named, grads):
        assert g.shape == x.shape and g.dtype == np.float64, name
        assert np.all(np.isfinite(g)), name
        np.testing.assert_allclose(g, fd_grad(loss, x), rtol=1e-5, atol=1e-7, err_msg=f"d{name}")
    return grads

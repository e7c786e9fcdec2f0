"""``python -m cupy_fmha.cli``: the same as the ``cupy-fmha`` console script."""

from .app import main

main()

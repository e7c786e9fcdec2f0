"""The command line the header generators share (tools/gen_arch_sm90.py, tools/gen_arch_gfx9.py):
write the generated text to the file in the tree (or ``--out``), or with ``--check`` write nothing
and exit 1 when the file differs from it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable, Optional, Sequence


def main(doc: str, target: Path, render: Callable[[], str], argv: Optional[Sequence[str]] = None) -> int:
    """Parse ``argv`` (``--out PATH``, ``--check``), then write or compare; returns the exit status."""
    ap = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    ap.add_argument("--out", type=Path, default=target, help="where to write (default: %(default)s)")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if the file differs from the generator's output")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        same = args.out.is_file() and args.out.read_text() == text
        print("up to date" if same else f"{args.out} differs from the generator's output: run it without --check")
        return 0 if same else 1
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0

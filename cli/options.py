"""The options of ``cupy-fmha fwd`` and ``bwd``, declared once (Typer ``Annotated`` types).

Choices are enums, so ``--help`` lists them; defaults that depend on other options or on the
backend are shown as text (``[default: (...)]``). Values are checked in :mod:`.config`.
"""

from __future__ import annotations

from enum import Enum
from typing import Optional

import typer

try:
    from typing import Annotated
except ImportError:  # pragma: no cover
    from typing_extensions import Annotated

# Defaults shared by fwd and bwd: a meaningful, quick job on a GPU that the numpy backend also
# finishes in about half a minute on 2 CPU cores.
DEFAULT_BATCH = 2
DEFAULT_NHEAD = 16
DEFAULT_SEQLEN = 2048
DEFAULT_HDIM = 128
# warm-up / timed calls when not given, per backend
DEFAULT_WARMUP = {"cupy": 5, "numpy": 0}
DEFAULT_REPEAT = {"cupy": 20, "numpy": 1}


class DType(str, Enum):
    """--dtype: fp16 or bf16 (the other spellings the library's ``dtype=`` takes, too)."""

    fp16 = "fp16"
    bf16 = "bf16"
    float16 = "float16"
    bfloat16 = "bfloat16"
    half = "half"
    f16 = "f16"


class Layout(str, Enum):
    bshd = "bshd"
    bhsd = "bhsd"
    thd = "thd"


class Backend(str, Enum):
    auto = "auto"
    cupy = "cupy"
    numpy = "numpy"


class SeqMode(str, Enum):
    batch = "batch"
    group = "group"


BatchOpt = Annotated[
    Optional[int],
    typer.Option("--batch", "-b", help="Batch size (group mode: the number of lengths).",
                 show_default=f"{DEFAULT_BATCH}; group mode: the number of --seqlen-q lengths"),
]
ModeOpt = Annotated[
    SeqMode,
    typer.Option("--mode", case_sensitive=False,
                 help="batch (equal lengths) or group (variable lengths, layout thd)."),
]
NheadOpt = Annotated[int, typer.Option("--nhead", help="Number of query heads.")]
NheadKOpt = Annotated[
    Optional[int],
    typer.Option("--nhead-k", help="Number of K/V heads (GQA/MQA).", show_default="--nhead"),
]
SeqQOpt = Annotated[
    str,
    typer.Option(
        "--seqlen-q",
        "-s",
        help="Query sequence length; group mode: comma list of per-sequence lengths, e.g. "
        "100,37,0,250.",
    ),
]
SeqKOpt = Annotated[
    Optional[str],
    typer.Option(
        "--seqlen-k",
        help="Key sequence length (group mode: a comma list as long as --seqlen-q's).",
        show_default="--seqlen-q",
    ),
]
HdimOpt = Annotated[int, typer.Option("--hdim", "-d", help="Head dim of Q and K.")]
HdimVOpt = Annotated[
    Optional[int],
    typer.Option("--hdim-v", help="Head dim of V and O.", show_default="--hdim"),
]
DtypeOpt = Annotated[
    DType,
    typer.Option("--dtype", case_sensitive=False, metavar="<fp16|bf16>",
                 help="Input dtype: fp16 or bf16 (also spelled float16, half, f16 / bfloat16)."),
]
LayoutOpt = Annotated[
    Optional[Layout],
    typer.Option(
        "--layout",
        case_sensitive=False,
        help="bshd (batch, seq, head, dim) or bhsd (batch, head, seq, dim); group mode: thd "
        "(tokens, head, dim), its only layout.",
        show_default="bshd; group mode: thd",
    ),
]
MaskOpt = Annotated[
    Optional[str],
    typer.Option(
        "--mask",
        "-m",
        help="CK mask string: 0 none; t or 1 / b or 2: causal from the top-left / bottom-right "
        "corner; t:l,r / b:l,r: sliding window of l keys left and r right of that diagonal "
        "(negative = unlimited); xt:w / xb:w: window of width w (l = w/2 rounded down, "
        "r = w-1-l; w <= 0 is causal, as in CK); g:y,x: CK's raw window (row i sees keys "
        "i-y < j < i+x); |size| <= 2**62.",
        show_default="0, no mask",
    ),
]
CausalOpt = Annotated[
    bool, typer.Option("--causal", help="FlashAttention-style causal (bottom-right aligned).")
]
WindowOpt = Annotated[
    Optional[str],
    typer.Option(
        "--window",
        help="FlashAttention-style sliding window 'L,R' (-1 = unlimited), bottom-right aligned.",
        show_default="-1,-1",
    ),
]
BiasOpt = Annotated[
    str,
    typer.Option(
        "--bias",
        # (shapes in parentheses: Rich would read "[batch, nhead]" as markup and drop it)
        help="CK's names. n: none; e or e:0: elementwise bias of shape (1, 1, seqlen_q, seqlen_k); "
        "e:1: (1, nhead, seqlen_q, seqlen_k); e:2: (batch, nhead, seqlen_q, seqlen_k) (normal draws "
        "in the input dtype; group mode: the longest lengths, each sequence reads its top-left "
        "corner); a or a:0: ALiBi slopes of shape (nhead,); a:1: ALiBi slopes (batch, nhead).",
    ),
]
DbiasOpt = Annotated[
    bool,
    typer.Option(
        "--dbias/--no-dbias",
        help="Also compute and check dBias (needs an elementwise --bias e, e:0, e:1 or e:2; with "
        "e:0 and e:1 the whole problem is checked, since dBias sums over batches and heads).",
    ),
]
DeterministicOpt = Annotated[
    bool,
    typer.Option(
        "--deterministic",
        help="Bit-reproducible dQ: dQ tiles added in a fixed key-block order instead of float atomics "
        "(on the Hopper warp-specialized backward behind per-tile semaphores, no extra memory; elsewhere "
        "per-key-block dQ slabs, more memory). The numpy backend is deterministic anyway: accepted, no-op.",
    ),
]
PDropOpt = Annotated[
    float,
    typer.Option("--p-drop", help="Dropout probability in [0, 1) on the attention weights (CK's -p_drop)."),
]
DropSeedOpt = Annotated[
    int, typer.Option("--drop-seed", help="Dropout Philox seed, an integer in [0, 2**64).")
]
DropOffsetOpt = Annotated[
    int, typer.Option("--drop-offset", help="Dropout Philox counter offset, an integer in [0, 2**64).")
]
ScaleOpt = Annotated[
    Optional[float],
    typer.Option("--scale", help="Softmax scale.", show_default="1/sqrt(hdim)"),
]
SeedOpt = Annotated[
    int,
    typer.Option("--seed", help="Seed of the normal input draws, an integer in [0, 2**64) (not "
                 "dropout's: --drop-seed)."),
]
WarmupOpt = Annotated[
    Optional[int],
    typer.Option("--warmup", help="Untimed calls first.",
                 show_default=f"{DEFAULT_WARMUP['cupy']} on cupy, {DEFAULT_WARMUP['numpy']} on numpy"),
]
RepeatOpt = Annotated[
    Optional[int],
    typer.Option("--repeat", help="Timed calls; the median is reported.",
                 show_default=f"{DEFAULT_REPEAT['cupy']} on cupy, {DEFAULT_REPEAT['numpy']} on numpy"),
]
VerifyOpt = Annotated[
    bool, typer.Option("--verify/--no-verify", help="Check against the float64 reference.")
]
FullCheckOpt = Annotated[
    bool,
    typer.Option(
        "--full-check",
        help="Run the float64 reference on every batch and head (default: a subset on large "
        "problems: first/last batch, first/last K/V head group).",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead.")]
BackendOpt = Annotated[
    Backend,
    typer.Option("--backend", case_sensitive=False,
                 help="auto = cupy when a CUDA GPU is usable, else numpy (the NumPy reference)."),
]
MaxMemoryOpt = Annotated[
    Optional[float],
    typer.Option(
        "--max-memory",
        help="Host memory in GiB the run may use (the numpy backend and the float64 check); a "
        "larger problem is refused before anything is allocated.",
        show_default="1/2 of this machine's RAM",
    ),
]

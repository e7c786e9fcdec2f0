"""``cupy-fmha``: correctness and speed runs of the fused attention forward and backward.

Commands:

* ``cupy-fmha fwd``  time the forward, check O and LSE against the float64 reference.
* ``cupy-fmha bwd``  time the backward (dq_dk_dv pipeline), check dQ, dK, dV.
* ``cupy-fmha info`` describe the device and software stack.

Each ``fwd``/``bwd`` run prints one summary line (or one JSON object with ``--json``) and exits
with status 0 when valid, 1 when a check fails, 2 on a bad argument or a run this machine cannot
hold (refused up front from the problem's sizes, see :mod:`.memory`; a ``MemoryError`` that
happens anyway also ends with one line and status 2).

Backends: ``cupy`` runs the GPU kernels; ``numpy`` runs the library's reference in its
``precision="low"`` mode (a plain same-precision implementation) and checks it through the same
path, so the command line works on machines without a GPU. ``auto`` picks ``cupy`` when a GPU
is usable.

Group mode (``--mode group``, variable-length sequences packed along one axis, layout ``thd``):
``--seqlen-q 100,37,0,250`` gives one length per sequence (the batch is their number; zeros are
allowed), ``--seqlen-k`` the same number of key lengths (default: the query lengths). Masks are
resolved per sequence with its own lengths; the subset check takes the first and last sequence.
An elementwise ``--bias e|e:0|e:1|e:2`` has the longest lengths as its sequence dimensions
(sequence i uses the top-left [seqlen_q_i, seqlen_k_i] corner of its plane), and ``--dbias``
checks dBias in that shape.

The modules: :mod:`.options` (the option declarations), :mod:`.config` (options -> a frozen,
checked :class:`~.config.RunConfig`, with the library's own checks), :mod:`.memory` (refusing
what does not fit), :mod:`.run` (backend, inputs, timed calls, verification), :mod:`.report`
(the summary line and the JSON object), and this one (the Typer app and its commands).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

import typer
from typer.core import TyperCommand, TyperGroup

from cupy_fmha import device

from . import memory, report, run
from .config import UsageProblem, build, option_names
from .options import (
    DEFAULT_HDIM,
    DEFAULT_NHEAD,
    DEFAULT_SEQLEN,
    Backend,
    BackendOpt,
    BatchOpt,
    BiasOpt,
    CausalOpt,
    DbiasOpt,
    DeterministicOpt,
    DropOffsetOpt,
    DropSeedOpt,
    DType,
    DtypeOpt,
    FullCheckOpt,
    HdimOpt,
    HdimVOpt,
    JsonOpt,
    LayoutOpt,
    MaskOpt,
    MaxMemoryOpt,
    ModeOpt,
    NheadKOpt,
    NheadOpt,
    PDropOpt,
    RepeatOpt,
    ScaleOpt,
    SeedOpt,
    SeqKOpt,
    SeqMode,
    SeqQOpt,
    VerifyOpt,
    WarmupOpt,
    WindowOpt,
)

PROG = "cupy-fmha"


def _exception_classes(name: str) -> tuple[type, ...]:
    """``name`` from Typer's vendored Click (Typer >= 0.20), Typer itself and the click package,
    whichever exist: a usage error may come from any of them depending on the Typer version."""
    found = []
    for mod in ("typer._click.exceptions", "typer.exceptions", "typer", "click.exceptions"):
        try:
            cls = getattr(__import__(mod, fromlist=[name]), name)
        except (ImportError, AttributeError):
            continue
        if isinstance(cls, type) and cls not in found:
            found.append(cls)
    return tuple(found)


_ClickException = _exception_classes("ClickException")
_NoArgsIsHelpError = _exception_classes("NoArgsIsHelpError")
_Abort = _exception_classes("Abort")


def _err(msg: str) -> None:
    msg = " ".join(str(msg).split())  # exactly one line
    sys.stderr.write(f"{PROG}: error: {msg}\n")
    sys.stderr.flush()


def _notice(msg: str) -> None:
    sys.stderr.write(f"{PROG}: {msg}\n")
    sys.stderr.flush()


def _plain_flags(params):
    """Flags take no value: show no ``<bool>`` type next to them (``--help`` included)."""
    for p in params:
        if getattr(p, "is_flag", False) and getattr(p, "metavar", None) is None:
            p.metavar = ""
    return params


class _Command(TyperCommand):
    def get_params(self, ctx):
        return _plain_flags(super().get_params(ctx))


class _OneLineErrors(TyperGroup):
    """Typer group whose usage errors are one line on stderr (exit 2), not a Rich panel; no
    command at all prints the help on stderr and exits 2."""

    def get_params(self, ctx):
        return _plain_flags(super().get_params(ctx))

    def parse_args(self, ctx, args):
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            # the help on stderr (Typer's Rich help prints itself to stdout), exit status 2
            with contextlib.redirect_stdout(sys.stderr):
                text = ctx.get_help()
                if text:
                    typer.echo(text, err=True)
            ctx.exit(2)
        return super().parse_args(ctx, args)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            rv = super().main(
                args=args,
                prog_name=prog_name,
                complete_var=complete_var,
                standalone_mode=False,
                **extra,
            )
        except _NoArgsIsHelpError as e:
            if not standalone_mode:
                raise
            e.show()
            sys.exit(2)
        except _ClickException as e:
            if not standalone_mode:
                raise
            # (Typer's option validation goes through pydantic, whose messages start "Value error, ")
            _err(e.format_message().replace("Value error, ", ""))
            sys.exit(e.exit_code)
        except _Abort:
            if not standalone_mode:
                raise
            _err("aborted")
            sys.exit(1)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(
    cls=_OneLineErrors,
    name=PROG,
    help="Fused multi-head attention (forward and backward) for CuPy: correctness and speed runs.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["--help"]},
)


def _is_out_of_memory(e: BaseException) -> bool:
    """A host MemoryError or CuPy's OutOfMemoryError (without importing CuPy)."""
    return isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError"


def _run(mode: str, **options) -> None:
    """Check, refuse what cannot fit, run, report; exit 2 / 1 / 0 (see the module docstring)."""
    try:
        cfg = build(mode, **options)
        picked = run.pick_backend(cfg)
        memory.check(picked, auto_picked=cfg.backend == "auto")
    except UsageProblem as e:
        _err(str(e))
        raise typer.Exit(2)
    if cfg.backend == "auto" and picked.backend == "numpy":
        _notice("no usable CUDA GPU found: using the numpy backend (the NumPy reference; slow)")
    try:
        out = run.execute(picked)
    except (ValueError, TypeError) as e:  # the library's argument checks
        _err(option_names(str(e)))
        raise typer.Exit(2)
    except Exception as e:  # noqa: BLE001 - only running out of memory is turned into a line
        if not _is_out_of_memory(e):
            raise
        where = "GPU" if type(e).__name__ == "OutOfMemoryError" else "host"
        _err(f"--backend {picked.backend}: ran out of {where} memory during this {mode} "
             f"({type(e).__name__}{': ' + str(e) if str(e) else ''}); try smaller sizes"
             + ("" if where == "GPU" else " or a lower --max-memory"))
        raise typer.Exit(2)
    typer.echo(report.render(picked, out))
    if out.valid is False:
        raise typer.Exit(1)


# ---------------------------------------------------------------------------------------------
# commands


@app.command(cls=_Command)
def fwd(
    batch: BatchOpt = None,
    nhead: NheadOpt = DEFAULT_NHEAD,
    nhead_k: NheadKOpt = None,
    seqlen_q: SeqQOpt = str(DEFAULT_SEQLEN),
    seqlen_k: SeqKOpt = None,
    hdim: HdimOpt = DEFAULT_HDIM,
    hdim_v: HdimVOpt = None,
    dtype: DtypeOpt = DType.bf16,
    layout: LayoutOpt = None,
    mask: MaskOpt = None,
    causal: CausalOpt = False,
    window: WindowOpt = None,
    bias: BiasOpt = "n",
    p_drop: PDropOpt = 0.0,
    drop_seed: DropSeedOpt = 0,
    drop_offset: DropOffsetOpt = 0,
    scale: ScaleOpt = None,
    seed: SeedOpt = 0,
    warmup: WarmupOpt = None,
    repeat: RepeatOpt = None,
    verify: VerifyOpt = True,
    full_check: FullCheckOpt = False,
    json_out: JsonOpt = False,
    backend: BackendOpt = Backend.auto,
    seq_mode: ModeOpt = SeqMode.batch,
    max_memory: MaxMemoryOpt = None,
) -> None:
    """Time the forward pass and check O and LSE against the float64 reference."""
    _run("fwd", batch=batch, nhead=nhead, nhead_k=nhead_k, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
         hdim=hdim, hdim_v=hdim_v, dtype=dtype, layout=layout, mask=mask, causal=causal,
         window=window, scale=scale, seed=seed, warmup=warmup, repeat=repeat, verify=verify,
         full_check=full_check, json=json_out, backend=backend, bias=bias, seq_mode=seq_mode,
         p_drop=p_drop, drop_seed=drop_seed, drop_offset=drop_offset, max_memory=max_memory)


@app.command(cls=_Command)
def bwd(
    batch: BatchOpt = None,
    nhead: NheadOpt = DEFAULT_NHEAD,
    nhead_k: NheadKOpt = None,
    seqlen_q: SeqQOpt = str(DEFAULT_SEQLEN),
    seqlen_k: SeqKOpt = None,
    hdim: HdimOpt = DEFAULT_HDIM,
    hdim_v: HdimVOpt = None,
    dtype: DtypeOpt = DType.bf16,
    layout: LayoutOpt = None,
    mask: MaskOpt = None,
    causal: CausalOpt = False,
    window: WindowOpt = None,
    bias: BiasOpt = "n",
    deterministic: DeterministicOpt = False,
    dbias: DbiasOpt = False,
    p_drop: PDropOpt = 0.0,
    drop_seed: DropSeedOpt = 0,
    drop_offset: DropOffsetOpt = 0,
    scale: ScaleOpt = None,
    seed: SeedOpt = 0,
    warmup: WarmupOpt = None,
    repeat: RepeatOpt = None,
    verify: VerifyOpt = True,
    full_check: FullCheckOpt = False,
    json_out: JsonOpt = False,
    backend: BackendOpt = Backend.auto,
    seq_mode: ModeOpt = SeqMode.batch,
    max_memory: MaxMemoryOpt = None,
) -> None:
    """Time the backward pass (dot_do_o, dq_dk_dv, convert_dq) and check dQ, dK, dV (and dBias;
    --deterministic: bit-reproducible dQ, see attention_backward)."""
    _run("bwd", batch=batch, nhead=nhead, nhead_k=nhead_k, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
         hdim=hdim, hdim_v=hdim_v, dtype=dtype, layout=layout, mask=mask, causal=causal,
         window=window, scale=scale, seed=seed, warmup=warmup, repeat=repeat, verify=verify,
         full_check=full_check, json=json_out, backend=backend, bias=bias, seq_mode=seq_mode,
         deterministic=deterministic, dbias=dbias, p_drop=p_drop, drop_seed=drop_seed,
         drop_offset=drop_offset, max_memory=max_memory)


@app.command(cls=_Command)
def info(json_out: JsonOpt = False) -> None:
    """Describe the GPU (if any), CuPy, CUDA, NVRTC and the kernel cache."""
    d = device.describe()
    if json_out:
        typer.echo(json.dumps(d, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="cupy-fmha environment", show_header=True)
    table.add_column("item")
    table.add_column("value")
    for k, v in d.items():
        table.add_row(k, "-" if v is None else str(v))
    Console().print(table)


def main() -> None:
    """Console-script entry point. Output that cannot be written (a full disk, a closed pipe)
    ends the run with one line on stderr and exit status 1: the result was not delivered."""
    try:
        app()
    except OSError as e:
        if isinstance(e, BrokenPipeError):  # the reader left (`| head`): stdout is gone, say nothing there
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(f"cupy-fmha: cannot write the output: {e.strerror or e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    main()

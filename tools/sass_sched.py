"""How long one warp takes through a stretch of a kernel's machine code, from the schedule ptxas
wrote into it: offline (NVRTC + nvdisasm, no GPU), for predicting what a change to a softmax or an
epilogue does before it is timed (bench/NOTES.md step 87).

Every sm_90 instruction carries its scheduling controls in bits 105-125 of its 128-bit word (the
layout public reverse-engineering of Volta and later documented: stall cycles 4 bits, yield 1,
write scoreboard 3, read scoreboard 3, wait mask 6, operand reuse 4). ptxas sets the stall count to
the fixed latency the next instruction must wait for, so the stalls of a stretch are what ncu calls
`wait` stalls; variable-latency results (MUFU, SHFL, shared-memory loads) go through the six
scoreboards, for which this model assumes latencies (LATENCY below, cycles; published
microbenchmarks of Ampere and Hopper put them near these). One warp alone is simulated in order:
an instruction issues when the previous one's stall count has passed and every scoreboard in its
wait mask is released, and MUFU takes 8 cycles per warp instruction (16 results per clock per SM,
4 per SM sub-partition). Other warps sharing the sub-partition, bank conflicts and the tensor cores
are not modelled: the result is a lower bound on the stretch's latency, with the issue slots and
the MUFU time that two warps on a sub-partition share.

    python tools/sass_sched.py fwd-ws DTYPE HDIM_Q HDIM_V [--region softmax|operands|block|serial|all] [--dropout] [--alibi] [--bias 2|4] [--edge] [--flip N,..] [--list]
    python tools/sass_sched.py fwd-ws bf16 64 64 --region block --warps 3 --blocks 12

``--warps N`` (step 88, :func:`simulate_warps`) runs N copies of the region on one sub-partition at once,
sharing its issue slot (one instruction a cycle) and pipes (ALU and integer multiply every 2 cycles,
MUFU every 8): what the one-warp model leaves out where two or three MMA warps of a sub-partition are
in their softmax together (hdim 64's three warpgroups). The pipes' totals per round are firm lower
bounds on the period; the simulated period itself depends on the issue policy and the warps' phases
(``--policy``, ``--stagger``: up to ~30% apart for the same code), so read it as a range.

The build is the library's (`fwd_ws_spec`), so ``CUPY_FMHA_FWD_WS_TILES=KEY=V,...`` selects a
variant as everywhere else. ``softmax``: the steady-state softmax of the overlapped pipeline, from
the wait for S_i (``WARPGROUP.DEPBAR.LE gsb0, 0x1``) to the loop's next mbarrier wait, taking the
branch past the mask tests (``--edge``: falling into them).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

#: assumed latencies (cycles) of results that go through a scoreboard
LATENCY = {"MUFU": 18, "SHFL": 24, "LDS": 30, "LDSM": 30, "S2R": 20, "S2UR": 20, "LDC": 20, "ULDC": 20,
           "F2I": 14, "I2F": 14, "default": 20}
#: a register operand read out by a store or a transfer, releasing its read scoreboard
READ_LATENCY = 8
MUFU_INTERVAL = 8
#: ``simulate_warps``: cycles between two warp instructions of one pipe of a sub-partition (its lanes:
#: 32 FP32 FMA lanes issue a warp instruction a cycle; the 16-lane ALU and FMA-heavy (integer
#: multiply) pipes one every 2; the MUFU unit one every MUFU_INTERVAL); opcodes not named here, 1
PIPE_INTERVAL = {"alu": 2, "fmaheavy": 2, "mufu": MUFU_INTERVAL}
_ALU = ("FMNMX", "IMNMX", "VIMNMX", "VIADDMNMX", "LOP3", "PLOP3", "SHF", "SEL", "FSEL", "FSETP", "ISETP",
        "PRMT", "F2FP", "IADD3", "LEA", "FCHK")
_FMAHEAVY = ("IMAD", "IMUL")


@dataclass
class Ins:
    addr: int
    text: str
    stall: int
    wb: int  # write scoreboard, 7: none
    rb: int  # read scoreboard, 7: none
    wait: int  # mask of scoreboards waited for

    @property
    def op(self) -> str:
        body = re.sub(r"^@!?U?P\w+\s+", "", self.text)
        return body.split()[0] if body else ""


_LINE = re.compile(r"^\s+/\*([0-9a-f]+)\*/\s+(.*?)\s*;\s*/\* (0x[0-9a-f]+) \*/\s*$")
_HI = re.compile(r"^\s+/\* (0x[0-9a-f]+) \*/\s*$")
_LABEL = re.compile(r"^(\.L_x_\d+):")


def parse(sass_hex: str) -> tuple[list[Ins], dict[str, int]]:
    """nvdisasm ``-c -hex`` output -> instructions in code order, and label -> instruction index."""
    out: list[Ins] = []
    labels: dict[str, int] = {}
    pending = None
    for line in sass_hex.splitlines():
        m = _LABEL.match(line.strip())
        if m:
            labels[m.group(1)] = len(out)
            continue
        m = _LINE.match(line)
        if m:
            pending = (int(m.group(1), 16), m.group(2))
            continue
        m = _HI.match(line)
        if m and pending is not None:
            ctl = int(m.group(1), 16) >> 41
            out.append(Ins(pending[0], pending[1], ctl & 15, (ctl >> 5) & 7, (ctl >> 8) & 7, (ctl >> 11) & 63))
            pending = None
    return out, labels


def sass_hex(spec) -> str:
    from cupy.cuda import nvrtc

    from cupy_fmha import compile as C

    tool = C.nvdisasm_path()
    if tool is None:
        sys.exit("nvdisasm not found (pip install nvidia-cuda-nvdisasm)")
    prog = nvrtc.createProgram(C.load_source(spec.source), f"{spec.name}.cu", [], [])
    try:
        nvrtc.compileProgram(prog, [*C.nvrtc_options(spec, "sm_90a"), *C._nvrtc_include_dirs()])
        cubin = C._whole_elf(nvrtc.getCUBIN(prog))
    finally:
        nvrtc.destroyProgram(prog)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, "-c", "-hex", f.name], capture_output=True, text=True, check=True).stdout


_BRANCH = re.compile(r"BRA(?:\.\w+)*\s+(?:!?U?P\w+,\s*)?`\((\.L_x_\d+)\)")


def _walk(ins: list[Ins], labels: dict[str, int], start: int, end: int, take_conditional: bool,
          flip: frozenset) -> list[Ins]:
    """The instructions from ``start`` up to ``end`` along one path: an unconditional forward branch
    to a label inside is followed; conditional ones (numbered from 0 in path order) are taken when
    ``take_conditional``, except those whose number is in ``flip`` (the other way); branches out of
    the stretch or backwards fall through."""
    path, i, seen = [], start, 0
    while i < end:
        x = ins[i]
        path.append(x)
        m = _BRANCH.search(x.text)
        if m and i < labels.get(m.group(1), -1) < end:
            take = True
            if x.text.startswith("@"):
                take = take_conditional != (seen in flip)
                seen += 1
            if take:
                i = labels[m.group(1)]
                continue
        i += 1
    return path


def _first(ins: list[Ins], what: str, lo: int = 0) -> int:
    for i in range(lo, len(ins)):
        if ins[i].text.startswith(what):
            return i
    raise SystemExit(f"no `{what}` in the machine code: not the overlapped pipeline (PV_OVERLAP=1)?")


def softmax_path(ins: list[Ins], labels: dict[str, int], flip: frozenset = frozenset()) -> list[Ins]:
    """The steady-state softmax of the overlapped forward: after the first ``WARPGROUP.DEPBAR.LE
    gsb0, 0x1`` up to the next ``SYNCS.PHASECHK``, conditional branches taken (the first one skips the
    mask tests; flip 0 for an edge tile)."""
    start = _first(ins, "WARPGROUP.DEPBAR.LE gsb0, 0x1") + 1
    end = next(i for i in range(start, len(ins)) if ins[i].op.startswith("SYNCS.PHASECHK"))
    return _walk(ins, labels, start, end, True, flip)


def operands_path(ins: list[Ins], labels: dict[str, int], flip: frozenset = frozenset()) -> list[Ins]:
    """The overlapped forward's loop from the wait for P_{i-2} V_{i-2} (its last ``WARPGROUP.DEPBAR.LE
    gsb0, 0x0`` before the steady-state GEMMs) to their ``WARPGROUP.ARRIVE``: O's rescale, P packed,
    the turn's barrier (counted as issued at once); conditional branches taken (LAZY_RESCALE's skipped
    rescale is then the path)."""
    d1 = _first(ins, "WARPGROUP.DEPBAR.LE gsb0, 0x1")
    end = max(i for i in range(d1) if ins[i].text.startswith("WARPGROUP.ARRIVE"))
    start = max(i for i in range(end) if ins[i].text.startswith("WARPGROUP.DEPBAR.LE gsb0, 0x0"))
    return _walk(ins, labels, start, end, True, flip)


def loop_path(ins: list[Ins], labels: dict[str, int], flip: frozenset = frozenset()) -> list[Ins]:
    """The overlapped forward's whole loop iteration in one stretch: from the wait for P_{i-2} V_{i-2}
    (as :func:`operands_path`) through the GEMMs' issue, what runs under them (the dropout build's
    keep bits) and the wait for S_i (counted as met at once) to the softmax's end (as
    :func:`softmax_path`): a warp's whole share of a key block's issue slots and pipes."""
    d1 = _first(ins, "WARPGROUP.DEPBAR.LE gsb0, 0x1")
    arrive = max(i for i in range(d1) if ins[i].text.startswith("WARPGROUP.ARRIVE"))
    start = max(i for i in range(arrive) if ins[i].text.startswith("WARPGROUP.DEPBAR.LE gsb0, 0x0"))
    end = next(i for i in range(d1 + 1, len(ins)) if ins[i].op.startswith("SYNCS.PHASECHK"))
    return _walk(ins, labels, start, end, True, flip)


def serial_paths(ins: list[Ins], labels: dict[str, int], flip: frozenset = frozenset()) -> tuple[list[Ins], list[Ins]]:
    """The serial pipeline's loop (PV_OVERLAP=0: the dropout builds above hdim 128 (at 128 until step 97), ALiBi at 256), in
    two stretches: from the S GEMM's issue (the first ``WARPGROUP.ARRIVE`` followed by a K-major
    HGMMA run that ends in a wait for all groups) to that wait (what runs under the GEMM: the keep
    bits), and from the wait to the P V GEMM's ``WARPGROUP.ARRIVE`` (the softmax, P packed, V's wait);
    conditional branches taken as in the softmax region."""
    arrives = [i for i, x in enumerate(ins) if x.text.startswith("WARPGROUP.ARRIVE")]
    for a in arrives:
        wait = next((i for i in range(a + 1, len(ins)) if ins[i].text.startswith("WARPGROUP.DEPBAR")), None)
        nxt = next((b for b in arrives if b > a), None)
        if wait is None or nxt is None or not ins[wait].text.startswith("WARPGROUP.DEPBAR.LE gsb0, 0x0"):
            continue
        if any("tnspB" in ins[i].text for i in range(a, wait)) or not any(ins[i].op.startswith("HGMMA") for i in range(a, wait)):
            continue  # (a P V GEMM, or no GEMM)
        if not any(ins[i].op.startswith("MUFU") for i in range(wait, nxt)):
            continue  # (not the loop's S: no softmax after it)
        return _walk(ins, labels, a, wait, True, flip), _walk(ins, labels, wait, nxt, True, flip)
    raise SystemExit("no serial S GEMM followed by a softmax: not the serial pipeline (PV_OVERLAP=0)?")


@dataclass
class Timing:
    instructions: int
    cycles: int  # one warp, alone
    fixed_wait: int  # cycles of stall counts above 1 (ncu's `wait`)
    scoreboard_wait: int  # cycles waited on scoreboards
    mufu: int
    mufu_wait: int  # cycles an MUFU waited for the unit


def simulate(path: list[Ins], trace=None) -> Timing:
    t, ready, mufu_free = 0, [0] * 6, 0
    fixed = sb = mw = mufu = 0
    for x in path:
        need = max([ready[b] for b in range(6) if x.wait >> b & 1] + [t])
        sb += need - t
        issue = need
        if x.op.startswith("MUFU"):
            mufu += 1
            if mufu_free > issue:
                mw += mufu_free - issue
                issue = mufu_free
            mufu_free = issue + MUFU_INTERVAL
        if x.wb != 7:
            ready[x.wb] = max(ready[x.wb], issue + LATENCY.get(x.op.split(".")[0], LATENCY["default"]))
        if x.rb != 7:
            ready[x.rb] = max(ready[x.rb], issue + READ_LATENCY)
        if trace is not None:
            trace(issue, x)
        fixed += max(0, x.stall - 1)
        t = issue + max(1, x.stall)
    return Timing(len(path), t, fixed, sb, mufu, mw)


def pipe_of(x: Ins) -> str:
    """The pipe ``simulate_warps`` charges an instruction to (``PIPE_INTERVAL``; "other": 1 cycle)."""
    base = x.op.split(".")[0]
    if base == "MUFU":
        return "mufu"
    if base in _ALU:
        return "alu"
    if base in _FMAHEAVY:
        return "fmaheavy"
    return "other"


@dataclass
class WarpsTiming:
    cycles: int  # until the last warp's last instruction has issued (and its stall passed)
    finish: list  # per warp
    issue_slots: int  # instructions issued in all (one per cycle at most)
    pipe_busy: dict  # cycles each pipe was occupied


def simulate_warps(paths: list[list[Ins]], starts: list[int] | None = None, policy: str = "gto") -> WarpsTiming:
    """Several warps on one SM sub-partition, each running its own path in order from its start
    cycle: one instruction a cycle from the sub-partition (the oldest ready warp, greedily the one
    that issued last), each pipe taking a warp instruction every PIPE_INTERVAL cycles, and every
    warp's own stall counts and scoreboards as in :func:`simulate`. The contention that the one-warp
    model leaves out: two or three MMA warps of a sub-partition in their softmax at once share the
    issue slot, the ALU pipe's 2-cycle pace and the MUFU unit."""
    n = len(paths)
    starts = list(starts or [0] * n)
    pc, t_next, ready = [0] * n, starts[:], [[0] * 6 for _ in range(n)]
    pipe_free = {k: 0 for k in (*PIPE_INTERVAL, "other")}
    busy = {k: 0 for k in pipe_free}
    finish, last, t, slots = [0] * n, -1, min(starts) if n else 0, 0
    while any(pc[w] < len(paths[w]) for w in range(n)):
        if policy == "lrr":  # loose round robin: from the warp after the one that issued last
            order = [(last + 1 + k) % n for k in range(n)]
        else:  # greedy then oldest: the warp that issued last while it can, else the lowest-numbered
            order = ([last] if last >= 0 else []) + [w for w in range(n) if w != last]
        chosen = None
        for w in order:
            if pc[w] >= len(paths[w]) or t_next[w] > t:
                continue
            x = paths[w][pc[w]]
            if any(ready[w][b] > t for b in range(6) if x.wait >> b & 1):
                continue
            if pipe_free[pipe_of(x)] > t:
                continue
            chosen = w
            break
        if chosen is None:
            t += 1
            continue
        w, x = chosen, paths[chosen][pc[chosen]]
        pipe = pipe_of(x)
        step = PIPE_INTERVAL.get(pipe, 1)
        pipe_free[pipe] = t + step
        busy[pipe] += step
        if x.wb != 7:
            ready[w][x.wb] = max(ready[w][x.wb], t + LATENCY.get(x.op.split(".")[0], LATENCY["default"]))
        if x.rb != 7:
            ready[w][x.rb] = max(ready[w][x.rb], t + READ_LATENCY)
        t_next[w] = t + max(1, x.stall)
        pc[w] += 1
        slots += 1
        last = w
        if pc[w] == len(paths[w]):
            finish[w] = t_next[w]
        t += 1
    return WarpsTiming(max(finish) if n else 0, finish, slots, busy)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=["fwd-ws"])
    ap.add_argument("dtype")
    ap.add_argument("hdim_q", type=int)
    ap.add_argument("hdim_v", type=int)
    ap.add_argument("--region", choices=["softmax", "operands", "block", "loop", "serial", "all"], default="softmax",
                    help="block: the operands then the softmax (a warp's work per key block outside the GEMMs); "
                    "loop: the whole iteration, the GEMMs' issue and what runs under them too (the waits met at once)")
    ap.add_argument("--dropout", action="store_true", help="the dropout build")
    ap.add_argument("--alibi", action="store_true", help="the ALiBi build")
    ap.add_argument("--bias", type=int, default=0, choices=(0, 2, 4), help="the TMA bias build with 2- or 4-byte elements "
                    "(loop: whole only with BIAS_ACC=1; where the softmax adds the tile, the path stops at its mbarrier wait)")
    ap.add_argument("--edge", action="store_true", help="softmax: the path through the mask tests (--flip 0)")
    ap.add_argument("--flip", default="", help="comma-separated numbers of conditional branches (from 0, in path "
                    "order) to go the other way: fall through instead of taking")
    ap.add_argument("--list", action="store_true", help="print each instruction with its issue cycle")
    ap.add_argument("--warps", type=int, default=1, help="this many warps on one sub-partition, each running the "
                    "region (simulate_warps: shared issue slot and pipes)")
    ap.add_argument("--stagger", type=int, default=0, help="--warps: warp w starts w * STAGGER cycles late")
    ap.add_argument("--policy", choices=["gto", "lrr"], default="gto", help="--warps: which ready warp issues (greedy "
                    "then oldest, or loose round robin); the periods differ by up to ~30%% between them and with the "
                    "stagger, so only the pipes' totals (the bounds printed) are firm")
    ap.add_argument("--blocks", type=int, default=1, help="--warps: each warp runs the region this many times in a "
                    "row; the period printed is the time per round (the softmax side's pace per key block)")
    a = ap.parse_args(argv)
    from cupy_fmha.backends.cuda import fwd_ws_spec

    spec = fwd_ws_spec(a.dtype, a.hdim_q, a.hdim_v, alibi=a.alibi, dropout=a.dropout, bias_tma=a.bias)
    ins, labels = parse(sass_hex(spec))
    flip = frozenset(int(v) for v in a.flip.split(",") if v) | (frozenset({0}) if a.edge else frozenset())
    if a.region == "serial":
        for label, part in zip(("under S", "after S"), serial_paths(ins, labels, flip)):
            r = simulate(part)
            print(f"{spec.name}  serial, {label}: {r.instructions} instructions, {r.cycles} cycles for one warp alone; "
                  f"fixed-latency stalls {r.fixed_wait}, scoreboard waits {r.scoreboard_wait}, MUFU {r.mufu}")
        return 0
    if a.region == "all":
        path = ins
    elif a.region == "operands":
        path = operands_path(ins, labels, flip)
    elif a.region == "block":
        path = operands_path(ins, labels, flip) + softmax_path(ins, labels, flip)
    elif a.region == "loop":
        path = loop_path(ins, labels, flip)
    else:
        path = softmax_path(ins, labels, flip)
    if a.warps > 1:
        r = simulate_warps([path * a.blocks] * a.warps, [w * a.stagger for w in range(a.warps)], a.policy)
        one = simulate(path)
        print(f"{spec.name}  {a.region}{' (edge)' if a.edge else ''}: {a.warps} warps on a sub-partition, starts "
              f"{a.stagger} cycles apart, {a.blocks} round(s) each: the last done at {r.cycles}"
              f"{f' (period {max(f - w * a.stagger for w, f in enumerate(r.finish)) / a.blocks:.0f} a round)' if a.blocks > 1 else ''}, each taking "
              f"{[f - w * a.stagger for w, f in enumerate(r.finish)]} (one warp alone {one.cycles} a round); "
              f"{r.issue_slots} issue slots; pipes busy {dict((k, v) for k, v in r.pipe_busy.items() if v)}; "
              f"a round's bounds: issue {r.issue_slots // a.blocks}, "
              f"{', '.join(f'{k} {v // a.blocks}' for k, v in r.pipe_busy.items() if v and k != 'other')}")
        return 0
    trace = (lambda t, x: print(f"{t:6d}  {x.stall:2d} {'w' + str(x.wb) if x.wb != 7 else '  '} "
                                f"{'m%02x' % x.wait if x.wait else '   '}  {x.text}")) if a.list else None
    r = simulate(path, trace)
    print(f"{spec.name}  {a.region}{' (edge)' if a.edge else ''}: {r.instructions} instructions, "
          f"{r.cycles} cycles for one warp alone; fixed-latency stalls {r.fixed_wait}, scoreboard waits "
          f"{r.scoreboard_wait}, MUFU {r.mufu} ({MUFU_INTERVAL * r.mufu} cycles of the unit; waited {r.mufu_wait})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

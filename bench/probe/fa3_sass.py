"""Instruction counts of a forward's key-block loop, ours against FlashAttention-3's, offline (no GPU).

FlashAttention-3's kernels come from the `flash-attn3-jax` wheel (the peer bench/fa3_peer.py times): its
extension library holds the fatbins uncompressed, so the sm_90a cubins are cut out of the file by their
fatbin headers and disassembled with nvdisasm (the `nvidia-cuda-nvdisasm` wheel the library's tools use).
A kernel is picked by substrings of its mangled name; the loop is the smallest backward branch whose body
holds at least 12 HGMMA. For facts (what the other kernel's loop issues per key block), not for code.

    python bench/probe/fa3_sass.py WHEEL [NAME_SUBSTRING ...]     FA3's loop (default: bf16 hdim 128, 176 keys,
                                                                  no mask, the static persistent scheduler)
    [CUPY_FMHA_FWD_WS_TILES=KEY=V,...] python bench/probe/fa3_sass.py --ours
                                                                  our ws forward's at hdim 128 (bf16), the
                                                                  variable choosing a variant
(bench/NOTES.md row 112.)
"""

from __future__ import annotations

import collections
import re
import struct
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cupy_fmha import compile as C  # noqa: E402

#: FA3's bf16 hdim-128 forward without a mask, 128 x 176 tiles, no PackGQA / Split, static persistent grid
FA3_DEFAULT = ("ILi176E", "bfloat16", "StaticPersistentTileSchedulerILb0EE",
               "Sm90ELb0ELb0ELb0ELb0ELb0ELb0ELb0ELb1ELb1ELb0ELb0ELb0E")
_INS = re.compile(r"^\s*/\*[0-9a-f]{4}\*/\s+(.*?)\s*;", re.M)


def cubins_of_wheel(wheel: str) -> list[bytes]:
    """The CUDA ELF images in the fatbins of every shared library of ``wheel``."""
    out = []
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if not name.endswith(".so"):
                continue
            data = z.read(name)
            for m in re.finditer(rb"\x50\xed\x55\xba", data):  # fatbin header: magic, version, size
                _, _, hsz, fsz = struct.unpack_from("<IHHQ", data, m.start())
                p, end = m.start() + hsz, m.start() + hsz + fsz
                while p < end:
                    kind, _, hs, size = struct.unpack_from("<HHIQ", data, p)
                    if kind == 2:  # (an ELF image; 1 would be PTX)
                        out.append(data[p + hs:p + hs + size])
                    p += hs + size
    return out


def functions(sass: str) -> dict[str, str]:
    """nvdisasm's text split by function section."""
    parts = re.split(r"^\s*\.section\s+\.text\.([^,\s]+).*$", sass, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def loop_body(text: str) -> list[str] | None:
    """The smallest loop (label .. backward branch to it) with at least 12 HGMMA: its instructions."""
    lines = text.split("\n")
    label = {m.group(1): i for i, l in enumerate(lines) if (m := re.match(r"^\s*(\.L_x_\d+):", l))}
    best = None
    for i, line in enumerate(lines):
        m = re.search(r"BRA.*`\((\.L_x_\d+)\)", line)
        if m and label.get(m.group(1), i) < i:
            body = [x.group(1) for x in (_INS.match(l) for l in lines[label[m.group(1)]:i + 1]) if x]
            if sum("HGMMA" in b for b in body) >= 12 and (best is None or len(body) < len(best)):
                best = body
    return best


def opcode(ins: str) -> str:
    return re.sub(r"^@!?U?P\w+ ", "", ins).split()[0].split(".")[0]


def report(name: str, body: list[str] | None) -> None:
    if body is None:
        print(f"{name[:120]}: no loop with 12 HGMMA")
        return
    c = collections.Counter(opcode(b) for b in body)
    print(f"{name[:160]}\n  loop: {len(body)} instructions; {dict(c.most_common(20))}")


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--ours":
        from cupy_fmha.backends import cuda
        spec = cuda.fwd_ws_spec("bf16", 128, 128)  # (CUPY_FMHA_FWD_WS_TILES picks a variant, as everywhere)
        report(spec.name, loop_body(C.sass_text(spec) or ""))
        return
    wheel, want = argv[0], tuple(argv[1:]) or FA3_DEFAULT
    seen = set()
    for cubin in cubins_of_wheel(wheel):
        if not any(w.encode() in cubin for w in want[:1]):
            continue
        sass = C.disassemble(cubin) or ""
        for fname, text in functions(sass).items():
            if fname not in seen and all(w in fname for w in want):
                seen.add(fname)
                report(fname, loop_body(text))


if __name__ == "__main__":
    main(sys.argv[1:])

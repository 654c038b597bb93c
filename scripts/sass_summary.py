#!/usr/bin/env python3
"""Instruction counts of a build's kernels from their SASS, without a GPU: the size of each kernel
and, per loop that issues wgmma (HGMMA), its instructions by opcode. A code-size change shows here
before any device time is spent (docs/PERFORMANCE.md item 61: a second copy of the forward's loop
body, +55% instructions, lost 22-31%).

    cuobjdump -sass -arch sm_90a build/src/libraggedattn.so > /tmp/sass.txt
    scripts/sass_summary.py /tmp/sass.txt [--kernel fwd_kernel] [--loops]

cuobjdump ships with the CUDA toolkit; where a toolkit lacks it, PyPI's `nvidia-cuda-cuobjdump`
package has it (under nvidia/cu13/bin of the environment it is installed into).
Static counts: a loop's count includes every path through it (masked and unmasked steps, softcap),
not the instructions one iteration issues.
"""
import argparse
import collections
import re
import sys

INSTR = re.compile(r"/\*([0-9a-f]{4,7})\*/\s+([^;]*);")
TARGET = re.compile(r"0x([0-9a-f]+)")


def kernels(text):
    """{mangled name: [(offset, instruction text)]} in the dump's order."""
    out = {}
    for part in re.split(r"\n\s*Function : ", text)[1:]:
        name = part.split("\n", 1)[0].strip()
        out[name] = [(int(o, 16), i.strip()) for o, i in INSTR.findall(part)]
    return out


def opcode(instr):
    """The instruction's opcode without its predicate and modifiers: '@!P0 BRA 0x60' -> 'BRA'."""
    words = re.sub(r"^@!?U?P\w+\s+", "", instr).split()
    return words[0].split(".")[0] if words else ""


def loops(instrs):
    """(first, last) indices of each backward branch's range: the loops, outermost included."""
    at = {off: k for k, (off, _) in enumerate(instrs)}
    found = set()
    for k, (off, ins) in enumerate(instrs):
        if opcode(ins) != "BRA":
            continue
        t = TARGET.search(ins.split("BRA", 1)[1])
        if t and int(t.group(1), 16) < off and int(t.group(1), 16) in at:
            found.add((at[int(t.group(1), 16)], k))
    return sorted(found)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("sass", help="cuobjdump -sass output")
    ap.add_argument("--kernel", default="", help="only kernels whose mangled name has this")
    ap.add_argument("--loops", action="store_true", help="also each loop that issues HGMMA")
    a = ap.parse_args()
    ks = {n: i for n, i in kernels(open(a.sass).read()).items() if a.kernel in n}
    if not ks:
        sys.exit(f"sass_summary.py: no kernel in {a.sass} matches {a.kernel!r}")
    for name, instrs in sorted(ks.items(), key=lambda kv: -len(kv[1])):
        print(f"{len(instrs):7d}  {name}")
        if not a.loops:
            continue
        for first, last in loops(instrs):
            ops = collections.Counter(opcode(i) for _, i in instrs[first:last + 1])
            if ops["HGMMA"]:
                top = ", ".join(f"{op} {n}" for op, n in ops.most_common(10))
                print(f"         loop {instrs[first][0]:#x}-{instrs[last][0]:#x}: "
                      f"{last - first + 1} instructions, HGMMA {ops['HGMMA']}; {top}")


if __name__ == "__main__":
    main()

"""scripts/sass_summary.py on a small hand-written SASS dump: kernels, opcodes, loops."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
import sass_summary  # noqa: E402

DUMP = """
        Function : _Z1aPf
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0020*/              @!P0 FMUL R2, R2, R3 ;
        /*0030*/              @P1 BRA 0x10 ;
        /*0040*/                   EXIT ;
        Function : _Z1bPf
        /*0000*/                   BRA 0x20 ;
        /*0010*/                   NOP ;
"""


def test_kernels_opcodes_and_loops():
    ks = sass_summary.kernels(DUMP)
    assert list(ks) == ["_Z1aPf", "_Z1bPf"]
    a = ks["_Z1aPf"]
    assert len(a) == 5 and a[3] == (0x30, "@P1 BRA 0x10")
    assert [sass_summary.opcode(i) for _, i in a] == ["MOV", "HGMMA", "FMUL", "BRA", "EXIT"]
    assert sass_summary.loops(a) == [(1, 3)]           # the branch back to 0x10
    assert sass_summary.loops(ks["_Z1bPf"]) == []      # a forward branch is no loop

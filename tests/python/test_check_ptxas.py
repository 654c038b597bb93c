"""scripts/check_ptxas.sh --report on hand-written ptxas -v reports: which of ptxas's wgmma reports
fail the check (every serialization reason, injected waits, spills in the forward's grid kernel)
and which do not (injected arrives, spills elsewhere). The lines are ptxas 13.0's own format."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "check_ptxas.sh")
BWD = "_ZN10raggedattn4sm9010bwd_kernelI13__nv_bfloat16Li128ELi128EEEvNS0_12BwdTmaParamsE"
FWD = "_ZN10raggedattn4sm9010fwd_kernelI13__nv_bfloat16Li128ELi128EEEvNS0_12FwdTmaParamsE"
PERSISTENT = "_ZN10raggedattn4sm9021fwd_persistent_kernelI13__nv_bfloat16Li128ELi128EEEvNS0_12FwdTmaParamsE"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def properties(name, spill_bytes=0):
    return (f"ptxas info    : Function properties for {name}\n"
            f"    {spill_bytes} bytes stack frame, {spill_bytes} bytes spill stores, "
            f"{spill_bytes} bytes spill loads\n"
            "ptxas info    : Used 168 registers, used 2 barriers\n")


def serialized(code, reason, name):
    # ptxas ends the register reason with "for the function", the others with "in the function".
    where = "for" if code == "C7512" else "in"
    return (f"ptxas info    : ({code}) Potential Performance Loss: wgmma.mma_async instructions are "
            f"serialized due to {reason} {where} the function '{name}'\n")


def injected(what, code, name):
    use = "use of registers defined by GMMA" if what == "wait" else "use of registers in GMMA"
    return (f"ptxas info    : ({code}) warpgroup.{what} is injected in around line 21735 by "
            f"compiler to allow {use} in function '{name}'\n")


CLEAN = properties(BWD, 8) + properties(FWD) + properties(PERSISTENT, 12)


def check(tmp_path, text):
    log = tmp_path / "ptxas.log"
    log.write_text(text)
    return subprocess.run(["bash", SCRIPT, "--report", str(log)], capture_output=True, text=True)


def test_clean_report_passes(tmp_path):
    # Spills outside the forward's grid kernel and injected arrives are reported, not failed.
    r = check(tmp_path, CLEAN + injected("arrive", "C7519", FWD))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 kernels, 2 with spills, 0 serialized wgmma or injected waits, 1 injected arrives" \
        in r.stdout


@pytest.mark.parametrize("code,reason", [
    ("C7515", "non wgmma instructions defining accumulator registers of a wgmma between start and "
              "end of the pipeline stage"),
    ("C7514", "non wgmma instructions reading accumulator registers of  a wgmma between start and "
              "end of the pipeline stage"),
    ("C7512", "insufficient register resources"),
])
def test_every_serialization_reason_fails(tmp_path, code, reason):
    r = check(tmp_path, CLEAN + serialized(code, reason, BWD))
    assert r.returncode == 1, r.stdout + r.stderr
    assert code in r.stdout and BWD in r.stdout


def test_injected_wait_fails(tmp_path):
    r = check(tmp_path, CLEAN + injected("wait", "C7517", BWD))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "C7517" in r.stdout


def test_grid_kernel_spill_fails(tmp_path):
    r = check(tmp_path, properties(BWD, 8) + properties(FWD, 16))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "forward grid kernel spills 16 bytes" in r.stdout


def test_unreadable_report_is_a_usage_error(tmp_path):
    r = subprocess.run(["bash", SCRIPT, "--report", str(tmp_path / "missing.log")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "cannot read" in r.stderr

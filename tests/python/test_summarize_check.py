"""scripts/summarize_check.py on a small hand-written `raggedattn check` log: the worst segment per
tensor, the verdict, and a clear error for a log that is not there."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPTS = os.path.join(os.path.dirname(__file__), "..", "..", "scripts")
sys.path.insert(0, SCRIPTS)
import summarize_check  # noqa: E402

LOG = """raggedattn 0.1.0 (CUDA build), seed 1
== two_segs: [100,7] Hq=4 Hkv=2 D=128/128 bf16, causal top-left, dq_accum fp32, seed 0x1
  seg  len_q len_kv | O                         | LSE                       | dQ                        | dK                        | dV
                    |      cos     rel     max  |      cos     rel     max  |      cos     rel     max  |      cos     rel     max  |      cos     rel     max
    0    100    100 | 0.999998 1.9e-03 8.9e-03  | 1.000000 4.4e-08 4.8e-07  | 0.999997 2.5e-03 1.3e-02  | 0.999997 2.5e-03 2.6e-02  | 0.999997 2.3e-03 2.2e-02
    1      7      7 | 0.999990 2.1e-03 8.9e-03  | 1.000000 4.4e-08 4.8e-07  | 0.999000! 9.0e-02! 1.3e-01  | 0.999997 2.4e-03 2.6e-02  | 0.999997 2.2e-03 2.2e-02
two_segs                 FAIL  cuda_sm90 bf16
== empty_seg: [0] Hq=4 Hkv=2 D=128/128 bf16
    0      0      0 | (empty) | (empty) | (empty) | (empty) | (empty)
empty_seg                PASS  cuda_sm90 bf16
"""


def test_worst_segment_and_verdict(tmp_path):
    log = tmp_path / "check.txt"
    log.write_text(LOG)
    res = summarize_check.parse(str(log))
    assert list(res) == ["two_segs", "empty_seg"]
    t = res["two_segs"]
    assert t["verdict"] == "FAIL"
    assert t["rel"][0] == 2.1e-03 and t["rel"][2] == 9.0e-02 and t["rel"][3] == 2.5e-03
    assert t["cos"][2] == 0.999 and t["cos"][0] == 0.99999
    assert res["empty_seg"]["verdict"] == "PASS" and res["empty_seg"]["rel"] == [0.0] * 5


def test_missing_log_is_named(tmp_path):
    run = subprocess.run([sys.executable, os.path.join(SCRIPTS, "summarize_check.py"),
                          f"fp32={tmp_path / 'absent.txt'}"], capture_output=True, text=True)
    assert run.returncode != 0
    assert "no such log" in run.stderr and "absent.txt" in run.stderr

"""scripts/ncu_percycle.py on a small hand-written ncu raw CSV: launches, units, filtering."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "ncu_percycle.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import ncu_percycle  # noqa: E402

# Two launches, wrapped in the lines ncu and the program print around the CSV. ncu picks the units
# per run: ms and Gbyte here, ns and byte in RAW_NS.
RAW = """==PROF== Connected to process 1 (/bin/prog)
forward      3.3702 ms    652.52 TFLOP/s
"ID","Kernel Name","gpu__time_duration.sum","gpc__cycles_elapsed.max","sm__cycles_elapsed.avg.per_second","sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active","dram__bytes_read.sum","dram__bytes_write.sum","sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32_sparsity_off.sum"
"","","ms","cycle","Ghz","%","Gbyte","Mbyte",""
"0","void fwd_kernel<__nv_bfloat16, 128, 128>(FwdTmaParams)","3.127296","5,384,714","1.701669","77.53","1.992707","123.022336","2,211,908,157,440"
"1","cudnn_generated_sdpa_fprop","3.370400","5,772,685","1.691890","74.66","0.402685","127.142144","2,216,203,124,736"
==PROF== Disconnected from process 1
"""


def write(tmp_path, text):
    p = tmp_path / "raw.csv"
    p.write_text(text)
    return str(p)


def test_launches_scale_units(tmp_path):
    path = write(tmp_path, RAW)
    got = list(ncu_percycle.launches(path))
    assert [name for name, _ in got] == ["void fwd_kernel<__nv_bfloat16, 128, 128>(FwdTmaParams)",
                                         "cudnn_generated_sdpa_fprop"]
    ours = got[0][1]
    assert abs(ours["time"] - 3.127296e-3) < 1e-12
    assert ours["cycles"] == 5384714
    assert abs(ours["clock"] - 1.701669e9) < 1
    assert abs(ours["dram_read"] - 1.992707e9) < 1 and abs(ours["dram_write"] - 123.022336e6) < 1
    assert ours["ops"] == 2211908157440
    assert "issue" not in ours  # a metric the run did not collect is absent, not zero
    assert abs(got[1][1]["time"] - 3.3704e-3) < 1e-12


def test_other_units_give_the_same_values(tmp_path):
    raw_ns = (RAW.replace('"ms","cycle","Ghz","%","Gbyte","Mbyte"', '"ns","cycle","hz","%","byte","byte"')
              .replace('"3.127296","5,384,714","1.701669","77.53","1.992707","123.022336"',
                       '"3,127,296","5,384,714","1,701,669,000","77.53","1,992,707,000","123,022,336"'))
    ours = next(ncu_percycle.launches(write(tmp_path, raw_ns)))[1]
    assert abs(ours["time"] - 3.127296e-3) < 1e-12 and abs(ours["clock"] - 1.701669e9) < 1
    assert ours["dram_read"] == 1992707000 and ours["dram_write"] == 123022336


def test_table_and_filter(tmp_path):
    path = write(tmp_path, RAW)
    out = subprocess.run([sys.executable, SCRIPT, path, "--match", "fwd_kernel"],
                         capture_output=True, text=True, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("| fwd_kernel")]
    assert len(rows) == 1 and "cudnn" not in out
    assert "3.127 ms" in rows[0] and "5.385 M" in rows[0] and "1.70 GHz" in rows[0]
    assert "77.5%" in rows[0] and "1.99 / 0.12 GB" in rows[0]


def test_no_launch_is_an_error(tmp_path):
    path = write(tmp_path, RAW)
    r = subprocess.run([sys.executable, SCRIPT, path, "--match", "no_such_kernel"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "no kernel launch found" in r.stderr


def test_unknown_unit_is_an_error(tmp_path):
    path = write(tmp_path, RAW.replace('"Gbyte"', '"Pbyte"'))
    r = subprocess.run([sys.executable, SCRIPT, path], capture_output=True, text=True)
    assert r.returncode != 0 and "Pbyte" in (r.stderr + r.stdout)


def test_metrics_list_names_every_column():
    out = subprocess.run([sys.executable, SCRIPT, "--metrics"], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out.split(",") == list(ncu_percycle.METRICS.values())

"""The installed package: what it loads, and that it loads no framework it is not asked for."""

from __future__ import annotations

import os
import subprocess
import sys

import raggedattn


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True).stdout


def test_import_loads_no_framework():
    out = _run("import sys, raggedattn; print('torch' in sys.modules, 'jax' in sys.modules)")
    assert out.split() == ["False", "False"]


def test_library_is_the_packaged_one():
    """The extension finds libraggedattn.so beside itself (rpath $ORIGIN), not elsewhere."""
    package_dir = os.path.dirname(os.path.realpath(raggedattn.__file__))
    assert os.path.exists(os.path.join(package_dir, "libraggedattn.so"))
    maps = _run("import raggedattn; print(open('/proc/self/maps').read())")
    loaded = {line.split()[-1] for line in maps.splitlines() if "libraggedattn" in line}
    assert loaded == {os.path.join(package_dir, "libraggedattn.so")}, loaded


def test_versions_and_device_query():
    assert raggedattn.library_version() == raggedattn.__version__
    caps = raggedattn.query_device()
    assert set(caps) >= {"cuda", "device", "compute_capability", "num_sms"}
    assert isinstance(caps["cuda"], bool)


def test_problem_defaults_are_the_c_api_defaults():
    from raggedattn import _C

    p = _C.Problem()
    assert (p.dtype, p.mask, p.alignment, p.dq_accum, p.backend) == (
        _C.DTYPE_BF16, _C.MASK_NONE, _C.ALIGN_TOP_LEFT, _C.DQ_ACCUM_FP32, _C.BACKEND_AUTO)
    assert (p.window_left, p.window_right, p.q_strides, p.has_sink) == (-1, -1, (0, 0), 0)


def test_extension_exports_only_its_init():
    """Nothing the extension links in (a static C++ runtime included) may interpose on the
    library's symbols."""
    import glob
    import shutil

    import pytest

    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    (ext,) = glob.glob(os.path.join(os.path.dirname(raggedattn.__file__), "_C*.so"))
    out = subprocess.run([nm, "-D", "--defined-only", ext], check=True, capture_output=True,
                         text=True).stdout
    assert [line.split()[-1] for line in out.splitlines()] == ["PyInit__C"]


def test_plan_reports_its_path_by_the_library_name():
    from raggedattn import _C

    p = _C.Problem()
    p.batch = 1
    p.total_q = p.total_kv = p.max_seqlen_q = p.max_seqlen_kv = 8
    p.num_heads_q = p.num_heads_kv = 1
    p.head_dim_qk = p.head_dim_v = 64
    p.dtype = _C.DTYPE_FP32
    p.backend = _C.BACKEND_CPU
    assert _C.get_plan(p, -1).path == "cpu"

"""Every class of input the library rejects raises a Python exception, and no process dies of it.

Each case runs in a child process of its own: an input that crashes the process (a signal, as
SIGSEGV did on the GPU machine in a process that had imported torch and jax, while the library
formatted its message) then fails one test with the signal's name instead of ending the run.
The child prints one JSON line saying what the case's code raised; the parent checks it.

RATTN_TEST_PRELOAD_FRAMEWORKS=1 makes each child import torch and jax (those installed) before
raggedattn, the order in which the crash showed (a JAX-only process crashed too); on by default.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Dict, NamedTuple, Optional, Tuple

import pytest

import raggedattn

INSTALLED = {name: importlib.util.find_spec(name) is not None for name in ("torch", "jax")}
PRELOAD = os.environ.get("RATTN_TEST_PRELOAD_FRAMEWORKS", "1") == "1"
TIMEOUT_S = 300  # a child imports its framework and may compile (JAX) or run the CPU backend

_MARK = "RATTN_CASE_RESULT "


class Case(NamedTuple):
    name: str
    framework: str  # "torch", "jax", or "capi" (raggedattn._C, the C API as the bindings see it)
    code: str  # run after the framework's setup (_SETUP) in the child
    raises: Optional[str]  # the name of a class the exception must be an instance of; None: runs
    fragment: str = ""  # what the exception's message must contain
    device: str = "cpu"


# --- the child's setup, per framework: `inputs(...)` makes q, k, v; CU is [0, 4, 10] ----------

_SETUP = {
    "torch": """
        import raggedattn.torch as rt
        import torch

        DEVICE = torch.device(DEVICE_NAME)
        if DEVICE.type == "cuda" and not torch.cuda.is_available():
            skip("PyTorch sees no CUDA device")
        torch.manual_seed(0)

        def inputs(t=10, hq=2, hkv=2, d=64, dtype=torch.float32):
            return tuple(torch.randn(t, h, d, dtype=dtype, device=DEVICE) for h in (hq, hkv, hkv))

        CU = torch.tensor([0, 4, 10], dtype=torch.int32, device=DEVICE)
        """,
    "jax": """
        import raggedattn.jax as rj
        import jax
        import jax.numpy as jnp
        import numpy as np

        try:
            DEVICE = jax.devices("gpu" if DEVICE_NAME == "cuda" else DEVICE_NAME)[0]
        except RuntimeError as e:
            skip(f"JAX has no {DEVICE_NAME} device: {e}")
        jax.config.update("jax_default_device", DEVICE)

        def inputs(t=10, hq=2, hkv=2, d=64, dtype=jnp.float32):
            rng = np.random.default_rng(0)
            return tuple(jnp.asarray(rng.standard_normal((t, h, d)), dtype) for h in (hq, hkv, hkv))

        CU = jnp.array([0, 4, 10], jnp.int32)
        """,
    "capi": """
        import numpy as np
        from raggedattn import _C

        def problem(**fields):
            # A valid CPU problem (float32, 10 tokens in 2 segments, 2 heads of 64), then `fields`
            p = _C.Problem()
            p.batch, p.total_q, p.total_kv, p.max_seqlen_q, p.max_seqlen_kv = 2, 10, 10, 6, 6
            p.num_heads_q = p.num_heads_kv = 2
            p.head_dim_qk = p.head_dim_v = 64
            p.dtype, p.backend = _C.DTYPE_FP32, _C.BACKEND_CPU
            for name, value in fields.items():
                setattr(p, name, value)
            return p

        def forward(plan, q=None, cu=None, sink=None):
            # plan.forward on numpy buffers; q (an address) and cu (an array) replace valid ones;
            # sink: an array of sinks (none by default).
            t = np.zeros((10, 2, 64), np.float32)
            o = np.zeros_like(t)
            lse = np.zeros((2, 10), np.float32)
            cu = np.array([0, 4, 10], np.int32) if cu is None else cu
            ws = np.zeros(max(plan.workspace_size(_C.FORWARD), 1) + 16, np.uint8)
            ws_address = ws.ctypes.data + (-ws.ctypes.data % 16)
            plan.forward(t.ctypes.data if q is None else q, t.ctypes.data, t.ctypes.data,
                         o.ctypes.data, lse.ctypes.data, cu.ctypes.data,
                         cu.ctypes.data, 0, 0, ws_address, plan.workspace_size(_C.FORWARD), 0,
                         sink=0 if sink is None else sink.ctypes.data)

        def misaligned_address(elements):
            # An address inside a numpy buffer of `elements` float32s plus two that is not 16-byte
            # aligned (numpy's own alignment varies); the buffer stays alive as an attribute.
            misaligned_address.buffer = b = np.zeros(elements + 2, np.float32)
            return b.ctypes.data + (4 if (b.ctypes.data + 4) % 16 else 8)
        """,
}


def _runs(framework: str, d: int, device: str) -> Case:
    """Causal GQA 4/2 over segments [100, 200] at head dim d: forward and backward must run."""
    code = {
        "torch": f"""
            q, k, v = (t.requires_grad_() for t in inputs(300, 4, 2, {d}, torch.bfloat16))
            cu = torch.tensor([0, 100, 300], dtype=torch.int32, device=DEVICE)
            o = rt.attention(q, k, v, cu, cu, 200, 200, causal=True)
            o.float().sum().backward()
            assert o.shape == q.shape, o.shape
            for t in (o, q.grad, k.grad, v.grad):
                assert torch.isfinite(t).all()
            """,
        "jax": f"""
            q, k, v = inputs(300, 4, 2, {d}, jnp.bfloat16)
            cu = jnp.array([0, 100, 300], jnp.int32)
            attend = lambda q, k, v: rj.attention(q, k, v, cu, cu, 200, 200, causal=True)
            o = jax.jit(attend)(q, k, v)
            loss = lambda q, k, v: attend(q, k, v).astype(jnp.float32).sum()
            grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
            assert o.shape == q.shape, o.shape
            for t in (o, *grads):
                assert bool(jnp.isfinite(t.astype(jnp.float32)).all())
            """,
    }[framework]
    return Case(f"d{d}_causal_gqa_runs", framework, code, None, device=device)


CASES = [
    # Rejected by the library's plan (rattn_plan_create): ValueError with its message.
    Case("head_dim_80", "torch", "rt.attention(*inputs(d=80), CU, CU, 6, 6)",
         "ValueError", "head_dim_qk=80, head_dim_v=80; supported"),
    Case("head_dim_80", "jax", "rj.attention(*inputs(d=80), CU, CU)",
         "ValueError", "head_dim_qk=80, head_dim_v=80; supported"),
    Case("heads_6_over_4", "torch", "rt.attention(*inputs(hq=6, hkv=4), CU, CU, 6, 6)",
         "ValueError", "num_heads_q=6, num_heads_kv=4"),
    Case("heads_6_over_4", "jax", "rj.attention(*inputs(hq=6, hkv=4), CU, CU)",
         "ValueError", "num_heads_q=6, num_heads_kv=4"),
    Case("max_seqlen_over_tokens", "torch", "rt.attention(*inputs(), CU, CU, 11, 10)",
         "ValueError", "max_seqlen_q=11 (total_q=10)"),
    Case("max_seqlen_over_tokens", "jax", "rj.attention(*inputs(), CU, CU, 11, 10)",
         "ValueError", "max_seqlen_q=11 (total_q=10)"),
    Case("causal_right_window", "torch",
         "rt.attention(*inputs(), CU, CU, 6, 6, causal=True, window=(-1, 2))",
         "ValueError", "causal mask with window_right=2"),
    Case("causal_right_window", "jax",
         "rj.attention(*inputs(), CU, CU, causal=True, window=(-1, 2))",
         "ValueError", "causal mask with window_right=2"),
    # Rejected when the call runs: the CPU backend reads the segment arrays on the host. PyTorch
    # raises the library's ValueError; JAX raises it from the FFI handler as a JaxRuntimeError.
    Case("cu_seqlens_decreasing", "torch",
         "bad = torch.tensor([0, 6, 4], dtype=torch.int32)\n"
         "rt.attention(*inputs(), bad, bad, 10, 10)",
         "ValueError", "cu_seqlens_q decreases at segment 1 (6 -> 4)"),
    Case("cu_seqlens_decreasing", "jax",
         "bad = jnp.array([0, 6, 4], jnp.int32)\n"
         "jax.block_until_ready(rj.attention(*inputs(), bad, bad, 10, 10))",
         "RuntimeError", "cu_seqlens_q decreases at segment 1 (6 -> 4)"),
    # q's pointer one bf16 element past an allocation: the library checks 16-byte alignment.
    # JAX cannot express it (XLA allocates the buffers); capi-forward_misaligned_q covers it.
    Case("misaligned_q", "torch",
         "q, k, v = inputs(dtype=torch.bfloat16)\n"
         "q = torch.empty(q.numel() + 1, dtype=torch.bfloat16)[1:].view(q.shape)\n"
         "rt.attention(q, k, v, CU, CU, 6, 6)",
         "ValueError", "is not 16-byte aligned"),
    # Checked in Python before the library sees them.
    Case("negative_softmax_scale", "torch",
         "rt.attention(*inputs(), CU, CU, 6, 6, softmax_scale=-1.0)",
         "ValueError", "softmax_scale=-1.0; need a finite positive scale"),
    Case("negative_softmax_scale", "jax", "rj.attention(*inputs(), CU, CU, softmax_scale=-1.0)",
         "ValueError", "softmax_scale=-1.0; need a finite positive scale"),
    Case("dtype_mismatch", "torch",
         "q, k, v = inputs()\nrt.attention(q, k.bfloat16(), v, CU, CU, 6, 6)",
         "ValueError", "k has dtype torch.bfloat16 but q has torch.float32"),
    Case("dtype_mismatch", "jax",
         "q, k, v = inputs()\nrj.attention(q, k.astype(jnp.bfloat16), v, CU, CU)",
         "ValueError", "k has dtype bfloat16 but q has float32"),
    # Learnable sinks: one float logit per query head (16-bit ones are upcast; integers are not).
    Case("sink_wrong_shape", "torch", "rt.attention(*inputs(), CU, CU, 6, 6, sink=torch.zeros(3))",
         "ValueError", "sink has shape (3,); expected (2,)"),
    Case("sink_wrong_shape", "jax", "rj.attention(*inputs(), CU, CU, sink=jnp.zeros(3))",
         "ValueError", "sink has shape (3,); expected (2,)"),
    Case("sink_int_dtype", "torch",
         "rt.attention(*inputs(), CU, CU, 6, 6, sink=torch.zeros(2, dtype=torch.int32))",
         "ValueError", "sink has dtype torch.int32; supported: torch.float32"),
    Case("sink_int_dtype", "jax",
         "rj.attention(*inputs(), CU, CU, sink=jnp.zeros(2, jnp.int32))",
         "ValueError", "sink has dtype int32; supported: float32"),
    Case("int64_cu_seqlens", "torch", "rt.attention(*inputs(), CU.long(), CU, 6, 6)",
         "ValueError", "cu_seqlens_q is torch.int64"),
    # Without x64 JAX turns int64 into int32 (and warns) before the binding sees it.
    Case("int64_cu_seqlens", "jax",
         "jax.config.update('jax_enable_x64', True)\n"
         "rj.attention(*inputs(), np.array([0, 4, 10], np.int64), CU)",
         "ValueError", "cu_seqlens_q is int64"),
    # The extension directly: what the C API rejects, bypassing the bindings' own checks.
    Case("plan_batch_0", "capi", "_C.get_plan(problem(batch=0), -1)",
         "ValueError", "batch=0; need at least one segment"),
    Case("plan_negative_softmax_scale", "capi", "_C.get_plan(problem(softmax_scale=-1.0), -1)",
         "ValueError", "softmax_scale=-1; need a finite positive scale, or 0"),
    Case("forward_misaligned_q", "capi",
         "forward(_C.get_plan(problem(), -1), q=misaligned_address(10 * 2 * 64))",
         "ValueError", "is not 16-byte aligned"),
    Case("plan_has_sink_2", "capi", "_C.get_plan(problem(has_sink=2), -1)",
         "ValueError", "has_sink=2; supported: 0 (no sinks), 1 (one per query head)"),
    Case("forward_sink_without_has_sink", "capi",
         "forward(_C.get_plan(problem(), -1), sink=np.zeros(2, np.float32))",
         "ValueError", "sink is given but the problem has no sinks (has_sink=0)"),
    Case("forward_has_sink_without_sink", "capi", "forward(_C.get_plan(problem(has_sink=1), -1))",
         "ValueError", "sink is null"),
    Case("forward_cu_seqlens_decreasing", "capi",
         "forward(_C.get_plan(problem(), -1), cu=np.array([0, 6, 4], np.int32))",
         "ValueError", "cu_seqlens_q decreases at segment 1 (6 -> 4)"),
    # CUDA paths take bf16 and fp16 only.
    Case("fp32", "torch", "rt.attention(*inputs(), CU, CU, 6, 6)",
         "ValueError", "dtype fp32 on a CUDA path", device="cuda"),
    Case("fp32", "jax", "rj.attention(*inputs(), CU, CU)",
         "ValueError", "dtype fp32 on a CUDA path", device="cuda"),
    # Supported problems next to the rejected ones: these must run.
    *(_runs(framework, d, device)
      for framework in ("torch", "jax") for d in (96, 192) for device in ("cpu", "cuda")),
]


def _id(case: Case) -> str:
    return f"{case.framework}-{case.name}" + ("-cuda" if case.device == "cuda" else "")


# --- the runner -------------------------------------------------------------------------------

_CHILD = """
import json
import sys
import traceback

def report(**fields):
    print(MARK + json.dumps(fields), flush=True)

def skip(reason):
    report(outcome="skipped", reason=reason)
    sys.exit(0)

# The frameworks before raggedattn (where PRELOAD names them): the order in which the crash showed.
for name in PRELOAD:
    __import__(name)

{setup}
try:
{code}
except BaseException as e:
    cause = e.__cause__
    report(outcome="raised", type=type(e).__qualname__, mro=[c.__name__ for c in type(e).__mro__],
           message=str(e), traceback=traceback.format_exc(),
           cause=None if cause is None else [type(cause).__qualname__, str(cause)])
else:
    report(outcome="returned")
"""


def run_child(setup: str, code: str, device: str = "cpu") -> dict:
    """Runs setup and code in a fresh interpreter; returns what its code did, as a dict.

    Fails the test where the child does not exit normally: killed by a signal, timed out, or an
    error outside the code under test.
    """
    return _verdict(_child(setup, code, device))


def _verdict(outcome: Tuple[str, object]) -> dict:
    """A child's outcome (_child) as the test sees it: its result, or the test failed or skipped."""
    kind, value = outcome
    if kind == "fail":
        pytest.fail(value)
    if kind == "skip":
        pytest.skip(value)
    return value


def _child(setup: str, code: str, device: str) -> Tuple[str, object]:
    """Runs one child; ("ok", result), ("skip", reason) or ("fail", message). It calls no pytest
    function, so that children can run on threads of their own (_started)."""
    preload = [name for name, found in INSTALLED.items() if found] if PRELOAD else []
    program = (
        f"MARK = {_MARK!r}\nPRELOAD = {list(preload)!r}\nDEVICE_NAME = {device!r}\n"
        + _CHILD.format(setup=textwrap.dedent(setup),
                        code=textwrap.indent(textwrap.dedent(code).strip(), "    "))
    )
    env = dict(os.environ, PYTHONFAULTHANDLER="1", XLA_PYTHON_CLIENT_PREALLOCATE="false")
    try:
        done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                              timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired as e:
        return "fail", f"the child ran past {TIMEOUT_S} s; stderr:\n{_tail(e.stderr)}"
    if done.returncode < 0:
        return "fail", (f"the child was killed by {_signal_name(-done.returncode)}; "
                        f"stdout:\n{_tail(done.stdout)}\nstderr:\n{_tail(done.stderr)}")
    results = [line[len(_MARK):] for line in done.stdout.splitlines() if line.startswith(_MARK)]
    if done.returncode != 0 or len(results) != 1:
        return "fail", (f"the child exited with {done.returncode} and {len(results)} results; "
                        f"stderr:\n{_tail(done.stderr)}")
    result = json.loads(results[0])
    if result["outcome"] == "skipped":
        return "skip", result["reason"]
    return "ok", result


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _tail(text, lines: int = 40) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join((text or "").splitlines()[-lines:])


def _skip_reason(case: Case) -> Optional[str]:
    if case.framework in INSTALLED and not INSTALLED[case.framework]:
        return f"{case.framework} is not installed"
    if case.device == "cuda" and not raggedattn.query_device()["cuda"]:
        return "the library sees no CUDA device (none here, or a CPU-only build)"
    return None


# Children run several at once: one that imports torch and jax on a GPU machine takes about 20 s,
# most of it spent importing, so one after the other the cases would take many minutes. Asked for
# a case's result, _started also starts the children of the cases after it (in the order pytest
# runs them), up to RATTN_TEST_CHILDREN at once (default: the cores, at most 8); each case is
# still a process of its own, and a selection of a few cases starts few more.
_WORKERS = max(1, int(os.environ.get("RATTN_TEST_CHILDREN", min(8, os.cpu_count() or 1))))
_POOL = ThreadPoolExecutor(max_workers=_WORKERS)
_STARTED: Dict[str, Future] = {}


def _started(case: Case) -> Future:
    ahead = [c for c in CASES[CASES.index(case):] if _skip_reason(c) is None][:_WORKERS]
    for c in ahead:
        if _id(c) not in _STARTED:
            _STARTED[_id(c)] = _POOL.submit(_child, _SETUP[c.framework], c.code, c.device)
    return _STARTED[_id(case)]


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_case(case: Case):
    reason = _skip_reason(case)
    if reason is not None:
        pytest.skip(reason)
    result = _verdict(_started(case).result())
    if case.raises is None:
        assert result["outcome"] == "returned", (
            f"raised {result['type']}: {result['message']}\n{result['traceback']}"
        )
        return
    assert result["outcome"] == "raised", f"returned; expected {case.raises}"
    assert case.raises in result["mro"], (
        f"raised {result['type']} (a {', '.join(result['mro'])}); expected a {case.raises}: "
        f"{result['message']}"
    )
    assert case.fragment in result["message"], result["message"]


# --- a missing framework says what to install ---------------------------------------------------

# How the framework's import fails: "blocked" sets sys.modules[name] = None, which makes `import
# name` raise wherever the framework is installed; "absent" needs it not installed at all.
@pytest.mark.parametrize("how", ["blocked", "absent"])
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_missing_framework_says_what_to_install(framework: str, how: str):
    if how == "absent" and INSTALLED[framework]:
        pytest.skip(f"{framework} is installed")
    block = f"sys.modules[{framework!r}] = None" if how == "blocked" else ""
    result = run_child(block, f"import raggedattn.{framework}")
    assert result["outcome"] == "raised", f"import raggedattn.{framework} succeeded"
    assert "ImportError" in result["mro"], result["type"]
    assert f"pip install {framework}" in result["message"], result["message"]
    assert f"raggedattn.{framework} needs" in result["message"], result["message"]
    # Chained from the framework's own error, which says what failed.
    assert result["cause"] is not None and framework in result["cause"][1], result["cause"]

"""raggedattn.jax on a GPU (skipped where JAX has none): the CUDA FFI handlers, jit and grad.

The reference is the float32 jax.numpy one of jax_reference.py, run on the same GPU from the
same low-precision inputs.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed")
import jax.numpy as jnp  # noqa: E402


def _gpu():
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:
        return None


GPU = _gpu()
pytestmark = pytest.mark.skipif(GPU is None, reason="JAX has no GPU")

import raggedattn.jax as rj  # noqa: E402
from cases import (  # noqa: E402
    CASES,
    CASES_BY_NAME,
    assert_segments_close,
    assert_zero_rows,
    full_mask,
    make_packing,
    mask_from_segment_ids,
    random_inputs,
    segment_ids_for,
)
from jax_reference import reference, segment_args  # noqa: E402

# Relative error per segment against float32 math from the same inputs.
TOL = {jnp.bfloat16: (1e-2, 2e-2), jnp.float16: (4e-3, 1e-2)}


@pytest.fixture(autouse=True)
def _on_gpu():
    with jax.default_device(GPU):
        yield


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_forward_and_gradients(case, dtype):
    packing = make_packing(case)
    q, k, v, d_o = (jnp.asarray(x, dtype) for x in random_inputs(case, packing))
    seg = segment_args(packing)
    mask = full_mask(case, packing)

    def ours(q, k, v):
        return rj.attention(q, k, v, max_seqlen_q=max(case.lens_q),
                            max_seqlen_kv=max(case.kv_lens), return_lse=True, **seg,
                            **case.options())

    def theirs(q, k, v):
        return reference(q, k, v, mask, case.scale, case.softcap)

    def loss(f, q, k, v):
        return jnp.sum(f(q, k, v)[0].astype(jnp.float32) * d_o.astype(jnp.float32))

    o, lse = jax.jit(ours)(q, k, v)
    assert next(iter(o.devices())).platform == "gpu"
    o_ref, lse_ref = theirs(q, k, v)
    tol, gtol = TOL[dtype]
    assert_segments_close(f"{case.name} o", o, o_ref, packing.rows_q, tol)
    assert_segments_close(f"{case.name} lse", lse, lse_ref, packing.rows_q, 1e-3, axis=1)
    assert_zero_rows(f"{case.name} o", o, packing.padding_q)
    grads = jax.jit(jax.grad(functools.partial(loss, ours), argnums=(0, 1, 2)))(q, k, v)
    grads_ref = jax.grad(functools.partial(loss, theirs), argnums=(0, 1, 2))(q, k, v)
    for name, g, g_ref in zip(("dq", "dk", "dv"), grads, grads_ref):
        rows = packing.rows_q if name == "dq" else packing.rows_kv
        # The reference's gradients are rounded to the inputs' dtype too: compare in float32.
        assert_segments_close(f"{case.name} {name}", g, g_ref, rows, gtol)


def test_segment_ids_training_step():
    """A MaxText-style packed batch: jit of value_and_grad, a few SGD steps, loss decreases."""
    rng = np.random.default_rng(0)
    ids = jnp.asarray(segment_ids_for([[40, 30, 58], [128], [1, 90, 20]], 128))
    batch, seq, heads, d, d_model = 3, 128, 4, 128, 256
    x = jnp.asarray(rng.standard_normal((batch, seq, d_model)), jnp.bfloat16)
    target = jnp.asarray(rng.standard_normal((batch, seq, d_model)), jnp.float32)
    params = {n: jnp.asarray(rng.standard_normal((d_model, heads * d)) * 0.03, jnp.bfloat16)
              for n in ("wq", "wk", "wv")}
    params["wo"] = jnp.asarray(rng.standard_normal((heads * d, d_model)) * 0.03, jnp.bfloat16)

    def loss(p):
        q, k, v = ((x @ p[n]).reshape(batch, seq, heads, d) for n in ("wq", "wk", "wv"))
        o = rj.attention(q, k, v, segment_ids=ids, causal=True, max_segments_per_seq=4)
        y = o.reshape(batch, seq, heads * d) @ p["wo"]
        return jnp.mean((y.astype(jnp.float32) - target) ** 2 * (ids[..., None] != 0))

    @jax.jit
    def step(p):
        value, grads = jax.value_and_grad(loss)(p)
        return value, jax.tree_util.tree_map(lambda w, g: (w - 2.0 * g).astype(w.dtype), p, grads)

    losses = []
    for _ in range(5):
        value, params = step(params)
        losses.append(float(value))
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses


def test_segment_ids_against_reference():
    ids = segment_ids_for([[5, 9, 2], [16], [1, 3, 7, 1]], 20)
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.standard_normal((3, 20, 2, 64)), jnp.bfloat16) for _ in range(3))
    o = jax.jit(lambda q, k, v: rj.attention(q, k, v, segment_ids=ids, causal=True))(q, k, v)
    mask = mask_from_segment_ids(ids, causal=True)
    o_ref, _ = reference(q.reshape(60, 2, 64), k.reshape(60, 2, 64), v.reshape(60, 2, 64), mask,
                         64**-0.5)
    flat = ids.reshape(-1)
    row = np.arange(60) // 20
    segments = [np.nonzero((flat == i) & (row == r))[0] for r in range(3)
                for i in np.unique(ids[r][ids[r] != 0])]
    assert_segments_close("o", o.reshape(60, 2, 64), o_ref, segments, 1e-2)
    assert_zero_rows("o", o.reshape(60, 2, 64), np.nonzero(flat == 0)[0])


def test_float32_is_refused_with_the_library_message():
    case = CASES_BY_NAME["mha"]
    packing = make_packing(case)
    q, k, v, _ = (jnp.asarray(x, jnp.float32) for x in random_inputs(case, packing))
    with pytest.raises(ValueError, match=r"dtype fp32 on a CUDA path"):
        rj.attention(q, k, v, **segment_args(packing))

"""raggedattn.jax against a plain jax.numpy block-diagonal reference.

On the CPU (the library's reference backend) always; the same checks run on a GPU where JAX has
one (test_jax_gpu.py). Forward, LSE and the gradients of q, k and v, per segment.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed")
import jax.numpy as jnp  # noqa: E402

import raggedattn.jax as rj  # noqa: E402
from jax_reference import reference, segment_args  # noqa: E402
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

CPU = jax.devices("cpu")[0]

# Relative error per segment: float32 runs the same math; bfloat16 rounds the outputs.
TOL = {jnp.float32: 2e-6, jnp.bfloat16: 6e-3}
GRAD_TOL = {jnp.float32: 4e-6, jnp.bfloat16: 1.2e-2}


@pytest.fixture(autouse=True)
def _on_cpu():
    """These tests are for the CPU backend, also on a machine whose default device is a GPU."""
    with jax.default_device(CPU):
        yield


def _arrays(case, packing, dtype, seed=0):
    q, k, v, d_o = random_inputs(case, packing, seed)
    # The reference reads the same (rounded) inputs the library gets.
    return tuple(jax.device_put(jnp.asarray(x, dtype), CPU) for x in (q, k, v, d_o))


def _check_case(case, dtype, jit: bool):
    packing = make_packing(case)
    q, k, v, d_o = _arrays(case, packing, dtype)
    seg = segment_args(packing)
    mask = full_mask(case, packing)
    max_q, max_kv = max(case.lens_q), max(case.kv_lens)

    def ours(q, k, v):
        return rj.attention(q, k, v, max_seqlen_q=max_q, max_seqlen_kv=max_kv, return_lse=True,
                            **seg, **case.options())

    def theirs(q, k, v):
        return reference(q, k, v, mask, case.scale, case.softcap)

    def loss(f, q, k, v):
        o, _ = f(q, k, v)
        return jnp.sum(o.astype(jnp.float32) * d_o.astype(jnp.float32))

    grad_ours = jax.grad(functools.partial(loss, ours), argnums=(0, 1, 2))
    if jit:
        ours_fn, grad_ours = jax.jit(ours), jax.jit(grad_ours)
    else:
        ours_fn = ours
    o, lse = ours_fn(q, k, v)
    o_ref, lse_ref = theirs(q, k, v)
    assert o.dtype == dtype and o.shape == (packing.total_q, case.hq, case.head_dim_v)
    assert lse.dtype == jnp.float32 and lse.shape == (case.hq, packing.total_q)
    tol, gtol = TOL[dtype], GRAD_TOL[dtype]
    assert_segments_close(f"{case.name} o", o, o_ref, packing.rows_q, tol)
    assert_segments_close(f"{case.name} lse", lse, lse_ref, packing.rows_q, 1e-5, axis=1)
    assert_zero_rows(f"{case.name} o", o, packing.padding_q)

    dq, dk, dv = grad_ours(q, k, v)
    dq_ref, dk_ref, dv_ref = jax.grad(functools.partial(loss, theirs), argnums=(0, 1, 2))(q, k, v)
    assert_segments_close(f"{case.name} dq", dq, dq_ref, packing.rows_q, gtol)
    assert_segments_close(f"{case.name} dk", dk, dk_ref, packing.rows_kv, gtol)
    assert_segments_close(f"{case.name} dv", dv, dv_ref, packing.rows_kv, gtol)
    assert_zero_rows(f"{case.name} dq", dq, packing.padding_q)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_float32_jit(case):
    _check_case(case, jnp.float32, jit=True)


@pytest.mark.parametrize(
    "name", ["mha", "causal_gqa", "cross_bottom_right", "padded_causal_gqa", "softcap_scale"]
)
def test_bfloat16(name):
    _check_case(CASES_BY_NAME[name], jnp.bfloat16, jit=True)


@pytest.mark.parametrize("name", ["mha", "window", "padded"])
def test_eager(name):
    _check_case(CASES_BY_NAME[name], jnp.float32, jit=False)


# --- segment_ids (MaxText-style packing) -------------------------------------------------------

SEGMENT_ROWS = [[5, 9, 2], [16], [1, 3, 7, 1]]  # lengths per row; rows are 20 tokens
SEQ = 20


def _segment_ids_inputs(hq=4, hkv=2, d=64, dtype=jnp.float32):
    ids = segment_ids_for(SEGMENT_ROWS, SEQ)
    rng = np.random.default_rng(3)
    shape = (len(SEGMENT_ROWS), SEQ)
    q = jnp.asarray(rng.standard_normal(shape + (hq, d)), dtype)
    k = jnp.asarray(rng.standard_normal(shape + (hkv, d)), dtype)
    v = jnp.asarray(rng.standard_normal(shape + (hkv, d)), dtype)
    return ids, q, k, v


@pytest.mark.parametrize("causal", [False, True])
def test_segment_ids_jit_grad(causal):
    ids, q, k, v = _segment_ids_inputs()
    mask = mask_from_segment_ids(ids, causal)
    flat = ids.reshape(-1)
    row = np.arange(flat.size) // SEQ
    segments = [np.nonzero((flat == i) & (row == r))[0]
                for r in range(ids.shape[0]) for i in np.unique(ids[r][ids[r] != 0])]
    padding = np.nonzero(flat == 0)[0]
    flat_shape = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731

    def ours(q, k, v):
        return rj.attention(q, k, v, segment_ids=jnp.asarray(ids), causal=causal,
                            max_segments_per_seq=4)

    def loss_ours(q, k, v):
        return jnp.sum(ours(q, k, v) ** 2)

    def loss_ref(q, k, v):
        o, _ = reference(flat_shape(q), flat_shape(k), flat_shape(v), mask, 64**-0.5)
        return jnp.sum(o**2)

    o = jax.jit(ours)(q, k, v)
    assert o.shape == q.shape
    o_ref, _ = reference(flat_shape(q), flat_shape(k), flat_shape(v), mask, 64**-0.5)
    assert_segments_close("o", flat_shape(o), o_ref, segments, 2e-6)
    assert_zero_rows("o", flat_shape(o), padding)

    grads = jax.jit(jax.grad(loss_ours, argnums=(0, 1, 2)))(q, k, v)
    grads_ref = jax.grad(loss_ref, argnums=(0, 1, 2))(q, k, v)
    for name, g, g_ref in zip(("dq", "dk", "dv"), grads, grads_ref):
        assert g.shape == q.shape[:2] + g.shape[2:]
        assert_segments_close(name, flat_shape(g), flat_shape(g_ref), segments, 4e-6)
        assert_zero_rows(name, flat_shape(g), padding)


def test_segment_ids_flat_matches_cu_seqlens():
    """[total] ids give the same result as the equivalent cu_seqlens + seq_offsets."""
    ids = np.array([1, 1, 1, 0, 2, 2, 0, 0, 3, 3, 3, 3, 3, 0], np.int32)
    rng = np.random.default_rng(4)
    q, k, v = (jnp.asarray(rng.standard_normal((ids.size, 2, 64)), jnp.float32) for _ in range(3))
    by_ids = jax.jit(lambda q, k, v: rj.attention(q, k, v, segment_ids=ids, causal=True))(q, k, v)
    cu = jnp.array([0, 3, 5, 10], jnp.int32)
    offsets = jnp.array([0, 4, 8, 14], jnp.int32)
    by_cu = rj.attention(q, k, v, cu, cu, 5, 5, seq_offsets_q=offsets, seq_offsets_kv=offsets,
                         causal=True)
    np.testing.assert_array_equal(np.asarray(by_ids), np.asarray(by_cu))


def test_segment_ids_rows_split_equal_ids():
    """A row boundary ends a segment even where the next row starts with the same id."""
    ids = np.array([[1, 1, 1, 1], [1, 1, 2, 2]], np.int32)
    rng = np.random.default_rng(5)
    q, k, v = (jnp.asarray(rng.standard_normal((2, 4, 1, 64)), jnp.float32) for _ in range(3))
    o = rj.attention(q, k, v, segment_ids=ids)
    mask = mask_from_segment_ids(ids, causal=False)
    flat = lambda x: x.reshape(8, 1, 64)  # noqa: E731
    o_ref, _ = reference(flat(q), flat(k), flat(v), mask, 64**-0.5)
    np.testing.assert_allclose(np.asarray(flat(o)), np.asarray(o_ref), rtol=1e-5, atol=1e-5)


def test_segment_ids_overflow():
    ids = segment_ids_for([[2, 2, 2, 2]], 8)  # 4 segments in one row
    q = jnp.ones((1, 8, 1, 64), jnp.float32)
    with pytest.raises(ValueError, match="max_segments_per_seq=3"):
        rj.attention(q, q, q, segment_ids=ids, max_segments_per_seq=3)
    # Under jit the count is not known at trace time: the output turns NaN instead.
    f = jax.jit(lambda ids: rj.attention(q, q, q, segment_ids=ids, max_segments_per_seq=3))
    assert bool(jnp.all(jnp.isnan(f(jnp.asarray(ids)))))
    g = jax.jit(lambda ids: rj.attention(q, q, q, segment_ids=ids, max_segments_per_seq=4))
    assert bool(jnp.all(jnp.isfinite(g(jnp.asarray(ids)))))


# --- plain usage ---------------------------------------------------------------------------------


def test_traced_segment_arrays_default_max_seqlen():
    """Under jit with cu_seqlens as arguments, max_seqlen defaults to the token count."""
    case = CASES_BY_NAME["causal_gqa"]
    packing = make_packing(case)
    q, k, v, _ = _arrays(case, packing, jnp.float32)
    f = jax.jit(lambda q, k, v, cu: rj.attention(q, k, v, cu, cu, causal=True))
    o = f(q, k, v, jnp.asarray(packing.cu_q))
    o_ref, _ = reference(q, k, v, full_mask(case, packing), case.scale)
    assert_segments_close("o", o, o_ref, packing.rows_q, 2e-6)


def test_training_step_jit_grad():
    """A small attention layer trained a few steps on the CPU: finite, decreasing loss."""
    rng = np.random.default_rng(6)
    d_model, heads, d = 128, 2, 64
    lens = [7, 12, 5, 8]
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(lens)]), jnp.int32)
    x = jnp.asarray(rng.standard_normal((sum(lens), d_model)), jnp.float32)
    target = jnp.asarray(rng.standard_normal((sum(lens), d_model)), jnp.float32)
    params = {n: jnp.asarray(rng.standard_normal((d_model, heads * d)) * 0.05, jnp.float32)
              for n in ("wq", "wk", "wv")}
    params["wo"] = jnp.asarray(rng.standard_normal((heads * d, d_model)) * 0.05, jnp.float32)

    def loss(p):
        t = x.shape[0]
        q, k, v = ((x @ p[n]).reshape(t, heads, d) for n in ("wq", "wk", "wv"))
        o = rj.attention(q, k, v, cu, cu, max(lens), max(lens), causal=True)
        return jnp.mean((o.reshape(t, heads * d) @ p["wo"] - target) ** 2)

    @jax.jit
    def step(p):
        value, grads = jax.value_and_grad(loss)(p)
        return value, jax.tree_util.tree_map(lambda w, g: w - 0.5 * g, p, grads)

    losses = []
    for _ in range(5):
        value, params = step(params)
        losses.append(float(value))
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses


def test_lse_is_differentiated():
    """The returned LSE's cotangent flows into dq and dk (here alone: o is unused)."""
    case = CASES_BY_NAME["causal_gqa"]
    packing = make_packing(case)
    q, k, v, _ = _arrays(case, packing, jnp.float32)
    seg = segment_args(packing)
    mask = full_mask(case, packing)
    w = jnp.asarray(np.random.default_rng(5).standard_normal((case.hq, packing.total_q)),
                    jnp.float32)

    def ours(q, k):
        return jnp.sum(rj.attention(q, k, v, return_lse=True, causal=True, **seg)[1] * w)

    def theirs(q, k):
        return jnp.sum(reference(q, k, v, mask, case.scale)[1] * w)

    got = jax.grad(ours, argnums=(0, 1))(q, k)
    want = jax.grad(theirs, argnums=(0, 1))(q, k)
    assert float(jnp.abs(got[0]).max()) > 0
    assert_segments_close("dq", got[0], want[0], packing.rows_q, GRAD_TOL[jnp.float32])
    assert_segments_close("dk", got[1], want[1], packing.rows_kv, GRAD_TOL[jnp.float32])


def test_lse_without_return_lse_costs_no_cotangent():
    """return_lse=False: the gradients are those of o alone."""
    case = CASES_BY_NAME["mha"]
    packing = make_packing(case)
    q, k, v, d_o = _arrays(case, packing, jnp.float32)
    seg = segment_args(packing)
    a = jax.grad(lambda q: jnp.sum(rj.attention(q, k, v, **seg) * d_o))(q)
    b = jax.grad(lambda q: jnp.sum(rj.attention(q, k, v, return_lse=True, **seg)[0] * d_o))(q)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_deterministic_and_dq_accum_options_run():
    case = CASES_BY_NAME["causal_gqa"]
    packing = make_packing(case)
    q, k, v, _ = _arrays(case, packing, jnp.bfloat16)
    seg = segment_args(packing)
    f = jax.jit(jax.grad(lambda q: jnp.sum(rj.attention(
        q, k, v, causal=True, dq_accum="bf16", deterministic=True, **seg).astype(jnp.float32))))
    a, b = f(q), f(q)
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))

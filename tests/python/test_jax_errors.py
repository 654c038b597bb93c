"""Bad input to raggedattn.jax raises, with the library's own message where the library checks."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed")
import jax.numpy as jnp  # noqa: E402

import raggedattn.jax as rj  # noqa: E402

CPU = jax.devices("cpu")[0]


@pytest.fixture(autouse=True)
def _on_cpu():
    with jax.default_device(CPU):
        yield


def _inputs(t=10, hq=2, hkv=2, d=64, dv=None, dtype=jnp.float32):
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((t, hq, d)), dtype)
    k = jnp.asarray(rng.standard_normal((t, hkv, d)), dtype)
    v = jnp.asarray(rng.standard_normal((t, hkv, dv or d)), dtype)
    return q, k, v


CU = jnp.array([0, 4, 10], jnp.int32)


# Checked by the library (rattn_plan_create), raised at trace time.


def test_unsupported_head_dim():
    q, k, v = _inputs(d=32)
    with pytest.raises(ValueError, match=r"head_dim_qk=32.*supported: head_dim_qk = head_dim_v in"):
        rj.attention(q, k, v, CU, CU)


def test_unsupported_head_dim_pair():
    q, k, v = _inputs(d=128, dv=64)
    with pytest.raises(ValueError, match=r"head_dim_qk=128, head_dim_v=64"):
        jax.jit(lambda q, k, v: rj.attention(q, k, v, CU, CU))(q, k, v)


def test_heads_not_a_multiple():
    q, k, v = _inputs(hq=3, hkv=2)
    with pytest.raises(ValueError, match=r"num_heads_q=3, num_heads_kv=2"):
        rj.attention(q, k, v, CU, CU)


def test_bad_window():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match=r"window=\(-2, 0\)"):
        rj.attention(q, k, v, CU, CU, window=(-2, 0))


def test_causal_with_right_window():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match=r"causal mask with window_right=3"):
        rj.attention(q, k, v, CU, CU, causal=True, window=(4, 3))


def test_max_seqlen_larger_than_tensor():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match=r"max_seqlen_q=11"):
        rj.attention(q, k, v, CU, CU, max_seqlen_q=11, max_seqlen_kv=10)


def test_negative_softcap():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match=r"softcap=-1"):
        rj.attention(q, k, v, CU, CU, softcap=-1.0)


# Segment values: the CPU backend checks them when it runs (a GPU does not read them on the host).


def _run_error(fn):
    with pytest.raises(Exception) as info:
        jax.block_until_ready(fn())
    assert isinstance(info.value, RuntimeError), type(info.value)
    return str(info.value)


def test_decreasing_cu_seqlens():
    q, k, v = _inputs()
    bad = jnp.array([0, 6, 4], jnp.int32)
    message = _run_error(lambda: rj.attention(q, k, v, bad, bad, 10, 10))
    assert "cu_seqlens_q decreases at segment 1 (6 -> 4)" in message


def test_cu_seqlens_past_the_tensor():
    q, k, v = _inputs()
    bad = jnp.array([0, 4, 12], jnp.int32)
    message = _run_error(lambda: jax.jit(lambda cu: rj.attention(q, k, v, cu, cu, 10, 10))(bad))
    assert "cu_seqlens_q[2]=12 > total_q=10" in message


def test_segment_longer_than_max_seqlen():
    q, k, v = _inputs()
    message = _run_error(lambda: rj.attention(q, k, v, CU, CU, 5, 10))
    assert "segment 1 has q length 6 > max_seqlen_q=5" in message


# Checked in Python: what the library cannot see.


def test_rank():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match=r"q has shape \(10, 128\); expected 3 dims"):
        rj.attention(q.reshape(10, 128), k, v, CU, CU)


def test_dtype():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match=r"q has dtype int32; supported: bfloat16, float16"):
        rj.attention(q.astype(jnp.int32), k, v, CU, CU)


def test_dtype_mismatch():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match=r"k has dtype bfloat16 but q has float32"):
        rj.attention(q, k.astype(jnp.bfloat16), v, CU, CU)


def test_head_dim_mismatch():
    q, _, _ = _inputs(d=64)
    _, k, v = _inputs(d=128)
    with pytest.raises(ValueError, match=r"must have the same head_dim"):
        rj.attention(q, k, v, CU, CU)


def test_cu_seqlens_dtype_and_length():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match=r"cu_seqlens_q is float32 .* expected 1-D int32"):
        rj.attention(q, k, v, CU.astype(jnp.float32), CU)
    with pytest.raises(ValueError, match=r"cu_seqlens_q has 3 entries and cu_seqlens_kv 2"):
        rj.attention(q, k, v, CU, jnp.array([0, 10], jnp.int32))


def test_offsets_need_both():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match=r"both seq_offsets_q and seq_offsets_kv"):
        rj.attention(q, k, v, CU, CU, seq_offsets_q=CU)


def test_option_spelling():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match=r"causal_alignment='bottom'"):
        rj.attention(q, k, v, CU, CU, causal=True, causal_alignment="bottom")
    with pytest.raises(ValueError, match=r"dq_accum='fp16'"):
        rj.attention(q, k, v, CU, CU, dq_accum="fp16")
    with pytest.raises(ValueError, match=r"softmax_scale=0"):
        rj.attention(q, k, v, CU, CU, softmax_scale=0.0)
    with pytest.raises(ValueError, match=r"window=3"):
        rj.attention(q, k, v, CU, CU, window=3)


def test_segment_ids_and_cu_seqlens_exclusive():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match=r"either segment_ids or cu_seqlens"):
        rj.attention(q, k, v, CU, CU, segment_ids=jnp.ones((10,), jnp.int32))


def test_segment_ids_token_count():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match=r"segment_ids has 8 tokens but q has 10"):
        rj.attention(q, k, v, segment_ids=jnp.ones((8,), jnp.int32))

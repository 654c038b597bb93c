"""A plain jax.numpy reference of block-diagonal attention, for the JAX tests."""

from __future__ import annotations

import jax
import jax.numpy as jnp

HIGHEST = jax.lax.Precision.HIGHEST


def reference(q, k, v, mask, scale, softcap=0.0, sink=None):
    """Block-diagonal attention in float32 jax.numpy: o [Tq, Hq, Dv] and lse [Hq, Tq].

    Rows that see no key give o = 0 and lse = -inf, as the library defines them. sink: [Hq]
    logits, one more column of every row's softmax with no value (such rows then give lse =
    sink[h])."""
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k = jnp.repeat(k, group, axis=1)
    v = jnp.repeat(v, group, axis=1)
    s = jnp.einsum("qhd,khd->hqk", q, k, precision=HIGHEST) * scale
    if softcap:
        s = softcap * jnp.tanh(s / softcap)
    mask = jnp.asarray(mask)[None]
    s = jnp.where(mask, s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    if sink is not None:
        sink = jnp.asarray(sink, jnp.float32)[:, None, None]  # [Hq, 1, 1]
        m = jnp.maximum(m, sink)
    m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))
    p = jnp.where(mask, jnp.exp(s - m), 0.0)
    l = jnp.sum(p, axis=-1, keepdims=True)
    if sink is not None:
        l = l + jnp.exp(sink - m)
    o = jnp.einsum("hqk,khd->qhd", p / jnp.where(l == 0, 1.0, l), v, precision=HIGHEST)
    l = l[..., 0]
    lse = jnp.where(l == 0, -jnp.inf, m[..., 0] + jnp.log(jnp.where(l == 0, 1.0, l)))
    return o, lse


def segment_args(packing):
    """The keyword arguments that give raggedattn.jax.attention a Packing."""
    args = dict(
        cu_seqlens_q=jnp.asarray(packing.cu_q),
        cu_seqlens_kv=jnp.asarray(packing.cu_kv),
    )
    if packing.off_q is not None:
        args.update(seq_offsets_q=jnp.asarray(packing.off_q),
                    seq_offsets_kv=jnp.asarray(packing.off_kv))
    return args

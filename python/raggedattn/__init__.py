"""raggedattn: fused attention over packed variable-length sequences (the THD layout).

Documents are packed back to back along the token axis; each attends only within itself. Two
bindings over one C library, each imported on first use so that neither framework is needed for
the other:

    raggedattn.torch.attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, ...)
    raggedattn.jax.attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, ..., segment_ids=...)

Bad input raises ValueError carrying the library's message; a failure while running raises
RuntimeError.
"""

from __future__ import annotations

import importlib

from . import _C

__version__ = "0.1.0"
__all__ = ["library_version", "plan_cache_size", "clear_plan_cache", "query_device"]


def library_version() -> str:
    """The version of the libraggedattn this package loaded."""
    return _C.version()


def plan_cache_size() -> int:
    """How many plans the cache holds (shared by both bindings)."""
    return _C.plan_cache_size()


def clear_plan_cache() -> None:
    _C.clear_plan_cache()


def query_device(device: int = -1) -> dict:
    """The library's view of a CUDA device; {'cuda': False, ...} without one or in a CPU build."""
    return _C.query_device(device)


def __getattr__(name: str):
    # raggedattn.torch / raggedattn.jax load their framework only when first touched.
    if name in ("torch", "jax"):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

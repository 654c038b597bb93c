"""raggedattn as a Hugging Face transformers attention backend, for packed training.

    import raggedattn.hf
    raggedattn.hf.register()                         # once, before the model is built
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="raggedattn")

Batches come the ways transformers' FlashAttention-2 path takes them:
- packed, from `DataCollatorWithFlattening` (batch 1, documents back to back): its
  `cu_seq_lens_q/k` and `max_length_q/k` keyword arguments, or, without them, `position_ids` that
  restart at every document;
- padded, with a 2D `attention_mask` (1 for tokens, 0 for padding): the tokens of each row form
  one segment;
- plain, every row one sequence (with a KV cache the queries are the last rows of their keys:
  causal is aligned to the bottom-right corner).
Models with GQA, sliding windows (`sliding_window` is the window's total length, as transformers
counts it), soft caps (Gemma-2) and learnable attention sinks (gpt-oss's `s_aux`, one logit per
query head) run as they are. What raggedattn cannot take raises: an arbitrary dense (4D)
`attention_mask`, attention dropout.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import torch
from torch import Tensor

from .torch import flash_attn_varlen_func

__all__ = ["register", "attention_forward", "NAME"]

NAME = "raggedattn"


def register(name: str = NAME) -> None:
    """Registers the backend with transformers' AttentionInterface (and the 2D padding-mask
    handling of its FlashAttention backends), so that `attn_implementation=name` selects it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)


def _compute_dtype(query: Tensor, module: torch.nn.Module) -> Optional[torch.dtype]:
    """The 16-bit type to run a float32 query in on a GPU (a PEFT model's layer norms may
    upcast): autocast's, else the module's projection weights'."""
    if query.dtype != torch.float32 or query.device.type == "cpu":
        return None
    if torch.is_autocast_enabled(query.device.type):
        return torch.get_autocast_dtype(query.device.type)
    for layer in module.modules():
        if isinstance(layer, torch.nn.Linear) and layer.weight.dtype != torch.float32:
            return layer.weight.dtype
    return None


def _window(sliding_window: Optional[int], key_length: int) -> Tuple[int, int]:
    # transformers counts a window by its total length (the token itself included), and applies
    # it only where the keys are longer than it.
    if sliding_window is None or key_length <= sliding_window:
        return (-1, -1)
    return (sliding_window - 1, sliding_window - 1)


def _cu_from_position_ids(position_ids: Tensor) -> Tuple[Tensor, int]:
    """Documents restart their positions: each first position starts a segment."""
    positions = position_ids.reshape(-1)
    starts = (positions == positions.min()).nonzero().view(-1).to(torch.int32)
    cu = torch.cat([starts, torch.tensor([positions.numel()], dtype=torch.int32,
                                         device=positions.device)])
    return cu, int(cu.diff().max())


def attention_forward(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Optional[Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    sliding_window: Optional[int] = None,
    softcap: Optional[float] = None,
    is_causal: Optional[bool] = None,
    s_aux: Optional[Tensor] = None,
    **kwargs,
) -> Tuple[Tensor, None]:
    """transformers' attention-function interface: query [batch, Hq, q_len, D], key and value
    [batch, Hkv, k_len, D]; returns ([batch, q_len, Hq, Dv], None)."""
    if dropout and float(dropout) > 0.0:
        raise NotImplementedError(
            f"raggedattn: attention dropout ({dropout}) is not supported; set the model's "
            "attention_dropout to 0")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(
            "raggedattn: the attention mask must be a 2D padding mask [batch, kv_len] (or none, "
            f"with packed documents); got a dense mask of shape {tuple(attention_mask.shape)}. "
            "Arbitrary dense masks need attn_implementation='sdpa' or 'eager'")
    batch, q_len, k_len = query.shape[0], query.shape[2], key.shape[2]
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # [batch, len, heads, dim]
    run_dtype = _compute_dtype(q, module)
    if run_dtype is not None:
        q, k, v = q.to(run_dtype), k.to(run_dtype), v.to(run_dtype)
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    deterministic = kwargs.get("deterministic")
    if deterministic is None:
        deterministic = os.environ.get("FLASH_ATTENTION_DETERMINISTIC", "0") == "1"
    options = dict(softmax_scale=scaling, causal=causal, window_size=_window(sliding_window, k_len),
                   softcap=float(softcap or 0.0), deterministic=bool(deterministic),
                   learnable_sink=s_aux)

    if attention_mask is not None:  # padded rows: each row's tokens are one segment
        return _padded_rows(q, k, v, attention_mask, options), None
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
    if cu_q is None and kwargs.get("position_ids") is not None and q_len == k_len:
        cu_q, max_q = _cu_from_position_ids(kwargs["position_ids"][:batch])
        cu_k, max_k = cu_q, max_q
    if cu_q is None:  # every row one sequence
        cu_q = torch.arange(0, (batch + 1) * q_len, q_len, dtype=torch.int32, device=q.device)
        cu_k = torch.arange(0, (batch + 1) * k_len, k_len, dtype=torch.int32, device=q.device)
        max_q, max_k = q_len, k_len
    out = flash_attn_varlen_func(
        q.reshape(-1, *q.shape[2:]), k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:]),
        cu_q.to(torch.int32), cu_k.to(torch.int32), int(max_q), int(max_k), **options)
    return out.view(batch, q_len, *out.shape[1:]), None


def _padded_rows(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, options: dict) -> Tensor:
    """Attention over each row's unmasked tokens (the queries: its last q_len positions)."""
    batch, q_len, k_len = q.shape[0], q.shape[1], k.shape[1]
    keep_k = mask[:, -k_len:].bool()
    keep_q = keep_k[:, -q_len:]
    len_k, len_q = keep_k.sum(1, dtype=torch.int32), keep_q.sum(1, dtype=torch.int32)
    zero = torch.zeros(1, dtype=torch.int32, device=q.device)
    cu_k, cu_q = torch.cat([zero, len_k.cumsum(0, dtype=torch.int32)]), torch.cat(
        [zero, len_q.cumsum(0, dtype=torch.int32)])
    rows_q = keep_q.reshape(-1).nonzero().view(-1)
    rows_k = keep_k.reshape(-1).nonzero().view(-1)
    flat = lambda t: t.reshape(-1, *t.shape[2:])  # noqa: E731
    out = flash_attn_varlen_func(
        flat(q)[rows_q], flat(k)[rows_k], flat(v)[rows_k], cu_q, cu_k, int(len_q.max()),
        int(len_k.max()), **options)
    full = out.new_zeros(batch * q_len, *out.shape[1:])
    full[rows_q] = out
    return full.view(batch, q_len, *out.shape[1:])

"""The attention options both bindings take, checked for their Python spelling only.

Values (window sizes, softcap, head dims, ...) are the library's to check: its validation is the
one place, and its message comes back as the exception's text.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Tuple

_ALIGNMENTS = ("top_left", "bottom_right")
_DQ_ACCUM = ("fp32", "bf16")


@dataclasses.dataclass(frozen=True)
class Options:
    causal: bool
    bottom_right: bool
    window_left: int
    window_right: int
    softmax_scale: float  # 0.0: the library's default, 1/sqrt(head_dim_qk)
    softcap: float
    dq_accum_bf16: bool
    deterministic: bool

    def fill(self, problem, module) -> None:
        """Writes these options into a raggedattn._C.Problem (`module` is raggedattn._C)."""
        problem.mask = module.MASK_CAUSAL if self.causal else module.MASK_NONE
        problem.alignment = (
            module.ALIGN_BOTTOM_RIGHT if self.bottom_right else module.ALIGN_TOP_LEFT
        )
        problem.window_left = self.window_left
        problem.window_right = self.window_right
        problem.softmax_scale = self.softmax_scale
        problem.softcap = self.softcap
        problem.dq_accum = module.DQ_ACCUM_BF16 if self.dq_accum_bf16 else module.DQ_ACCUM_FP32
        problem.deterministic = int(self.deterministic)


def make_options(
    *,
    causal: bool = False,
    causal_alignment: str = "top_left",
    window: Tuple[int, int] = (-1, -1),
    softmax_scale: Optional[float] = None,
    softcap: float = 0.0,
    dq_accum: str = "fp32",
    deterministic: bool = False,
) -> Options:
    if causal_alignment not in _ALIGNMENTS:
        raise ValueError(
            f"raggedattn: causal_alignment={causal_alignment!r}; supported: "
            + ", ".join(repr(a) for a in _ALIGNMENTS)
        )
    if dq_accum not in _DQ_ACCUM:
        raise ValueError(
            f"raggedattn: dq_accum={dq_accum!r}; supported: " + ", ".join(repr(a) for a in _DQ_ACCUM)
        )
    try:
        left, right = window
        left, right = _as_int(left), _as_int(right)
    except (TypeError, ValueError):
        raise ValueError(
            f"raggedattn: window={window!r}; expected a pair of ints (left, right), -1 = unbounded"
        ) from None
    if softmax_scale is None:
        scale = 0.0
    else:
        scale = float(softmax_scale)
        # The library reads a scale <= 0 as "default"; an explicit one must mean itself.
        if not scale > 0.0 or not math.isfinite(scale):
            raise ValueError(
                f"raggedattn: softmax_scale={softmax_scale!r}; need a finite positive scale "
                "(None: 1/sqrt(head_dim_qk))"
            )
    return Options(
        causal=bool(causal),
        bottom_right=causal_alignment == "bottom_right",
        window_left=left,
        window_right=right,
        softmax_scale=scale,
        softcap=float(softcap),
        dq_accum_bf16=dq_accum == "bf16",
        deterministic=bool(deterministic),
    )


def _as_int(x) -> int:
    if isinstance(x, bool) or int(x) != x:
        raise ValueError(x)
    return int(x)

# Copy of the project-wide standard workloads (steering repo: shared/bench/workloads.py); keep in sync.
"""The standard packed-attention workloads every benchmark of this project reports.

Each workload packs documents (segments) into one THD batch with the llama3-8B
attention shape: 32 query heads, 8 KV heads (GQA), head dim 128, bf16.
The segment lengths are written out so that every tool measures the same work.
FLOPs count only the unmasked (query, key) pairs: 4*d*Hq per pair forward,
2.5x that backward (the usual FlashAttention convention).
"""

HQ, HKV, D = 32, 8, 128

MIXED = [1356, 4918, 7198, 6828, 6512, 772, 2345, 1221, 1618]  # 32768 tokens
SHORT = [121, 157, 150, 433, 237, 379, 321, 684, 281, 685, 100, 659, 226, 505, 466, 585, 444,
         621, 519, 578, 338, 100, 92, 436, 540, 390, 453, 497, 602, 232, 637, 245, 305, 300, 88,
         244, 396, 241, 203, 586, 586, 432, 590, 637, 250, 520, 488, 601, 436, 671, 426, 434, 520,
         229, 473, 536, 607, 319, 565, 349, 574, 576, 591, 426, 529, 536, 423, 645, 634, 531, 562,
         291, 396, 234, 695, 338, 42]  # 32768 tokens

WORKLOADS = {
    # name: (segment lengths, causal)
    "docs_mixed_32k": (MIXED, True),        # realistic pretraining pack, causal per document
    "docs_short_32k": (SHORT, True),        # many short documents
    "one_doc_16k": ([16384], True),         # a single long document
    "docs_mixed_32k_full": (MIXED, False),  # non-causal (encoder-style)
    "seed_cases": ([100, 80, 76], True),    # tiny: launch overhead dominates
}


def fwd_flops(lens, causal, hq=HQ, d=D):
    pairs = sum(s * (s + 1) // 2 if causal else s * s for s in lens)
    return 4.0 * d * hq * pairs


def bwd_flops(lens, causal, hq=HQ, d=D):
    return 2.5 * fwd_flops(lens, causal, hq, d)

"""Real text, packed: documents of different lengths into fixed-size batches with cu_seqlens.

The corpus is the Python documentation's reference topics, which every CPython installation ships
in the standard library (`pydoc_data.topics`, from the `python3` packages of Debian and Ubuntu):
79 documents of 200 bytes to 62 KB of English prose and code, read at run time, nothing
downloaded. Tokens are bytes (0..255) plus an end-of-document token.
"""
import hashlib
import random

import torch

EOD = 256
VOCAB = 257


def load_documents(max_doc_bytes=4096):
    """Returns (train_docs, heldout_docs): lists of byte strings.

    Topics longer than max_doc_bytes are cut at paragraph boundaries into several documents, so
    lengths span short to long as in a pretraining pack. Every tenth topic, chosen by a hash of
    its name (stable across Python versions), is held out whole for evaluation.
    """
    from pydoc_data.topics import topics

    train, heldout = [], []
    for name in sorted(topics):
        text = topics[name].encode("utf-8")
        pieces, cur = [], b""
        for para in text.split(b"\n\n"):
            if cur and len(cur) + len(para) + 2 > max_doc_bytes:
                pieces.append(cur)
                cur = b""
            cur = cur + b"\n\n" + para if cur else para
        if cur:
            pieces.append(cur)
        pieces = [p[i:i + max_doc_bytes] for p in pieces for i in range(0, len(p), max_doc_bytes)]
        bucket = int(hashlib.sha256(name.encode()).hexdigest(), 16) % 10
        (heldout if bucket == 0 else train).extend(pieces)
    return train, heldout


def tokens(doc):
    return list(doc) + [EOD]


class Packer:
    """Packs documents, in a seeded random order, into batches of exactly `batch_tokens` tokens.

    A document that does not fit is cut; its rest starts the next batch as a document of its own
    (attention never crosses a cut). Yields (tokens [T] int64, targets [T] int64, cu_seqlens
    int32 [B+1], max_seqlen, positions [T] int64). Targets are the next token within the same
    document; the last token of each document predicts nothing (target -100).
    """

    def __init__(self, docs, batch_tokens, seed, max_doc_tokens=None):
        self.docs = [tokens(d) for d in docs]
        self.batch_tokens = batch_tokens
        self.rng = random.Random(seed)
        self.max_doc_tokens = max_doc_tokens or batch_tokens
        self.queue = []

    def _next_doc(self):
        if not self.queue:
            order = list(range(len(self.docs)))
            self.rng.shuffle(order)
            self.queue = [self.docs[i] for i in order]
        return self.queue.pop()

    def __iter__(self):
        return self

    def __next__(self):
        toks, tgts, pos, cu = [], [], [], [0]
        pending = getattr(self, "_pending", None)
        self._pending = None
        while len(toks) < self.batch_tokens:
            doc = pending if pending is not None else self._next_doc()
            pending = None
            doc = doc[: self.max_doc_tokens]
            room = self.batch_tokens - len(toks)
            piece, rest = doc[:room], doc[room:]
            if len(rest) > 1:
                self._pending = rest
            toks += piece
            tgts += piece[1:] + [-100]
            pos += range(len(piece))
            cu.append(len(toks))
        lens = [b - a for a, b in zip(cu[:-1], cu[1:])]
        return (torch.tensor(toks), torch.tensor(tgts), torch.tensor(cu, dtype=torch.int32),
                max(lens), torch.tensor(pos))


def fixed_batches(docs, batch_tokens, count, seed):
    """The first `count` batches of a Packer: the same data order for every run that asks."""
    p = Packer(docs, batch_tokens, seed)
    return [next(p) for _ in range(count)]

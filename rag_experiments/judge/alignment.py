"""Token-level soft alignment of a claim to its context (BERTScore-style), on the packaged MiniLM.

Exact word coverage calls a paraphrase unsupported ("demonstrates" is not "shows"); sentence
cosine cannot tell which words of the claim the context lacks. Soft alignment sits between
them: every content word of the claim is matched to its most similar token of the context by
cosine of MiniLM's contextual token vectors (last layer; a word = the mean of its word pieces),

    r_w = max_t cos(v_w, u_t)        (w: claim content word, t: any context token)

and the claim is summarised by the distribution of ``r``: its mean (soft recall), minimum and
lower quartile (the worst-supported words), and the share of words below 0.5 and 0.7 (words the
context does not state, even in other words). Soft precision is the mean over the context's
content words of their best match in the claim (how much of the context the claim is about);
F = 2·R·P/(R+P). Claim and context are encoded separately (as BERTScore does), and a context
sentence by sentence (:mod:`.token_pass`: the same pass gives the heuristic checks' sentence
embeddings), each distinct text once per process (memoised).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from rag_experiments.judge.token_pass import MAX_TOKENS, TokenPass, concat
from rag_experiments.stages.text import sentence_texts

ALIGN_FEATURES = (
    "soft_recall",  # mean over claim content words of their best cosine to a context token
    "soft_min",  # the worst-aligned claim word
    "soft_q25",  # lower quartile
    "soft_unaligned_50",  # share of claim words with best cosine < 0.5
    "soft_unaligned_70",  # ... < 0.7
    "soft_precision",  # mean over context content words of their best cosine to a claim word
    "soft_f",  # 2RP / (R + P)
    "soft_unaligned_n",  # log1p(number of claim words with best cosine < 0.5)
)


class TokenAligner:
    """Soft-alignment features (module docstring) from the embedder's own MiniLM weights.

    Token vectors come from the shared :class:`~.token_pass.TokenPass` (one memoised pass per
    distinct text). ``context_by_sentence`` (the default, feature version 3): a context's tokens are
    its sentences' passes, concatenated, so the pass the heuristic checks need serves the
    alignment too; False: the context is encoded as one text (truncated at 256 tokens; feature
    version 2, kept as the two-pass reference for benchmarks).
    """

    def __init__(self, embedder: Any = None, context_by_sentence: bool = True, precision: str = "float32") -> None:
        self.passes = TokenPass(embedder, precision)
        self.embedder = self.passes.embedder
        self.context_by_sentence = bool(context_by_sentence)
        self.identity = json.dumps(
            {"kind": "token-alignment", "version": 2 if self.context_by_sentence else 1, "layer": "last",
             "context": "sentences" if self.context_by_sentence else "whole", "max_tokens": MAX_TOKENS,
             "embedder": json.loads(self.passes.identity)["embedder"],
             **({"precision": precision} if precision != "float32" else {})},
            sort_keys=True,
        )

    def context_texts(self, context: str) -> list[str]:
        """The texts whose passes make up a context's tokens."""
        if not self.context_by_sentence:
            return [context]
        return sentence_texts(context) or ([context] if context.strip() else [])

    def prepare(self, claims: list[str], contexts: list[str]) -> None:
        texts = list(claims) + [t for c in dict.fromkeys(contexts) for t in self.context_texts(c)]
        self.passes.encode(list(dict.fromkeys(texts)))

    def features(self, claims: list[str], contexts: list[str]) -> np.ndarray:
        """:data:`ALIGN_FEATURES` per (claim, context) pair."""
        parts = {c: self.context_texts(c) for c in dict.fromkeys(contexts)}
        texts = list(dict.fromkeys(list(claims) + [t for ts in parts.values() for t in ts]))
        enc = dict(zip(texts, self.passes.encode(texts), strict=True))  # one call: one memo state
        ctx_vecs = {c: concat([enc[t] for t in ts]) for c, ts in parts.items()}
        rows = [soft_alignment((enc[c].words, enc[c].tokens), ctx_vecs[x]) for c, x in zip(claims, contexts, strict=True)]
        return np.array(rows).reshape(len(claims), len(ALIGN_FEATURES))


def soft_alignment(claim: tuple[np.ndarray, np.ndarray], context: tuple[np.ndarray, np.ndarray]) -> list[float]:
    """:data:`ALIGN_FEATURES` of one pair from its word vectors (module docstring for formulas)."""
    c_words, _ = claim
    x_words, x_all = context
    if not len(c_words) or not len(x_all):
        return [0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, float(np.log1p(len(c_words)))]
    r = (c_words @ x_all.T).max(1)
    recall = float(r.mean())
    precision = float((x_words @ c_words.T).max(1).mean()) if len(x_words) else 0.0
    return [
        recall,
        float(r.min()),
        float(np.quantile(r, 0.25)),
        float((r < 0.5).mean()),
        float((r < 0.7).mean()),
        precision,
        2 * recall * precision / (recall + precision + 1e-9),
        float(np.log1p((r < 0.5).sum())),
    ]

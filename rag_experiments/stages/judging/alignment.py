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
F = 2·R·P/(R+P). Claim and context are encoded separately (as BERTScore does), so a context is
encoded once for all the claims judged against it (memoised per process).
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from rag_experiments.stages.judging.heuristic import _NEGATIONS, _STOPWORDS

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
MAX_TOKENS = 256  # a claim and a 2-sentence window fit easily; longer contexts are truncated
MEMO_BYTES = 512 * 2**20  # token vectors are ~1.5 KB per token: bound the memo, not the count
_MEMO: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
_MEMO_SIZE: dict[str, int] = {}
_ALNUM = re.compile(r"[a-z0-9]")


class TokenAligner:
    """Soft-alignment features (module docstring) from the embedder's own MiniLM weights.

    ``embedder``: a ``SentenceTransformerEmbedder`` (default: the metric embedder, the same model
    the heuristic judge uses, loaded once per process).
    """

    def __init__(self, embedder: Any = None) -> None:
        from rag_experiments.stages.embedding import SentenceTransformerEmbedder, metric_embedder

        self.embedder = embedder if isinstance(embedder, SentenceTransformerEmbedder) else metric_embedder()
        self.identity = json.dumps(
            {"kind": "token-alignment", "version": 1, "layer": "last", "max_tokens": MAX_TOKENS,
             "embedder": json.loads(self.embedder.identity)},
            sort_keys=True,
        )

    def _vectors(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per text: (content-word vectors, all token vectors), unit length; memoised."""
        memo = _MEMO.setdefault(self.identity, {})
        if _MEMO_SIZE.get(self.identity, 0) > MEMO_BYTES:  # bound memory on very large sweeps
            memo.clear()  # before choosing what to encode: every text asked for is then encoded
            _MEMO_SIZE[self.identity] = 0
        todo = list(dict.fromkeys(t for t in texts if t not in memo))
        if todo:
            import torch

            st = self.embedder.model
            model, tok = st[0].auto_model, st.tokenizer
            for b in range(0, len(todo), 32):
                batch = todo[b : b + 32]
                enc = tok(batch, truncation=True, max_length=MAX_TOKENS, padding=True, return_tensors="pt")
                with torch.inference_mode():
                    hidden = model(**enc).last_hidden_state.numpy()
                for i, text in enumerate(batch):
                    memo[text] = _word_vectors(hidden[i], enc.word_ids(i), tok.convert_ids_to_tokens(enc["input_ids"][i]))
                    _MEMO_SIZE[self.identity] = _MEMO_SIZE.get(self.identity, 0) + sum(a.nbytes for a in memo[text])
        return [memo[t] for t in texts]

    def prepare(self, texts: list[str]) -> None:
        self._vectors(list(texts))

    def features(self, claims: list[str], contexts: list[str]) -> np.ndarray:
        """:data:`ALIGN_FEATURES` per (claim, context) pair."""
        vecs = dict(zip(claims + contexts, self._vectors(list(claims) + list(contexts)), strict=True))
        return np.array([soft_alignment(vecs[c], vecs[x]) for c, x in zip(claims, contexts, strict=True)]).reshape(
            len(claims), len(ALIGN_FEATURES)
        )


def _word_vectors(hidden: np.ndarray, word_ids: list[int | None], pieces: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(content-word vectors, all real-token vectors) of one encoded text, unit length.

    A word's vector is the mean of its word pieces; stopwords, negations and punctuation are not
    content words (negation is the verifier's separate ``neg_mismatch`` feature).
    """
    unit = hidden / np.maximum(np.linalg.norm(hidden, axis=1, keepdims=True), 1e-9)
    words: dict[int, list[int]] = {}
    for j, w in enumerate(word_ids):
        if w is not None:
            words.setdefault(w, []).append(j)
    content = []
    for js in words.values():
        word = "".join(pieces[j].removeprefix("##") for j in js).lower()
        if _ALNUM.search(word) and word not in _STOPWORDS and word not in _NEGATIONS:
            v = unit[js].mean(0)
            content.append(v / max(float(np.linalg.norm(v)), 1e-9))
    real = [j for j, w in enumerate(word_ids) if w is not None]
    dim = hidden.shape[1]
    return (np.array(content, dtype=np.float32).reshape(-1, dim), unit[real].astype(np.float32).reshape(-1, dim))


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

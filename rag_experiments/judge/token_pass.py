"""One MiniLM pass per distinct text, shared by every feature of the verifier.

The packaged all-MiniLM-L6-v2 sentence embedding is mean pooling of the last layer's token
vectors over the attention mask (``[CLS]`` and ``[SEP]`` included) followed by L2 normalisation
(its ``modules.json``: Transformer → Pooling(mean) → Normalize). So one forward pass of a text
gives both what the soft alignment needs (its token vectors) and its sentence embedding, exactly:

    e(text) = normalise(Σ_t h_t / n)          (t: the text's n tokens, h_t: last-layer vectors)

The verifier encodes each distinct claim and each distinct context *sentence* once per process
(memoised, bounded in bytes) and derives everything else from it:

- a window of adjacent sentences s_1..s_k (the heuristic's 2-sentence candidates) gets
  normalise(Σ_i Σ_{t∈s_i} h_t / Σ_i n_i), the mean of its sentences' token vectors. This is an
  *approximation* of encoding the window as one text: each sentence is contextualised on its own,
  and the window counts one [CLS]/[SEP] pair per sentence. Measured on judge_pairs windows:
  docs/judges.md ("Throughput").
- a context's token vectors for the soft alignment are its sentences' token vectors, concatenated
  (each sentence contextualised on its own; no 256-token truncation of long contexts).

Batches are sorted by length, so padding is to the longest text of similar-length neighbours, and
the texts are tokenised once (one fast-tokeniser call for all texts to encode).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from rag_experiments.judge.heuristic import _NEGATIONS, _STOPWORDS

MAX_TOKENS = 256  # MiniLM's max_seq_length: a sentence's embedding equals SentenceTransformer.encode's
BATCH = 64
#: ``float32``: the sentence embedding is SentenceTransformer.encode's exactly; ``bfloat16``: CPU
#: autocast, about 3x less CPU on CPUs with bf16 instructions, embeddings within cosine 0.9999
#: (docs/judges.md, "Throughput"); part of the identity, so its verdicts are cached apart.
PRECISIONS = ("float32", "bfloat16")
MEMO_BYTES = 512 * 2**20  # token vectors are ~1.5 KB per token: bound the memo, not the count
_MEMO: dict[str, dict[str, Encoded]] = {}
_MEMO_SIZE: dict[str, int] = {}
_ALNUM = re.compile(r"[a-z0-9]")


@dataclass(frozen=True)
class Encoded:
    """One text's pass: the sum of its last-layer token vectors over the attention mask and their
    count (the sentence embedding is their normalised mean), its content-word vectors and all its
    real-token vectors (unit length; for the soft alignment)."""

    pooled_sum: np.ndarray
    n_tokens: int
    words: np.ndarray
    tokens: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.pooled_sum.nbytes + self.words.nbytes + self.tokens.nbytes

    @property
    def embedding(self) -> np.ndarray:
        return _unit(self.pooled_sum / max(self.n_tokens, 1))


def _unit(v: np.ndarray) -> np.ndarray:
    return (v / max(float(np.linalg.norm(v)), 1e-12)).astype(np.float32)


class TokenPass:
    """MiniLM's token vectors and sentence embeddings from one memoised pass (module docstring).

    ``embedder``: a ``SentenceTransformerEmbedder`` (default: the metric embedder, the model the
    heuristic judge uses, loaded once per process).
    """

    def __init__(self, embedder: Any = None, precision: str = "float32") -> None:
        from rag_experiments.stages.embedding import SentenceTransformerEmbedder, metric_embedder

        if precision not in PRECISIONS:
            raise ValueError(f"judge.precision: {precision!r}: expected one of {', '.join(PRECISIONS)}")
        self.embedder = embedder if isinstance(embedder, SentenceTransformerEmbedder) else metric_embedder()
        self.precision = precision
        ident = {"kind": "token-pass", "layer": "last", "pooling": "mean", "max_tokens": MAX_TOKENS,
                 "embedder": json.loads(self.embedder.identity)}
        if precision != "float32":  # float32 keeps the identity (and memo) it always had
            ident["precision"] = precision
        self.identity = json.dumps(ident, sort_keys=True)

    def encode(self, texts: list[str]) -> list[Encoded]:
        """Per text, its :class:`Encoded` pass; texts not in the memo are encoded in sorted batches."""
        memo = _MEMO.setdefault(self.identity, {})
        if _MEMO_SIZE.get(self.identity, 0) > MEMO_BYTES:  # bound memory on very large sweeps
            memo.clear()  # before choosing what to encode: every text asked for is then encoded
            _MEMO_SIZE[self.identity] = 0
        todo = list(dict.fromkeys(t for t in texts if t not in memo))
        if todo:
            for text, enc in zip(todo, self._run(todo), strict=True):
                memo[text] = enc
                _MEMO_SIZE[self.identity] = _MEMO_SIZE.get(self.identity, 0) + enc.nbytes
        return [memo[t] for t in texts]

    def _run(self, texts: list[str]) -> list[Encoded]:
        import torch

        st = self.embedder.model
        model, tok = st[0].auto_model, st.tokenizer
        enc = tok(texts, truncation=True, max_length=MAX_TOKENS, padding=False)  # one tokeniser call
        ids = enc["input_ids"]
        order = sorted(range(len(texts)), key=lambda i: len(ids[i]))
        out: list[Encoded | None] = [None] * len(texts)
        for b in range(0, len(order), BATCH):
            batch = order[b : b + BATCH]
            width = max(len(ids[i]) for i in batch)
            input_ids = np.zeros((len(batch), width), dtype=np.int64)  # [PAD] is id 0
            mask = np.zeros((len(batch), width), dtype=np.int64)
            for r, i in enumerate(batch):
                input_ids[r, : len(ids[i])] = ids[i]
                mask[r, : len(ids[i])] = 1
            with torch.inference_mode(), _autocast(self.precision):
                hidden = model(
                    input_ids=torch.from_numpy(input_ids),
                    attention_mask=torch.from_numpy(mask),
                    token_type_ids=torch.zeros_like(torch.from_numpy(input_ids)),
                ).last_hidden_state.float().numpy()
            for r, i in enumerate(batch):
                n = len(ids[i])
                h = hidden[r, :n]
                words, tokens = _word_vectors(h, enc.word_ids(i), tok.convert_ids_to_tokens(ids[i]))
                out[i] = Encoded(h.sum(0, dtype=np.float64).astype(np.float32), n, words, tokens)
        return out  # type: ignore[return-value]

    def embeddings(self, texts: list[str]) -> np.ndarray:
        """Sentence embeddings (rows, unit length): SentenceTransformer.encode's, from the pass."""
        return np.stack([e.embedding for e in self.encode(list(texts))]) if texts else np.zeros((0, 384), np.float32)


def _autocast(precision: str):
    """bfloat16: torch's CPU autocast (matrix products in bf16 with float32 accumulation;
    layer norms and softmax stay float32). Fast only on CPUs with bf16 instructions."""
    import contextlib

    import torch

    if precision == "bfloat16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def bf16_supported() -> bool:
    """Whether this CPU runs bfloat16 matrix products natively (AVX512-BF16 or AMX)."""
    try:
        import torch

        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:  # noqa: BLE001 - an older torch without the probe: assume not
        return False


def window_embedding(parts: list[Encoded]) -> np.ndarray:
    """normalise(Σ token vectors / Σ tokens) over a window's sentences (an approximation of
    encoding the window as one text: module docstring)."""
    return _unit(sum(p.pooled_sum for p in parts) / max(sum(p.n_tokens for p in parts), 1))


def concat(parts: list[Encoded]) -> tuple[np.ndarray, np.ndarray]:
    """(content-word vectors, all token vectors) of several passes, stacked (a context's sentences)."""
    dim = parts[0].tokens.shape[1] if parts else 384
    words = np.concatenate([p.words for p in parts]) if parts else np.zeros((0, dim), np.float32)
    tokens = np.concatenate([p.tokens for p in parts]) if parts else np.zeros((0, dim), np.float32)
    return words, tokens


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

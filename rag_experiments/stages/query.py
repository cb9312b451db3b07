"""Query transformations: what the retriever searches for, before retrieval (docs/stages.md).

A transform asks a chat model (the run's generator, or a generator node of its own,
``query.llm``) for text derived from the question, and the retriever searches with that text:

- ``RewriteQuery``: one rewritten query replaces the question.
- ``HydeQuery`` (HyDE, Gao et al. 2022): the model writes a hypothetical answer passage; a dense
  retriever searches with v = normalise(w · E_query(question) + (1 − w) · E_passage(answer)),
  w = ``query_weight`` (0: the answer alone; 0.5: the paper's mean of the query and one
  hypothetical document); a retriever without vectors (BM25, hybrid) searches the text
  ``question + "\\n\\n" + answer`` (w > 0) or the answer (w = 0).
- ``MultiQuery``: the model writes ``n`` variants; each (and the question, ``include_original``)
  is searched and the lists are fused by reciprocal rank, score(c) = Σ_v 1 / (rrf_c + rank_v(c)).

The model's reply is parsed here (:func:`parse_rewrite`, :func:`parse_hyde`, :func:`parse_variants`);
a failed call, an empty reply or one with nothing usable raises nothing: the result carries the
error, the question is searched as it is, and the pipeline counts it (``n_query_errors``).

``llm_identity`` names what decides the model's reply (the model's identity, the prompt, ``n``):
the pipeline caches replies under it per question. ``identity`` adds what decides how the reply is
searched (``query_weight``, ``include_original``, ``rrf_c``): it enters ``config_hash``.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from rag_experiments.core.redaction import redact
from rag_experiments.stages.replies import drop_preamble

REWRITE_PROMPT = (
    "Rewrite the question as a short search query for a documentation search engine: keep the key "
    "terms, add likely synonyms, drop filler words. Reply with the query only, on one line.\n\n"
    "Question: {question}"
)
HYDE_PROMPT = (
    "Write a short passage from product documentation that answers the question. Write it as the "
    "documentation would state it, in two or three sentences, without mentioning the question.\n\n"
    "Question: {question}"
)
MULTI_QUERY_PROMPT = (
    "Write {n} different search queries that would find documentation answering the question. "
    "Vary the wording and the terms. Reply with one query per line, nothing else.\n\n"
    "Question: {question}"
)
KINDS = ("rewrite", "hyde", "multi_query")


class QueryTransform(Protocol):
    """``kind``: rewrite | hyde | multi_query; ``llm``: the chat model it calls (a Generator)."""

    identity: str
    llm_identity: str
    kind: str
    prompt: str

    def ask(self, question: str) -> Transformed: ...


@dataclass
class Transformed:
    """One question's transform: ``texts`` the model's usable output (rewritten query, hypothetical
    answer, variants; [] when it failed), the call's ``usage`` and seconds, and its ``error``
    ("" when it worked)."""

    texts: list[str]
    usage: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    error: str = ""
    truncated: bool = False  # the reply was cut at the model's max_answer_chars (its tail never read)


_LABEL = re.compile(r"^\s*(?:(?:rewritten\s+)?(?:search\s+)?query|answer|passage)\s*\d*\s*[:：]\s*", re.I)
_BULLET = re.compile(r"^\s*(?:[-*•]+|\(?\d{1,2}[.):]|[a-z][.)])(?:\s+|$)", re.I)


def _clean(line: str) -> str:
    """A line without a list marker (``1.``, ``-``, ``2)``), a label (``Query:``) or quotes."""
    line = _BULLET.sub("", line.strip())
    line = _LABEL.sub("", line).strip()
    return line.strip("\"'`“”‘’ ").strip()


def parse_rewrite(reply: str) -> list[str]:
    """[the first non-empty line of ``reply`` after any chat preamble (``replies.drop_preamble``),
    cleaned]; [] when there is none or it holds no word."""
    for line in drop_preamble(reply).splitlines():
        if text := _clean(line):
            return [text] if re.search(r"\w", text) else []
    return []


def parse_hyde(reply: str) -> list[str]:
    """[the reply, whitespace collapsed, a chat preamble and a leading ``Passage:`` label dropped];
    [] when it holds no word."""
    text = _LABEL.sub("", " ".join(drop_preamble(reply).split())).strip()
    return [text] if re.search(r"\w", text) else []


def parse_variants(reply: str, question: str, n: int) -> list[str]:
    """Up to ``n`` distinct query lines of ``reply`` (list markers and labels dropped), none equal
    to the question (case and surrounding punctuation ignored); [] when there is none."""
    seen = {question.strip().lower().rstrip("?.! ")}
    out = []
    for line in drop_preamble(reply).splitlines():
        text = _clean(line)
        key = text.lower().rstrip("?.! ")
        if re.search(r"\w", text) and key not in seen:
            seen.add(key)
            out.append(text)
        if len(out) == n:
            break
    return out


class _LLMTransform:
    """What the three transforms share: one chat call per question, its reply parsed by ``_parse``."""

    kind = ""
    default_prompt = ""

    def __init__(self, llm, prompt: str | None = None, **settings: Any) -> None:
        self.llm = llm
        self.prompt = prompt or self.default_prompt
        self.prompt_name = f"query.{self.kind}"  # in MLflow's Prompt Registry: rag-experiments.query.<kind>
        self.concurrency = max(1, int(getattr(llm, "concurrency", 1) or 1))
        asked = {k: v for k, v in settings.items() if k == "n"}  # what changes the model's reply
        self.llm_identity = json.dumps(
            {"query": self.kind, "llm": str(llm.identity), "prompt": self.prompt, **asked}, sort_keys=True
        )
        self.identity = json.dumps({"query": self.kind, "llm": str(llm.identity), "prompt": self.prompt,
                                    **settings}, sort_keys=True)  # fmt: skip

    def messages(self, question: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.prompt.format(question=question, n=getattr(self, "n", ""))}]

    def _parse(self, reply: str, question: str) -> list[str]:
        raise NotImplementedError

    def ask(self, question: str) -> Transformed:
        """The model's reply to this question, parsed; never raises (errors travel in the result)."""
        t = time.perf_counter()
        g = self.llm.generate([self.messages(question)])[0]
        seconds = float(g.latency_s or (time.perf_counter() - t))
        usage = {k: v for k, v in (g.usage or {}).items() if k in ("prompt_tokens", "completion_tokens")}
        if g.error:
            return Transformed([], usage, seconds, f"model call failed: {redact(str(g.error))[:300]}")
        texts = [redact(x) for x in self._parse(g.text or "", question)]
        if not texts:
            shown = redact(g.text or "")[:80]
            return Transformed([], usage, seconds, f"unparseable reply {shown!r} (no {self.kind} text in it)")
        return Transformed(texts, usage, seconds, truncated=bool(getattr(g, "truncated", False)))

    def search_texts(self, question: str, texts: list[str]) -> list[str]:
        """The texts the retriever searches for this question (the ``search_queries`` column)."""
        raise NotImplementedError


class RewriteQuery(_LLMTransform):
    """The retriever searches one rewritten query instead of the question."""

    kind, default_prompt = "rewrite", REWRITE_PROMPT

    def __init__(self, llm, prompt: str | None = None) -> None:
        super().__init__(llm, prompt)

    def _parse(self, reply: str, question: str) -> list[str]:
        return parse_rewrite(reply)

    def search_texts(self, question: str, texts: list[str]) -> list[str]:
        return texts[:1] or [question]


class HydeQuery(_LLMTransform):
    """HyDE: search with a hypothetical answer's embedding, mixed with the question's by
    ``query_weight`` (module docstring)."""

    kind, default_prompt = "hyde", HYDE_PROMPT

    def __init__(self, llm, prompt: str | None = None, query_weight: float = 0.5) -> None:
        self.query_weight = float(query_weight)
        super().__init__(llm, prompt, query_weight=self.query_weight)

    def _parse(self, reply: str, question: str) -> list[str]:
        return parse_hyde(reply)

    def search_texts(self, question: str, texts: list[str]) -> list[str]:
        """[question, answer] when the question is mixed in (w > 0), [answer] alone otherwise."""
        if not texts:
            return [question]
        return [question, texts[0]] if self.query_weight > 0 else [texts[0]]

    def vectors(self, embedder, questions: list[str], answers: list[str | None]) -> np.ndarray:
        """Row i: normalise(w · E_query(q_i) + (1 − w) · E_passage(a_i)); a_i None (the transform
        failed): E_query(q_i). Rows are L2-normalised, as every embedder's are."""
        q = np.asarray(embedder.encode(list(questions), kind="query"), dtype=np.float32)
        have = [i for i, a in enumerate(answers) if a]
        if not have:
            return q
        a = np.asarray(embedder.encode([answers[i] for i in have], kind="passage"), dtype=np.float32)
        out = q.copy()
        out[have] = self.query_weight * q[have] + (1.0 - self.query_weight) * a
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return (out / np.where(norms > 0, norms, 1.0)).astype(np.float32)

    def text_query(self, question: str, texts: list[str]) -> str:
        """What a retriever without vectors searches: question + answer (w > 0), or the answer."""
        if not texts:
            return question
        return f"{question}\n\n{texts[0]}" if self.query_weight > 0 else texts[0]


class MultiQuery(_LLMTransform):
    """``n`` variants (and the question when ``include_original``), each searched, fused by RRF."""

    kind, default_prompt = "multi_query", MULTI_QUERY_PROMPT

    def __init__(
        self, llm, prompt: str | None = None, n: int = 3, include_original: bool = True, rrf_c: int = 60
    ) -> None:
        self.n, self.include_original, self.rrf_c = int(n), bool(include_original), int(rrf_c)
        super().__init__(llm, prompt, n=self.n, include_original=self.include_original, rrf_c=self.rrf_c)

    def _parse(self, reply: str, question: str) -> list[str]:
        return parse_variants(reply, question, self.n)

    def search_texts(self, question: str, texts: list[str]) -> list[str]:
        if not texts:
            return [question]
        return [question, *texts] if self.include_original else list(texts)


def rrf_lists(rankings: list[np.ndarray], depth: int, c: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """Reciprocal-rank fusion of one question's ranked lists (chunk indices, -1 padding):
    score(d) = Σ_v 1 / (c + rank_v(d)), ranks from 1, a list without d adds nothing. Returns the
    ``depth`` best (indices, scores), score descending, ties by chunk index; -1 / -inf pad."""
    fused: dict[int, float] = {}
    for row in rankings:
        for r, i in enumerate(int(x) for x in row):
            if i >= 0:
                fused[i] = fused.get(i, 0.0) + 1.0 / (c + r + 1)
    best = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))[:depth]
    idx = np.full(depth, -1, dtype=np.int64)
    sc = np.full(depth, -np.inf, dtype=np.float32)
    for j, (i, s) in enumerate(best):
        idx[j], sc[j] = i, s
    return idx, sc

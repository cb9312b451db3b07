"""Data contracts shared by every stage (docs/architecture.md). Plain dataclasses; no behaviour."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Document:
    doc_id: str
    title: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Span:
    """A gold evidence span: characters ``text[start:end]`` of document ``doc_id``."""

    doc_id: str
    start: int
    end: int


@dataclass(frozen=True)
class Chunk:
    """A piece of a document. ``doc.text[start:end] == text`` always holds (offsets are exact)."""

    chunk_id: str
    doc_id: str
    start: int
    end: int
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ScoredChunk:
    chunk: Chunk
    score: float


@dataclass(frozen=True)
class Check:
    """One per-item assertion of an eval item's ``assert`` list (promptfoo's shape: ``{"type":
    "not_contains", "value": "never", "critical": true}``); parsed by ``evalset.checks``, evaluated
    by ``evaluation.assertions`` (docs/metrics.md, "Per-item assertions")."""

    type: str
    value: Any = None
    critical: bool = False


@dataclass
class EvalItem:
    id: str
    query: str
    gold_spans: list[Span]
    gold_answer: str | None = None
    key_facts: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    line: int = 0  # 1-based line in the source file, for error messages
    # every acceptable answer (SQuAD keeps each annotator's); empty: [gold_answer]
    gold_answers: list[str] = field(default_factory=list)
    # key facts an answer can hold without answering (evalset.weak_facts): left out of correctness
    weak_key_facts: list[str] = field(default_factory=list)
    # a conversation's turn (docs/conversations.md): the earlier turns ({"role": "user" |
    # "assistant", "text"}), a human standalone rewrite of ``query``, the turn's answerability
    # (answerable | unanswerable | underspecified | partial), its number and its conversation
    history: list[dict[str, str]] = field(default_factory=list)
    standalone_query: str | None = None
    answerability: str | None = None
    turn: int | None = None
    conversation_id: str | None = None
    checks: list[Check] = field(default_factory=list)  # the item's ``assert`` list (evalset.checks)

    @property
    def strong_key_facts(self) -> list[str]:
        """The key facts correctness counts: non-empty and not weak."""
        return [f for f in self.key_facts if f and f.strip() and f not in self.weak_key_facts]

    @property
    def answerable(self) -> bool:
        return bool(self.gold_spans)


@dataclass
class Generation:
    """One generator reply. ``error`` is set (and ``text`` empty) when the call failed for good."""

    text: str
    model: str
    latency_s: float = 0.0
    cached: bool = False
    error: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    truncated: bool = False  # cut at the generator's max_answer_chars (an endpoint ignoring max_tokens)


VERDICTS = ("supported", "unsupported", "unparseable")


@dataclass
class Verdict:
    """A judge's verdict on one claim against the retrieved context.

    ``label`` is one of VERDICTS. ``score`` is a continuous support score where the backend has
    one (log P(yes) - log P(no) for LLM judges, a similarity for the heuristic), else None.
    """

    claim: str
    label: str
    score: float | None = None
    rationale: str = ""
    raw: str = ""
    error: str | None = None
    # OpenAI-style usage of the judge call(s) behind it; None: no model call or none reported
    usage: dict[str, Any] | None = None
    # which stage of a cascade decided it ("verifier" | "llm"); None for single-stage judges
    stage: str | None = None

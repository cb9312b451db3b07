"""The history step: what a conversation's turn searches for, before the query transform
(docs/conversations.md).

An eval item may carry its conversation: ``history`` (the earlier turns, ``{"role": "user" |
"assistant", "text": ...}``), ``query`` (the last user turn) and ``standalone_query`` (a human
rewrite). The slot ``history`` turns that into the text the retriever searches:

- ``last_turn`` (the default; builds nothing): the last question as it is, what every run did
  before conversations existed, so single-turn eval sets keep their ``config_hash``;
- ``window``: the last ``turns`` user turns (the question included) joined, with the assistant's
  turns between them when ``roles: all``;
- ``rewrite``: a chat model rewrites the question as a standalone search query from the
  conversation; the call, its cache and its strict parser are the query transform's
  (``stages.query``: ``_LLMTransform``, ``parse_rewrite``); a failed or unparseable reply is
  counted (``n_history_errors``) and the last question is searched;
- ``oracle``: the item's ``standalone_query`` (the human rewrite): an eval set without one on
  every item is refused before the run (exit 2, naming the lines).

A single-turn item (no history) searches its question under every option but ``oracle``.
"""

from __future__ import annotations

import json
from typing import Literal, Protocol

from rag_experiments.core.types import EvalItem
from rag_experiments.stages.query import _LLMTransform, parse_rewrite

KINDS = ("last_turn", "window", "rewrite", "oracle")
ROLES = ("user", "assistant")

HISTORY_REWRITE_PROMPT = (
    "Below is a conversation between a user and an assistant. Rewrite the user's last question as "
    "one standalone search query that can be understood without the conversation: resolve pronouns "
    "and references ('it', 'that', 'and for contractors?') using the earlier turns, keep the key "
    "terms. Reply with the query only, on one line.\n\n{question}"
)


class HistoryQuery(Protocol):
    """``kind``: window | rewrite | oracle (last_turn builds no stage); ``identity`` enters
    ``config_hash``."""

    kind: str
    identity: str


def last_turns(item: EvalItem, turns: int | None = None) -> list[tuple[str, str]]:
    """(role, text) of the conversation, the question last; ``turns``: from the last that many
    user turns on (the question included), whitespace collapsed."""
    lines = [(t["role"], " ".join(t["text"].split())) for t in item.history] + [
        ("user", " ".join(item.query.split()))
    ]
    if turns is not None:
        users = [i for i, (role, _) in enumerate(lines) if role == "user"]
        lines = lines[users[-turns] if len(users) >= turns else 0 :]
    return lines


def render(item: EvalItem, turns: int | None = None) -> str:
    """The conversation as text, one ``User:`` / ``Assistant:`` line per turn (:func:`last_turns`)."""
    return "\n".join(f"{'User' if r == 'user' else 'Assistant'}: {t}" for r, t in last_turns(item, turns))


class Window:
    """The last ``turns`` user turns (the question last), joined by a space; ``roles: all`` keeps
    the assistant's turns between them."""

    kind = "window"

    def __init__(self, turns: int = 3, roles: Literal["user", "all"] = "user") -> None:
        self.turns, self.roles = int(turns), str(roles)
        self.identity = json.dumps(
            {"history": self.kind, "turns": self.turns, "roles": self.roles}, sort_keys=True
        )

    def search_query(self, item: EvalItem) -> str:
        return " ".join(t for r, t in last_turns(item, self.turns) if self.roles == "all" or r == "user")


class Oracle:
    """The item's ``standalone_query``, the human rewrite (``run.assemble`` refuses an eval set
    where an item has none)."""

    kind = "oracle"
    identity = json.dumps({"history": "oracle"})

    def search_query(self, item: EvalItem) -> str:
        return item.standalone_query or item.query


class HistoryRewrite(_LLMTransform):
    """A chat model rewrites the last question as a standalone query from the conversation
    (:func:`render`, at most ``turns`` user turns); one call per item with a history, the reply
    read by ``stages.query.parse_rewrite``. An item without history is not sent: its question is
    standalone."""

    kind, default_prompt = "history_rewrite", HISTORY_REWRITE_PROMPT

    def __init__(self, llm, prompt: str | None = None, turns: int = 5) -> None:
        self.turns = int(turns)
        super().__init__(llm, prompt, turns=self.turns)
        self.prompt_name = "history.rewrite"  # in MLflow's Prompt Registry: rag-experiments.history.rewrite

    def conversation(self, item: EvalItem) -> str:
        """What the model is asked about: the conversation, cut to ``turns`` user turns."""
        return render(item, self.turns)

    def _parse(self, reply: str, question: str) -> list[str]:
        return parse_rewrite(reply)

    def search_texts(self, question: str, texts: list[str]) -> list[str]:
        return texts[:1]


def missing_standalone(items: list[EvalItem]) -> list[str]:
    """``line N: id: no standalone_query`` for every item ``history=oracle`` cannot search."""
    return [f"line {it.line}: {it.id}: no standalone_query" for it in items if not it.standalone_query]

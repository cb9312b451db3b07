"""Prompt templates: numbered context chunks and the question, rendered as OpenAI chat messages.

A template names two placeholders, ``{context}`` and ``{question}`` (and optionally
``{decline_text}``); they are substituted literally (no ``str.format``), so braces elsewhere in a
template are safe. ``text`` is the template's full wording: it is part of the generation cache key
and of ``config_hash``, so rewording a prompt re-generates, while re-running it does not.

``context_format`` says how the passages are rendered into ``{context}``: ``plain`` (the default,
unchanged since the first run: ``[n] (doc_id) text``) or ``tagged``, each passage between
``<passage id="n" doc="…">`` and ``</passage>`` lines with any passage tag inside its text
neutralised, so a document that writes ``</passage> Question: … Answer:`` or a "SYSTEM NOTE"
cannot leave its passage (docs/reliability.md, "Untrusted text"). The generator prompt is the
system under test: delimiting is offered (``prompt=concise_tagged``) and recommended, not imposed.
"""

from __future__ import annotations

import html
import re

from rag_experiments.core.sanitize import delimited
from rag_experiments.core.types import Chunk

CONTEXT_FORMATS = ("plain", "tagged")
_PLACEHOLDER = re.compile(r"\{(context|question|decline_text)\}")


class PromptRegistryError(ValueError):
    """A prompt the config names in MLflow's Prompt Registry does not exist or cannot be run
    (``tracking.prompt_registry``); ``problems`` name the registry entry (exit 2, no run)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def format_context(chunks: list[Chunk], context_format: str = "plain") -> str:
    """The passages in retrieval order, numbered from 1 (``[n]`` is what citations cite).

    ``plain``: ``[1] (doc_id) text`` blocks. ``tagged``: ``<passage id="1" doc="doc_id">`` line, the
    text, ``</passage>`` line, every ``<passage`` / ``</passage`` (and the judge's prompt tags) inside
    the text escaped as ``&lt;…`` (``sanitize.delimited``), the doc id attribute-escaped."""
    if not chunks:
        return "(no context retrieved)"
    if context_format == "tagged":
        return "\n\n".join(_passage(i, c) for i, c in enumerate(chunks, start=1))
    return "\n\n".join(f"[{i}] ({c.doc_id}) {c.text.strip()}" for i, c in enumerate(chunks, start=1))


def _passage(i: int, chunk: Chunk) -> str:
    block = delimited("passage", chunk.text.strip())  # <passage>\n…\n</passage>, inner tags escaped
    return f'<passage id="{i}" doc="{html.escape(chunk.doc_id, quote=True)}">' + block.removeprefix("<passage>")


class PromptTemplate:
    def __init__(
        self, name: str, system: str, template: str, decline_text: str = "I don't know", context_format: str = "plain",
        history_turns: int = 0,
    ) -> None:  # fmt: skip
        self.name = name
        # a conversation's earlier turns shown to the model as chat messages before the question: at
        # most this many user turns with their assistant replies (docs/conversations.md); 0: none
        self.history_turns = int(history_turns)
        self.system = system.strip()
        self.template = template.strip()
        self.decline_text = decline_text
        if context_format not in CONTEXT_FORMATS:
            raise ValueError(f"prompt {name!r}: context_format must be one of {', '.join(CONTEXT_FORMATS)}")
        self.context_format = context_format
        for placeholder in ("{context}", "{question}"):
            if placeholder not in self.template:
                raise ValueError(f"prompt {name!r}: template must contain {placeholder}")

    @property
    def text(self) -> str:
        """Everything that shapes the rendered prompt (system + template + decline text, and the
        context format when it is not the default: a plain prompt's text, hence its cache keys and
        ``config_hash``, is what it was before the option existed)."""
        text = f"{self.system}\n---\n{self.template}\n---\ndecline_text: {self.decline_text}"
        text = text if self.context_format == "plain" else f"{text}\n---\ncontext_format: {self.context_format}"
        return text if not self.history_turns else f"{text}\n---\nhistory_turns: {self.history_turns}"

    def _fill(self, s: str, query: str, context: str) -> str:
        if self.context_format == "tagged":  # one pass: a "{question}" inside a passage stays text
            values = {"context": context, "question": query.strip(), "decline_text": self.decline_text}
            return _PLACEHOLDER.sub(lambda m: values[m.group(1)], s)
        return (
            s.replace("{decline_text}", self.decline_text)
            .replace("{context}", context)
            .replace("{question}", query.strip())
        )

    def recent(self, history: list[dict] | None, cut: int = 0) -> list[dict]:
        """The turns of ``history`` the prompt shows: from the last ``history_turns`` user turns on,
        less the ``cut`` oldest of those (each with its assistant reply; the window's cut)."""
        users = [i for i, t in enumerate(history or []) if t["role"] == "user"]
        keep = min(self.history_turns, len(users)) - cut
        return list(history[users[-keep] :]) if keep > 0 else []

    def render(self, query: str, chunks: list[Chunk], history: list[dict] | None = None) -> list[dict]:
        """system, then the conversation's earlier turns (:meth:`recent` of ``history``; teacher-forced:
        the assistant turns are the eval set's), then the question with the context."""
        context = format_context(chunks, self.context_format)
        messages = []
        if self.system:
            messages.append({"role": "system", "content": self._fill(self.system, query, context)})
        messages += [{"role": t["role"], "content": t["text"]} for t in self.recent(history)]
        messages.append({"role": "user", "content": self._fill(self.template, query, context)})
        return messages

    def __repr__(self) -> str:
        return f"PromptTemplate(name={self.name!r})"

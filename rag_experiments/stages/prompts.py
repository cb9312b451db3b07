"""Prompt templates: numbered context chunks and the question, rendered as OpenAI chat messages.

A template names two placeholders, ``{context}`` and ``{question}`` (and optionally
``{decline_text}``); they are substituted literally (no ``str.format``), so braces elsewhere in a
template are safe. ``text`` is the template's full wording: it is part of the generation cache key
and of ``config_hash``, so rewording a prompt re-generates, while re-running it does not.
"""

from __future__ import annotations

from rag_experiments.core.types import Chunk


class PromptRegistryError(ValueError):
    """A prompt the config names in MLflow's Prompt Registry does not exist or cannot be run
    (``tracking.prompt_registry``); ``problems`` name the registry entry (exit 2, no run)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def format_context(chunks: list[Chunk]) -> str:
    """``[1] (doc_id) text`` blocks, one per chunk, in retrieval order; ``[n]`` is what citations cite."""
    if not chunks:
        return "(no context retrieved)"
    return "\n\n".join(f"[{i}] ({c.doc_id}) {c.text.strip()}" for i, c in enumerate(chunks, start=1))


class PromptTemplate:
    def __init__(self, name: str, system: str, template: str, decline_text: str = "I don't know") -> None:
        self.name = name
        self.system = system.strip()
        self.template = template.strip()
        self.decline_text = decline_text
        for placeholder in ("{context}", "{question}"):
            if placeholder not in self.template:
                raise ValueError(f"prompt {name!r}: template must contain {placeholder}")

    @property
    def text(self) -> str:
        """Everything that shapes the rendered prompt (system + template + decline text)."""
        return f"{self.system}\n---\n{self.template}\n---\ndecline_text: {self.decline_text}"

    def _fill(self, s: str, query: str, context: str) -> str:
        return (
            s.replace("{decline_text}", self.decline_text)
            .replace("{context}", context)
            .replace("{question}", query.strip())
        )

    def render(self, query: str, chunks: list[Chunk]) -> list[dict]:
        context = format_context(chunks)
        messages = []
        if self.system:
            messages.append({"role": "system", "content": self._fill(self.system, query, context)})
        messages.append({"role": "user", "content": self._fill(self.template, query, context)})
        return messages

    def __repr__(self) -> str:
        return f"PromptTemplate(name={self.name!r})"

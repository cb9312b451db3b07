"""Contexts an application used, mapped back onto corpus spans (docs/app.md): gold evidence is
text in the corpus, so an application's retrieved passages can be scored against it."""

from __future__ import annotations

from typing import Any

from rag_experiments.core.types import Document
from rag_experiments.evalset.load import Normalised, normalise_ws


class ContextMapper:
    """Maps a context onto a corpus span: exact offsets when given (and the text there matches),
    else the text found exactly, then whitespace-normalised, within the named document, else
    within the corpus (the first document in corpus order). None: not in the corpus."""

    def __init__(self, docs: list[Document]) -> None:
        self.docs = {d.doc_id: d for d in docs}
        self._norm: dict[str, Normalised] = {}

    def _find(self, doc: Document, text: str) -> tuple[int, int] | None:
        i = doc.text.find(text)
        if i >= 0:
            return i, i + len(text)
        if doc.doc_id not in self._norm:
            self._norm[doc.doc_id] = Normalised.of(doc.text)
        hits = self._norm[doc.doc_id].find_all(normalise_ws(text))
        return hits[0] if hits else None

    def map(self, ctx: dict[str, Any]) -> tuple[str, int, int] | None:
        text, doc_id = str(ctx.get("text") or ""), ctx.get("doc_id")
        if not normalise_ws(text):
            return None
        doc = self.docs.get(doc_id) if isinstance(doc_id, str) else None
        start, end = ctx.get("start"), ctx.get("end")
        if doc is not None and isinstance(start, int) and isinstance(end, int) and 0 <= start < end <= len(doc.text):
            if normalise_ws(doc.text[start:end]) == normalise_ws(text):
                return doc.doc_id, start, end
        for d in [doc] if doc is not None else []:
            if (hit := self._find(d, text)) is not None:
                return d.doc_id, *hit
        for d in self.docs.values():
            if d is not doc and (hit := self._find(d, text)) is not None:
                return d.doc_id, *hit
        return None

"""A small RAG application written with plain Python (docs/app.md): BM25 over the bundled sample's
documents and the packaged SmolLM2 through its llama.cpp server. rag-experiments evaluates it as a
black box: ``app=python app.target=examples.bm25_smollm2_app:answer``.

It knows nothing of rag-experiments' stages: it returns what any application can, the answer and
the passages it used (here with their document and offsets; text alone is mapped too).
"""

from __future__ import annotations

import functools
from pathlib import Path

SAMPLE = Path(__file__).resolve().parent.parent / "rag_experiments" / "data" / "sample" / "docs"


@functools.cache
def _index():
    import bm25s

    passages = []  # (doc_id, start, end, text): paragraphs of every page
    for path in sorted(SAMPLE.rglob("*.md")):
        text, at = path.read_text(encoding="utf-8"), 0
        for para in text.split("\n\n"):
            start = text.index(para, at)
            at = start + len(para)
            if para.strip():
                passages.append((path.relative_to(SAMPLE).as_posix(), start, at, para))
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize([p[3] for p in passages], show_progress=False), show_progress=False)
    return retriever, passages


def retrieve(question: str, top_k: int = 3) -> list[dict]:
    import bm25s

    retriever, passages = _index()
    ids, scores = retriever.retrieve(bm25s.tokenize([question], show_progress=False), k=top_k, show_progress=False)
    return [
        {"text": passages[i][3], "doc_id": passages[i][0], "start": passages[i][1], "end": passages[i][2],
         "score": float(s)}
        for i, s in zip(ids[0], scores[0], strict=True)
    ]  # fmt: skip


def answer(question: str, top_k: int = 3, generate: bool = True, max_tokens: int = 96) -> dict:
    """The application: retrieve, then answer from the passages (``generate=False``: the first
    passage's first sentence, no model, for quick checks)."""
    contexts = retrieve(question, top_k)
    if not generate:
        return {"answer": contexts[0]["text"].split(". ")[0] if contexts else "I don't know.", "contexts": contexts}
    from openai import OpenAI

    from rag_experiments.stages.generation import local_server  # the packaged SmolLM2, served once

    client = OpenAI(base_url=local_server(), api_key="none")
    context = "\n\n".join(c["text"] for c in contexts)
    reply = client.chat.completions.create(
        model="smollm2", max_tokens=max_tokens, temperature=0,
        messages=[{"role": "user", "content": f"Answer from the context.\n\nContext:\n{context}\n\nQuestion: {question}"}],
    )  # fmt: skip
    return {"answer": reply.choices[0].message.content or "", "contexts": contexts}

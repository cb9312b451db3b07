"""The ``app`` slot as a step of the run loop (docs/app.md): the application asked every question,
its contexts mapped onto corpus spans and ranked in its order, its answers kept for the
generation half."""

from __future__ import annotations

import numpy as np

from rag_experiments.core.cache import stable_hash, stage_key
from rag_experiments.core.parallel import ask_missing
from rag_experiments.core.steps import StepRecord
from rag_experiments.core.types import Chunk
from rag_experiments.evalset.contexts import ContextMapper
from rag_experiments.run.retrieval import Ranking
from rag_experiments.stages.app import AppReply
from rag_experiments.tracking.app_traces import with_trace_id


def _ask(app, question: str) -> AppReply:
    """The app asked once; the id of the MLflow trace the call made, when it traces itself."""
    reply, made = with_trace_id(lambda: app.ask(question))
    reply.trace_id = reply.trace_id or made
    return reply


class AppStep:
    """The ``app`` slot as a step: every question asked (cached per (identity, question), failures
    not), the contexts mapped onto corpus spans and ranked in the app's order (the run's ranking,
    so every retrieval metric scores them), the answers kept for the generation half."""

    slot = "app"

    def run(self, st, ctx) -> StepRecord:
        app, cache, items = ctx.stages.app, ctx.cache, ctx.data.items
        keys = [stage_key("app", app.identity, q) for q in st.queries]
        found, fresh = ask_missing(
            cache, "app", keys, lambda i: _ask(app, st.queries[i]),
            lambda r: None if r.error else {"answer": r.answer, "contexts": r.contexts, "seconds": r.seconds,
                                            "trace_id": r.trace_id},
            app.concurrency, ("app", "questions"), ctx.settings.progress)  # fmt: skip
        replies = [fresh[k] if k in fresh else AppReply(**found[k]) for k in keys]
        mapper, spans, rows, unmapped = ContextMapper(ctx.data.docs), {}, [], []
        for r in replies:
            row, lost = [], 0
            for c in r.contexts:
                span = mapper.map(c)
                if span is None:
                    lost += 1
                    continue
                spans.setdefault(span, len(spans))
                if spans[span] not in row:
                    row.append(spans[span])
            rows.append(row)
            unmapped.append(lost)
        st.chunks = [Chunk(f"{d}#{s}-{e}", d, s, e, mapper.docs[d].text[s:e]) for (d, s, e) in spans]
        st.chunks_key = stable_hash("app_contexts", sorted(spans))
        st.cache_keys.update(chunks=st.chunks_key, app=stable_hash("app", app.identity, st.queries))
        depth = max([len(r) for r in rows] + [1])
        idx = np.full((len(rows), depth), -1, dtype=np.int64)
        for qi, row in enumerate(rows):
            idx[qi, : len(row)] = row
        scores = np.where(idx >= 0, -np.arange(depth, dtype=np.float32), -np.inf).astype(np.float32)
        st.ranking = Ranking(idx, scores, st.cache_keys["app"])
        self.replies, self.unmapped = replies, unmapped
        st.app_replies = {it.id: r for it, r in zip(items, replies, strict=True)}
        errors = [r.error for r in replies if r.error]
        return StepRecord(self.slot, len(keys), len(errors), {"app": len(fresh)}, first_error=errors[0] if errors else "")

    def columns(self, st, rows: list[dict]) -> None:
        for row, r, lost in zip(rows, self.replies, self.unmapped, strict=True):
            row.update(app_error=r.error or None, app_trace_id=r.trace_id or None, latency_app_s=r.seconds,
                       n_contexts=len(r.contexts), n_unmapped_contexts=lost)  # fmt: skip

"""The history slot in a run: every turn's conversation made into what it searches
(``stages.history``, docs/conversations.md), before the query transform.

``history=window`` and ``oracle`` are read off each item; ``history=rewrite`` asks its chat model
through the query transform's cached, strict path (``run.query_stage.query_stage``, under the cache
namespace ``history``): one call per turn that has a history, committed as it arrives, a failed or
unparseable reply not cached, its turn searched as the last question and counted
(``history_error``, ``n_history_errors``). A turn without history is searched as it is.
"""

from __future__ import annotations

import math

import numpy as np

from rag_experiments.core.steps import StepRecord
from rag_experiments.evaluation.cost import usage_columns
from rag_experiments.run.query_stage import query_stage


class HistoryStep:
    """The ``history`` slot as a step: sets ``RunState.queries``, what every later step searches
    (a rewrite failing on every turn fails the run, ``run.steps.failure_reason``)."""

    slot = "history"

    def run(self, st, ctx) -> StepRecord:
        stage, items = ctx.stages.history, ctx.data.items
        n = len(items)
        st.history_errors, st.history_usage = [""] * n, None  # usage: a rewrite's, per turn
        st.history_seconds = np.full(n, np.nan) if stage.kind == "history_rewrite" else np.zeros(n)
        if stage.kind != "history_rewrite":
            st.queries = [stage.search_query(it) for it in items]
            return StepRecord(self.slot, n)
        asked = [i for i, it in enumerate(items) if it.history]
        q = query_stage(stage, [stage.conversation(items[i]) for i in asked], ctx.cache, ctx.settings.progress,
                        namespace="history")  # fmt: skip
        queries, st.history_usage = [it.query for it in items], [{} for _ in range(n)]
        for j, i in enumerate(asked):
            if q.outputs[j]:
                queries[i] = q.outputs[j][0]
            st.history_errors[i], st.history_usage[i] = q.errors[j], q.usage[j]
            st.history_seconds[i] = q.seconds[j]
        for i in set(range(n)) - set(asked):
            st.history_seconds[i] = 0.0
        st.queries = queries
        errors = [e for e in q.errors if e]
        tokens = {
            k: float(sum((u.get(k) or 0) for u in q.usage)) for k in ("prompt_tokens", "completion_tokens")
        }
        return StepRecord(self.slot, len(asked), len(errors), {"history": q.calls}, tokens,
                          first_error=errors[0] if errors else "")  # fmt: skip

    def columns(self, st, rows: list[dict]) -> None:
        """Each row's ``history_query`` (and ``search_queries`` when no transform followed), its
        rewrite's error, seconds and tokens."""
        for qi, row in enumerate(rows):
            row["history_query"] = st.queries[qi]
            if st.queried is None:
                row["search_queries"] = [st.queries[qi]]
            secs = float(st.history_seconds[qi])
            row.update(latency_history_s=secs if math.isfinite(secs) else math.nan,
                       history_error=st.history_errors[qi] or None)  # fmt: skip
            if st.history_usage is not None:
                row.update(usage_columns(st.history_usage[qi], "history"))

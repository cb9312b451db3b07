"""The query slot in a run: transform every question (``stages.query``), then rank what the
transform says to search (docs/stages.md, "Query transformation").

The model's replies are cached per question under (the transform's ``llm_identity``, question),
with their usage and seconds, and committed as they arrive: a killed run resumes with only the
missing questions, and a re-run makes no call. A failed or unusable reply is not cached (a re-run
retries it); its question is searched as it is and counted (``query_error``, ``n_query_errors``).
The rankings of rewritten queries and of multi-query variants go through the ranking cache like
the questions' (so chunks and the corpus's vectors are reused); a HyDE vector search is recomputed
(the index and the vectors come from their caches).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from rag_experiments.core.cache import StageCache, stage_key
from rag_experiments.core.parallel import ask_missing
from rag_experiments.core.steps import StepRecord
from rag_experiments.evaluation.cost import usage_columns
from rag_experiments.stages.query import Transformed

log = logging.getLogger(__name__)


@dataclass
class Queried:
    """Per question: the texts searched (``search_queries``), the transform's seconds, error ("":
    none) and usage; ``calls``: model calls made (0: all from the cache)."""

    search_queries: list[list[str]]
    outputs: list[list[str]]  # the model's usable output ([] when it failed)
    seconds: np.ndarray
    errors: list[str]
    usage: list[dict[str, Any]]
    calls: int


def query_stage(transform, questions: list[str], cache: StageCache, progress: bool = True,
                namespace: str = "query") -> Queried:  # fmt: skip
    """Every question's transform, from the cache (``namespace``: the slot's, ``history`` for the
    history rewrite) or one model call each (``transform.concurrency`` in flight, each committed
    as it completes)."""
    keys = [stage_key(namespace, transform.llm_identity, q) for q in questions]
    def store(res: Transformed) -> dict | None:
        if res.error:
            log.warning("query=%s: %s (the question is searched as it is)", transform.kind, res.error)
            return None
        return {"texts": res.texts, "usage": res.usage, "seconds": res.seconds}

    found, fresh = ask_missing(cache, namespace, keys, lambda i: transform.ask(questions[i]), store,
                               transform.concurrency, (f"query ({transform.kind})", "queries"), progress)  # fmt: skip
    got = [fresh[k] if k in fresh else Transformed(**found[k]) for k in keys]
    if n_cut := sum(t.truncated for t in fresh.values()):  # said, not silently searched on a cut reply
        cap = getattr(transform.llm, "max_answer_chars", "?")
        log.warning("query=%s: %d of %d replies cut at the model's max_answer_chars=%s (the endpoint ignored "
                    "max_tokens); their tails were not searched", transform.kind, n_cut, len(fresh), cap)  # fmt: skip
    return Queried(
        search_queries=[transform.search_texts(q, t.texts) for q, t in zip(questions, got, strict=True)],
        outputs=[list(t.texts) for t in got],
        seconds=np.array([t.seconds for t in got], dtype=float),
        errors=[t.error for t in got],
        usage=[dict(t.usage or {}) for t in got],
        calls=len(fresh),
    )


class QueryStep:
    """The ``query`` slot as a step: every question's transform (``run.steps``: a transform that
    fails on every question fails the run; failures are not cached, so a re-run redoes them)."""

    slot = "query_transform"

    def run(self, st, ctx) -> StepRecord:
        q = query_stage(ctx.stages.query_transform, st.queries, ctx.cache, ctx.settings.progress)
        st.queried = q
        errors = [e for e in q.errors if e]
        tokens = {k: float(sum((u.get(k) or 0) for u in q.usage)) for k in ("prompt_tokens", "completion_tokens")}
        return StepRecord(self.slot, len(st.queries), len(errors), {"query": q.calls}, tokens,
                          first_error=errors[0] if errors else "")  # fmt: skip


def query_columns(rows: list[dict], queried: Queried | None) -> None:
    """Each row's ``search_queries`` (the question alone without a transform) and, with one, the
    transform's seconds, error (None: none) and tokens (``tokens_in_query``, ``tokens_out_query``)."""
    for qi, row in enumerate(rows):
        if queried is None:
            row["search_queries"] = [row["query"]]
            continue
        row["search_queries"] = list(queried.search_queries[qi])
        secs = float(queried.seconds[qi])
        row.update(latency_query_s=secs if math.isfinite(secs) else math.nan,
                   query_error=queried.errors[qi] or None)  # fmt: skip
        row.update(usage_columns(queried.usage[qi], "query"))

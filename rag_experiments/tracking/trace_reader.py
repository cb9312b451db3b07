"""Traced requests out of an MLflow experiment, as ``analysis.trace_sample.TracedQuery`` (docs/from-traces.md).

Any application traced with MLflow tracing: the question is the root span's input (a string, or
the first of ``query``, ``question``, ``input``, ``prompt``, ``user_input``, or the last user
message of ``messages``), the answer its output (a string, or ``answer``/``output``/``response``/
``content``/``text``, or a chat completion's first choice); the context is every RETRIEVER span's
documents (``page_content``, the doc id from ``metadata`` ``doc_id``/``doc_uri``/``source``/``id``,
``score``). This project's own runs write exactly that (``tracking/traces.py``); their
``failure_label`` and metric feedback become judge signals. Filters: the trace's start time and
its tags.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from rag_experiments.analysis.trace_sample import RetrievedDoc, TracedQuery

_Q_KEYS = ("query", "question", "input", "prompt", "user_input", "request")
_A_KEYS = ("answer", "output", "response", "content", "text", "result")
_ID_KEYS = ("doc_id", "doc_uri", "source", "id")


class TraceInputError(ValueError):
    """The experiment holds nothing to sample: exit 2 with this message."""


@dataclass(frozen=True)
class Filters:
    start_ms: int | None = None
    end_ms: int | None = None
    tags: tuple[tuple[str, str], ...] = ()

    def filter_string(self) -> str:
        parts = []
        if self.start_ms is not None:
            parts.append(f"trace.timestamp_ms >= {int(self.start_ms)}")
        if self.end_ms is not None:
            parts.append(f"trace.timestamp_ms < {int(self.end_ms)}")
        parts += [f"tags.`{k}` = '{v.replace(chr(39), '')}'" for k, v in self.tags]
        return " AND ".join(parts)


def _loads(x):
    if isinstance(x, str):
        try:
            return json.loads(x)
        except ValueError:
            return x
    return x


def question_of(inputs) -> str | None:
    x = _loads(inputs)
    if isinstance(x, str):
        return x.strip() or None
    if isinstance(x, dict):
        for k in _Q_KEYS:
            if isinstance(x.get(k), str) and x[k].strip():
                return x[k].strip()
        msgs = x.get("messages")
        if isinstance(msgs, list):
            users = [m.get("content") for m in msgs if isinstance(m, dict) and m.get("role") == "user"]
            if users and isinstance(users[-1], str):
                return users[-1].strip()
        strs = [v for v in x.values() if isinstance(v, str) and v.strip()]
        return strs[0].strip() if len(strs) == 1 else None
    return None


def answer_of(outputs) -> str | None:
    x = _loads(outputs)
    if isinstance(x, str):
        return x
    if isinstance(x, dict):
        for k in _A_KEYS:
            if isinstance(x.get(k), str):
                return x[k]
        choices = x.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            msg = choices[0].get("message") or {}
            if isinstance(msg.get("content"), str):
                return msg["content"]
    return None  # a list (our retrieval-only runs: the top chunk ids) or nothing: no answer


def documents_of(outputs) -> list[RetrievedDoc]:
    x = _loads(outputs)
    if isinstance(x, dict):
        x = x.get("documents", [])
    out = []
    for d in x if isinstance(x, list) else []:
        if isinstance(d, str):
            out.append(RetrievedDoc(d))
        elif isinstance(d, dict):
            meta = d.get("metadata") or {}
            doc_id = next((str(meta[k]) for k in _ID_KEYS if meta.get(k)), str(d.get("id") or ""))
            score = meta.get("score", d.get("score"))
            text = d.get("page_content") or d.get("text") or d.get("content") or ""
            out.append(
                RetrievedDoc(str(text), doc_id, float(score) if isinstance(score, int | float) else None)
            )
    return out


def _feedback(info) -> dict[str, object]:
    out: dict[str, object] = {}
    for a in getattr(info, "assessments", None) or []:
        fb = getattr(a, "feedback", None)
        if fb is None or getattr(fb, "error", None) is not None or a.name == "more_metrics":
            continue
        if isinstance(fb.value, bool | int | float | str):
            out[a.name] = fb.value
    return out


def as_traced(trace) -> TracedQuery | None:
    """One MLflow ``Trace`` → ``TracedQuery``; None when its root span has no readable question."""
    spans = trace.data.spans
    root = next((s for s in spans if s.parent_id is None), None)
    if root is None:
        return None
    question = question_of(root.inputs)
    if not question:
        return None
    retrievers = [s for s in spans if str(s.span_type) == "RETRIEVER"]
    docs = [d for s in retrievers for d in documents_of(s.outputs)]
    info = trace.info
    return TracedQuery(
        trace_id=info.trace_id,
        question=question,
        answer=answer_of(root.outputs),
        docs=docs,
        timestamp_ms=int(info.request_time or 0),
        tags={k: v for k, v in (info.tags or {}).items() if not k.startswith("mlflow.")},
        feedback=_feedback(info),
        error=str(info.state) in ("ERROR", "TraceState.ERROR"),
        has_retriever=bool(retrievers),
        experiment_id=getattr(info, "experiment_id", "") or "",
    )


def read_traces(
    uri: str, experiment: str, filters: Filters = Filters(), limit: int = 50_000
) -> tuple[list[TracedQuery], int]:
    """(traced queries, traces skipped for no readable question) of ``experiment`` (name or id).

    Raises :class:`TraceInputError` for an unknown experiment or one without a matching trace."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None and experiment.isdigit():
        try:
            exp = client.get_experiment(experiment)
        except Exception:  # noqa: BLE001 - MLflow raises its own error type per store
            exp = None
    if exp is None:
        raise TraceInputError(f"experiment {experiment!r}: not found on {uri}")
    out: list[TracedQuery] = []
    skipped = 0
    token = None
    for _ in range(10_000):
        page = client.search_traces(
            locations=[exp.experiment_id], filter_string=filters.filter_string() or None,
            max_results=500, page_token=token, include_spans=True,
        )  # fmt: skip
        for t in page:
            q = as_traced(t)
            if q is None:
                skipped += 1
            else:
                out.append(q)
        token = page.token
        if not token or len(out) >= limit:
            break
    if not out:
        what = f" matching {filters.filter_string()}" if filters.filter_string() else ""
        raise TraceInputError(
            f"experiment {experiment!r} on {uri}: no trace{what}"
            + (f" with a readable question ({skipped} traces' root span input has none)" if skipped else "")
        )
    return out, skipped


def tag_pairs(values: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """``--tag KEY=VALUE`` arguments as pairs; ValueError naming a malformed one."""
    out = []
    for v in values:
        if "=" not in v:
            raise ValueError(f"--tag {v!r}: expected KEY=VALUE")
        k, val = v.split("=", 1)
        out.append((k.strip(), val.strip()))
    return tuple(out)

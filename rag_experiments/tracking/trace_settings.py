"""The trace settings of a run, typed (docs/tracing.md): built once at assembly, read by
``tracking.traces`` and the run writers. No MLflow import, so the run's typed settings
(``run.types.JobSettings``) stay light."""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_SAMPLE = 2000  # tracking.trace_sample: every item up to this many, then a sample


@dataclass(frozen=True)
class TraceSettings:
    """How a run's traces are written, from its config (keys in brackets): ``enabled``
    (tracking.traces), ``sample`` (tracking.trace_sample: every item up to this many, then a
    seeded sample; None: all), ``seed`` (the sample's seed), ``k`` (retriever.k: the context the
    generator got), ``path`` (``RAG_EXPERIMENTS_TRACES``: ``auto``, ``public``, ``fast`` …, see
    :func:`write_traces`). Built once at assembly (``run.assemble.job_settings``)."""

    enabled: bool = True
    sample: int | None = DEFAULT_SAMPLE
    seed: int = 0
    k: int = 5
    path: str = "auto"


def trace_path() -> str:
    """The trace writing path of this process (``RAG_EXPERIMENTS_TRACES``, default ``auto``)."""
    return os.environ.get("RAG_EXPERIMENTS_TRACES", "auto") or "auto"

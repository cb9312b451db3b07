"""The run store: the one door between a job (``run.sweep.run_job``) and the tracking store
(issue 36 item 7, docs/architecture.md "The run store").

A :class:`RunStore` is a :class:`~rag_experiments.tracking.run_writer.RunWriter` (start, log, end
of the run) plus everything else a job asks of the store before and around its run: the config
lock, healing RUNNING runs a dead process left, the resume decision (``tracking.resume``: one
rule for every store), a FINISHED config joining a new sweep, prompt registration, the latest
FINISHED run of an eval set (the pilot of the sweep's power line) and a finished run's table.

Two real implementations with the same semantics:

- ``run_writer.MlflowRunWriter``: the production one, over an MLflow tracking store;
- :class:`MemoryRunStore`: runs kept in a ``tracking.memory.MemoryStore`` (a dict), no MLflow
  store at all: the run-path tests use it, and ``tests/test_run_store.py`` holds both to one
  contract.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

import pandas as pd

from rag_experiments.core.run_record import RunData
from rag_experiments.tracking import resume
from rag_experiments.tracking.memory import StoredRun
from rag_experiments.tracking.resume import Resume
from rag_experiments.tracking.run_info import _runner_alive
from rag_experiments.tracking.run_reader import MemoryRunReader
from rag_experiments.tracking.run_writer import MemoryRunWriter, RunWriter


class RunStore(RunWriter, Protocol):
    """What a job asks of the tracking store, in the order ``run.sweep.run_job`` asks it:
    ``latest_finished_of_evalset`` (pilot) and the prompt registration, then under
    ``config_lock``: ``heal_stale_runs``, ``resume_decision``, and either the reuse
    (``link_reused_run``, ``reuse_in_sweep``, ``per_query``) or the run itself (``RunWriter``)."""

    def config_lock(self, chash: str) -> AbstractContextManager[None]:
        """Held around the resume decision and the run: identical jobs started together run a
        config once."""
        ...

    def heal_stale_runs(self, chash: str) -> list[str]:
        """RUNNING runs of ``chash`` whose process is gone marked KILLED (tag ``healed``); their ids.
        A run of a live process, or of another host, is left alone."""
        ...

    def resume_decision(self, chash: str, fingerprint: str) -> Resume:
        """The FINISHED, complete run of this ``config_hash`` and ``code_fingerprint`` to reuse
        (None: run it; FAILED, KILLED and incomplete runs are never reused), and why
        (``resume.decide``)."""
        ...

    def reuse_in_sweep(
        self, done: RunData, chash: str, sweep: dict, force: bool, start: Callable[[], tuple[str, str | None]]
    ) -> str | None:
        """``done`` made part of this multirun: a FINISHED child of its parent (``start`` creates
        it) carrying ``done``'s results, tagged ``reused_from``. None when the parent already
        holds a FINISHED run of ``chash`` (a resumed sweep)."""
        ...

    def register_prompt(self, prompt: Any) -> tuple[str, int]:
        """The answer prompt's template registered by content: (registry name, version); the same
        text is the same version."""
        ...

    def register_stage_prompts(self, stages: Any) -> list[tuple[str, int]]:
        """The query transform's and LLM reranker's prompts registered by content: (name, version)s."""
        ...

    def link_reused_run(self, run_id: str, prompt_version: tuple[str, int]) -> None:
        """A reused run linked to a prompt version that holds the same text as its own."""
        ...

    def latest_finished_of_evalset(self, evalset_digest: str) -> RunData | None:
        """The latest FINISHED run of the experiment on this eval set, or None."""
        ...

    def per_query(self, run: RunData, long: bool = False) -> pd.DataFrame:
        """A logged run's per-query table (wide, replicates collapsed, unless ``long``)."""
        ...

    def ui_line(self) -> str | None:
        """How to open the store's UI on the experiment (None: the store has none)."""
        ...


class MemoryRunStore(MemoryRunWriter):
    """A :class:`RunStore` over a ``MemoryStore``: the MLflow store's semantics in plain Python
    (one experiment per instance; several instances may share one ``MemoryStore``)."""

    def _of_config(self, chash: str, status: str) -> list[StoredRun]:
        """This experiment's runs of ``chash`` with ``status``, newest first."""
        runs = [
            r for r in self.store.runs.values()
            if r.experiment == self.experiment_id and r.tags.get("config_hash") == chash and r.status == status
        ]  # fmt: skip
        return sorted(runs, key=lambda r: r.start_time, reverse=True)

    @contextmanager
    def config_lock(self, chash: str) -> Iterator[None]:
        with self.store.lock(f"{self.experiment_id}/{chash}"):
            yield

    def heal_stale_runs(self, chash: str) -> list[str]:
        healed = []
        for run in self._of_config(chash, "RUNNING"):
            if _runner_alive(run.tags.get("runner")):
                continue
            run.tags["healed"] = "its process died while RUNNING; marked KILLED by a re-run"
            run.status = "KILLED"
            healed.append(run.run_id)
        return healed

    def resume_decision(self, chash: str, fingerprint: str) -> Resume:
        finished = self._of_config(chash, "FINISHED")
        same = [r for r in finished if r.tags.get("code_fingerprint") == fingerprint]
        candidates = (
            (r.run_id, resume.incomplete_reason(r.tags, r.metrics, r.table is not None)) for r in same
        )

        def previous() -> tuple[str, str] | None:
            return (
                (finished[0].run_id, finished[0].tags.get("code_fingerprint", "none recorded"))
                if finished
                else None
            )

        rid, why = resume.decide(chash, fingerprint, candidates, previous)
        return Resume(None if rid is None else self._record(self.store.get(rid)), why)

    def reuse_in_sweep(self, done, chash, sweep, force, start):
        parent = self._parent(sweep, force)
        if any(
            r.tags.get("config_hash") == chash and r.status == "FINISHED"
            for r in self.store.children(parent.run_id)
        ):
            return None
        run_id, _ = start()
        src, dst = self.store.get(done.run_id), self.store.get(run_id)
        dst.metrics.update(src.metrics)
        for key, value in src.tags.items():
            if key not in resume.OWN_TAGS and key not in dst.tags and not key.startswith("mlflow."):
                dst.tags[key] = value
        dst.table = None if src.table is None else src.table.copy()
        dst.artifacts.update(src.artifacts)
        dst.tags[resume.REUSED_FROM] = resume.original_run_id(src.tags, src.run_id)
        dst.status = "FINISHED"
        return run_id

    def _register(self, name: str, text: str) -> tuple[str, int]:
        texts = self.store.prompts.setdefault(name, [])
        if text not in texts:
            texts.append(text)
        return name, texts.index(text) + 1

    def register_prompt(self, prompt):
        from rag_experiments.tracking.prompt_registry import PREFIX, RegisteredPrompt

        if isinstance(prompt, RegisteredPrompt):  # prompt=registry: a version read from a store
            return prompt.name, prompt.version
        return self._register(PREFIX + prompt.name, prompt.text)

    def register_stage_prompts(self, stages):
        from rag_experiments.tracking.prompt_registry import stage_prompts  # which stages send a prompt

        return [self._register(name, text) for name, text in stage_prompts(stages)]

    def begin_version(self, run_id, chash, identities, prompt_refs):
        self.store.get(run_id).prompts.extend(prompt_refs)
        return None  # a memory store keeps no app versions

    def link_reused_run(self, run_id, prompt_version):
        run = self.store.get(run_id)
        if tuple(prompt_version) not in run.prompts:
            run.prompts.append(tuple(prompt_version))

    def latest_finished_of_evalset(self, evalset_digest):
        runs = [
            r for r in self.store.runs.values()
            if r.experiment == self.experiment_id and r.status == "FINISHED"
            and r.tags.get("evalset_digest") == evalset_digest
        ]  # fmt: skip
        return self._record(max(runs, key=lambda r: r.start_time)) if runs else None

    def per_query(self, run, long=False):
        return MemoryRunReader(self.store).per_query(run, long)

    def ui_line(self):
        return None

    @staticmethod
    def _record(run: StoredRun) -> RunData:
        return MemoryRunReader.record(run)

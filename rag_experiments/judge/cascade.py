"""``judge=cascade``: the trained verifier decides the claims it is sure of; an LLM judge decides
the rest (docs/judges.md, "The cascade").

A claim whose verifier P(supported) lies inside ``band = [lo, hi]`` is *escalated*: its verdict
is the LLM judge's (any judge with ``verdicts``: ``LocalLLMJudge`` on a GGUF, ``LLMJudge`` on an
OpenAI-compatible endpoint). Every verdict records the stage that decided it (``Verdict.stage``:
``verifier`` or ``llm``); the pipeline counts escalations per query (``n_escalated``). The cascade
is one judge: one identity (both stages' identities and the band), one verdict per claim, so PPI
and the spot-check treat it like any other judge. An unparseable LLM reply stays unparseable (it
is not replaced by the verifier's guess): counted, never read as "no".
"""

from __future__ import annotations

import json
from typing import Any

from rag_experiments.core.types import Verdict


class CascadeJudge:
    """Verifier first, LLM judge inside the uncertainty band (module docstring)."""

    def __init__(self, verifier: Any, llm: Any, band: list[float] | tuple[float, float] = (0.3, 0.7)) -> None:
        lo, hi = (float(x) for x in band)
        if not 0 <= lo <= hi <= 1:
            raise ValueError(f"judge.band: must be [lo, hi] with 0 <= lo <= hi <= 1 (got {list(band)})")
        self.verifier, self.llm, self.band = verifier, llm, (lo, hi)
        self.model = getattr(llm, "model", None)
        self.identity = json.dumps(
            {"kind": "cascade", "verifier": verifier.identity, "llm": llm.identity, "band": [lo, hi]},
            sort_keys=True,
        )

    def escalate(self, score: float | None) -> bool:
        lo, hi = self.band
        return score is None or lo <= score <= hi

    def split(self, answer: str) -> list[str]:
        return self.verifier.split(answer)

    def prepare(self, answers: list[str], contexts: list[str], progress: bool = False, desc: str = "", cache=None) -> None:
        self.verifier.prepare(answers, contexts, progress, desc)

    def verdicts(self, claims: list[str], context: str) -> list[Verdict]:
        first = self.verifier.verdicts(list(claims), context)
        for v in first:
            v.stage = "verifier"
        ask = [i for i, v in enumerate(first) if v.label == "unparseable" or self.escalate(v.score)]
        if ask:
            second = self.llm.verdicts([claims[i] for i in ask], context)
            for i, v in zip(ask, second, strict=True):
                v.stage = "llm"
                p = first[i].score
                v.rationale = f"escalated: verifier P(supported)={p if p is None else round(p, 3)}; {v.rationale}"
                first[i] = v
        return first

    def answer_relevance(self, query: str, answer: str) -> tuple[float, str]:
        return self.verifier.answer_relevance(query, answer)

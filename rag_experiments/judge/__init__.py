"""Judges: claim decomposition, per-claim verdicts, answer relevance, and correctness helpers.

- :mod:`.claims`: the judge-independent parts (claim splitting, decline detection, the strict
  verdict parser, faithfulness / key-fact recall / correctness, the :class:`Judge` protocol);
- :mod:`.heuristic`: :class:`HeuristicJudge`, the deterministic offline default;
- :mod:`.verifier` / :mod:`.verifier_fit`: :class:`VerifierJudge`, a claim verifier trained here;
  :mod:`.cascade`: :class:`CascadeJudge`, the verifier with an LLM judge for uncertain claims;
- :mod:`.llm`: :class:`LLMJudge` (OpenAI-compatible endpoint) and :class:`LocalLLMJudge` (GGUF on the
  embedded llama.cpp server);
- :mod:`.cached`: any judge behind the stage cache (claims, verdicts and their token usage) and the
  claim-level diagnostics stage the pipeline runs after judging.

The public names are re-exported here, so ``rag_experiments.judge.HeuristicJudge`` (the
config ``_target_``s) and ``from rag_experiments.judge import Verdict`` keep working.
"""

from rag_experiments.core.types import Verdict
from rag_experiments.judge.cascade import CascadeJudge
from rag_experiments.judge.claims import (
    Judge,
    correctness,
    faithfulness,
    is_decline,
    key_fact_recall,
    normalise_text,
    parse_verdict,
    split_claims,
)
from rag_experiments.judge.heuristic import HeuristicJudge
from rag_experiments.judge.llm import (
    DECOMPOSE_USER,
    LOGPROB_FLOOR,
    QUESTIONS_USER,
    VERDICT_SCHEMA,
    VERDICT_SYSTEM,
    VERDICT_USER,
    LLMJudge,
    LocalLLMJudge,
    yes_no_score,
)
from rag_experiments.judge.verifier_judge import VerifierJudge

__all__ = [
    "DECOMPOSE_USER",
    "LOGPROB_FLOOR",
    "QUESTIONS_USER",
    "VERDICT_SCHEMA",
    "VERDICT_SYSTEM",
    "VERDICT_USER",
    "CascadeJudge",
    "HeuristicJudge",
    "Judge",
    "LLMJudge",
    "LocalLLMJudge",
    "Verdict",
    "VerifierJudge",
    "correctness",
    "faithfulness",
    "is_decline",
    "key_fact_recall",
    "normalise_text",
    "parse_verdict",
    "split_claims",
    "yes_no_score",
]

"""The judge behind the stage cache: claim lists, verdicts and their token usage, and the
claim-level diagnostics' verdicts (docs/metrics.md, "Judge tokens" and "Claim-level diagnostics").

Every result is committed as it arrives, keyed by (judge identity, text[, context]), with the
OpenAI-style usage of the call(s) that made it, so a killed run resumes with only the missing
calls and a resumed run reports the same judge tokens as an uninterrupted one. ``tally`` maps
each cache key a query needed to that usage: a query's judge tokens are the sum over its
distinct calls (``evaluation.cost.add_usage``).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from rag_experiments.core.cache import StageCache, stage_key
from rag_experiments.core.progress import track
from rag_experiments.core.types import Verdict
from rag_experiments.evaluation.cost import add_usage, usage_columns
from rag_experiments.evaluation.diagnostics import (
    DIAGNOSTICS,
    Diagnosis,
    diagnose,
    gold_claims,
    reference_text,
)
from rag_experiments.judge.claims import is_decline


@dataclass
class JudgedAnswer:
    """One answer as judged: its claims, their verdicts, answer relevance (score and method), the
    seconds it took, and ``usage``: cache key -> usage of every judge call it needed (the tally)."""

    claims: list[str]
    verdicts: list[Verdict]
    relevance: float
    method: str
    seconds: float
    usage: dict[str, dict | None]
    n_errors: int = 0  # split / relevance calls that failed on transport (verdicts carry their own)
    error: str = ""  # the first such call's error


def cached_claims(judge, text: str, cache: StageCache, calls: Counter, tally: dict) -> list[str]:
    """``judge.split(text)``, cached with the usage of the call(s) that made it (docs/metrics.md)."""
    ck = stage_key("claims", judge.identity, text)
    got = cache.get_json_many("claims", [ck])
    if ck in got:
        hit = got[ck]
        claims, usage = (hit, None) if isinstance(hit, list) else (hit["claims"], hit["usage"])
    else:
        claims = judge.split(text)
        usage = last_usage(judge)
        calls["claims"] += 1
        if last_error(judge):  # a fallback after a transport error: counted, retried next run
            calls["errors"] += 1
        else:
            cache.put_json_many("claims", {ck: {"claims": claims, "usage": usage}})
    tally[ck] = usage
    return claims


def last_usage(judge) -> dict | None:
    """Token usage of the judge's last split / answer_relevance call (None: no model or not reported)."""
    last = getattr(judge, "last_usage", None)
    return last() if callable(last) else None


def last_error(judge) -> str | None:
    """Transport error of the judge's last split / answer_relevance call (None: none, or a judge
    without model calls)."""
    last = getattr(judge, "last_error", None)
    return last() if callable(last) else None


def verdict_failures(verdicts: list[Verdict]) -> tuple[int, int]:
    """(unparseable replies, transport errors): a reply read but not understood is a model
    problem; a call that failed (``error`` set) is the endpoint's, counted in ``n_judge_errors``."""
    errors = sum(v.error is not None for v in verdicts)
    return sum(v.label == "unparseable" and v.error is None for v in verdicts), errors


def cached_verdicts(
    judge, claims: list[str], context: str, cache: StageCache, calls: Counter, tally: dict, counter: str
) -> list[Verdict]:
    """Verdicts per (judge identity, claim, context): only misses reach the judge; each is committed
    with its token usage, so a resumed run reports the tokens of an uninterrupted one."""
    vkeys = [stage_key("verdict", judge.identity, c, context) for c in claims]
    found = cache.get_json_many("verdicts", vkeys)
    missing = list(dict.fromkeys(c for c, k in zip(claims, vkeys, strict=True) if k not in found))
    if missing:
        fresh = judge.verdicts(missing, context)
        calls[counter] += len(missing)
        new = {stage_key("verdict", judge.identity, v.claim, context): asdict(v) for v in fresh}
        cache.put_json_many("verdicts", {k: v for k, v in new.items() if not v.get("error")})
        found.update(new)
    verdicts = [Verdict(**found[k]) for k in vkeys]
    tally.update((k, v.usage) for k, v in zip(vkeys, verdicts, strict=True))
    return verdicts


def cached_judgement(
    judge, answer: str, context: str, cache: StageCache, calls: Counter, tally: dict
) -> tuple[list[str], list[Verdict]]:
    """An answer's claims and their verdicts against ``context``: :func:`cached_claims` then
    :func:`cached_verdicts`, or for a folded judge (``judge.fold=true``) its one call
    (``fold_verdicts``) cached per (judge identity, answer, context) with that call's usage. A
    folded call that failed or whose reply was unread (counted in ``folded_unread``) is not cached
    and counts as a transport error: the answer's judging failed, the next run asks again."""
    if not getattr(judge, "fold", False):
        claims = cached_claims(judge, answer, cache, calls, tally)
        return claims, cached_verdicts(judge, claims, context, cache, calls, tally, "verdicts")
    fk = stage_key("folded", judge.identity, answer, context)
    got = cache.get_json_many("folded", [fk])
    if fk in got:
        claims, verdicts, usage = got[fk]["claims"], [Verdict(**v) for v in got[fk]["verdicts"]], got[fk]["usage"]
    else:
        claims, verdicts, unread = judge.fold_verdicts(answer, context)
        usage = last_usage(judge)
        calls["folded"] += 1
        calls["folded_unread"] += unread
        if last_error(judge):
            calls["errors"] += 1
        else:
            cache.put_json_many("folded", {fk: {"claims": claims, "verdicts": [asdict(v) for v in verdicts], "usage": usage}})
    tally[fk] = usage
    return claims, verdicts


def diagnostics_stage(
    judge, items, answers, chunk_lists, judged: list[JudgedAnswer | None], cache, min_coverage, progress=True
):
    """Claim-level diagnostics of every judged answer (evaluation.diagnostics.diagnose), every
    verdict through the stage cache. Adds each query's verdict usages to its judge tally, and its
    verdict calls that failed to its errors (the judge step's failed item: re-run retries it)."""
    calls: Counter = Counter()
    todo = [i for i, j in enumerate(judged) if j is not None]
    prepare = getattr(judge, "prepare", None)
    if prepare is not None and todo:  # one embedding batch for the heuristic judge
        golds = [items[i].gold_answer or "" for i in todo]
        texts = [c.text for i in todo for c in chunk_lists[i]] + [answers[i] for i in todo]
        prepare(golds, texts + [reference_text(items[i]) for i in todo], progress=progress,
                desc="diagnostics: embedding", cache=cache)  # fmt: skip
    out: list[Diagnosis | None] = [None] * len(items)
    for i in track(todo, "diagnostics", enabled=progress, unit="answers"):
        tally = judged[i].usage

        def verdicts(claims, context, tally=tally, j=judged[i]):
            out = cached_verdicts(judge, claims, context, cache, calls, tally, "diagnostic_verdicts")
            j.n_errors += verdict_failures(out)[1]  # a failed call (transport, budget): the answer's error
            return out

        gold = gold_claims(items[i], lambda text, t=tally: cached_claims(judge, text, cache, calls, t))
        out[i] = diagnose(
            items[i],
            answers[i],
            judged[i].claims,
            gold,
            chunk_lists[i],
            verdicts,
            declined=is_decline(answers[i]),
            min_coverage=min_coverage,
        )
    return out, calls


def diagnostic_columns(d: Diagnosis | None, tally: dict | None) -> dict[str, Any]:
    """Claim-level diagnostics (``d``: an ``evaluation.diagnostics.Diagnosis``, None: not judged)
    and the judge's token counts: the sum over the query's distinct judge calls, NaN when any of
    them reported no usage (the heuristic judge makes no model call: NaN, not 0)."""
    usage = add_usage(*tally.values()) if tally else None
    if d is None:
        return {**dict.fromkeys(DIAGNOSTICS, math.nan), **usage_columns(usage, "judge")}
    return {
        **d.values,
        "n_unparseable_diagnostics": d.n_unparseable,
        "diagnostics_nan_reason": dict(d.reasons),
        "gold_claims": list(d.gold_claims),
        "answer_claim_classes": list(d.answer_classes),
        **usage_columns(usage, "judge"),
    }

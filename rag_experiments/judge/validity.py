"""A judge measured on labelled pairs: build it by name, judge the pairs (cached), compute its card.

The figures are ``judge.card``'s; this module runs the judge. Each pair's verdict is cached
with the seconds it took (stage ``card_verdict``: judge identity, claim, context), committed every
few pairs, so a killed card loses only the verdicts in flight; the card itself is cached per
(judge identities, pairs digest, resamples, seed) (stage ``judge_card``), so every run of a sweep
with the same judge logs it without judging again. docs/judges.md, "Validity card".
"""

from __future__ import annotations

import hashlib
import logging
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from itertools import zip_longest
from pathlib import Path
from typing import Any

import yaml

from rag_experiments.core.build import build
from rag_experiments.core.cache import StageCache, stage_key
from rag_experiments.core.conf_groups import conf_dir, options
from rag_experiments.core.progress import Progress
from rag_experiments.evalset.corpus import corpus_digest
from rag_experiments.evalset.judge_pairs import JudgePair, JudgePairsError, load_pairs, pairs_digest
from rag_experiments.evalset.synthetic_pairs import synthetic_pairs
from rag_experiments.judge.card import UNPARSEABLE, card_line, card_metrics, judge_card, kappa_interval

log = logging.getLogger(__name__)

#: Keys of a judge config that are not constructor arguments (cost tables, the repeat count).
NON_ARGS = ("pricing", "repeats")
#: The intervals of a sequential card that stopped before its last pair. Stopping when the 95 %
#: interval is narrow enough under-covers: simulated (tests/test_judge_card.py), 0.905 at κ 0.56 and
#: 0.90 at κ 0.77 against 0.93-0.94 for a fixed n of the same size; at 97.5 % it is 0.93-0.94 again.
EARLY_STOP_CONFIDENCE = 0.975
_COMMIT_EVERY = 16  # verdicts per cache commit: a kill loses at most this many
#: The largest unparseable share of a card that is cached (``judge card --max-unparseable``): above
#: it the card says so and is measured again next time (a judge endpoint that answered garbage for
#: a while must not leave a κ of 0 beside every later run's faithfulness).
MAX_UNPARSEABLE = 0.2


class JudgeNameError(ValueError):
    """An unknown ``--judge`` name (the message lists the options)."""


def judge_names() -> list[str]:
    """The judges a user can name: ``conf/judge/*.yaml`` (``conf_groups.options``)."""
    return options("judge")


def judge_config(name: str, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """``conf/judge/NAME.yaml`` with ``key=value`` overrides (dotted keys for nested nodes, values
    read as YAML scalars: ``temperature=0.7`` is a float), as plain data. Interpolations into a
    run's config (``${corpus.path}``) stay as they are: outside a run nothing sets them
    (:func:`instantiate_judge` passes them as unset, ``judge card`` fills its place keys)."""
    path = conf_dir() / "judge" / f"{name}.yaml"
    if not path.is_file():
        raise JudgeNameError(f"unknown judge {name!r} (options: {', '.join(judge_names())})")
    cfg = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"judge override {item!r}: expected KEY=VALUE")
        try:
            value = yaml.safe_load(raw) if raw.strip() else raw
        except yaml.YAMLError as e:
            raise ValueError(f"judge override {item!r}: not a YAML value ({e})") from None
        node = cfg
        *parents, leaf = key.strip().split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"judge override {item!r}: {part!r} is not a node of conf/judge/{name}.yaml")
        node[leaf] = value
    return cfg


def instantiate_judge(cfg: Mapping[str, Any], **kwargs: Any):
    r"""The judge a judge config describes (without its :data:`NON_ARGS`); ``kwargs`` override keys.

    ``cfg`` is plain, resolved data: ``run.assemble`` resolves the run's judge node against the
    whole config (an escaped ``\${x}`` is then the literal text ``${x}`` and stays so), a standalone
    ``conf/judge/NAME.yaml`` goes through :func:`build_judge` (its interpolations unset)."""
    return build({k: v for k, v in cfg.items() if k not in NON_ARGS}, **kwargs)  # resolved once


def _unset_outside(node: Any) -> Any:
    """``${...}`` strings (interpolations into a config this judge is not part of) -> None."""
    if isinstance(node, Mapping):
        return {k: _unset_outside(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_unset_outside(v) for v in node]
    return None if isinstance(node, str) and node.startswith("${") else node


def build_judge(name: str, overrides: Sequence[str] = ()):
    """The one way to build a judge by name (``judge card``, ``scripts/judge_agreement.py``)."""
    return instantiate_judge(_unset_outside(judge_config(name, overrides)))


# ------------------------------------------------------------------------------ repeats


def is_stochastic(cfg: Mapping[str, Any]) -> bool:
    """A judge config whose verdicts can differ between calls: it samples (temperature > 0) and
    takes a seed. The heuristic judge (no temperature) and temperature 0 are deterministic."""
    temp = cfg.get("temperature")
    return "seed" in cfg and temp is not None and float(temp) > 0


def repeat_judges(
    cfg: Mapping[str, Any], repeats: int, build: Callable[..., Any] = instantiate_judge
) -> tuple[list, str | None]:
    """(the judges of repeats 2..N, a warning or None) for ``judge.repeats = N``.

    Repeat r (0-based) is the judge with ``seed = judge.seed + r``: its identity differs, so its
    verdicts are cached separately. A deterministic judge (:func:`is_stochastic` false) cannot
    give different verdicts: no extra judges and a warning instead of N× the calls.
    """
    repeats = int(repeats or 1)
    if repeats <= 1:
        return [], None
    if not is_stochastic(cfg):
        if cfg.get("temperature") is None or float(cfg.get("temperature")) <= 0:
            why = "deterministic: " + (
                "it has no temperature" if cfg.get("temperature") is None else "temperature is 0"
            )
        else:  # sampling, but one seed: every repeat would be the same cached call
            why = "it takes no seed, so repeats cannot be told apart"
        return [], (
            f"judge.repeats={repeats} ignored: this judge's repeats cannot differ ({why}); "
            "judging once (judge_flip_rate is not logged)"
        )
    seed = int(cfg.get("seed") or 0)
    return [build(cfg, seed=seed + r) for r in range(1, repeats)], None


def judge_with_repeats(cfg: Mapping[str, Any]) -> tuple[Any, list]:
    """(the run's judge, the judges of repeats 2..N) from a judge config (the run's assembly passes
    the resolved node as plain data, a DictConfig is read the same way); a deterministic judge with
    ``repeats > 1`` prints a warning on stderr and is asked once (:func:`repeat_judges`)."""
    import sys

    repeats, warning = repeat_judges(cfg, cfg.get("repeats", 1))
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    return instantiate_judge(cfg), repeats


# ------------------------------------------------------------------------------ pairs


def select_pairs(pairs: list[JudgePair], max_pairs: int | None) -> list[JudgePair]:
    """At most ``max_pairs`` pairs, interleaved by type so every type is represented; within a type
    in the order of sha256(id), so the choice depends on the pairs, not the file order."""
    if not max_pairs or len(pairs) <= max_pairs:
        return list(pairs)
    by_type: dict[str, list[JudgePair]] = {}
    for p in sorted(pairs, key=lambda p: hashlib.sha256(p.id.encode()).hexdigest()):
        by_type.setdefault(p.type, []).append(p)
    mixed = [p for row in zip_longest(*(by_type[t] for t in sorted(by_type))) for p in row if p]
    return mixed[:max_pairs]


def card_pairs(
    pairs_path: str | None, docs=None, seed: int = 0, n_max: int | None = None, cache: StageCache | None = None
) -> tuple[list[JudgePair], str]:
    """(pairs, source): human-labelled pairs from ``pairs_path`` (source ``file:<name>``), else
    synthetic pairs made from the corpus ``docs`` (``evalset.synthetic_pairs``, at most ``n_max``;
    source ``synthetic``), kept in ``cache`` per (corpus digest, seed, n_max) so a run whose card is
    cached does not make them again. Bad pairs files raise ``JudgePairsError``; a corpus too small
    for synthetic pairs raises its ``SyntheticPairsError`` (a ValueError naming the count and minimum)."""
    if pairs_path:
        return load_pairs(pairs_path), f"file:{Path(pairs_path).name}"
    docs = list(docs or [])
    key = stage_key("synthetic_pairs", corpus_digest(docs), seed, n_max) if cache is not None else ""
    hit = cache.get_json_many("synthetic_pairs", [key]) if cache is not None else {}
    if key in hit:
        return [JudgePair(**p) for p in hit[key]], "synthetic"
    pairs = synthetic_pairs(docs, seed=seed, n_max=n_max)
    if cache is not None:
        cache.put_json_many("synthetic_pairs", {key: [asdict(p) for p in pairs]})
    return pairs, "synthetic"


# ------------------------------------------------------------------------------ verdicts


def _is_model_judge(judge) -> bool:
    return getattr(judge, "model", None) is not None


def pair_verdicts(
    judge, pairs: Sequence[JudgePair], cache: StageCache, progress: bool = True, bar: Progress | None = None
) -> tuple[list[str], list[float], int]:
    """(labels, seconds, errors): the judge's label of each pair's claim against its context, the
    wall seconds of that verdict (one batched embedding pass of the heuristic judge is spread evenly
    over the pairs it served), and how many verdicts failed (a dead endpoint, a transport error).
    A failed verdict is ``unparseable``; neither it nor an unparseable reply is cached (a re-run
    asks again). ``bar``: the card's own progress line, moved per pair judged (else one of its own)."""
    keys = [stage_key("card_verdict", judge.identity, p.claim, p.context) for p in pairs]
    found = cache.get_json_many("card_verdict", keys)
    todo = [i for i, k in enumerate(keys) if k not in found]
    prep_s = 0.0
    own = bar is None  # else the card's line, opened by the caller, moved for cached pairs too
    prepare = getattr(judge, "prepare", None)
    if todo and prepare is not None:
        t0 = time.perf_counter()
        prepare([pairs[i].claim for i in todo], [pairs[i].context for i in todo], progress=progress and own,
                desc="judge card: embedding", cache=cache)  # fmt: skip
        prep_s = (time.perf_counter() - t0) / len(todo)
    fresh: dict[str, Any] = {}
    errors = 0
    if not own:
        bar.update(len(pairs) - len(todo))
    with Progress("judge card: verdicts", len(todo), progress and len(todo) > 20, unit="pairs") if own else nullcontext(bar) as shown:
        for i in todo:
            t0 = time.perf_counter()
            v, listed = card_verdict(judge, pairs[i].claim, pairs[i].context)
            row = {"label": v.label if not v.error else UNPARSEABLE, "seconds": time.perf_counter() - t0 + prep_s}
            row.update({} if listed is None else {"listed": listed})
            found[keys[i]] = row
            errors += bool(v.error)
            if row["label"] != UNPARSEABLE:
                fresh[keys[i]] = row
            if len(fresh) >= _COMMIT_EVERY:
                cache.put_json_many("card_verdict", fresh)
                fresh = {}
            shown.update()
    cache.put_json_many("card_verdict", fresh)
    resplit = sum(found[k].get("listed", 1) != 1 for k in keys)
    return [found[k]["label"] for k in keys], [float(found[k]["seconds"]) for k in keys], errors, resplit


def card_verdict(judge, claim: str, context: str):
    """(verdict, claims listed) of one card pair: the claim judged as the run judges an answer's
    claims. A folded judge (``judge.fold=true``) is asked its folded call with the claim as the
    answer (``fold_pair``): one claim is expected, and how many its reply listed is kept (the card's
    ``n_resplit``: pairs whose reply split the claim otherwise; supported only when every part is).
    Any other judge: its per-claim verdict, and None."""
    if getattr(judge, "fold", False):
        return judge.fold_pair(claim, context)
    return judge.verdicts([claim], context)[0], None


def unsound(card: Mapping[str, Any], max_unparseable: float = MAX_UNPARSEABLE) -> str | None:
    """Why a card is not a sound measurement of its judge (None: sound): verdicts that failed
    (``n_judge_errors`` > 0: the judge endpoint was down or erring), or an unparseable share above
    ``max_unparseable``. Such a card is shown with this reason and never cached."""
    errors, n = int(card.get("n_judge_errors", 0)), int(card["n"])
    rate = card["unparseable_rate"]["value"]
    if errors:
        return f"{errors} of {n} verdicts failed (judge errors, e.g. an unreachable endpoint)"
    if rate is not None and rate > max_unparseable:
        return f"unparseable share {rate:.3f} above the cached card's limit {max_unparseable:g}"
    return None


def stratified_order(pairs: Sequence[JudgePair]) -> list[JudgePair]:
    """``pairs`` in an order whose every prefix keeps the whole set's label mix (to within one
    pair): each next pair is of the label furthest below its share so far; within a label, the
    given order (:func:`select_pairs`: interleaved by type). A card stopped after any batch is
    then measured on the mix of positives and negatives it would have had on every pair."""
    by_label: dict[str, list[JudgePair]] = {}
    for p in pairs:
        by_label.setdefault(p.label, []).append(p)
    taken = dict.fromkeys(by_label, 0)
    out: list[JudgePair] = []
    for i in range(1, len(pairs) + 1):
        left = [lab for lab in sorted(by_label) if taken[lab] < len(by_label[lab])]
        lab = max(left, key=lambda x: len(by_label[x]) * i / len(pairs) - taken[x])
        out.append(by_label[lab][taken[lab]])
        taken[lab] += 1
    return out


def sequential_stop(
    n_pool: int, batch: int, target_width: float, look: Callable[[int], float]
) -> tuple[int, list[list], str]:
    """The sequential card's rule: look after every ``batch`` pairs (``look(n)``: judge the first
    n, return the width of their κ 95 % CI) and stop at the first n whose width is at most
    ``target_width``, else at ``n_pool``. Returns (n, each look's [n, width], why it stopped).
    The rule reads only the interval's width, never κ: its coverage is checked by simulation
    (tests/test_judge_card.py)."""
    looks: list[list] = []
    n, width = 0, math.nan
    while n < n_pool:
        n = min(n + max(1, int(batch)), n_pool)
        width = look(n)
        looks.append([n, None if math.isnan(width) else round(width, 4)])
        if width <= target_width:
            return n, looks, f"κ 95% CI width {width:.3f} ≤ target {target_width:g} at {n} pairs"
    wide = "undefined (too few labels in a class)" if math.isnan(width) else f"{width:.3f}"
    return n, looks, f"all {n} pairs judged (judge_card.max_pairs): κ 95% CI width {wide} > target {target_width:g}"


def sequential_verdicts(
    judge, pairs: Sequence[JudgePair], cache: StageCache, target_width: float, batch: int,
    n_resamples: int = 1000, seed: int = 0, progress: bool = True,
) -> tuple[list[JudgePair], list[str], list[float], int, int, dict[str, Any]]:  # fmt: skip
    """Judge ``pairs`` in batches (:func:`stratified_order`) until the card's κ interval
    (``judge.card.kappa_interval``: the same draws as the card's) is at most ``target_width``
    wide (:func:`sequential_stop`). Returns (the pairs judged, their labels, seconds, errors, the
    pairs a folded judge split otherwise (:func:`card_verdict`), the stop record: target, batch,
    pool size, each look's [n, width], and why it stopped)."""
    order = stratified_order(pairs)
    got: list[tuple[list[str], list[float], int, int]] = []
    with Progress("judge card", len(order), enabled=progress, unit="pairs") as bar:

        def look(n: int) -> float:
            done = sum(len(g[0]) for g in got)
            got.append(pair_verdicts(judge, order[done:n], cache, progress, bar))
            labels = [x for g in got for x in g[0]]
            used = order[:n]
            lo, hi = kappa_interval([p.label for p in used], labels, [p.group_key for p in used], n_resamples, seed)
            return hi - lo

        n, looks, why = sequential_stop(len(order), batch, target_width, look)
    stop = {"target_width": target_width, "batch": int(batch), "n_pool": len(order), "looks": looks, "why": why}
    labels = [x for g in got for x in g[0]]
    seconds = [x for g in got for x in g[1]]
    return order[:n], labels, seconds, sum(g[2] for g in got), sum(g[3] for g in got), stop


def validity_card(
    judge,
    pairs: Sequence[JudgePair],
    cache: StageCache,
    repeats: Sequence[Any] = (),
    n_resamples: int = 1000,
    seed: int = 0,
    progress: bool = True,
    max_unparseable: float = MAX_UNPARSEABLE,
    target_width: float | None = None,
    batch: int = 40,
) -> dict[str, Any]:
    """The judge's card on ``pairs`` (``judge.card.judge_card``) with ``judge`` (its
    identity), ``pairs_digest``, ``n_judge_errors``, ``cached`` and ``unsound`` (:func:`unsound`,
    None for a sound card); with ``repeats`` (the judges of repeats 2..N) the flip rate across all
    N. With ``target_width``, sequential (:func:`sequential_verdicts`): only as many pairs as the
    κ interval needs, ``n`` of them, and ``stop`` says why it stopped. Cached per (identities,
    pairs digest, n_resamples, seed[, target_width, batch]), only when sound."""
    digest = pairs_digest(list(pairs))
    idents = [judge.identity, *(j.identity for j in repeats)]
    seq = (float(target_width), int(batch)) if target_width else ()
    key = stage_key("judge_card", idents, digest, n_resamples, seed, *seq)
    hit = cache.get_json_many("judge_card", [key])
    if key in hit and unsound(hit[key], max_unparseable) is None:
        return {**hit[key], "cached": True, "unsound": None}
    stop = None
    if target_width:
        pairs, labels, seconds, errors, resplit, stop = sequential_verdicts(
            judge, pairs, cache, target_width, batch, n_resamples, seed, progress
        )
    else:
        labels, seconds, errors, resplit = pair_verdicts(judge, pairs, cache, progress)
    rep = None
    if repeats:
        more = [pair_verdicts(j, pairs, cache, progress) for j in repeats]
        rep = [labels] + [m[0] for m in more]
        errors += sum(m[2] for m in more)
    card = judge_card(
        [p.label for p in pairs],
        labels,
        [p.type for p in pairs],
        [p.group_key for p in pairs],
        seconds,
        repeat_preds=rep,
        n_resamples=n_resamples,
        seed=seed,
        confidence=EARLY_STOP_CONFIDENCE if stop and len(pairs) < stop["n_pool"] else 0.95,
    )
    card.update(judge=judge.identity, repeats=len(idents), pairs_digest=digest, n_judge_errors=errors)
    if getattr(judge, "fold", False):  # pairs whose folded reply listed other than the one claim
        card["n_resplit"] = resplit
    if stop is not None:
        card["stop"] = stop
        card["ci_method"] += (
            f"; sequential: batches of {stop['batch']} pairs until the κ 95 % CI is at most "
            f"{stop['target_width']:g} wide; a card stopped before its last pair reports "
            f"{100 * EARLY_STOP_CONFIDENCE:g} % intervals (the stopping rule's under-coverage, by simulation)"
        )
    why = unsound(card, max_unparseable)
    if why is None:
        cache.put_json_many("judge_card", {key: card})
    else:
        log.warning("judge card not cached: %s", why)
    return {**card, "cached": False, "unsound": why}


@dataclass(frozen=True)
class CardSettings:
    """The ``judge_card`` config block, typed (``conf/config.yaml``; docs/judges.md): ``pairs`` a
    judge_pairs JSONL with human labels (None: synthetic pairs from the corpus), ``max_pairs`` /
    ``max_pairs_model`` the caps for heuristic / model-calling judges, ``target_width`` the κ 95 %
    CI width at which the card stops judging (None or 0: every pair up to the cap), in batches of
    ``batch_pairs``."""

    enabled: bool = True
    pairs: str | None = None
    max_pairs: int | None = 200
    max_pairs_model: int | None = 40
    bootstrap_resamples: int = 1000
    seed: int = 0
    #: κ within ±0.1 (analysis.judge_trust.DEFAULT_HALF_WIDTH, the half-width the notes plan for)
    target_width: float | None = 0.2
    batch_pairs: int = 40

    @classmethod
    def of(cls, block: Mapping[str, Any] | None) -> CardSettings | None:
        """From the resolved ``judge_card`` block (None: no block, no card)."""
        if block is None:
            return None
        return cls(
            enabled=bool(block.get("enabled", True)),
            pairs=block.get("pairs") or None,
            max_pairs=block.get("max_pairs"),
            max_pairs_model=block.get("max_pairs_model"),
            bootstrap_resamples=int(block.get("bootstrap_resamples", 1000)),
            seed=int(block.get("seed", 0) or 0),
            target_width=block.get("target_width", cls.target_width),
            batch_pairs=int(block.get("batch_pairs", cls.batch_pairs)),
        )


def run_card(
    card: CardSettings | None, judge, repeats: Sequence[Any], docs, cache: StageCache, progress: bool = True
):
    """The card a run logs: ``(metrics, tags, card)`` from the run's :class:`CardSettings`;
    ``({}, {"judge_card_source": ...}, None)`` when disabled or without pairs."""
    if card is None or not card.enabled or judge is None:
        return {}, {"judge_card_source": "disabled"}, None
    seed = card.seed
    cap = card.max_pairs_model if _is_model_judge(judge) else card.max_pairs
    try:
        pairs, source = card_pairs(card.pairs, docs, seed=seed, n_max=cap, cache=cache)
    except ValueError as e:  # a corpus too small for synthetic pairs: the run goes on, said loudly
        if isinstance(e, JudgePairsError):
            raise
        print(f"warning: judge card skipped: {e}", file=sys.stderr)
        return {}, {"judge_card_source": f"none: {str(e)[:200]}"}, None
    if not pairs:
        print("warning: judge card skipped: judge_card.pairs is null and no synthetic pairs", file=sys.stderr)
        return {}, {"judge_card_source": source}, None
    chosen = select_pairs(pairs, cap)
    t0 = time.perf_counter()
    result = validity_card(judge, chosen, cache, repeats, card.bootstrap_resamples, seed, progress,
                           target_width=card.target_width, batch=card.batch_pairs)  # fmt: skip
    log.info("judge card: %d of %d pairs (%s) in %.1f s", result["n"], len(chosen), source, time.perf_counter() - t0)
    tags = {
        "judge_card_source": source,
        "judge_card_pairs_digest": result["pairs_digest"],
        "judge_card_ci": result["ci_method"],
        # "sound", or why not: a card measured while the judge failed is shown, never cached
        "judge_card_status": "sound" if result["unsound"] is None else f"not cached: {result['unsound']}"[:500],
    }
    if result.get("stop"):  # how many pairs the sequential card judged, and why it stopped there
        tags["judge_card_stop"] = result["stop"]["why"][:500]
    if result["unsound"]:
        print(f"warning: judge card not cached: {result['unsound']}", file=sys.stderr)
    return card_metrics(result), tags, result


def add_card(
    card_settings: CardSettings | None, stages, docs, cache: StageCache, res, progress: bool = True
) -> dict | None:
    """The run's judge card into its results (``PipelineResult``): ``judge_card/*`` metrics, the
    pairs' source and digest as tags, ``judge_card_s`` in the timings. ``stages``: the run's
    ``run_types.Stages``; ``docs``: its corpus (for synthetic pairs). Returns the card (None: no
    judge, card disabled or no pairs)."""
    if stages.judge is None:
        return None
    t = time.perf_counter()
    metrics, tags, card = run_card(card_settings, stages.judge, stages.judge_repeats, docs, cache, progress)
    res.aggregates.update(metrics)
    res.tags.update(tags)
    res.timings["judge_card_s"] = time.perf_counter() - t
    return None if card is None else {**card, "line": card_line(card, tags["judge_card_source"])}

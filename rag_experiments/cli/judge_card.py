"""``python -m rag_experiments.judge card``: a judge's validity card on labelled (claim, evidence) pairs.

    python -m rag_experiments.judge card --judge heuristic --pairs pairs.jsonl [--json]
    python -m rag_experiments.judge card --judge local --pairs pairs.jsonl --max-pairs 40 temperature=0.7 repeats=3

Prints Cohen's κ, balanced accuracy, accuracy, precision/recall of "supported", acceptance per pair
type, the unparseable rate, seconds per verdict and (with ``repeats=N`` on a stochastic judge) the
verdict flip rate, each with a 95 % cluster-bootstrap CI (docs/judges.md). ``--json``: one JSON
object (shape in docs/judges.md). Without ``--pairs``: synthetic pairs from ``--corpus`` (default
the bundled sample), when the synthetic-pairs module is installed. Exit 0 ok, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROWS = (
    ("kappa", "Cohen's κ (unparseable = 3rd class)"),
    ("balanced_accuracy", "balanced accuracy"),
    ("accuracy", "accuracy"),
    ("precision_supported", "precision of 'supported'"),
    ("recall_supported", "recall of 'supported'"),
    ("unparseable_rate", "unparseable rate"),
    ("seconds_per_verdict", "seconds per verdict"),
    ("flip_rate", "flip rate across repeats"),
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m rag_experiments.judge card",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--judge", required=True, metavar="NAME", help="a conf/judge/NAME.yaml (heuristic, local, ...)"
    )
    p.add_argument("--pairs", metavar="FILE", help="judge_pairs JSONL (id, claim, context, label, type)")
    p.add_argument("--corpus", metavar="DIR", help="corpus for synthetic pairs when --pairs is absent")
    p.add_argument("--max-pairs", type=int, metavar="N", help="at most N pairs, interleaved by type")
    p.add_argument(
        "--target-width", type=float, default=None, metavar="W",
        help="judge in batches of 40 until the kappa 95%% CI is at most W wide (a run's judge_card.target_width); "
        "default: every pair",
    )  # fmt: skip
    p.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (default 1000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--cache-dir", default=".cache/rag_experiments", help="the stage cache (verdicts, cards)")
    p.add_argument("--no-cache", action="store_true", help="judge every pair again")
    p.add_argument(
        "--max-unparseable", type=float, default=None, metavar="SHARE",
        help="the largest unparseable share of a card that is cached (default 0.2)",
    )  # fmt: skip
    p.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="judge config overrides, e.g. threshold=-1"
    )
    return p


def _cell(c: dict, nd: int = 3) -> str:
    v, (lo, hi) = c["value"], c["ci"]

    def f(x):
        return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"

    return f"{f(v)}  [{f(lo)}, {f(hi)}]"


def render(card: dict, name: str, source: str) -> str:
    """The card as a text table (value and 95 % CI per figure, then acceptance per pair type); a
    synthetic card says it is an optimistic bound (``analysis.judge_trust.card_title``)."""
    from rag_experiments.analysis.judge_trust import card_title

    lines = [
        f"judge card: {name}  ({card['n']} pairs in {card['n_groups']} claim groups, {card_title(source)}; "
        f"pairs digest {card['pairs_digest'][:12]})",
        f"judge identity {card['judge'][:200]}",
        f"{'figure':<38} value  [{100 * card.get('confidence', 0.95):g}% CI]",
    ]
    for key, label in ROWS:
        lines.append(f"{label:<38} {_cell(card[key], 4 if key == 'seconds_per_verdict' else 3)}")
    lines.append("acceptance (share judged supported) per pair type:")
    for ty, c in card["accept_by_type"].items():
        lines.append(f"  {ty:<36} {_cell(c)}")
    lines.append(f"CI: {card['ci_method']}")
    if card.get("stop"):
        lines.append(f"stopped: {card['stop']['why']} (of {card['stop']['n_pool']} pairs)")
    if "n_resplit" in card:
        lines.append(f"folded judge (judge.fold=true), each claim asked as an answer: {card['n_resplit']} of "
                     f"{card['n']} replies listed other than one claim (supported only if every part is)")  # fmt: skip
    if card.get("unsound"):
        lines.append(f"NOT A SOUND CARD (not cached, measured again next time): {card['unsound']}")
    return "\n".join(lines)


def _sample_docs(corpus_dir: str | None):
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from rag_experiments.core.conf_groups import conf_dir
    from rag_experiments.evalset.load import sample_dir

    if corpus_dir:
        from rag_experiments.evalset.corpus import Corpus

        return Corpus(path=corpus_dir).docs
    node = OmegaConf.load(conf_dir() / "corpus" / "sample.yaml")
    node.path = str(sample_dir() / "docs")
    return instantiate(node).docs


def _place_keys(cfg, corpus: str | None, cache_dir: str) -> None:
    """A verifier's (or a cascade's verifier's) ``${corpus.path}`` / ``${cache_dir}`` outside a run:
    the card's ``--corpus`` (default: the bundled sample, as ``judge fit``) and ``--cache-dir``."""
    from rag_experiments.evalset.load import sample_dir

    for node in (cfg, cfg.get("verifier")):
        if not isinstance(node, dict):
            continue
        for key, value in (("corpus_path", corpus or str(sample_dir() / "docs")), ("cache_dir", cache_dir)):
            if str(node.get(key, "")).startswith("${"):  # an interpolation into a run's config
                node[key] = value


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from rag_experiments.core.cache import StageCache
    from rag_experiments.judge.validity import (
        MAX_UNPARSEABLE,
        JudgeNameError,
        card_pairs,
        instantiate_judge,
        judge_config,
        repeat_judges,
        select_pairs,
        validity_card,
    )

    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        print(f"error: judge overrides must be KEY=VALUE (got {', '.join(bad)})", file=sys.stderr)
        return 2
    try:
        cfg = judge_config(args.judge, args.overrides)
        docs = None if args.pairs else _sample_docs(args.corpus)
        pairs, source = card_pairs(args.pairs, docs, args.seed, n_max=args.max_pairs)
    except (JudgeNameError, ValueError) as e:  # JudgePairsError FILE:LINE, or a corpus too small
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not pairs:
        print("error: no pairs: give --pairs FILE (judge_pairs format; docs/judges.md)", file=sys.stderr)
        return 2
    pairs = select_pairs(pairs, args.max_pairs)
    _place_keys(cfg, args.corpus, args.cache_dir)
    try:
        judge = instantiate_judge(cfg)
    except Exception as e:  # noqa: BLE001 - hydra wraps the judge's own error (a missing verifier ...)
        from rag_experiments.judge.verifier import VerifierError

        cause = e.__cause__ or e
        if not isinstance(cause, VerifierError):
            raise
        print(f"error: {cause}", file=sys.stderr)
        return 2
    repeats, warning = repeat_judges(cfg, int(cfg.get("repeats", 1) or 1))
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    cache = StageCache(args.cache_dir, enabled=not args.no_cache)
    limit = MAX_UNPARSEABLE if args.max_unparseable is None else args.max_unparseable
    card = validity_card(judge, pairs, cache, repeats, args.resamples, args.seed, not args.json, limit,
                         target_width=args.target_width)  # fmt: skip
    card["source"] = source
    if card["unsound"]:
        print(f"warning: judge card not cached: {card['unsound']}", file=sys.stderr)
    if args.json:
        print(json.dumps(card, allow_nan=True))
    else:
        print(render(card, args.judge, source))
    return 0

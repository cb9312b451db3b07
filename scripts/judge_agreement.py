"""Agreement of a faithfulness judge with human labels: a thin wrapper over ``judge card``, plus the
heuristic judge's calibration.

    python scripts/judge_agreement.py --pairs PATH [--judge NAME] [--split test|calib|all] [--limit N]
                                      [--json] [key=value judge overrides ...]
    python scripts/judge_agreement.py --pairs PATH --calibrate [ENTITY_THRESHOLD]

The agreement table is the validity card (``python -m rag_experiments.judge card``; one home:
``rag_experiments.judge.card``), here on a split of the pairs. Splits: a pair is in
``calib`` when sha256(id) is even, else in ``test``; the heuristic thresholds were fitted on
``calib`` only (``--calibrate``, a grid search maximising κ) and are reported on ``test``.
``--pairs`` defaults to $JUDGE_PAIRS.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from rag_experiments.evalset.judge_pairs import JudgePair, JudgePairsError, load_pairs  # noqa: E402
from rag_experiments.judge.agreement import cohen_kappa  # noqa: E402  (one definition of κ)
from rag_experiments.judge.card import point_figures  # noqa: E402


def split_of(pair_id: str) -> str:
    return "calib" if hashlib.sha256(pair_id.encode()).digest()[-1] % 2 == 0 else "test"


def split_pairs(pairs: list[JudgePair], split: str) -> list[JudgePair]:
    return pairs if split == "all" else [p for p in pairs if split_of(p.id) == split]


def _write(pairs: list[JudgePair], path: Path) -> None:
    import json

    with open(path, "w", encoding="utf-8") as f:
        for p in pairs:
            row = {"id": p.id, "claim": p.claim, "context": p.context, "label": p.label, "type": p.type}
            f.write(json.dumps({**row, "group": p.group, "source": p.source}) + "\n")


def calibrate(pairs: list[JudgePair], pin_entity: float | None) -> None:
    """Grid-search HeuristicJudge thresholds maximising κ on the calib half; report on both halves."""
    from rag_experiments.judge import HeuristicJudge

    judge = HeuristicJudge()
    t0 = time.perf_counter()
    feats = [judge.features([p.claim], p.context)[0] for p in pairs]
    print(f"features for {len(pairs)} pairs in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    calib = [i for i, p in enumerate(pairs) if split_of(p.id) == "calib"]
    test = [i for i, p in enumerate(pairs) if split_of(p.id) == "test"]
    grid = list(
        itertools.product(
            [round(0.30 + 0.04 * i, 2) for i in range(13)],  # sim 0.30..0.78
            [round(0.1 * i, 1) for i in range(8)],  # coverage 0..0.7
        )
    )
    gold = [pairs[i].label for i in calib]
    best_by_ent = {}
    for ent in (0.0, 0.5, 1.0):  # entity coverage: reported separately, it is a domain choice
        for sim, cov in grid:
            j = HeuristicJudge(sim, cov, ent, True, embedder=judge.embedder)
            k = cohen_kappa(gold, [j.decide(feats[i])[0] for i in calib])
            if ent not in best_by_ent or k > best_by_ent[ent][0] + 1e-12:
                best_by_ent[ent] = (k, sim, cov, ent)
        k, sim, cov, _ = best_by_ent[ent]
        print(f"best on calib for entity_threshold={ent}: kappa={k:.3f} sim={sim} coverage={cov}")
    k, sim, cov, ent = best_by_ent[pin_entity] if pin_entity is not None else max(best_by_ent.values())
    print(
        f"chosen (n={len(calib)}): kappa={k:.3f} sim_threshold={sim} coverage_threshold={cov} entity_threshold={ent}"
    )
    j = HeuristicJudge(sim, cov, ent, True, embedder=judge.embedder)
    for name, idx in (("calib", calib), ("test", test)):
        figs = point_figures([pairs[i].label for i in idx], [j.decide(feats[i])[0] for i in idx])
        print(f"{name}: " + ", ".join(f"{k_} {v:.3f}" for k_, v in figs.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--judge", default="heuristic", help="a conf/judge/NAME.yaml")
    ap.add_argument("--pairs", type=Path, default=os.environ.get("JUDGE_PAIRS"), help="default $JUDGE_PAIRS")
    ap.add_argument("--limit", type=int, default=None, help="at most N pairs, interleaved by type")
    ap.add_argument("--split", choices=("test", "calib", "all"), default="test")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--calibrate", nargs="?", const="auto", help="fit heuristic thresholds on the calib half")
    ap.add_argument("overrides", nargs="*", help="judge overrides, e.g. threshold=-1.5")
    args = ap.parse_args(argv)
    if not args.pairs:
        print("error: give --pairs FILE (or set JUDGE_PAIRS)", file=sys.stderr)
        return 2
    try:
        pairs = load_pairs(args.pairs)
    except JudgePairsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.calibrate:
        calibrate(pairs, None if args.calibrate == "auto" else float(args.calibrate))
        return 0
    from rag_experiments.cli.judge_card import main as card

    with tempfile.TemporaryDirectory() as tmp:
        part = Path(tmp) / f"{args.split}.jsonl"
        _write(split_pairs(pairs, args.split), part)
        extra = (["--max-pairs", str(args.limit)] if args.limit else []) + (["--json"] if args.json else [])
        return card(["--judge", args.judge, "--pairs", str(part), *extra, *args.overrides])


if __name__ == "__main__":
    sys.exit(main())

"""Agreement of a faithfulness judge with human labels on (claim, context, label) pairs.

    python scripts/judge_agreement.py [--judge heuristic|openai|local] [--pairs PATH] [--limit N]
                                      [--split test|calib|all] [key=value judge overrides ...]
    python scripts/judge_agreement.py --calibrate      # re-fit the heuristic thresholds

Prints accuracy, Cohen's kappa, precision/recall of ``supported``, unparseable rate and seconds per
verdict, overall and per pair ``type`` (for a type with a single gold label, kappa is undefined and
the "accept" column - the share judged supported - is the figure to read). An unparseable verdict
counts as a disagreement in accuracy and kappa (it is a third predicted class), so a judge cannot
look better by refusing to answer.

Splits: a pair is in ``calib`` when sha256(id) is even, else in ``test``. Heuristic thresholds are
fitted on ``calib`` only (``--calibrate``) and reported on ``test``.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from rag_experiments.analysis.agreement import cohen_kappa  # noqa: E402  (one definition of κ)

DEFAULT_PAIRS = Path(os.environ.get("JUDGE_PAIRS", ROOT.parent / "shared/datasets/judge_pairs/pairs.jsonl"))
LABELS = ("supported", "unsupported", "unparseable")


def split_of(pair_id: str) -> str:
    return "calib" if hashlib.sha256(pair_id.encode()).digest()[-1] % 2 == 0 else "test"


def load_pairs(path: Path, split: str = "all", limit: int | None = None) -> list[dict]:
    pairs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if split != "all":
        pairs = [p for p in pairs if split_of(p["id"]) == split]
    if limit:
        # a stratified prefix: interleave types so a small limit still covers each of them
        by_type: dict[str, list[dict]] = defaultdict(list)
        for p in pairs:
            by_type[p.get("type", "all")].append(p)
        inter = [p for group in itertools.zip_longest(*by_type.values()) for p in group if p]
        pairs = sorted(inter[:limit], key=lambda p: p["id"])
    return pairs


def agreement(gold: list[str], pred: list[str]) -> dict:
    n = len(gold)
    tp = sum(g == "supported" and p == "supported" for g, p in zip(gold, pred, strict=True))
    n_pred_sup = sum(p == "supported" for p in pred)
    n_gold_sup = sum(g == "supported" for g in gold)
    return {
        "n": n,
        "accuracy": sum(g == p for g, p in zip(gold, pred, strict=True)) / n if n else float("nan"),
        "kappa": cohen_kappa(gold, pred) if len(set(gold)) > 1 else float("nan"),
        "precision": tp / n_pred_sup if n_pred_sup else float("nan"),
        "recall": tp / n_gold_sup if n_gold_sup else float("nan"),
        "accept": n_pred_sup / n if n else float("nan"),
        "unparseable": sum(p == "unparseable" for p in pred) / n if n else float("nan"),
    }


def _fmt(x: float) -> str:
    return "  —  " if x != x else f"{x:5.3f}"


def print_table(rows: dict[str, dict], sec_per_verdict: float) -> None:
    head = f"{'slice':<28} {'n':>4} {'acc':>6} {'kappa':>6} {'P(sup)':>6} {'R(sup)':>6} {'accept':>6} {'unpars':>6}"
    print(head)
    print("-" * len(head))
    for name, m in rows.items():
        print(
            f"{name:<28} {m['n']:>4} {_fmt(m['accuracy']):>6} {_fmt(m['kappa']):>6} {_fmt(m['precision']):>6}"
            f" {_fmt(m['recall']):>6} {_fmt(m['accept']):>6} {_fmt(m['unparseable']):>6}"
        )
    print(f"seconds per verdict: {sec_per_verdict:.4f}")


def build_judge(name: str, overrides: list[str]):
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(ROOT / "rag_experiments" / "conf" / "judge" / f"{name}.yaml")
    if overrides:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))
    return instantiate(cfg)


def run(judge, pairs: list[dict]) -> tuple[list[str], float]:
    preds = []
    t0 = time.perf_counter()
    for i, p in enumerate(pairs, 1):
        v = judge.verdicts([p["claim"]], p["context"])[0]
        preds.append(v.label)
        p["_score"] = v.score
        if i % 50 == 0:
            print(f"  {i}/{len(pairs)} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return preds, (time.perf_counter() - t0) / max(1, len(pairs))


def report(pairs: list[dict], preds: list[str], spv: float) -> dict[str, dict]:
    gold = [p["label"] for p in pairs]
    rows = {"overall": agreement(gold, preds)}
    for t in sorted({p.get("type", "?") for p in pairs}):
        idx = [i for i, p in enumerate(pairs) if p.get("type", "?") == t]
        rows[t] = agreement([gold[i] for i in idx], [preds[i] for i in idx])
    print_table(rows, spv)
    return rows


def calibrate(pairs_path: Path) -> None:
    """Grid-search HeuristicJudge thresholds maximising kappa on the calib half; report on test."""
    from rag_experiments.stages.judging import HeuristicJudge

    judge = HeuristicJudge()
    all_pairs = load_pairs(pairs_path)
    t0 = time.perf_counter()
    feats = [judge.features([p["claim"]], p["context"])[0] for p in all_pairs]
    print(f"features for {len(all_pairs)} pairs in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    calib = [i for i, p in enumerate(all_pairs) if split_of(p["id"]) == "calib"]
    test = [i for i, p in enumerate(all_pairs) if split_of(p["id"]) == "test"]
    grid = list(
        itertools.product(
            [round(0.30 + 0.04 * i, 2) for i in range(13)],  # sim 0.30..0.78
            [round(0.1 * i, 1) for i in range(8)],  # coverage 0..0.7
        )
    )
    gold = [all_pairs[i]["label"] for i in calib]
    best_by_ent = {}
    for ent in (0.0, 0.5, 1.0):  # entity coverage: reported separately, it is a domain choice
        for sim, cov in grid:
            j = HeuristicJudge(sim, cov, ent, True, embedder=judge.embedder)
            k = cohen_kappa(gold, [j.decide(feats[i])[0] for i in calib])
            if ent not in best_by_ent or k > best_by_ent[ent][0] + 1e-12:
                best_by_ent[ent] = (k, sim, cov, ent, True)
        print(
            f"best on calib for entity_threshold={ent}: kappa={best_by_ent[ent][0]:.3f} "
            f"sim={best_by_ent[ent][1]} coverage={best_by_ent[ent][2]}"
        )
    best = max(best_by_ent.values(), key=lambda b: b[0])
    if len(sys.argv) > 2:  # --calibrate ENTITY_THRESHOLD pins the entity check
        best = best_by_ent[float(sys.argv[2])]
    k, sim, cov, ent, pol = best
    print(
        f"chosen (n={len(calib)}): kappa={k:.3f} sim_threshold={sim} coverage_threshold={cov} "
        f"entity_threshold={ent} check_polarity={pol}"
    )
    j = HeuristicJudge(sim, cov, ent, pol, embedder=judge.embedder)
    for name, idx in (("calib", calib), ("test", test)):
        print(f"\n== {name} ==")
        report([all_pairs[i] for i in idx], [j.decide(feats[i])[0] for i in idx], float("nan"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--judge", default="heuristic", help="a conf/judge/*.yaml name (heuristic, openai, local)"
    )
    ap.add_argument("--pairs", type=Path, default=DEFAULT_PAIRS)
    ap.add_argument("--limit", type=int, default=None, help="first N pairs (interleaved by type)")
    ap.add_argument("--split", choices=("test", "calib", "all"), default="all")
    ap.add_argument("--save", type=Path, default=None, help="write per-pair predictions (JSONL)")
    ap.add_argument("--calibrate", action="store_true", help="fit heuristic thresholds on the calib half")
    ap.add_argument("overrides", nargs="*", help="judge overrides, e.g. threshold=-1.5 model_path=/x.gguf")
    args = ap.parse_args(argv)
    if not args.pairs.is_file():
        print(f"pairs file not found: {args.pairs}", file=sys.stderr)
        return 2
    if args.calibrate:
        calibrate(args.pairs)
        return 0
    pairs = load_pairs(args.pairs, args.split, args.limit)
    judge = build_judge(args.judge, args.overrides)
    print(f"judge={args.judge} split={args.split} pairs={len(pairs)}\nidentity={judge.identity}")
    preds, spv = run(judge, pairs)
    report(pairs, preds, spv)
    if args.split == "all":
        test = [i for i, p in enumerate(pairs) if split_of(p["id"]) == "test"]
        if test and len(test) < len(pairs):
            print("\n-- test half only (pairs not used for calibration) --")
            report([pairs[i] for i in test], [preds[i] for i in test], spv)
    if args.save:
        with open(args.save, "w") as f:
            for p, label in zip(pairs, preds, strict=True):
                f.write(
                    json.dumps(
                        {
                            "id": p["id"],
                            "type": p.get("type"),
                            "label": p["label"],
                            "pred": label,
                            "score": p.get("_score"),
                        }
                    )
                    + "\n"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The heuristic judge, the trained verifier and the cascade, side by side on judge_pairs.

    python scripts/bench_verifier.py [--pairs FILE] [--cascade-n 80] [--speed-n 150] [--rounds 3]
        [--threads N] [--speed-only] [--no-fit-time] [--json OUT]

Prints (measured, never asserted), every figure on pairs the model was not fitted to:
- heuristic (thresholds calibrated on half of these pairs: its figure is optimistic);
- verifier, feature-logistic, grouped 5-fold CV by claim (no claim in two folds), for both feature
  versions side by side: the two-pass reference (v2: sentence-transformers windows + a token pass
  over whole contexts) and the one shared token pass (v3, the default);
- verifier trained on synthetic pairs of the bundled sample only, evaluated on all pairs (the
  honest figure for a new user's corpus with no labels);
- how close v3's window vectors (mean of its sentences' token vectors) are to encoding the window;
- verdicts/s of heuristic and both verifiers on the same pairs, cold (embeddings not memoised), as
  ratios in this run (the machine is shared: absolute rates depend on its load): one claim per
  call, batched, and batched with 4 claims per context (as an answer's claims share one in a run;
  alternating rounds, median, with CPU-seconds per verdict);
- the cascade over band widths: verifier (out-of-fold P) + the packaged SmolLM2 judge for claims
  inside the band, on a type-stratified subset (LLM verdicts computed once per pair, combined per
  band): LLM calls saved vs agreement;
- the wall time of ``python -m rag_experiments.judge fit --labels PAIRS`` (bundled sample + pairs).
Reads the judge_pairs file given by --pairs (default $JUDGE_PAIRS); skips (exit 0) when absent.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import yaml  # noqa: E402

from rag_experiments.evalset.corpus import load_corpus  # noqa: E402
from rag_experiments.evalset.judge_pairs import load_pairs  # noqa: E402
from rag_experiments.evalset.load import sample_dir  # noqa: E402
from rag_experiments.evalset.synthetic_pairs import synthetic_pairs  # noqa: E402
from rag_experiments.judge import alignment, token_pass  # noqa: E402
from rag_experiments.judge import heuristic as heur  # noqa: E402
from rag_experiments.judge.verifier import (  # noqa: E402
    FEATURES,
    FeatureExtractor,
    fit_logistic,
    predict_logistic,
)
from rag_experiments.judge.verifier_eval import cross_validated, figures_with_ci  # noqa: E402
from rag_experiments.stages.text import sentence_texts  # noqa: E402

PAIRS = Path(os.environ.get("JUDGE_PAIRS", "judge_pairs/pairs.jsonl"))  # a judge_pairs JSONL file
QUICK = False  # --speed-only


def row(name, pairs, pred, idx=None):
    idx = np.arange(len(pairs)) if idx is None else idx
    sub = [pairs[i] for i in idx]
    f = figures_with_ci([p.label for p in sub], np.asarray(pred)[idx] if len(pred) == len(pairs) else pred,
                        [p.group_key for p in sub], [p.type for p in sub], n_resamples=1000)
    ci = f["ci"]
    acc_c = f["accept_by_type"].get("contradict_evidence", float("nan"))
    cc = ci.get("accept/contradict_evidence", (float("nan"),) * 2)
    print(f"{name:<46} n={f['n']:<4} kappa {f['kappa']:.3f} [{ci['kappa'][0]:.3f}, {ci['kappa'][1]:.3f}]  "
          f"bal.acc {f['balanced_accuracy']:.3f} [{ci['balanced_accuracy'][0]:.3f}, {ci['balanced_accuracy'][1]:.3f}]  "
          f"contradictions accepted {acc_c:.3f} [{cc[0]:.3f}, {cc[1]:.3f}]", flush=True)
    return f


def labels(p, th=0.5):
    return np.where(np.asarray(p) >= th, "supported", "unsupported")


def heuristic_judge():
    cfg = yaml.safe_load((ROOT / "rag_experiments/conf/judge/heuristic.yaml").read_text())
    cfg.pop("_target_")
    cfg.pop("repeats", None)  # a run-level setting, not the judge's
    return heur.HeuristicJudge(**cfg)


def _cold():
    heur._VEC_MEMO.clear()
    token_pass._MEMO.clear()
    token_pass._MEMO_SIZE.clear()


def speed(pairs, n, h, judges):
    """Cold verdicts/s of the heuristic and each verifier on the same n pairs (memos cleared before
    each): one claim per call, and batched as in a run (one ``prepare`` for all pairs, then verdicts)."""
    sub = pairs[:n]
    claims, ctxs = [p.claim for p in sub], [p.context for p in sub]
    out = {}
    for mode in ("one_by_one", "batched"):
        _cold()
        t0 = time.perf_counter()
        if mode == "batched":
            h.prepare(claims, ctxs)
        for p in sub:
            h.verdicts([p.claim], p.context)
        out[mode] = {"heuristic": n / (time.perf_counter() - t0)}
        for name, (fx, model) in judges.items():
            _cold()
            t0 = time.perf_counter()
            if mode == "batched":
                predict_logistic(model, fx.matrix(claims, ctxs))
            else:
                for p in sub:
                    predict_logistic(model, fx.matrix([p.claim], [p.context]))
            out[mode][name] = n / (time.perf_counter() - t0)
    return out


def window_approximation(pairs, fx):
    """Cosine of each 2-sentence window's one-pass vector (mean of its sentences' token vectors)
    with sentence-transformers' encoding of the window as one text, over the pairs' contexts."""
    got, want = [], []
    for ctx in dict.fromkeys(p.context for p in pairs):
        sents = sentence_texts(ctx)
        enc = dict(zip(sents, fx.aligner.passes.encode(sents), strict=True))
        for a, b in zip(sents, sents[1:], strict=False):
            got.append(token_pass.window_embedding([enc[a], enc[b]]))
            want.append(f"{a} {b}")
    cos = (np.stack(got) * fx.aligner.embedder.encode(want)).sum(1)
    return {"n_windows": len(cos), "mean": float(cos.mean()), "p05": float(np.quantile(cos, 0.05)),
            "min": float(cos.min())}


def speed_shared_context(pairs, h, judges, n_ctx=75, per_ctx=4, rounds=3):
    """Cold, batched verdicts/s when an answer's claims share one context (as in a run): n_ctx
    contexts of judge_pairs, each judged against per_ctx claims; wall and per CPU-second (process
    time: all threads of this process). ``judges``: name -> (FeatureExtractor, model). The judges
    run in turn, ``rounds`` times (so load drifts hit all alike); the median round is reported."""
    ctxs = list(dict.fromkeys(p.context for p in pairs))[:n_ctx]
    claims = [pairs[(i * per_ctx + j) % len(pairs)].claim for i in range(len(ctxs)) for j in range(per_ctx)]
    contexts = [c for c in ctxs for _ in range(per_ctx)]
    times: dict[str, list[tuple[float, float]]] = {}
    for _ in range(rounds):
        for name in ("heuristic", *judges):
            _cold()
            t0, c0 = time.perf_counter(), time.process_time()
            if name == "heuristic":
                h.prepare(claims, ctxs)
                for i, c in enumerate(ctxs):
                    h.verdicts(claims[i * per_ctx : (i + 1) * per_ctx], c)
            else:
                fx, model = judges[name]
                predict_logistic(model, fx.matrix(claims, contexts))
            times.setdefault(name, []).append((time.perf_counter() - t0, time.process_time() - c0))
    out = {}
    for name, t in times.items():
        wall, cpu = sorted(t)[len(t) // 2]
        out[name] = {"verdicts_s": len(claims) / wall, "verdicts_per_cpu_s": len(claims) / cpu,
                     "cpu_s_per_verdict": cpu / len(claims), "wall_rounds": [round(w, 2) for w, _ in t]}
    return out


def quality(pairs, syn, X, Xs, y, ys, groups):
    """Grouped 5-fold CV rows (all features, checks only) and synthetic-only rows for one X."""
    out = {}
    if QUICK:
        return out, np.full(len(pairs), 0.5)

    def cv(cols):
        def fit(tr):
            m = fit_logistic(X[tr][:, cols], y[tr])
            return lambda te: predict_logistic(m, X[te][:, cols])

        return cross_validated(fit, len(pairs), groups, k=5, seed=0)

    every = list(range(X.shape[1]))
    ck = [i for i, f in enumerate(FEATURES) if f not in alignment.ALIGN_FEATURES]
    oof = cv(every)
    out["cv"] = row("verifier (features), grouped 5-fold CV", pairs, labels(oof))
    out["cv_checks_only"] = row("  ... checks only (no soft alignment)", pairs, labels(cv(ck)))
    out["synthetic_only"] = row(f"verifier (features), synthetic only ({len(syn)})", pairs,
                                labels(predict_logistic(fit_logistic(Xs, ys), X)))
    keep = np.array([p.type not in ("paraphrase", "same_doc") for p in syn])
    out["synthetic_only_no_paraphrase"] = row("  ... without paraphrase / same_doc pairs", pairs,
                                              labels(predict_logistic(fit_logistic(Xs[keep], ys[keep]), X)))
    out["synthetic_only_checks_only"] = row("  ... checks only (no soft alignment)", pairs,
                                            labels(predict_logistic(fit_logistic(Xs[:, ck], ys), X[:, ck])))
    return out, oof


def cascade_table(pairs, oof, n, seed=0):
    from rag_experiments.judge import LocalLLMJudge

    rng = np.random.default_rng(seed)
    by_type: dict[str, list[int]] = {}
    for i, p in enumerate(pairs):
        by_type.setdefault(p.type, []).append(i)
    idx = np.sort(np.concatenate([rng.choice(v, max(1, round(n * len(v) / len(pairs))), replace=False)
                                  for v in by_type.values()]))
    llm = LocalLLMJudge(decompose=False, max_tokens=8, n_parallel=1, n_threads=2)
    t0 = time.perf_counter()
    llm_v = [llm.verdicts([pairs[i].claim], pairs[i].context)[0] for i in idx]
    spv = (time.perf_counter() - t0) / len(idx)
    llm_lab = np.array([v.label for v in llm_v], dtype=object)
    print(f"\ncascade on {len(idx)} pairs (type-stratified); SmolLM2 {spv:.1f} s/verdict under load; "
          f"{int((llm_lab == 'unparseable').sum())} unparseable LLM replies")
    out = []
    for lo, hi in ((0.5, 0.5), (0.45, 0.55), (0.4, 0.6), (0.3, 0.7), (0.2, 0.8), (0.0, 1.0)):
        p = oof[idx]
        esc = (p >= lo) & (p <= hi) if hi > lo else np.zeros(len(idx), bool)
        pred = np.where(esc, llm_lab, labels(p))
        f = row(f"  band [{lo:.2f}, {hi:.2f}]: LLM calls {esc.mean():.0%}", pairs, pred, idx)
        out.append({"band": [lo, hi], "llm_share": float(esc.mean()), **f})
    return out, len(idx), spv


def fit_time(pairs_path: Path) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "rag_experiments.judge", "fit", "--labels", str(pairs_path.resolve()),
                        "--cache-dir", tmp, "--no-mlflow", "--no-progress"], check=True, cwd=tmp,
                       capture_output=True)
        return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=Path, default=PAIRS)
    ap.add_argument("--cascade-n", type=int, default=80)
    ap.add_argument("--speed-n", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=3, help="alternating timing rounds (median reported)")
    ap.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's, one per core)")
    ap.add_argument("--speed-only", action="store_true", help="skip the CV and synthetic-only cards")
    ap.add_argument("--no-fit-time", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if not args.pairs.is_file():
        print(f"skipped: {args.pairs} not found")
        return 0
    pairs = load_pairs(args.pairs)
    global QUICK
    QUICK = args.speed_only
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    print(f"{len(pairs)} pairs; load average {os.getloadavg()[0]:.1f} on 2 shared cores", flush=True)
    groups = [p.group_key for p in pairs]
    y = np.array([p.label == "supported" for p in pairs], float)
    h = heuristic_judge()
    res: dict = {}
    h.prepare([p.claim for p in pairs], [p.context for p in pairs])
    if not QUICK:
        res["heuristic"] = row("heuristic (calibrated on half of these)", pairs,
                               [h.verdicts([p.claim], p.context)[0].label for p in pairs])
    syn = [] if QUICK else synthetic_pairs(load_corpus(sample_dir() / "docs"), n_max=1500)
    ys = np.array([p.label == "supported" for p in syn], float)
    judges, oof = {}, None
    for name, one_pass in (("two-pass (features v2)", False), ("one-pass (features v3)", True)):
        fx = FeatureExtractor(h.embedder, one_pass=one_pass)
        print(f"\n-- verifier, {name}", flush=True)
        X = fx.matrix([p.claim for p in pairs], [p.context for p in pairs])
        Xs = fx.matrix([p.claim for p in syn], [p.context for p in syn])
        res[name], o = quality(pairs, syn, X, Xs, y, ys, groups)
        oof = o if one_pass else oof
        judges[name] = (fx, fit_logistic(X, y))
    if token_pass.bf16_supported():  # the one-pass verifier with its MiniLM pass in bfloat16
        fx16 = FeatureExtractor(h.embedder, precision="bfloat16")
        X16 = fx16.matrix([p.claim for p in pairs], [p.context for p in pairs])
        X = fx.matrix([p.claim for p in pairs], [p.context for p in pairs])
        print(f"\n-- one-pass, bfloat16: max |feature difference| to float32 {np.abs(X16 - X).max():.4f}")
        res["one-pass bfloat16"], _ = quality(pairs, syn, X16, fx16.matrix([p.claim for p in syn], [p.context for p in syn]),
                                             y, ys, groups)
        judges["one-pass bfloat16"] = (fx16, fit_logistic(X16, y))
    res["window_approximation"] = wa = window_approximation(pairs, judges["one-pass (features v3)"][0])
    print(f"\none-pass window vector vs the window encoded as one text: cosine mean {wa['mean']:.3f}, "
          f"5th percentile {wa['p05']:.3f}, min {wa['min']:.3f} ({wa['n_windows']} windows)", flush=True)
    res["speed"] = sp = speed(pairs, args.speed_n, h, judges)
    res["speed"]["load"] = os.getloadavg()[0]
    for mode in ("one_by_one", "batched"):
        print(f"verdicts/s, cold, {mode.replace('_', ' ')}, n={args.speed_n}, one context per pair: "
              + ", ".join(f"{k} {v:.1f}" for k, v in sp[mode].items())
              + f" (load average {os.getloadavg()[0]:.1f})", flush=True)
    res["speed"]["shared_context"] = sc = speed_shared_context(pairs, h, judges, rounds=args.rounds)
    print(f"verdicts/s, cold, batched, 4 claims per context (as in a run), median of {args.rounds} "
          f"alternating rounds, load average {os.getloadavg()[0]:.1f}:")
    for k, v in sc.items():
        print(f"  {k:<24} {v['verdicts_s']:6.1f} verdicts/s wall  {v['verdicts_per_cpu_s']:6.1f} per CPU-s  "
              f"({1000 * v['cpu_s_per_verdict']:.1f} CPU-ms/verdict; rounds {v['wall_rounds']} s)", flush=True)
    old, new = sc["two-pass (features v2)"], sc["one-pass (features v3)"]
    print(f"  one-pass / two-pass: wall {new['verdicts_s'] / old['verdicts_s']:.2f}x, "
          f"per CPU-s {new['verdicts_per_cpu_s'] / old['verdicts_per_cpu_s']:.2f}x", flush=True)
    if args.cascade_n:
        res["cascade"], res["cascade_n"], res["llm_s_per_verdict"] = cascade_table(pairs, oof, args.cascade_n)
    if not args.no_fit_time:
        res["fit_s"] = fit_time(args.pairs)
        print(f"\njudge fit --labels judge_pairs (bundled sample + {len(pairs)} pairs): {res['fit_s']:.0f} s "
              f"wall, fresh process (load average {os.getloadavg()[0]:.1f})")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m rag_experiments.judge fit``: train the claim verifier used by ``judge=verifier``.

    python -m rag_experiments.judge fit [--corpus PATH] [--labels FILE ...] [--out DIR]
        [--cache-dir DIR] [--synthetic-max N] [--seed N] [--tracking-uri URI] [--experiment NAME]
        [--no-mlflow] [--no-progress]

Synthetic pairs of the corpus (default: the bundled sample, the default config's corpus) and
any human labels (``judge_pairs`` JSONL files, or filled spot-check label CSVs) train a logistic
verifier (docs/judges.md). Same inputs -> same
fit id -> cache hit. Bad input (corpus, labels ``FILE:LINE``, too-small corpus, an ``--out``
holding another verifier) exits 2 before anything is trained or logged. Out of memory exits 2 with
a message; SIGTERM / Ctrl-C end with one ``[interrupted]`` line saying what was written (exit
128 + signal), never silently (issue 31 item 12).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from rag_experiments.evalset.corpus import CorpusError, corpus_digest, load_corpus
from rag_experiments.evalset.judge_pairs import JudgePairsError, pairs_digest
from rag_experiments.evalset.label_csv import load_labels, training_label_problems
from rag_experiments.evalset.synthetic_pairs import SyntheticPairsError, synthetic_pairs, type_shares
from rag_experiments.judge.verifier import VerifierError


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m rag_experiments.judge fit", description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", help="corpus path (default: the bundled sample)")
    ap.add_argument("--labels", nargs="*", default=[], metavar="FILE", help="human labels: judge_pairs JSONL, or a filled spot-check CSV (.csv)")
    ap.add_argument("--out", help="write the verifier here (default: <cache-dir>/verifiers/<corpus>/<fit>)")
    ap.add_argument("--cache-dir", default=".cache/rag_experiments")
    ap.add_argument("--synthetic-max", type=int, default=1500, help="synthetic pairs kept (default 1500)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tracking-uri", default=None, help="MLflow store (default: $MLFLOW_TRACKING_URI, sqlite:///mlflow.db)")
    ap.add_argument("--experiment", default="judge-verifiers")
    ap.add_argument("--artifact-root", default="mlruns")
    ap.add_argument("--no-mlflow", action="store_true", help="do not log the fitted verifier to MLflow")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def _interrupt(signum, frame):  # SIGTERM (a timeout, a CI cancel): the same path as Ctrl-C
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _out_of_memory(e: BaseException) -> bool:
    """MemoryError, or torch's allocator failing (a RuntimeError naming the allocation)."""
    text = str(e)
    return isinstance(e, MemoryError) or (
        isinstance(e, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    stage = ["reading the inputs; nothing written"]  # what a signal interrupts, for its message
    previous = signal.getsignal(signal.SIGTERM)
    own = threading.current_thread() is threading.main_thread() and previous in (signal.SIG_DFL, None)
    if own:
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _fit(args, stage)
    except KeyboardInterrupt as e:
        name = str(e) if str(e) in signal.Signals.__members__ else "SIGINT"
        print(f"[interrupted] {name}: judge fit stopped while {stage[0]}", file=sys.stderr)
        return 128 + int(signal.Signals[name])
    except (MemoryError, RuntimeError) as e:
        if not _out_of_memory(e):
            raise
        print(
            f"error: out of memory while {stage[0]} ({(str(e).strip().splitlines() or [type(e).__name__])[0][:200]}); "
            f"lower --synthetic-max (now {args.synthetic_max}) or free memory",
            file=sys.stderr,
        )
        return 2
    finally:
        if own:
            signal.signal(signal.SIGTERM, previous or signal.SIG_DFL)


def _fit(args: argparse.Namespace, stage: list[str]) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from rag_experiments.evalset.load import sample_dir
    from rag_experiments.judge.verifier_fit import Recipe, fit_verifier

    if args.synthetic_max < 1:
        print(f"--synthetic-max: must be >= 1 (got {args.synthetic_max})", file=sys.stderr)
        return 2
    corpus = args.corpus or str(sample_dir() / "docs")
    try:
        docs = load_corpus(corpus)
        labelled, meta = [], []
        for f in args.labels:
            got = load_labels(f)
            if problems := training_label_problems(got, f):
                raise JudgePairsError("\n".join(problems))
            labelled += got
            meta.append({"file": os.path.basename(f), "pairs_digest": pairs_digest(got), "n": len(got)})
        recipe = Recipe(synthetic_max=args.synthetic_max, seed=args.seed)
        syn = synthetic_pairs(docs, seed=args.seed, n_max=args.synthetic_max)
        stage[0] = "fitting the verifier; nothing written (a verifier directory appears only complete)"
        res = fit_verifier(
            syn, labelled, corpus_digest(docs), args.cache_dir, args.out, recipe, meta, progress=not args.no_progress
        )
    except (CorpusError, JudgePairsError, SyntheticPairsError, VerifierError, FileNotFoundError) as e:
        for line in str(e).splitlines()[:50]:
            print(line, file=sys.stderr)
        return 2
    shares = ", ".join(f"{t} {v:.0%}" for t, v in type_shares(syn).items())
    state = "cache hit (nothing trained)" if res.cached else f"fitted in {res.seconds:.1f} s"
    print(f"verifier {res.fit_id[:16]}: {state}\n  path: {res.path}")
    print(f"  data: {len(syn)} synthetic pairs ({shares}); {len(labelled)} labelled pairs")
    for part, f in res.manifest.get("card", {}).items():
        if "kappa" in f:
            ci = f.get("ci", {})
            k_ci = ci.get("kappa", [float("nan")] * 2)
            print(
                f"  card ({part}, {f.get('cv', '')}, n={f['n']}): kappa {f['kappa']:.3f} "
                f"[{k_ci[0]:.3f}, {k_ci[1]:.3f}], balanced accuracy {f['balanced_accuracy']:.3f}"
            )
    if not args.no_mlflow:
        stage[0] = f"logging it to MLflow; the verifier is written at {res.path} (the same command logs it)"
        from rag_experiments.tracking.uri import tracking_uri
        from rag_experiments.tracking.verifier_model import log_verifier

        model_id, new = log_verifier(
            res.manifest, str(res.path), tracking_uri(args.tracking_uri), args.experiment, args.artifact_root
        )
        print(f"  MLflow: logged model {model_id}" + ("" if new else " (already logged)"))
    return 0

"""``python -m rag_experiments.evalset validate|import-squad|import-beir|import-mtrag|generate|accept|from-traces|estimate``
(usage: the ``rag_experiments.evalset`` docstring; ``generate``/``accept``: ``evalset/generate.py``;
``from-traces``/``estimate`` and ``accept`` of a trace review: ``cli/evalset_traces.py``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rag_experiments.cli import evalset_traces
from rag_experiments.evalset.corpus import CorpusError, load_corpus
from rag_experiments.evalset.generate import NEAR_MISS_THRESHOLD
from rag_experiments.evalset.generate import cli as generate_cli
from rag_experiments.evalset.importers import import_beir, import_mtrag, import_squad
from rag_experiments.evalset.load import EvalSetError, load_evalset, sample_dir, tag_counts
from rag_experiments.evalset.trace_review import is_trace_review
from rag_experiments.evalset.weak_facts import (
    WEAK_CHUNKING,
    WEAK_MIN_CORPUS,
    WEAK_MIN_DOC_CORPUS,
    weak_key_facts,
)
from rag_experiments.stages.chunking import chunk_corpus
from rag_experiments.tracking.errors import cli_main

DESCRIPTION = (
    "Eval sets: validate, import (SQuAD, BEIR, MTRAG conversations), generate and accept (LLM + human review), from-traces "
    "(production questions) and estimate (how often production answers fail)."
)


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


# --------------------------------------------------------------------------------------- CLI


def _validate(corpus_path: str, evalset_path: str, out=None) -> int:
    out = out or sys.stdout
    try:
        docs = load_corpus(corpus_path)
    except CorpusError as e:
        print(e, file=sys.stderr)
        return 2
    try:
        items, digest = load_evalset(evalset_path, docs)
    except EvalSetError as e:
        for p in e.problems:
            print(p, file=sys.stderr)
        print(f"{len(e.problems)} problem(s) in {evalset_path}", file=sys.stderr)
        return 2
    n_spans = sum(len(it.gold_spans) for it in items)
    print(
        f"corpus   {corpus_path}: {len(docs)} documents, {sum(len(d.text.split()) for d in docs)} words",
        file=out,
    )
    print(
        f"evalset  {evalset_path}: {len(items)} items, {n_spans} evidence spans, digest {digest[:12]}",
        file=out,
    )
    print("items per tag:", file=out)
    for tag, n in sorted(tag_counts(items).items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {tag:<14} {n:>5}", file=out)
    _print_weak(items, docs, evalset_path, out)
    print("OK", file=out)
    return 0


def _print_weak(items, docs, evalset_path: str, out) -> None:
    """The weak key facts (evalset.weak_facts), each with its line, item id and reason: correctness
    leaves them out, so an item whose facts are all weak has no correctness. A warning, not an error."""
    weak = weak_key_facts(items, docs)
    n_chunks = len(chunk_corpus(WEAK_CHUNKING, docs))
    if n_chunks < WEAK_MIN_CORPUS:
        print(
            f"weak key facts: the corpus rule is off ({n_chunks} chunks of 800 characters, fewer than "
            f"{WEAK_MIN_CORPUS}); length, stop words and the question still apply",
            file=out,
        )
    if len(docs) < WEAK_MIN_DOC_CORPUS:
        print(
            f"weak key facts: the document rule is off ({len(docs)} documents, fewer than {WEAK_MIN_DOC_CORPUS})",
            file=out,
        )
    if not weak:
        print("weak key facts: none", file=out)
        return
    facts = {(w.item_id, w.fact) for w in weak}
    only = [it.id for it in items if it.key_facts and all((it.id, f) in facts for f in it.key_facts if f.strip())]
    print(
        f"weak key facts: {len(weak)} in {len({w.item_id for w in weak})} items, left out of correctness "
        f"({len(only)} items keep no strong fact, so no correctness; docs/metrics.md, \"Key-fact correctness\"):",
        file=out,
    )
    for w in weak:
        print(f"  {evalset_path}:{w.line}: {w}", file=out)
    print(f"weak-only items: {', '.join(only) if only else 'none'}", file=out)


def _add_generate_parsers(sub) -> None:
    g = sub.add_parser("generate", help="LLM-proposed questions grounded in corpus quotes → review CSV")
    g.add_argument("--corpus", required=True)
    g.add_argument("--n", type=int, required=True, help="passages to sample (one generator call each)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--out", required=True, help="review CSV to write")
    g.add_argument(
        "--rejected",
        metavar="FILE",
        help="JSONL of the rejected replies, one per line with its reason (default: beside --out, "
        "REVIEW.rejected.jsonl)",
    )
    g.add_argument("--dedup-threshold", type=float, default=0.9, help="drop questions with cosine ≥ this")
    g.add_argument(
        "--near-miss",
        type=float,
        default=NEAR_MISS_THRESHOLD,
        metavar="SIMILARITY",
        help="keep a quote not found verbatim when a passage span is at least this similar "
        f"(difflib ratio over case- and punctuation-folded text; default {NEAR_MISS_THRESHOLD}; above 1: off)",
    )
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no progress lines")
    g.add_argument("--base-url", help="OpenAI-compatible endpoint (default: the packaged local SmolLM2)")
    g.add_argument("--model", help="model name at --base-url")
    g.add_argument("--api-key-env", default="OPENAI_API_KEY", help="name of the env var holding the key")
    g.add_argument("--model-path", help="local GGUF for the llama.cpp server (default: packaged SmolLM2)")
    g.add_argument("--max-tokens", type=int, default=200)
    g.add_argument("--temperature", type=float, default=0.0)
    a = sub.add_parser("accept", help="reviewed CSV (keep=yes) → validated evalset.jsonl")
    a.add_argument("review")
    a.add_argument("--corpus", required=True)
    a.add_argument("--out", required=True)
    a.add_argument("--evalset", help="a trace review (from-traces): the eval set the kept items join")
    a.add_argument("--experiment", default="evalsets", help="trace review: experiment of the MLflow dataset")
    a.add_argument("--tracking-uri", help="trace review: default $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    a.add_argument("--no-mlflow", action="store_true", help="trace review: do not log the MLflow dataset")
    evalset_traces.add_parsers(sub)


@cli_main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rag_experiments.evalset", description=DESCRIPTION)
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("validate", help="validate an eval set against a corpus (default: the bundled sample)")
    v.add_argument("--corpus", default=str(sample_dir() / "docs"))
    v.add_argument("--evalset", default=str(sample_dir() / "evalset.jsonl"))
    sq = sub.add_parser("import-squad", help="SQuAD v1.1 JSON → corpus.jsonl + evalset.jsonl")
    sq.add_argument("file")
    sq.add_argument("--out", required=True)
    sq.add_argument("--strict", action="store_true", help="exit 2 on any misaligned or missing answer")
    be = sub.add_parser("import-beir", help="BEIR dataset dir → corpus.jsonl + evalset.jsonl")
    be.add_argument("dir")
    be.add_argument("--out", required=True)
    be.add_argument("--split", default="test")
    be.add_argument("--strict", action="store_true", help="exit 2 on any qrel naming a missing document")
    mt = sub.add_parser("import-mtrag", help="MTRAG / MTRAG-UN generation tasks (conversations) → corpus.jsonl + evalset.jsonl")
    mt.add_argument("file")
    mt.add_argument("--out", required=True)
    mt.add_argument("--strict", action="store_true", help="exit 2 on any repaired or dropped turn or passage")
    _add_generate_parsers(sub)
    args = ap.parse_args(argv)
    if args.cmd == "validate":
        return _validate(args.corpus, args.evalset)
    if args.cmd == "from-traces":
        return evalset_traces.from_traces(args)
    if args.cmd == "estimate":
        return evalset_traces.estimate(args)
    if args.cmd == "accept" and is_trace_review(Path(args.review)):
        return evalset_traces.accept(args)
    if args.cmd in ("generate", "accept"):
        return generate_cli(args)
    try:
        if args.cmd == "import-mtrag":
            corpus, evals, report = import_mtrag(args.file)
        else:
            corpus, evals, report = (
                import_squad(args.file) if args.cmd == "import-squad" else import_beir(args.dir, args.split)
            )
    except (OSError, KeyError, ValueError, TypeError, AttributeError) as e:
        print(f"{getattr(args, 'file', None) or args.dir}: cannot import: {e!r}", file=sys.stderr)
        return 2
    what = {"import-squad": "answers", "import-mtrag": "reference passages"}.get(args.cmd, "qrels")
    if args.strict and report.notes:
        for note in report.notes:
            print(note, file=sys.stderr)
        print(
            f"--strict: {len(report.notes)} {what} do not match the documents; nothing written",
            file=sys.stderr,
        )
        return 2
    for note in report.notes[:20]:
        print(note)
    if len(report.notes) > 20:
        print(f"... and {len(report.notes) - 20} more")
    print(report.summary(what))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _write_jsonl(out / "corpus.jsonl", corpus)
    _write_jsonl(out / "evalset.jsonl", evals)
    print(
        f"wrote {len(corpus)} documents to {out / 'corpus.jsonl'} and {len(evals)} items to {out / 'evalset.jsonl'}"
    )
    return _validate(str(out / "corpus.jsonl"), str(out / "evalset.jsonl"))


if __name__ == "__main__":
    sys.exit(main())

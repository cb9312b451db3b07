"""``evalset from-traces``, ``evalset accept`` of a trace review, ``evalset estimate`` (docs/from-traces.md).

    python -m rag_experiments.evalset from-traces --experiment NAME --out review.csv [--evalset FILE]
        [--pick failures|disagreement|uncertain|random] [--n 50] [--since T] [--until T] [--tag K=V ...]
    python -m rag_experiments.evalset accept review.csv --corpus DOCS --evalset FILE --out NEW.jsonl
    python -m rag_experiments.evalset estimate review.csv

Exit codes: 0 ok, 2 bad input (nothing written).
"""

from __future__ import annotations

import json
import math
import sys
from datetime import UTC, datetime
from pathlib import Path

from rag_experiments.analysis import production
from rag_experiments.analysis.trace_sample import PICKS, TracedQuery, Unit, frame, pick
from rag_experiments.core.formatting import fmt_num, text_table
from rag_experiments.evalset.corpus import CorpusError, load_corpus
from rag_experiments.evalset.load import EvalSetError, load_evalset
from rag_experiments.evalset.trace_review import LABELS, ReviewRow, accept_review, read_review, write_review
from rag_experiments.stages.embedding import metric_embedder
from rag_experiments.tracking.trace_reader import Filters, TraceInputError, read_traces, tag_pairs
from rag_experiments.tracking.uri import tracking_uri

DEDUP = 0.95  # cosine of two MiniLM question embeddings above which they are one question
#: The project's run labels (evaluation/labels.py) as a reviewer's label of the production answer.
JUDGE_LABELS = {"ok": "ok", "correct_without_evidence": "ok", "retrieval_failure": "retrieval_failure",
                "generation_failure": "generation_failure", "error": "error"}  # fmt: skip


def design_path(review: Path) -> Path:
    return review.with_name(review.stem + ".design.json")


def add_parsers(sub) -> None:
    f = sub.add_parser(
        "from-traces", help="traced production questions → review CSV with inclusion probabilities"
    )
    f.add_argument("--experiment", required=True, help="MLflow experiment (name or id) holding the traces")
    f.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    f.add_argument("--out", required=True, help="review CSV to write (+ REVIEW.design.json beside it)")
    f.add_argument("--evalset", help="eval set whose questions are left out")
    f.add_argument("--pick", choices=PICKS, default="failures")
    f.add_argument("--n", type=int, default=50)
    f.add_argument("--seed", type=int, default=0)
    f.add_argument(
        "--fill", type=float, default=0.2, help="share of --n kept for the rest stratum (default 0.2)"
    )
    f.add_argument("--judge", action="append", default=[], metavar="NAME",
                   help="feedback name of a judge: two for disagreement, one for uncertain")  # fmt: skip
    f.add_argument("--threshold", type=float, default=0.5, help="a judge score at or above it passes")
    f.add_argument("--band", type=float, default=0.1, help="uncertain: |score − threshold| ≤ band")
    f.add_argument("--stratify-by", metavar="TAG|day", help="random: strata by a trace tag or by day")
    f.add_argument("--since", help="ISO time (UTC unless it says): traces started at or after it")
    f.add_argument("--until", help="ISO time: traces started before it")
    f.add_argument(
        "--tag", action="append", default=[], metavar="KEY=VALUE", help="only traces with this tag"
    )
    f.add_argument("--dedup-threshold", type=float, default=DEDUP)
    f.add_argument("--without-context", action="store_true",
                   help="sample traces that have no RETRIEVER span (no retrieved context to show)")  # fmt: skip
    e = sub.add_parser(
        "estimate", help="share of production answers per label, with a CI, from a reviewed sample"
    )
    e.add_argument("review")
    e.add_argument("--design", help="the design file (default: REVIEW.design.json beside the review)")


def _ms(text: str | None, flag: str) -> int | None:
    if not text:
        return None
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{flag} {text!r}: expected an ISO date or time, e.g. 2026-12-01 or 2026-12-01T08:00"
        ) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return int(t.timestamp() * 1000)


def _known_questions(path: str | None) -> list[str]:
    if not path:
        return []
    out = []
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                out.append(str(json.loads(line)["query"]))
            except (ValueError, KeyError, TypeError):
                raise ValueError(
                    f"{path}:{i}: query: not a JSON object with a query (validate the eval set)"
                ) from None
    return out


def _context(q: TracedQuery) -> str:
    return "\n---\n".join(f"[{d.doc_id or i + 1}] {d.text.strip()}" for i, d in enumerate(q.docs))


def _judge(q: TracedQuery) -> str | None:
    return JUDGE_LABELS.get(str(q.feedback.get("failure_label", "")))


def from_traces(args) -> int:
    try:
        if args.n < 1:
            raise ValueError(f"--n {args.n}: must be >= 1")
        if not 0 <= args.fill < 1:
            raise ValueError(f"--fill {args.fill}: must be in [0, 1)")
        need = {"disagreement": 2, "uncertain": 1}.get(args.pick, 0)
        if len(args.judge) != need and need:
            raise ValueError(f"--pick {args.pick} needs {need} --judge NAME (feedback names on the traces)")
        filters = Filters(_ms(args.since, "--since"), _ms(args.until, "--until"), tag_pairs(args.tag))
        known = _known_questions(args.evalset)
        uri = tracking_uri(args.tracking_uri)
        queries, skipped = read_traces(uri, args.experiment, filters)
    except (ValueError, OSError, TraceInputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with_ret = sum(q.has_retriever for q in queries)
    if with_ret == 0 and not args.without_context:
        print(
            f"error: none of the {len(queries)} traces of {args.experiment!r} has a RETRIEVER span: there is no "
            "retrieved context to show the reviewer, and --pick failures loses its retrieval signals (no "
            "retrieval, low retrieval score, answer-context overlap). What still works: the questions and "
            "answers (root span), declines, errors and judge feedback on the traces; the reviewer then finds "
            "the evidence in the corpus alone. Re-run with --without-context to sample them anyway, or trace "
            "the retriever (mlflow.trace(span_type=SpanType.RETRIEVER) returning documents).",
            file=sys.stderr,
        )
        return 2
    if need:
        present = {j: sum(j in q.feedback for q in queries) for j in args.judge}
        missing = [j for j, n in present.items() if n == 0]
        if missing:
            names = sorted({k for q in queries for k in q.feedback})
            print(f"error: no trace has feedback {', '.join(missing)}; feedback present: {', '.join(names) or 'none'}",
                  file=sys.stderr)  # fmt: skip
            return 2
    emb = metric_embedder()
    units, in_evalset = frame(queries, lambda t: emb.encode(t, kind="query"), args.dedup_threshold, known)
    if not units:
        print(
            f"error: every one of the {len(queries)} traces' questions is already in {args.evalset}",
            file=sys.stderr,
        )
        return 2
    drawn, strata = pick(units, args.pick, args.n, args.seed, args.fill, args.judge, args.threshold, args.band,
                         args.stratify_by)  # fmt: skip
    out = Path(args.out)
    rows = [ReviewRow(f"c{i + 1:03d}", u.rep.trace_id, u.pi, u.rep.question, u.rep.answer or "", _context(u.rep))
            for i, u in enumerate(drawn)]  # fmt: skip
    design = _design(args, uri, queries, units, drawn, rows, strata, in_evalset, skipped)
    write_review(out, rows)
    design_path(out).write_text(json.dumps(design, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    merged = sum(u.m - 1 for u in units)
    print(f"{len(queries)} traces ({with_ret} with retrieved context); {in_evalset} already in the eval set; "
          f"{merged} near-duplicates merged (MiniLM cosine ≥ {args.dedup_threshold:g}) → {len(units)} questions")  # fmt: skip
    for h, (n_units, n_drawn) in strata.items():
        print(
            f"  stratum {h:<12} {n_units:>6} questions, {n_drawn:>4} drawn, π = {fmt_num(n_drawn / n_units)}"
        )
    print(f"wrote {len(rows)} candidates to {out} (design: {design_path(out)}); fill in keep, label, doc_id, quote, "
          f"answer, then: python -m rag_experiments.evalset accept {out} --corpus DOCS --evalset EVALSET --out NEW")  # fmt: skip
    return 0


def _design(args, uri, queries, units: list[Unit], drawn, rows, strata, in_evalset, skipped) -> dict:
    judged = all(_judge(u.rep) is not None for u in units)
    stamps = [q.timestamp_ms for q in queries]
    tags: dict[str, int] = {}
    for q in queries:
        for k, v in q.tags.items():
            if k not in ("item_id",):
                tags[f"{k}={v}"] = tags.get(f"{k}={v}", 0) + 1
    return {
        "experiment": args.experiment,
        "tracking_uri": uri,
        "pick": args.pick,
        "n": args.n,
        "seed": args.seed,
        "fill": args.fill,
        "judges": args.judge,
        "threshold": args.threshold,
        "filters": {"since": args.since, "until": args.until, "tags": args.tag},
        "traces": len(queries),
        "traces_unreadable": skipped,
        "in_evalset": in_evalset,
        "dedup_threshold": args.dedup_threshold,
        "frame_units": len(units),
        "frame_traces": sum(u.m for u in units),
        "time_range": [min(stamps), max(stamps)],
        "tags": dict(sorted(tags.items(), key=lambda kv: -kv[1])[:50]),
        "strata": {h: list(v) for h, v in strata.items()},
        "units": {
            r.id: {
                "trace_id": u.rep.trace_id,
                "stratum": u.stratum,
                "pi": u.pi,
                "m": u.m,
                "members": u.members,
                "reasons": u.reasons,
                "judge": _judge(u.rep),
            }
            for r, u in zip(rows, drawn, strict=True)
        },  # fmt: skip
        "frame_judge": [[_judge(u.rep), u.m] for u in units] if judged else None,
    }


# --------------------------------------------------------------------------------------- estimate


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M")


def estimate(args) -> int:
    review = Path(args.review)
    rows, problems = read_review(review)
    dpath = Path(args.design) if args.design else design_path(review)
    design = None
    if dpath.is_file():
        try:
            design = json.loads(dpath.read_text(encoding="utf-8"))
        except ValueError as e:
            problems.append(f"{dpath}: not JSON ({e})")
    if problems:
        for p in problems:
            print(p, file=sys.stderr)
        return 2
    units = (design or {}).get("units", {})
    unknown = [r.id for r in rows if design and r.id not in units]
    if unknown:
        print(f"{dpath}: rows {', '.join(unknown[:5])} of {review} are not in this design", file=sys.stderr)
        return 2
    labelled = [
        production.Labelled(r.id, r.label, r.inclusion_prob, units.get(r.id, {}).get("m", 1),
                            units.get(r.id, {}).get("stratum", "all"), units.get(r.id, {}).get("judge"))
        for r in rows if r.label
    ]  # fmt: skip
    if not labelled:
        print(f"{review}: label: no row labelled ({', '.join(LABELS)}): nothing to estimate", file=sys.stderr)
        return 2
    sizes = {h: v[0] for h, v in design["strata"].items()} if design else None
    frame_judge = [tuple(x) for x in design["frame_judge"]] if design and design.get("frame_judge") else None
    ests = production.estimate(labelled, LABELS, sizes, frame_judge)
    uncovered = production.stratified_ratio(labelled, sizes, LABELS[0])[1] if sizes else []
    how = ("stratified ratio (Hájek) estimator, SRS-without-replacement variance per stratum"
           if sizes else "Hájek estimator with weights m/π, with-replacement variance (no design file)")  # fmt: skip
    print(
        f"production estimate from {review}: n = {len(labelled)} labelled of {len(rows)} sampled; {how}; 95% CI"
    )
    if design:
        lo, hi = design["time_range"]
        tags = ", ".join(f"{k} ({v})" for k, v in list(design["tags"].items())[:8]) or "none"
        print(f"covers: {design['frame_traces']} traces of experiment {design['experiment']!r} from {_when(lo)} to "
              f"{_when(hi)} UTC (filters {design['filters']}); tags: {tags}")  # fmt: skip
        print(f"not covered: {design['in_evalset']} traces whose question is already in the eval set"
              + (f"; strata with no labelled row: {', '.join(uncovered)}" if uncovered else ""))  # fmt: skip
        print("assumes: near-duplicate questions (merged) share the label of the one reviewed; "
              "unlabelled sampled rows are missing at random within their stratum")  # fmt: skip
    head = ["label", "share", "95% CI", "n"] + (["judge only", "PPI", "PPI 95% CI"] if frame_judge else [])
    table = []
    for e in ests:
        row = [e.label, fmt_num(e.hajek.value, 3), _ci(e.hajek), str(e.hajek.n)]
        if frame_judge:
            row += [
                fmt_num(e.judge_only, 3),
                fmt_num(e.ppi.value, 3) if e.ppi else "–",
                _ci(e.ppi) if e.ppi else "–",
            ]
        table.append(row)
    print(text_table(head, table))
    if frame_judge:
        print(
            "PPI: the judge's failure_label on every frame trace, corrected by its error on the labelled rows"
        )
        agreed = lambda lab: all((r.judge == lab) == (r.label == lab) for r in labelled)  # noqa: E731
        flat = [e.label for e in ests if e.ppi and agreed(e.label)]
        if flat:
            print(f"  judge and reviewer agreed on all {len(labelled)} labelled rows for {', '.join(flat)}: "
                  "its PPI interval is the exact bound of a disagreement rate never seen (Clopper–Pearson), "
                  "not certainty: label more rows")  # fmt: skip
    elif design:
        print("PPI: not available (the judge's failure_label is not on every trace of the frame)")
    return 0


def _ci(e) -> str:
    if e is None or math.isnan(e.ci_low):
        return "–"
    return f"[{fmt_num(e.ci_low, 3)}, {fmt_num(e.ci_high, 3)}]"


# --------------------------------------------------------------------------------------- accept


def accept(args) -> int:
    review = Path(args.review)
    if not args.evalset:
        print(f"error: {review} is a trace review: accept it with --evalset FILE (the eval set it extends)",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        docs = load_corpus(args.corpus)
    except CorpusError as e:
        print(e, file=sys.stderr)
        return 2
    acc, problems = accept_review(review, Path(args.evalset), docs)
    if problems:
        for p in problems:
            print(p, file=sys.stderr)
        print(f"{len(problems)} problem(s); nothing written", file=sys.stderr)
        return 2
    out = Path(args.out)
    text = "".join(json.dumps(it, ensure_ascii=False) + "\n" for it in acc.items)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    try:
        items, digest = load_evalset(out, docs)
        _, parent = load_evalset(args.evalset, docs)
    except EvalSetError as e:  # cannot happen after accept_review; never silent
        for p in e.problems:
            print(p, file=sys.stderr)
        return 2
    print(f"{len(acc.new)} new item(s) ({acc.already} already in the eval set, {acc.discarded} discarded, "
          f"{len(acc.pending)} not reviewed yet" + (f": lines {', '.join(map(str, acc.pending[:20]))}" if acc.pending else "")
          + ")")  # fmt: skip
    print(f"wrote {len(items)} items to {out}: digest {digest[:12]} (was {parent[:12]})")
    if not args.no_mlflow and acc.new:
        from rag_experiments.tracking.genai_dataset import log_version

        uri = tracking_uri(args.tracking_uri)
        ds = log_version(uri, args.experiment, items, docs, digest, parent, acc.lineage)
        print(f"logged as MLflow evaluation dataset {ds} (experiment {args.experiment!r} on {uri}; "
              f"parent evalset-{parent[:16]}, lineage of {len(acc.lineage)} trace(s))")  # fmt: skip
    elif not acc.new:
        print("nothing new: the eval set is unchanged (re-accepting a review is a no-op)")
    return 0

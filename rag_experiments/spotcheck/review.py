"""The spot-check as a review queue in MLflow's Review tab: ``sample --to-mlflow``, ``score --from-mlflow``.

``publish`` puts a sample (the rows ``sample`` writes to the CSV) into a review queue of the run's
experiment: one trace per sampled claim (``spotcheck_claim``: the claim, question and exact context
the judge saw as one literal chat message the Review tab renders, the answer as output, the exact
fields in its ``review_item`` span), tagged with the run, the claim's ``item_id``, its
``inclusion_prob`` and the judge, so the weighting is reproducible from MLflow alone; reviewers
answer the :data:`SCHEMA` label schema (the CSV's labels, the instructions in its text) and their
answers are ``HUMAN`` feedback on the claim's trace. Re-publishing the same sample reuses the queue
and its traces. ``queue_labels`` reads the queue back as the same :class:`Labels` the CSV reader
gives, checked by the same rules, so ``score`` runs one scoring function on either.

Deleting a trace in MLflow also removes its queue item and its feedback, so a queue alone cannot
tell that a label went missing. ``publish`` therefore logs the sample's manifest on the run
(``spotcheck/queues/<queue id>.json``: every item and its trace); :func:`missing_items` compares the
queue with it, and ``score`` names the items whose trace is gone instead of shrinking n silently.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from rag_experiments.core.run_record import RunData
from rag_experiments.spotcheck.claims import COLUMNS
from rag_experiments.spotcheck.labels import HUMAN_LABELS, Labels, labels_from_records
from rag_experiments.tracking import annotate
from rag_experiments.tracking import review_queue as rq
from rag_experiments.tracking.runs import RunInputError
from rag_experiments.tracking.uri import is_server

SCHEMA = "claim_support"  # the label schema's name = the HUMAN feedback's name
TRACE_NAME = "spotcheck_claim"
INSTRUCTION = (
    "Is the claim supported by the context? The message shows the claim, the question and the exact "
    "context the judge saw. Answer 'supported' only if the context alone states or entails the "
    "claim; 'unsupported' if the context contradicts it or does not say it (outside knowledge does not "
    "count). Judge this one claim, not the rest of the answer. Unsure: leave the item pending."
)
RUN, ITEM, PI = "spotcheck.run_id", "spotcheck.item_id", "spotcheck.inclusion_prob"


def queue_name(run: RunData, sample: pd.DataFrame) -> str:
    """``spotcheck <run name> <digest>``: the digest is of the run and the sampled (item, π), so the
    same sample names the same queue and another sample another one."""
    key = json.dumps(
        [
            run.run_id,
            [[i, repr(float(p))] for i, p in zip(sample["item_id"], sample["inclusion_prob"], strict=True)],
        ]
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    return f"spotcheck {(run.run_name or run.run_id[:8])[:150]} {digest}"


_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~])")


def _md(text: str) -> str:
    """``text`` shown literally by the Review tab's Markdown: punctuation escaped, lines kept."""
    return _MARKDOWN.sub(r"\\\1", str(text)).replace("\n", "  \n")


def shown(record: dict) -> tuple[dict, dict]:
    """(inputs, outputs) of the claim's root span: one chat message the Review tab renders as
    text (claim, question, the judge's context, each literal), and the answer. The exact fields
    are the trace's ``review_item`` span."""
    content = "\n\n".join(
        [
            f"**Claim:** {_md(record['claim'])}",
            f"**Question:** {_md(record['query'])}",
            "**Context the judge saw:**",
            _md(record["context"]),
        ]
    )
    return {"messages": [{"role": "user", "content": content}]}, {"answer": record["answer"]}


def review_url(uri: str, queue) -> str:
    """The queue in MLflow's Review tab: a full URL on a server, else the route to open in ``mlflow ui``."""
    route = f"#/experiments/{queue.experiment_id}/review-queue?selectedQueueId={queue.queue_id}"
    return f"{uri.rstrip('/')}/{route}" if is_server(uri) else route


@dataclass
class Published:
    queue: object  # mlflow ReviewQueue
    n_written: int
    n_reused: int


def _tags(run: RunData, row, design: str, show_judge: bool = False) -> dict[str, str]:
    """The claim trace's tags; the judge's verdict and score only with ``show_judge`` (the Review
    tab shows tags to the reviewer: blind by default, ``score`` takes the verdict from the run)."""
    score = row["judge_score"]
    tags = {
        RUN: run.run_id,
        ITEM: row["item_id"],
        PI: repr(float(row["inclusion_prob"])),  # repr: the float round-trips exactly
        "spotcheck.design": design,
        "spotcheck.judge": run.params.get("judge", ""),
        "spotcheck.judge_model": run.tags.get("judge_model", ""),
    }
    if show_judge:
        tags["spotcheck.judge_verdict"] = row["judge_verdict"]
        tags["spotcheck.judge_score"] = "" if score != score else repr(float(score))
    return tags


def publish(
    uri: str, run: RunData, sample: pd.DataFrame, design: str, name: str | None = None, show_judge: bool = False
) -> Published:
    """Create (or find) the queue ``name`` (default :func:`queue_name`) holding ``sample``'s claims.

    Idempotent: traces already written for the queue (found by tag, attached or not) are reused,
    and attaching is idempotent; a queue that holds another sample → :class:`RunInputError`.
    """
    eid = run.experiment_id
    name = name or queue_name(run, sample)
    schema = rq.ensure_schema(uri, eid, SCHEMA, HUMAN_LABELS, INSTRUCTION)
    queue, _ = rq.get_or_create_queue(uri, eid, name, schema.schema_id)
    if schema.schema_id not in queue.schema_ids:
        raise RunInputError(
            f"review queue {name!r} exists without the {SCHEMA!r} label schema; pick another --queue"
        )
    written = rq.traces_written_for(uri, eid, name)
    want = {f"{run.run_id}/{r['item_id']}": r for r in sample.to_dict("records")}
    by_trace = {tid: key for key, (tid, _) in written.items()}
    other = [
        by_trace.get(it.item_id, it.item_id)
        for it in rq.queue_items(uri, queue.queue_id)
        if by_trace.get(it.item_id) not in want
    ]
    changed = [
        k for k, (_, tags) in written.items() if k in want and tags.get(PI) != _tags(run, want[k], design)[PI]
    ]
    if other or changed:
        raise RunInputError(
            f"review queue {name!r} (experiment {eid}) already holds another sample "
            f"({len(other)} other item(s), {len(changed)} with another inclusion_prob, e.g. "
            f"{(other + changed)[0]}); pick another --queue name"
        )
    ids, n_new = [], 0
    if missing := sum(k not in written for k in want):
        print(f"writing {missing} claim traces to {name!r} ...", file=sys.stderr, flush=True)
    for key, row in want.items():
        if key in written:
            ids.append(written[key][0])
            continue
        record = {
            "claim": row["claim"],
            "query": row["query"],
            "context": row["context"],
            "answer": row["answer"],
        }
        ids.append(
            rq.write_item(
                uri, eid, name, key, TRACE_NAME, shown(record), record, _tags(run, row, design, show_judge)
            )
        )
        n_new += 1
    rq.flush()
    rq.attach(uri, queue.queue_id, ids)
    items = [
        {"item_id": row["item_id"], "inclusion_prob": repr(float(row["inclusion_prob"])), "trace_id": tid}
        for row, tid in zip(want.values(), ids, strict=True)
    ]
    manifest = {"queue_id": queue.queue_id, "queue": name, "run_id": run.run_id, "items": items}
    annotate.log_text(uri, run.run_id, json.dumps(manifest, indent=1), manifest_path(queue.queue_id))
    return Published(queue, n_new, len(ids) - n_new)


def manifest_path(queue_id: str) -> str:
    """The run artifact that records what ``publish`` put in the queue."""
    return f"spotcheck/queues/{queue_id}.json"


def missing_items(ql: QueueLabels, manifest: str | None) -> list[str]:
    """Warnings for the sampled items the queue no longer holds (their trace was deleted, and the
    item and its feedback with it): they are left out of n, and a label they had is lost. A queue
    published before manifests existed (``manifest`` None) gets a note that it cannot be checked."""
    label = f"review queue {ql.queue.name!r} (experiment {ql.queue.experiment_id})"
    if manifest is None:
        return [f"note: {label} has no manifest on the run (published by an older version): deleted traces cannot be counted"]
    want = [it["item_id"] for it in json.loads(manifest)["items"]]
    have = {rec["item_id"] for _, rec in ql.records}
    gone = [i for i in want if i not in have]
    if not gone:
        return []
    return [
        f"{len(gone)} of the {len(want)} sampled item(s) of {label} refer to deleted traces "
        f"({', '.join(gone[:5])}{' …' if len(gone) > 5 else ''}): any label they had is lost; they are "
        f"left out of n"
    ]


@dataclass
class QueueLabels:
    """The queue's items as label records: the run they came from and what the reviewers did."""

    queue: object
    run_id: str
    records: list[tuple[str, dict[str, str]]]
    warnings: list[str] = field(default_factory=list)


def read_queue(uri: str, queue_ref: str, experiment_ids: list[str]) -> QueueLabels:
    """The queue's items as ``(where, record)`` with the CSV's fields; the latest valid HUMAN
    answer per item (conflicting reviewers are named in a warning); no item → :class:`RunInputError`."""
    queue = rq.find_queue(uri, queue_ref, experiment_ids)
    label = f"review queue {queue.name!r} (experiment {queue.experiment_id})"
    items = rq.read_items(uri, queue, SCHEMA)
    if not items:
        raise RunInputError(f"{label} holds no items")
    runs = sorted({it.tags[RUN] for it in items if it.tags.get(RUN)})
    if len(runs) != 1:
        raise RunInputError(
            f"{label}: its items come from {len(runs)} runs ({', '.join(runs) or 'none tagged ' + RUN}); "
            "a spot-check scores one run"
        )
    records, conflicts, declined = [], [], 0
    for it in items:
        fb = sorted(it.feedback, key=lambda f: f[2])
        human = fb[-1][1] if fb else ""
        if len({str(v).strip().lower() for _, v, _ in fb}) > 1:
            conflicts.append(it.tags.get(ITEM, it.trace_id))
        declined += it.status == "declined" and not fb
        rec = {
            "item_id": it.tags.get(ITEM, ""),
            "claim": str(it.record.get("claim", "")),
            "human_verdict": human if isinstance(human, str) else json.dumps(human),
            "inclusion_prob": it.tags.get(PI, ""),
        }
        records.append((f"{label}: trace {it.trace_id}", rec))
    warnings = []
    if conflicts:
        warnings.append(
            f"{len(conflicts)} item(s) of {label} have different answers from different reviewers "
            f"({', '.join(conflicts[:5])}); the latest answer is scored"
        )
    if declined:
        warnings.append(f"{declined} item(s) declined by reviewers are counted as blank")
    return QueueLabels(queue, runs[0], records, warnings)


def queue_labels(ql: QueueLabels, claims: pd.DataFrame, csv_path: Path) -> Labels:
    """The queue's :class:`Labels` (checked like a CSV's), and the same labels written to
    ``csv_path`` in the CSV's columns (logged as ``spotcheck/labels.csv``; it scores the same)."""
    label = f"review queue {ql.queue.name!r} (experiment {ql.queue.experiment_id})"
    order = {iid: i for i, iid in enumerate(claims["item_id"])}  # the run's order, as the CSV has it:
    records = sorted(ql.records, key=lambda r: order.get(r[1]["item_id"], len(order)))  # same sums, bootstrap
    labels = labels_from_records(records, claims, Path(label), weighted=True)
    by_id = claims.set_index("item_id")
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for _, rec in records:
            iid = rec["item_id"]
            if iid in by_id.index:
                w.writerow({**by_id.loc[iid].to_dict(), **rec, "item_id": iid})
    return labels

"""Print a conversation sweep's per-turn table (docs/conversations.md): per turn index,
answerability and standalone-or-not, each history option's mean and its paired difference
against the baseline option, with a 95 % bootstrap CI (``analysis.conversations``).

python scripts/conversation_table.py --tracking-uri URI --experiment NAME
    [--where retriever=bm25] [--baseline last_turn] [--metrics hit_at_5 evidence_recall_at_512tok]

Runs are the experiment's FINISHED non-parent runs, the newest per ``history`` option among those
whose params match every ``--where KEY=VALUE``.
"""

import argparse
import sys

from rag_experiments.analysis.conversations import breakdown, markdown
from rag_experiments.tracking.run_reader import MlflowRunReader

ap = argparse.ArgumentParser()
ap.add_argument("--tracking-uri", required=True)
ap.add_argument("--experiment", required=True)
ap.add_argument("--where", nargs="*", default=[], metavar="KEY=VALUE")
ap.add_argument("--baseline", default="last_turn")
ap.add_argument("--metrics", nargs="+", default=["hit_at_5", "evidence_recall_at_512tok"])
ap.add_argument("--resamples", type=int, default=2000)
args = ap.parse_args()
reader = MlflowRunReader(args.tracking_uri)
exp = {n: i for i, n in reader.experiments().items()}.get(args.experiment) or args.experiment
want = dict(w.split("=", 1) for w in args.where)
from mlflow.tracking import MlflowClient  # noqa: E402 - the reader has no experiment-wide search

client = MlflowClient(tracking_uri=args.tracking_uri)
found = {}
for r in client.search_runs(
    [exp], filter_string="attributes.status = 'FINISHED'", order_by=["attributes.start_time DESC"]
):
    p = r.data.params
    if r.data.tags.get("is_parent") == "true" or any(p.get(k) != v for k, v in want.items()):
        continue
    found.setdefault(p.get("history", "last_turn"), r.info.run_id)
if args.baseline not in found:
    sys.exit(f"no finished run with history={args.baseline} among {sorted(found)}")
tables = {
    h: reader.per_query(reader.get(rid))
    for h, rid in sorted(found.items(), key=lambda kv: kv[0] != args.baseline)
}
rows = breakdown(tables, args.baseline, args.metrics, n_resamples=args.resamples)
print(markdown(rows, args.metrics, args.baseline))

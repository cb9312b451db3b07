"""Print the id of the newest FINISHED run of an experiment (for CI gates).

python scripts/latest_run.py EXPERIMENT_NAME [--tracking-uri URI]
"""

import argparse
import sys

from mlflow.tracking import MlflowClient

from rag_experiments.tracking.runs import tracking_uri

ap = argparse.ArgumentParser()
ap.add_argument("experiment")
ap.add_argument("--tracking-uri")
args = ap.parse_args()
client = MlflowClient(tracking_uri=tracking_uri(args.tracking_uri))
exp = client.get_experiment_by_name(args.experiment)
runs = (
    []
    if exp is None
    else client.search_runs(
        [exp.experiment_id],
        filter_string="attributes.status = 'FINISHED'",
        order_by=["attributes.start_time DESC"],
        max_results=50,
    )
)
runs = [r for r in runs if r.data.tags.get("is_parent") != "true"]
if not runs:
    sys.exit(f"no finished run in experiment {args.experiment!r}")
print(runs[0].info.run_id)

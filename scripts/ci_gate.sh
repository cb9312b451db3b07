#!/usr/bin/env bash
# The CI regression gate (docs/ci.md): run the pull request's config on the shared tracking server,
# gate it against the baseline run there, and write the verdict as Markdown for the PR.
#
#   scripts/ci_gate.sh [HYDRA_OVERRIDE ...]      # the PR's config: conf/ as checked out, plus these
#   GATE_MODE=baseline scripts/ci_gate.sh [HYDRA_OVERRIDE ...]   # on main: log the baseline run only
#
# Environment:
#   MLFLOW_TRACKING_URI  the shared tracking server (required; http(s)://…)
#   GATE_BASELINE        the baseline run: id, or a run name unique on the server; or
#   GATE_BASELINE_EXPERIMENT  the newest FINISHED run of this experiment is the baseline
#                        (what GATE_MODE=baseline writes on every push to main)
#   GATE_EXPERIMENT      experiment the candidate run is logged to (default: ci); one per PR keeps
#                        "the newest finished run" this PR's own
#   GATE_ARGS            extra arguments for the gate (e.g. "--metric hit_at_5 --margin 0.05")
#   GATE_SUMMARY         file the Markdown is appended to (default: $GITHUB_STEP_SUMMARY, else gate-summary.md)
#   PYTHON               interpreter with rag-experiments installed (default: python)
# Exit codes (the gate's): 0 pass, 1 a metric failed, 2 bad input (missing variable, failed sweep,
# unknown baseline, different eval sets …); on 2 the summary says what went wrong.
set -uo pipefail

PYTHON=${PYTHON:-python}
EXPERIMENT=${GATE_EXPERIMENT:-ci}
SUMMARY=${GATE_SUMMARY:-${GITHUB_STEP_SUMMARY:-gate-summary.md}}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

bad_input() {  # message → stderr and the summary, exit 2
  echo "ci_gate.sh: $1" >&2
  printf '## Regression gate: not run\n\n%s\n\n```\n%s\n```\n' "$1" "$(tail -n 20 "$work/log" 2>/dev/null)" >>"$SUMMARY"
  exit 2
}

[ -n "${MLFLOW_TRACKING_URI:-}" ] || bad_input "MLFLOW_TRACKING_URI is not set: point it at the shared tracking server"
export MLFLOW_TRACKING_URI
if [ "${GATE_MODE:-gate}" != baseline ] && [ -z "${GATE_BASELINE:-}" ]; then
  [ -n "${GATE_BASELINE_EXPERIMENT:-}" ] ||
    bad_input "neither GATE_BASELINE (a run id) nor GATE_BASELINE_EXPERIMENT is set: the gate has no baseline"
  repo=$(cd "$(dirname "$0")/.." && pwd)
  GATE_BASELINE=$("$PYTHON" "$repo/scripts/latest_run.py" "$GATE_BASELINE_EXPERIMENT" 2>"$work/log") ||
    bad_input "no baseline: no finished run in experiment $GATE_BASELINE_EXPERIMENT on $MLFLOW_TRACKING_URI"
fi

# 1. the candidate: the PR's config, logged to the shared server (tracking=server reads the URI
#    from MLFLOW_TRACKING_URI, which wins over the config: tracking/uri.py)
"$PYTHON" -m rag_experiments.sweep tracking=server experiment_name="$EXPERIMENT" progress=false force=true \
  "hydra.run.dir=$work/outputs" "$@" >"$work/log" 2>&1 ||
  bad_input "the candidate's sweep failed (exit $?): the PR's config does not run"
candidate=$(grep -oE '\(run [0-9a-f]{32},' "$work/log" | tail -n 1 | grep -oE '[0-9a-f]{32}')
[ -n "$candidate" ] || bad_input "the sweep printed no run id"
if [ "${GATE_MODE:-gate}" = baseline ]; then
  echo "baseline run: $candidate (experiment $EXPERIMENT)"
  exit 0
fi
echo "candidate run: $candidate (experiment $EXPERIMENT), baseline: $GATE_BASELINE"

# 2. the gate; its Markdown goes to the summary whatever the verdict
# shellcheck disable=SC2086  # GATE_ARGS is a list of arguments
"$PYTHON" -m rag_experiments.gate --baseline "$GATE_BASELINE" --candidate "$candidate" \
  --summary-md "$work/summary.md" ${GATE_ARGS:-} 2>"$work/log"
code=$?
cat "$work/log" >&2
if [ "$code" = 2 ] || [ ! -f "$work/summary.md" ]; then
  bad_input "the gate could not compare the runs (exit $code)"
fi
cat "$work/summary.md" >>"$SUMMARY"
exit "$code"

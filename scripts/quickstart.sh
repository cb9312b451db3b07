#!/usr/bin/env bash
# Quickstart command 1: set up (idempotent) and run the default sweep on the bundled sample.
# Extra arguments are Hydra overrides, e.g. `bash scripts/quickstart.sh generator=none` (retrieval
# only) or `bash scripts/quickstart.sh generation_subset=null` (generate for all 168 questions, not
# the default stratified subset of 24; see README "How long it takes").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
.venv/bin/python -m rag_experiments.evalset validate
exec .venv/bin/python -m rag_experiments.sweep "$@"

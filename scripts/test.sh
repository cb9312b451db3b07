#!/usr/bin/env bash
# Quickstart command 2: set up (idempotent, with the dev extra) and run the test suite.
#   scripts/test.sh           everything (CI)
#   scripts/test.sh --fast    the unit tier: pytest -m "not slow" (slow tests: tests/conftest.py)
# Other arguments go to pytest.
# Tests run in parallel (pytest-xdist): RAG_TEST_WORKERS processes (default 3, measured on 2 cores:
# most slow tests wait on servers and subprocesses rather than burn CPU; "auto" = one per CPU),
# --dist loadfile so that a test file's tests and its module-scoped sweeps and servers stay on one
# worker, longest files first (tests/conftest.py, HEAVY_FILES).
# Serially (e.g. for --pdb): RAG_TEST_WORKERS=0 scripts/test.sh, or scripts/test.sh -n 0 (a later -n wins).
set -euo pipefail
args=(-n "${RAG_TEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder) fast=0
for a in "$@"; do
  if [ "$a" = "--fast" ]; then fast=1; args+=(-m "not slow"); else args+=("$a"); fi
done
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
# Headless Chromium checks the HTML report; install it once (Debian package). Full run only: the
# fast tier needs neither Chromium nor PostgreSQL.
if [ "$fast" = 0 ] && ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "warning: could not install chromium; the report rendering test will fail" >&2
fi
# PostgreSQL backs the tracking-server tests (scripts/mlflow_server.sh); Debian package.
if [ "$fast" = 0 ] && [ ! -x /usr/lib/postgresql/15/bin/initdb ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) \
    || echo "warning: could not install postgresql; tests/test_server.py will fail" >&2
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/python -m pytest ${args[@]+"${args[@]}"}

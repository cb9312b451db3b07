"""Print pip's effective configuration as ``uv pip install`` arguments, one per line (scripts/setup.sh).

uv reads none of pip's configuration, so setup.sh hands it pip's own: the pip.conf files and the
``PIP_*`` variables, as ``pip config list`` shows them (the environment wins over the files, the
``install`` section over ``global``). Translated:

- ``index-url``, ``extra-index-url``, ``find-links``, ``constraint``, ``no-index`` and
  ``trusted-host`` to uv's flags of the same meaning;
- with more than one index, ``--index-strategy unsafe-best-match``: pip takes the best version
  from all its indexes, uv by default takes every package from the first index that has it;
- ``cert`` to a last line ``SSL_CERT_FILE=<path>``, which setup.sh exports for uv (uv reads the
  variable, not pip's key).

Standard library only: it runs in the fresh virtualenv before anything is installed there.
"""

from __future__ import annotations

import ast
import subprocess
import sys

_SCOPE_RANK = {"global": 0, "install": 1, ":env:": 2}  # later wins, as in pip
_FLAGS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraints",
    "trusted-host": "--allow-insecure-host",
}


def pip_config(listing: str) -> dict[str, str]:
    """``pip config list`` output (``scope.key='value'`` lines) -> key -> effective value."""
    ranked: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        name, sep, raw = line.partition("=")
        scope, _, key = name.rpartition(".")
        if not sep or scope not in _SCOPE_RANK:
            continue
        value = ast.literal_eval(raw)
        if key not in ranked or _SCOPE_RANK[scope] >= ranked[key][0]:
            ranked[key] = (_SCOPE_RANK[scope], str(value))
    return {key: value for key, (_, value) in ranked.items()}


def uv_args(conf: dict[str, str]) -> list[str]:
    """uv pip install arguments for pip's configuration ``conf`` (see the module docstring)."""
    args: list[str] = []
    for key, flag in _FLAGS.items():
        for value in conf.get(key, "").split():
            args += [flag, value]
    if conf.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        args.append("--no-index")
    if conf.get("extra-index-url", "").split():
        args += ["--index-strategy", "unsafe-best-match"]
    if conf.get("cert"):
        args.append(f"SSL_CERT_FILE={conf['cert']}")
    return args


def main() -> None:
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    print("\n".join(uv_args(pip_config(listing))))


if __name__ == "__main__":
    main()

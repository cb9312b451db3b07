"""``python -m rag_experiments.sweep [-m] [overrides]``: the Hydra entry point.

Thin shim: the job lives in ``rag_experiments.run.sweep`` (docs/architecture.md, "The run path").
"""

from __future__ import annotations

from rag_experiments.run.sweep import cli

if __name__ == "__main__":
    cli()

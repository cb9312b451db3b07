"""``python -m rag_experiments.gate``: pass/fail a candidate against a baseline.

Thin shim: the command lives in ``rag_experiments.cli.gate``.
"""

from __future__ import annotations

import sys

from rag_experiments.cli.gate import main

if __name__ == "__main__":
    sys.exit(main())

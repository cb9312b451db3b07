"""``python -m rag_experiments.select``: pick a config from a sweep.

Thin shim: the command lives in ``rag_experiments.cli.select``.
"""

from __future__ import annotations

import sys

from rag_experiments.cli.select import main

if __name__ == "__main__":
    sys.exit(main())

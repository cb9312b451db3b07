"""``python -m rag_experiments.compare``: compare two runs or a sweep.

Thin shim: the command lives in ``rag_experiments.cli.compare``.
"""

from __future__ import annotations

import sys

from rag_experiments.cli.compare import main

if __name__ == "__main__":
    sys.exit(main())

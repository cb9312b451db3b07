"""``python -m rag_experiments.plan --pilot RUN [--effect 0.03] [--alpha 0.05 --power 0.8]``.

Thin shim: the command lives in ``rag_experiments.cli.plan`` (docs/metrics.md, "Replicates, noise
and power").
"""

from __future__ import annotations

import sys

from rag_experiments.cli.plan import main

if __name__ == "__main__":
    sys.exit(main())

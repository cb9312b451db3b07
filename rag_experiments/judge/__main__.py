"""``python -m rag_experiments.judge fit|card``: the command lives in ``rag_experiments.judge``."""

from rag_experiments.cli.judge import main

raise SystemExit(main())

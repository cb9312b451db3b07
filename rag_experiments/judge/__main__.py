"""``python -m rag_experiments.judge fit|card``: the command lives in ``rag_experiments.cli.judge``
(run, not imported: the judges sit below the CLIs)."""

import runpy

runpy.run_module("rag_experiments.cli.judge", run_name="__main__")

"""``python -m rag_experiments.evalset validate|import-squad|import-beir|generate``: the command
lives in ``rag_experiments.cli.evalset``."""

import runpy

runpy.run_module("rag_experiments.cli.evalset", run_name="__main__")

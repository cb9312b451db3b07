"""rag-experiments: measure changes to a RAG pipeline one factor at a time (docs/architecture.md)."""

import os

# Offline by default: MLflow 3.x sends usage telemetry (and fetches a model catalog for GenAI
# judges) unless told not to; a user who wants either sets the variable themselves.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

# OpenMP threads (torch's MiniLM, scikit-learn, llama.cpp) sleep while they wait for work instead
# of spinning. On a 2-core machine shared with other jobs a spinning thread burns the core its
# partner needs: MiniLM embedding 400 texts at load 14-20 took 8.5-10.2 s CPU and 26-37 s wall
# with spinning, 5.0 s and 20 s passive, bit-identical vectors (issue 42, item 13). Read once when
# each OpenMP runtime loads, so it is set here, before any of them; a user's own value wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

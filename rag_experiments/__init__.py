"""rag-experiments: measure changes to a RAG pipeline one factor at a time (docs/architecture.md)."""

import os

# Offline by default: MLflow 3.x sends usage telemetry (and fetches a model catalog for GenAI
# judges) unless told not to; a user who wants either sets the variable themselves.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

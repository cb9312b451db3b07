import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# MLFLOW_TRACKING_URI wins over --tracking-uri (tracking/uri.py): a developer's exported server
# URI must not redirect the tests' temporary stores.
os.environ.pop("MLFLOW_TRACKING_URI", None)


@pytest.fixture(autouse=True)
def _no_leaked_tracking_uri():
    """``mlflow.set_tracking_uri`` also exports MLFLOW_TRACKING_URI; one test's store must not
    become the next test's (the variable wins over ``--tracking-uri``)."""
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    yield
    os.environ.pop("MLFLOW_TRACKING_URI", None)


SHARED = Path(__file__).resolve().parent.parent.parent / "shared"
DATASETS = SHARED / "datasets"


@pytest.fixture
def shared_datasets() -> Path:
    if not DATASETS.is_dir():
        pytest.skip(f"shared datasets not present at {DATASETS}")
    return DATASETS

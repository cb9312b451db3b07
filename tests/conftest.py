import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# MLFLOW_TRACKING_URI wins over --tracking-uri (tracking/uri.py): a developer's exported server
# URI must not redirect the tests' temporary stores.
os.environ.pop("MLFLOW_TRACKING_URI", None)

SHARED = Path(__file__).resolve().parent.parent.parent / "shared"
DATASETS = SHARED / "datasets"


@pytest.fixture
def shared_datasets() -> Path:
    if not DATASETS.is_dir():
        pytest.skip(f"shared datasets not present at {DATASETS}")
    return DATASETS

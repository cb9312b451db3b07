"""MLflow's "Inferred schema contains integer column(s)" paragraph is silenced where it is raised,
and no other warning with it (issue 37: it printed on every run)."""

from __future__ import annotations

import warnings

import mlflow
import pandas as pd
from mlflow.tracking import MlflowClient

from rag_experiments.tracking import writer


def _log(tmp_path) -> list[warnings.WarningMessage]:
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.create_experiment("e", artifact_location=str(tmp_path / "mlruns"))
    run_id = client.create_run(exp).info.run_id
    per_query = pd.DataFrame({"id": ["a", "b"], "query": ["q1", "q2"], "hit_at_1": [1.0, 0.0]})
    evalset = pd.DataFrame({"id": ["a", "b"], "query": ["q1", "q2"], "n_evidence": [1, 2]})  # an int column
    (tmp_path / "evalset.jsonl").write_text("{}\n")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        writer.log_results(
            client, run_id, {"hit_at_1": 0.5}, per_query, evalset, str(tmp_path / "evalset.jsonl"), "d" * 64, {}, {}
        )
    assert client.get_run(run_id).inputs.dataset_inputs, "the eval set is still recorded"
    return seen


def test_the_integer_schema_hint_is_not_printed(tmp_path):
    messages = [str(w.message) for w in _log(tmp_path)]
    assert not [m for m in messages if "Inferred schema contains integer" in m], messages
    assert not [m for m in messages if "can be interpreted in multiple ways" in m], messages


def test_other_warnings_still_show(tmp_path, monkeypatch):
    """Fault injection: a warning MLflow might raise one day, inside the quieted block, is shown."""
    real = mlflow.data.from_pandas

    def from_pandas(*a, **kw):
        warnings.warn("something new about datasets", UserWarning, stacklevel=2)
        return real(*a, **kw)

    monkeypatch.setattr(mlflow.data, "from_pandas", from_pandas)
    assert "something new about datasets" in [str(w.message) for w in _log(tmp_path)]


def test_only_the_exact_messages_are_ignored():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with writer.no_mlflow_noise():
            warnings.warn("Hint: Inferred schema contains integer column(s). Integer columns ...", UserWarning, stacklevel=1)
            warnings.warn("The specified dataset source can be interpreted in multiple ways: A, A. MLflow", UserWarning, stacklevel=1)
            warnings.warn("The specified dataset source can be interpreted in multiple ways: A, B. MLflow", UserWarning, stacklevel=1)
            warnings.warn("Hint: Inferred schema contains integer column(s).", DeprecationWarning, stacklevel=1)
    assert [(w.category, str(w.message)[-12:]) for w in seen] == [
        (UserWarning, "A, B. MLflow"),  # two different sources: news
        (DeprecationWarning, "r column(s)."),  # another category
    ]

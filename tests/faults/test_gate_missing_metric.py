"""`gate` with its default metrics when one run lacks one of them (a dead judge left faithfulness
all NaN): it refuses (exit 2, naming the metric and the run) instead of passing on the rest."""

from __future__ import annotations

import numpy as np
import pandas as pd
from mlflow.tracking import MlflowClient

from rag_experiments.cli import gate

N = 40


def _log(client, exp, tmp, name, faith) -> str:
    rid = client.create_run(
        exp, run_name=name, tags={"evalset_digest": "e1", "corpus_digest": "c1"}
    ).info.run_id
    hits = np.array([1.0 if i % 4 else 0.0 for i in range(N)])
    table = {"id": [f"q{i}" for i in range(N)], "hit_at_5": hits, "mrr": hits * 0.5, "error": [None] * N}
    if faith is not None:
        table["faithfulness"] = faith
    path = tmp / rid / "per_query.parquet"
    path.parent.mkdir()
    pd.DataFrame(table).to_parquet(path)
    client.log_artifact(rid, str(path))
    client.set_terminated(rid)
    return rid


def test_gate_refuses_when_a_default_metric_is_missing_from_one_run(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("rag", artifact_location=str(tmp_path / "mlruns"))
    judged = _log(client, exp, tmp_path, "judged", np.full(N, 0.9))
    dead = _log(client, exp, tmp_path, "dead-judge", np.full(N, np.nan))
    retrieval = [_log(client, exp, tmp_path, f"retrieval-{i}", None) for i in range(2)]

    assert gate.main(["--baseline", judged, "--candidate", dead, "--tracking-uri", uri]) == 2
    err = capsys.readouterr().err
    assert "faithfulness" in err and "dead-judge" in err, err
    # retrieval-only on both sides: faithfulness is not a metric of either run, nothing dropped
    assert gate.main(["--baseline", retrieval[0], "--candidate", retrieval[1], "--tracking-uri", uri]) == 0

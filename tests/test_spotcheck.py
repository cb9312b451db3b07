"""Judge spot-check: sample → label → score round trip on a hand-logged run in a temp MLflow store."""

from __future__ import annotations

import csv
import json
import math
import tempfile
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from rag_experiments import spotcheck

CONTEXT = "Webhooks retry with exponential backoff for 24 hours. After that the delivery is marked failed."
# (label, score) per claim; the judge decides at score >= 0.0 (judge.threshold)
VERDICTS = {
    "q1": [("supported", 3.1), ("unsupported", -2.5)],
    "q2": [("supported", 0.4), ("supported", 5.0), ("unsupported", -0.2)],
    "q3": [("unsupported", -4.0), ("unparseable", None)],
    "q4": [("supported", 1.2), ("unsupported", -0.9), ("supported", 0.1)],
    "q5": [("supported", 2.2), ("unsupported", -1.5)],
}


def _per_query() -> pd.DataFrame:
    rows = []
    for qid, vs in VERDICTS.items():
        claims = [f"claim {j} of {qid}, with a comma" for j in range(len(vs))]
        rows.append(
            {
                "id": qid,
                "query": f"question {qid}?",
                "tags": ["exact"],
                "answer": " ".join(claims),
                "context": CONTEXT + '\n\nsecond chunk, "quoted"\nacross lines',
                "claims": json.dumps(claims),
                "verdicts": json.dumps(
                    [
                        {"claim": c, "label": lab, "score": sc, "rationale": f"why {c}"}
                        for c, (lab, sc) in zip(claims, vs, strict=True)
                    ]
                ),
                "faithfulness": 0.5,
            }
        )
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    # one store for the module: creating a sqlite MLflow schema costs seconds
    tmp_path = tmp_path_factory.mktemp("spotcheck_store")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("spot", artifact_location=(tmp_path / "mlruns").as_uri())
    run = client.create_run(
        exp,
        run_name="gen-run",
        tags={
            "generator_model": "SmolLM2-135M-Instruct",
            "judge_model": "SmolLM2-135M-Instruct",
            "judge_is_generator": "true",
        },
    )
    client.log_param(run.info.run_id, "judge", "local")
    client.log_param(run.info.run_id, "judge.threshold", "0.0")
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "per_query.parquet"
        _per_query().to_parquet(p, index=False)
        client.log_artifact(run.info.run_id, str(p))
    client.set_terminated(run.info.run_id, "FINISHED")
    retr = client.create_run(exp, run_name="retr")
    p = tmp_path / "per_query.parquet"
    pd.DataFrame({"id": ["q1"], "query": ["x"], "hit_at_5": [1.0]}).to_parquet(p, index=False)
    client.log_artifact(retr.info.run_id, str(p))
    return uri, client, run.info.run_id


def _read(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _write(path: Path, rows: list[dict], fields: list[str] | None = None) -> None:
    fields = fields or list(rows[0])
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def test_sample_is_seeded_stratified_and_has_the_columns(store, tmp_path):
    uri, _, rid = store
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    for out in (a, b):
        assert (
            spotcheck.main(
                [
                    "--tracking-uri",
                    uri,
                    "sample",
                    "gen-run",
                    "-n",
                    "6",
                    "--stratify",
                    "--seed",
                    "3",
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
    assert a.read_text() == b.read_text()  # seeded
    rows = _read(a)
    assert list(rows[0]) == spotcheck.COLUMNS
    assert len(rows) == 6
    verdicts = [r["judge_verdict"] for r in rows]
    # 1 unparseable claim exists: it is taken, its unused share goes to the other two labels
    assert verdicts.count("unparseable") == 1
    assert verdicts.count("supported") + verdicts.count("unsupported") == 5
    assert min(verdicts.count("supported"), verdicts.count("unsupported")) >= 2
    assert all(r["human_verdict"] == "" for r in rows)
    assert all(r["context"].startswith("Webhooks retry") and "across lines" in r["context"] for r in rows)
    # every sampled claim is the run's claim at that index
    for r in rows:
        qid, j = r["item_id"].split("#")
        assert r["claim"] == f"claim {j} of {qid}, with a comma"


def test_borderline_claims_are_over_weighted():
    import numpy as np

    w = spotcheck.sample_weights(np.array([0.05, -0.1, 3.0, -4.0, float("nan")]), threshold=0.0)
    assert w[0] > w[2] and w[1] > w[3]  # near the threshold weighs more
    assert w[4] == 1.0 and w.max() <= 1 + spotcheck.BORDERLINE_BOOST
    assert (spotcheck.sample_weights(np.array([1.0, 2.0]), None) == 1.0).all()
    claims = pd.DataFrame({"judge_verdict": ["supported"] * 40, "judge_score": [0.01] * 20 + [9.0] * 20})
    near = sum(
        (spotcheck.sample_claims(claims.assign(i=range(40)), 10, seed=s, threshold=0.0)["i"] < 20).sum()
        for s in range(30)
    )
    assert near / 300 > 0.6  # borderline half gets well over half of the draws


def _kappa_by_hand(pairs: list[tuple[str, str]]) -> float:
    n = len(pairs)
    po = sum(h == j for h, j in pairs) / n
    hs = sum(h == "supported" for h, _ in pairs) / n
    js = sum(j == "supported" for _, j in pairs) / n
    pe = hs * js + (1 - hs) * (1 - js)
    return (po - pe) / (1 - pe)


def test_score_round_trip_kappa_confusion_and_logging(store, tmp_path, capsys):
    uri, client, rid = store
    out = tmp_path / "labels.csv"
    assert spotcheck.main(["--tracking-uri", uri, "sample", rid, "-n", "100", "--out", str(out)]) == 0
    rows = _read(out)
    assert len(rows) == 12  # every claim
    # the human disagrees on two judge-supported claims and one judge-unsupported one; one row blank
    flip = {"q2#0": "unsupported", "q4#2": "unsupported", "q1#1": "supported"}
    pairs = []
    for r in rows:
        if r["item_id"] == "q5#1":
            continue  # left blank
        human = flip.get(
            r["item_id"], r["judge_verdict"] if r["judge_verdict"] != "unparseable" else "supported"
        )
        r["human_verdict"] = human.upper() if r["item_id"] == "q1#0" else human  # case-insensitive
        if r["judge_verdict"] != "unparseable":
            pairs.append((human, r["judge_verdict"]))
    _write(out, rows)
    capsys.readouterr()
    assert spotcheck.main(["--tracking-uri", uri, "score", "gen-run", str(out)]) == 0
    cap = capsys.readouterr()
    assert "self-preference" in cap.err  # judge model == generator model

    labels = spotcheck.read_labels(out, spotcheck.judged_claims(_per_query()))
    ag = spotcheck.score_labels(labels)
    assert ag.n == len(pairs) == 10 and ag.n_blank == 1 and ag.n_judge_unparseable == 1
    assert math.isclose(ag.kappa, _kappa_by_hand(pairs))
    assert math.isclose(ag.agreement, 7 / 10)
    lo, hi = ag.kappa_ci
    assert -1 <= lo <= ag.kappa <= hi <= 1
    assert ag.confusion.loc["human unsupported", "judge supported"] == 2
    assert ag.confusion.loc["human supported", "judge unsupported"] == 1
    # leniency: judge said supported on 2 of the human's 5 unsupported; strictness 1 of 5
    assert math.isclose(ag.leniency, 2 / 5) and math.isclose(ag.strictness, 1 / 5)

    run = client.get_run(rid)
    assert math.isclose(run.data.metrics["spotcheck/kappa"], ag.kappa)
    assert run.data.metrics["spotcheck/n"] == 10
    assert run.data.metrics["spotcheck/n_judge_unparseable"] == 1
    assert run.data.metrics["spotcheck/confusion/human_unsupported/judge_supported"] == 2
    assert "spotcheck/kappa_ci_low" in run.data.metrics and "spotcheck/leniency" in run.data.metrics
    arts = {a.path for a in client.list_artifacts(rid, "spotcheck")}
    assert arts == {"spotcheck/labels.csv", "spotcheck/summary.md"}
    assert "Cohen's κ" in cap.out and "human unsupported" in cap.out


def test_malformed_label_files_exit_2_with_file_line(store, tmp_path, capsys):
    uri, _, rid = store
    out = tmp_path / "labels.csv"
    spotcheck.main(["--tracking-uri", uri, "sample", rid, "-n", "5", "--seed", "1", "--out", str(out)])
    rows = _read(out)
    capsys.readouterr()

    # unknown verdict value, unknown item, claim edited; multi-line context cells shift physical lines
    bad = [dict(r) for r in rows]
    bad[0]["human_verdict"] = "maybe"
    bad[1]["human_verdict"] = "supported"
    bad[1]["item_id"] = "q9#0"
    bad[2]["human_verdict"] = "unsupported"
    bad[2]["claim"] = "something else entirely"
    _write(out, bad)
    assert spotcheck.main(["--tracking-uri", uri, "score", rid, str(out), "--no-log"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    text = out.read_text()
    starts = _record_start_lines(text)
    assert err[0] == f"{out}:{starts[0]}: human_verdict: 'maybe' is not one of supported, unsupported"
    assert err[1].startswith(f"{out}:{starts[1]}: item_id: 'q9#0' is not a judged claim")
    assert err[2].startswith(f"{out}:{starts[2]}: claim: does not match")

    # missing column
    _write(out, [{k: v for k, v in r.items() if k != "human_verdict"} for r in rows])
    assert spotcheck.main(["--tracking-uri", uri, "score", rid, str(out)]) == 2
    assert capsys.readouterr().err.strip().startswith(f"{out}:1: human_verdict: missing column")

    # unknown run
    assert spotcheck.main(["--tracking-uri", uri, "score", "no-such-run", str(out)]) == 2
    assert "unknown run" in capsys.readouterr().err


def _record_start_lines(text: str) -> list[int]:
    """1-based start line of each data record (quoted fields span lines)."""
    import io

    f = io.StringIO(text, newline="")
    reader = csv.reader(f)
    next(reader)
    starts = []
    while True:
        start = reader.line_num + 1
        if next(reader, None) is None:
            return starts
        starts.append(start)


def test_retrieval_only_run_is_bad_input(store, capsys):
    uri, _, _ = store
    assert spotcheck.main(["--tracking-uri", uri, "sample", "retr"]) == 2
    assert "no judged claims" in capsys.readouterr().err

"""Answer-level spot-check and the correctness card, end to end on a logged run in a temp MLflow
store: sample-answers (blind CSV) → a human fills human_answer → score-answers (card, κ with CI,
logged)."""

from __future__ import annotations

import csv
import math
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from rag_experiments.judge.agreement import cohen_kappa
from rag_experiments.spotcheck import main
from rag_experiments.spotcheck.answers import generated_answers, view_labels

# (answer, declined, correctness, faithfulness, what a human reads): real shapes of SmolLM2 answers
ANSWERS = {
    "a1": ("Webhooks are retried for 24 hours [1].", False, 1.0, 1.0, "correct"),
    "a2": ("Function routes also take POST and GET.", False, 1.0, 1.0, "incorrect"),  # a weak fact matched
    "a3": ("I don't know.", True, 0.0, math.nan, "declined"),
    "a4": ("You can use the environment variable to set it.", False, 0.0, 0.0, "incorrect"),
    "a5": ("Refunds take 5-10 business days.", False, 1.0, 0.0, "correct"),  # the judge missed it
    "a6": ("I don't know, but keys rotate every 7 days.", False, 0.0, 1.0, "incorrect"),  # a hedge: answered
    "a7": ("The limit is 100 per page.", False, math.nan, 1.0, "correct"),  # only weak facts: no correctness
    "a8": ("There is no mention of that in the context.", True, 1.0, math.nan, "declined"),
}


def _per_query() -> pd.DataFrame:
    rows = [
        {
            "id": k, "query": f"question {k}?", "context": "ctx " + k, "answer": a, "error": None,
            "declined": d, "correctness": c, "faithfulness": f,
        }
        for k, (a, d, c, f, _) in ANSWERS.items()
    ]  # fmt: skip
    rows.append(
        {"id": "a9", "query": "q?", "context": "", "answer": None, "error": "timeout"}
    )  # not generated
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("answer_card")
    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("cards", artifact_location=(root / "mlruns").as_uri())
    r = client.create_run(exp, run_name="gen-run")
    client.log_param(r.info.run_id, "attribution.correct", "0.5")
    client.log_param(r.info.run_id, "attribution.faithful", "0.5")
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "per_query.parquet"
        _per_query().to_parquet(p, index=False)
        client.log_artifact(r.info.run_id, str(p))
    client.set_terminated(r.info.run_id, "FINISHED")
    return uri, client, r.info.run_id


def test_view_labels_decline_threshold_and_nan():
    ans = generated_answers(_per_query())
    assert list(ans["answer_id"]) == list(ANSWERS)  # a9 failed: not an answer to label
    lab = view_labels(ans, "correctness", 0.5)
    assert list(lab) == [
        "correct",
        "correct",
        "declined",
        "incorrect",
        "correct",
        "incorrect",
        None,
        "declined",
    ]


def test_sample_label_score_end_to_end(run, tmp_path, capsys):
    uri, client, run_id = run
    out = tmp_path / "answers.csv"
    assert main(["--tracking-uri", uri, "sample-answers", run_id, "-n", "20", "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == ["answer_id", "query", "context", "answer", "inclusion_prob", "human_answer"]
    assert len(rows) == 8 and {r["answer_id"] for r in rows} == set(ANSWERS)
    text = out.read_text()
    assert "correctness" not in text and "faithfulness" not in text and "declined" not in text  # blind
    for r in rows:
        r["human_answer"] = ANSWERS[r["answer_id"]][4]
    rows[0]["human_answer"] = ""  # a blank row is skipped and counted
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    capsys.readouterr()
    assert main(["--tracking-uri", uri, "score-answers", run_id, str(out), "--resamples", "300"]) == 0
    card = capsys.readouterr().out
    assert "7 answers labelled by hand" in card and "1 blank rows skipped" in card
    # by hand, a2..a8 (a1 blank): correctness view  c, d, i, c, i, -, d  vs human  i, d, i, c, i, c, d
    # 1 correct, 3 incorrect, 2 declined by hand: κ is too few to say (evaluation.intervals)
    assert (
        "| correctness | `correctness` ≥ 0.5 | 6 | 1 | 0.83 | too few to say (1 correct, 2 declined, 3 incorrect;"
        in card
    )
    # judge view: a3, a8 declined; a7 faithful → correct; a2 faithful, a4 not, a5 not, a6 faithful
    hj = ["incorrect", "declined", "incorrect", "correct", "incorrect", "correct", "declined"]
    vj = ["correct", "declined", "incorrect", "incorrect", "correct", "correct", "declined"]
    assert f"| judge | `faithfulness` ≥ 0.5 | 7 | 0 | {4 / 7:.2f} | too few to say (" in card
    assert hj and vj
    m = client.get_run(run_id).data.metrics
    assert m["spotcheck/answers/n"] == 7
    assert "spotcheck/answers/correctness/kappa" not in m  # too few to say: not logged as a figure
    assert m["spotcheck/answers/judge/n"] == 7 and m["spotcheck/answers/correctness/n_unscored"] == 1
    assert "spotcheck/answers/judge/kappa_ci_low" not in m and m["spotcheck/answers/judge/agreement"] == 4 / 7
    arts = {a.path for a in client.list_artifacts(run_id, "spotcheck")}
    assert "spotcheck/correctness_card.md" in arts and "spotcheck/answers" in arts


def test_bad_answer_labels_exit_2_with_file_line(run, tmp_path, capsys):
    uri, _, run_id = run
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "answer_id,answer,human_answer\n"
        "a1,Webhooks are retried for 24 hours [1].,maybe\n"
        "zz,x,correct\n"
        "a2,another answer,correct\n"
        "a3,I don't know.,declined\n"
        "a3,I don't know.,declined\n"
    )
    assert main(["--tracking-uri", uri, "score-answers", run_id, str(bad), "--no-log"]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2: human_answer: 'maybe' is not one of correct, incorrect, declined" in err
    assert f"{bad}:3: answer_id: 'zz' is not a generated answer of the run" in err
    assert f"{bad}:4: answer: does not match the run's answer a2" in err
    assert f"{bad}:6: answer_id: 'a3' already labelled on line 5" in err


def test_kappa_of_the_card_matches_sklearn():
    from sklearn.metrics import cohen_kappa_score

    rng = np.random.default_rng(0)
    a = rng.choice(["correct", "incorrect", "declined"], 40)
    b = np.where(rng.random(40) < 0.7, a, rng.choice(["correct", "incorrect", "declined"], 40))
    assert cohen_kappa(a, b) == pytest.approx(cohen_kappa_score(a, b))


def test_one_human_label_is_called_out(run, tmp_path, capsys):
    uri, _, run_id = run
    f = tmp_path / "all_incorrect.csv"
    f.write_text("answer_id,answer,human_answer\n" + "".join(
        f'{k},"{a}",incorrect\n' for k, (a, *_rest) in ANSWERS.items() if k in ("a2", "a4")
    ))  # fmt: skip
    assert (
        main(["--tracking-uri", uri, "score-answers", run_id, str(f), "--no-log", "--resamples", "50"]) == 0
    )
    out = capsys.readouterr().out
    assert "too few to say (0 correct, 2 incorrect;" in out or "too few to say (2 incorrect, " in out, out


def test_the_card_validates_correctness_judged_beside_string_match_on_the_same_answers():
    """Issue 45 (2): a run whose judge model read the key facts gets a correctness_judged view on
    the same labelled answers; a run without it gets none (not a row of declines alone)."""
    from types import SimpleNamespace

    from rag_experiments.spotcheck.answers import answer_card, generated_answers

    table = _per_query()
    human = {k: v[4] for k, v in ANSWERS.items()}
    # the judge model reads meaning: right where the human is, except a7 (no key facts: NaN)
    table["correctness_judged"] = [1.0 if human.get(i) == "correct" else 0.0 for i in table["id"]]
    table.loc[table["id"] == "a7", "correctness_judged"] = math.nan
    labels = pd.DataFrame({"answer_id": list(human), "human": list(human.values())})
    run = SimpleNamespace(params={"attribution.correct": "0.5", "attribution.faithful": "0.5"})
    rows = {r.view: r for r in answer_card(run, generated_answers(table), labels, n_resamples=50)}
    assert rows["correctness_judged"].agreement == 1.0 and rows["correctness"].agreement < 1.0
    assert rows["correctness_judged"].n == rows["correctness"].n  # a7: no key facts, NaN in both
    no_judge = {r.view for r in answer_card(run, generated_answers(_per_query()), labels, n_resamples=50)}
    assert "correctness_judged" not in no_judge and "correctness" in no_judge

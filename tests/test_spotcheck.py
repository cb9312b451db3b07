"""Judge spot-check: sample → label → score round trip on a hand-logged run in a temp MLflow store."""

from __future__ import annotations

import csv
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
                "claims": claims,
                "verdicts": [
                    {"claim": c, "label": lab, "score": sc, "rationale": f"why {c}"}
                    for c, (lab, sc) in zip(claims, vs, strict=True)
                ],
                "faithfulness": 0.5,
            }
        )
    return pd.DataFrame(rows)


def judged_run(root: Path, tags: dict[str, str]):
    """A FINISHED generation run judged by `local` with ``_per_query()``'s table, in a fresh store."""
    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("spot", artifact_location=(root / "mlruns").as_uri())
    run = client.create_run(exp, run_name="gen-run", tags=tags)
    client.log_param(run.info.run_id, "judge", "local")
    client.log_param(run.info.run_id, "judge.threshold", "0.0")
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "per_query.parquet"
        _per_query().to_parquet(p, index=False)
        client.log_artifact(run.info.run_id, str(p))
    client.set_terminated(run.info.run_id, "FINISHED")
    return uri, client, exp, run.info.run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    # one store for the module: creating a sqlite MLflow schema costs seconds
    tmp_path = tmp_path_factory.mktemp("spotcheck_store")
    model = "SmolLM2-135M-Instruct"
    tags = {"generator_model": model, "judge_model": model, "judge_is_generator": "true"}
    uri, client, exp, run_id = judged_run(tmp_path, tags)
    retr = client.create_run(exp, run_name="retr")
    p = tmp_path / "per_query.parquet"
    pd.DataFrame({"id": ["q1"], "query": ["x"], "hit_at_5": [1.0]}).to_parquet(p, index=False)
    client.log_artifact(retr.info.run_id, str(p))
    return uri, client, run_id


def judge_verdicts() -> dict[str, str]:
    """item_id → the judge's verdict, from the run's table (a blind CSV does not carry it)."""
    claims = spotcheck.judged_claims(_per_query())
    return dict(zip(claims["item_id"], claims["judge_verdict"], strict=True))


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
    # blind by default: nothing of the judge beside the empty human column
    assert list(rows[0]) == spotcheck.BLIND_COLUMNS
    assert not set(spotcheck.JUDGE_COLUMNS) & set(rows[0]) and "why claim" not in a.read_text()
    assert len(rows) == 6
    shown = tmp_path / "shown.csv"
    argv = ["--tracking-uri", uri, "sample", "gen-run", "-n", "6", "--stratify", "--seed", "3"]
    assert spotcheck.main([*argv, "--show-judge", "--out", str(shown)]) == 0
    with_judge = _read(shown)
    assert list(with_judge[0]) == spotcheck.COLUMNS  # --show-judge: the same sample, judge columns in
    assert [r["item_id"] for r in with_judge] == [r["item_id"] for r in rows]
    verdicts = [r["judge_verdict"] for r in with_judge]
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
    judge = judge_verdicts()
    assert "judge_verdict" not in rows[0]  # blind
    for r in rows:
        if r["item_id"] == "q5#1":
            continue  # left blank
        jv = judge[r["item_id"]]
        human = flip.get(r["item_id"], jv if jv != "unparseable" else "supported")
        r["human_verdict"] = human.upper() if r["item_id"] == "q1#0" else human  # case-insensitive
        if jv != "unparseable":
            pairs.append((human, jv))
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
    # scoring restored the judge's columns from the run, by item_id, beside the human labels
    with tempfile.TemporaryDirectory() as tmp:
        logged = _read(Path(client.download_artifacts(rid, "spotcheck/labels.csv", tmp)))
    assert list(logged[0]) == spotcheck.COLUMNS
    assert {r["item_id"]: r["judge_verdict"] for r in logged} == judge
    assert all(r["judge_rationale"] == f"why {r['claim']}" for r in logged)
    assert {r["item_id"]: r["human_verdict"] for r in logged} == {r["item_id"]: r["human_verdict"] for r in rows}
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


# ------------------------------------------------------------------------------ weighted estimates


def _population(n_unsupported: int = 60, n_supported: int = 20) -> pd.DataFrame:
    """Judged claims: the judge rarely says supported, and is lenient on half of those (the human
    says unsupported); near its threshold (|score| < 0.5) more claims are borderline."""
    import numpy as np

    rng = np.random.default_rng(7)
    score = np.concatenate([rng.uniform(0, 3, n_supported), -rng.uniform(0, 6, n_unsupported)])
    judge = np.where(score >= 0, "supported", "unsupported")
    human = judge.copy()
    human[:n_supported:2] = "unsupported"
    return pd.DataFrame(
        {
            "item_id": [f"c{i}" for i in range(len(score))],
            "judge_verdict": judge,
            "judge_score": score,
            "human": human,
        }
    )


def test_systematic_pps_draws_each_claim_with_its_inclusion_probability():
    import numpy as np

    from rag_experiments.judge.agreement import inclusion_probabilities, systematic_pps

    w = np.array([1.0, 1.0, 1.0, 10.0, 2.0, 4.0, 1.5])
    pi = inclusion_probabilities(w, 3)
    assert math.isclose(pi.sum(), 3) and pi[3] == 1.0 and (pi <= 1).all()
    rng = np.random.default_rng(0)
    counts = np.zeros(len(w))
    for _ in range(20000):
        drawn = systematic_pps(pi, rng)
        assert len(drawn) == 3 and len(set(drawn)) == 3
        counts[drawn] += 1
    assert np.abs(counts / 20000 - pi).max() < 0.015


def test_sample_records_the_inclusion_probability_it_drew_with():
    import numpy as np

    from rag_experiments.judge.agreement import inclusion_probabilities

    pop = _population(30, 10)
    w = spotcheck.sample_weights(pop["judge_score"].to_numpy(float), 0.0)
    for stratify in (False, True):
        s = spotcheck.sample_claims(pop, 8, stratify=stratify, seed=1, threshold=0.0)
        assert len(s) == 8
        for verdict, quota in (
            ((("supported", "unsupported"), 8),)
            if not stratify
            else (
                (("supported",), 4),
                (("unsupported",), 4),
            )
        ):
            g = pop["judge_verdict"].isin(verdict).to_numpy()
            expected = dict(zip(pop["item_id"][g], inclusion_probabilities(w[g], quota), strict=True))
            got = s[s["judge_verdict"].isin(verdict)]
            assert np.allclose(got["inclusion_prob"], got["item_id"].map(expected)), stratify


def _score_sample(pop: pd.DataFrame, seed: int, weighted: bool) -> spotcheck.Agreement:
    labels = spotcheck.Labels(_sample_rows(pop, seed), 0, Path("x.csv"), weighted=weighted, n_population=len(pop))
    return spotcheck.score_labels(labels, n_resamples=20)


def _sample_rows(pop: pd.DataFrame, seed: int) -> pd.DataFrame:
    s = spotcheck.sample_claims(pop, 12, stratify=True, seed=seed, threshold=0.0)
    truth = dict(zip(pop["item_id"], pop["human"], strict=True))
    return pd.DataFrame(
        {
            "item_id": s["item_id"],
            "claim": "",
            "human": s["item_id"].map(truth),
            "judge": s["judge_verdict"],
            "score": s["judge_score"],
            "pi": s["inclusion_prob"],
        }
    )


def test_weighted_leniency_and_kappa_estimate_the_run_not_the_boosted_sample():
    import numpy as np

    from rag_experiments.judge.agreement import agreement_figures, cohen_kappa

    pop = _population()
    true_len = float(np.mean(pop.loc[pop["human"] == "unsupported", "judge_verdict"] == "supported"))
    true_kappa = cohen_kappa(pop["human"], pop["judge_verdict"])
    est = [_score_sample(pop, seed, True) for seed in range(100)]
    raw = [_score_sample(pop, seed, False) for seed in range(100)]
    mean = lambda xs: float(np.nanmean(xs))  # noqa: E731
    assert abs(mean([a.leniency for a in est]) - true_len) < 0.05
    # κ of a 12-claim sample is "too few to say" (fewer than 5 labels in a class: not reported,
    # evaluation.intervals), so the estimator itself is checked: the weighted κ of each sample
    kappas = [agreement_figures(r["human"], r["judge"], 1 / r["pi"].to_numpy(float))["kappa"]
              for r in (_sample_rows(pop, seed) for seed in range(100))]  # fmt: skip
    assert abs(mean(kappas) - true_kappa) < 0.08
    assert all(a.kappa_too_few and np.isnan(a.kappa) for a in est if a.kappa_too_few)
    # stratifying by verdict over-represents the rare "supported" verdicts (and the boost the
    # borderline ones): the unweighted sample looks far more lenient than the run is
    assert mean([a.leniency for a in raw]) - true_len > 0.12
    assert all(a.sample["leniency"] == b.leniency for a, b in zip(est, raw, strict=True))


def test_summary_names_the_population_its_figures_describe(store, tmp_path, capsys):
    uri, _, rid = store
    out = tmp_path / "labels.csv"
    spotcheck.main(["--tracking-uri", uri, "sample", rid, "-n", "6", "--stratify", "--out", str(out)])
    rows = _read(out)
    assert all(0 < float(r["inclusion_prob"]) <= 1 for r in rows)
    for r in rows:
        r["human_verdict"] = "supported"
    _write(out, rows)
    capsys.readouterr()
    assert spotcheck.main(["--tracking-uri", uri, "score", rid, str(out), "--no-log"]) == 0
    assert "the run's 11 judged claims (parseable verdicts), estimated" in capsys.readouterr().out
    _write(out, [{k: v for k, v in r.items() if k != "inclusion_prob"} for r in rows])
    assert spotcheck.main(["--tracking-uri", uri, "score", rid, str(out), "--no-log"]) == 0
    assert "Population: the 5 labelled claims only" in capsys.readouterr().out
    rows[0]["inclusion_prob"] = "1.7"
    _write(out, rows)
    assert spotcheck.main(["--tracking-uri", uri, "score", rid, str(out), "--no-log"]) == 2
    assert "inclusion_prob: '1.7' is not a probability" in capsys.readouterr().err


def test_one_cohen_kappa_shared_with_judge_agreement_and_weighted_by_hand():
    import importlib.util

    from rag_experiments.judge import agreement

    spec = importlib.util.spec_from_file_location(
        "judge_agreement", Path(__file__).resolve().parent.parent / "scripts" / "judge_agreement.py"
    )
    ja = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ja)
    assert ja.cohen_kappa is agreement.cohen_kappa
    assert spotcheck.agreement_figures is agreement.agreement_figures  # which calls cohen_kappa
    h = ["s", "s", "u", "u", "s"]
    j = ["s", "u", "u", "s", "s"]
    w = [1.0, 2.0, 1.0, 3.0, 0.5]
    # by hand: weighted confusion, p_o and p_e from weighted marginals
    tot = sum(w)
    po = sum(wi for hi, ji, wi in zip(h, j, w, strict=True) if hi == ji) / tot
    ph = {c: sum(wi for hi, wi in zip(h, w, strict=True) if hi == c) / tot for c in "su"}
    pj = {c: sum(wi for ji, wi in zip(j, w, strict=True) if ji == c) / tot for c in "su"}
    pe = sum(ph[c] * pj[c] for c in "su")
    assert math.isclose(agreement.cohen_kappa(h, j, w), (po - pe) / (1 - pe))
    assert math.isclose(
        agreement.cohen_kappa(h, j),
        _kappa_by_hand(
            list(
                zip(
                    ["supported" if x == "s" else "unsupported" for x in h],
                    ["supported" if x == "s" else "unsupported" for x in j],
                    strict=True,
                )
            )
        ),
    )
    assert math.isnan(agreement.cohen_kappa(["s", "s"], ["s", "s"]))
    from sklearn.metrics import cohen_kappa_score  # independent implementation

    assert math.isclose(agreement.cohen_kappa(h, j, w), cohen_kappa_score(h, j, sample_weight=w))
    h3, j3 = h + ["x", "u"], j + ["u", "x"]  # three categories (judge_agreement's "unparseable")
    assert math.isclose(agreement.cohen_kappa(h3, j3), cohen_kappa_score(h3, j3))

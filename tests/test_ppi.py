"""Prediction-powered (judge-corrected) faithfulness: formula, coverage under a biased judge, CLI."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rag_experiments import spotcheck
from rag_experiments.analysis.ppi import judge_only, ppi_mean
from tests.test_spotcheck import _per_query, _read, _write, judge_verdicts, store  # noqa: F401  (fixture)


def _biased_run(rng: np.random.Generator, n_claims: int = 1500) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """True labels Y (70 % supported) and a lenient judge f: 45 % of unsupported claims pass, 5 % of
    supported ones fail; the judge's score is closer to its threshold (0) on the claims it gets wrong."""
    y = (rng.random(n_claims) < 0.7).astype(float)
    wrong = np.where(y == 1, rng.random(n_claims) < 0.05, rng.random(n_claims) < 0.45)
    f = np.where(wrong, 1 - y, y)
    mag = np.where(wrong, rng.exponential(0.3, n_claims), rng.exponential(2.0, n_claims))
    return y, f, np.where(f == 1, mag, -mag)


def test_equal_weights_is_the_classic_ppi_mean_estimator():
    f_all = np.array([1, 1, 0, 1, 0, 1, 1, 1], float)
    y, f = np.array([1, 0, 0, 1, 1]), np.array([1, 1, 0, 1, 0])
    est = ppi_mean(f_all, y, f)
    r = y - f
    assert math.isclose(est.value, f_all.mean() + r.mean())
    se = r.std(ddof=1) / math.sqrt(len(r))
    assert math.isclose(est.value - est.ci_low, 1.959963984540054 * se)
    assert est.ci_high == min(1.0, est.value + 1.959963984540054 * se) == 1.0  # clipped at the bound
    # constant weights change nothing (Hájek normalisation)
    assert math.isclose(ppi_mean(f_all, y, f, [0.3] * 5).value, est.value)
    # unequal weights: Σ w r / Σ w
    pi = np.array([0.5, 0.25, 0.5, 1.0, 0.25])
    assert math.isclose(ppi_mean(f_all, y, f, pi).value, f_all.mean() + np.sum(r / pi) / np.sum(1 / pi))
    assert math.isnan(ppi_mean(f_all, [], []).value)
    assert math.isnan(ppi_mean(f_all, [1], [0]).ci_low)  # one label: no variance estimate


def test_intervals_stay_inside_0_1_on_extreme_cases():
    """A proportion's estimate and CI are clipped to [0, 1] (docs/spotcheck.md, "Bounded outcomes")."""
    # issue 27's case: 10 labels, the judge agrees by chance; unclipped the CI reached below 0
    f_all = np.r_[np.ones(30), np.zeros(70)]
    y, f = np.array([0, 0, 0, 0, 0, 0, 0, 1, 0, 0.0]), np.array([1, 0, 1, 0, 1, 0, 0, 0, 1, 0.0])
    raw_low = f_all.mean() + (y - f).mean() - 1.959963984540054 * (y - f).std(ddof=1) / math.sqrt(10)
    assert raw_low < 0  # the unclipped interval would leave [0, 1]
    est = ppi_mean(f_all, y, f)
    assert 0.0 == est.ci_low <= est.value <= est.ci_high <= 1.0
    # the rectifier pushes the point past 1: judge passes 90 %, every labelled claim judged 0, human 1
    over = ppi_mean(np.r_[np.ones(90), np.zeros(10)], np.ones(5), np.zeros(5))
    assert over.value == over.ci_low == over.ci_high == 1.0
    under = ppi_mean(np.r_[np.ones(10), np.zeros(90)], [0, 0, 0, 1], [1, 1, 1, 1], [0.5, 0.2, 0.9, 0.4])
    assert 0.0 <= under.ci_low <= under.value <= under.ci_high <= 1.0 and under.value == 0.0
    # judge-only binomial interval near a bound
    j = judge_only([1.0] + [0.0] * 9)
    assert j.ci_low == 0.0 and 0.1 < j.ci_high <= 1.0


@pytest.mark.parametrize("design", ["srs", "borderline_pps"])
def test_ppi_interval_covers_truth_where_the_biased_judge_does_not(design):
    rng = np.random.default_rng(14)
    sims, n_labels, cover_ppi, cover_judge = 200, 80, 0, 0
    for s in range(sims):
        y, f, score = _biased_run(rng)
        truth = y.mean()
        if design == "srs":
            idx = rng.choice(len(y), n_labels, replace=False)
            est = ppi_mean(f, y[idx], f[idx])
        else:  # the spot-check's own sampler: borderline claims (where this judge errs) over-weighted
            pi = spotcheck.inclusion_probabilities(spotcheck.sample_weights(score, 0.0), n_labels)
            idx = spotcheck.systematic_pps(pi, np.random.default_rng(s))
            est = ppi_mean(f, y[idx], f[idx], pi[idx])
        j = judge_only(f)
        cover_ppi += est.ci_low <= truth <= est.ci_high
        cover_judge += j.ci_low <= truth <= j.ci_high
    assert 0.90 <= cover_ppi / sims <= 0.99, cover_ppi / sims
    assert cover_judge / sims < 0.5, cover_judge / sims


def test_unweighted_estimate_on_a_boosted_sample_would_be_biased():
    # why the weights matter: the borderline-boosted sample is full of judge errors
    rng = np.random.default_rng(3)
    bias_w, bias_u = [], []
    for s in range(100):
        y, f, score = _biased_run(rng)
        pi = spotcheck.inclusion_probabilities(spotcheck.sample_weights(score, 0.0), 80)
        idx = spotcheck.systematic_pps(pi, np.random.default_rng(s))
        bias_w.append(ppi_mean(f, y[idx], f[idx], pi[idx]).value - y.mean())
        bias_u.append(ppi_mean(f, y[idx], f[idx]).value - y.mean())
    assert abs(np.mean(bias_w)) < 0.01
    assert np.mean(bias_u) < -0.03  # over-corrects: errors are over-represented


def test_score_prints_and_logs_ppi_beside_judge_only(store, tmp_path, capsys):  # noqa: F811
    uri, client, rid = store
    out = tmp_path / "labels.csv"
    assert spotcheck.main(["--tracking-uri", uri, "sample", rid, "-n", "100", "--out", str(out)]) == 0
    rows = _read(out)
    flip = {"q2#0": "unsupported", "q4#2": "unsupported", "q1#1": "supported"}
    judge = judge_verdicts()  # the blind CSV has no judge column
    for r in rows:
        r["human_verdict"] = flip.get(r["item_id"], judge[r["item_id"]].replace("unparseable", "supported"))
    _write(out, rows)
    capsys.readouterr()
    assert spotcheck.main(["--tracking-uri", uri, "score", rid, str(out)]) == 0
    text = capsys.readouterr().out
    assert "judge-corrected (PPI" in text and "judge only" in text
    claims = spotcheck.judged_claims(_per_query())
    pop = claims[claims["judge_verdict"] != "unparseable"]
    judge_rate = (pop["judge_verdict"] == "supported").mean()  # 6 / 11
    # every parseable claim labelled: PPI = the human rate exactly (6 − 2 + 1) / 11
    m = client.get_run(rid).data.metrics
    assert math.isclose(m["spotcheck/judge_faithfulness"], judge_rate)
    assert math.isclose(m["spotcheck/ppi_faithfulness"], 5 / 11)
    assert m["spotcheck/ppi_faithfulness_ci_low"] < 5 / 11 < m["spotcheck/ppi_faithfulness_ci_high"]


def test_report_shows_judge_only_and_ppi_only_for_spot_checked_configs():
    from types import SimpleNamespace

    from rag_experiments.report.sections import spotcheck_table

    checked = {"spotcheck/n": 40.0, "spotcheck/judge_faithfulness": 0.8, "spotcheck/ppi_faithfulness": 0.7}
    checked |= {"spotcheck/ppi_faithfulness_ci_low": 0.6, "spotcheck/ppi_faithfulness_ci_high": 0.8}
    an = SimpleNamespace(
        configs=[SimpleNamespace(label="a", metrics=checked), SimpleNamespace(label="b", metrics={})]
    )
    blocks = spotcheck_table(an)
    rows = [["".join(span.text for span in cell) for cell in r] for r in blocks[1].rows]
    assert rows == [["a", "0.800 [–, –]", "0.700 [0.600, 0.800]", "40"]]
    assert spotcheck_table(SimpleNamespace(configs=[SimpleNamespace(label="b", metrics={})])) == []

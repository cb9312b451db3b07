"""The judge's validity card: pure figures, the ``judge card`` CLI, judge repeats (flip rate) and the
card every generating run logs. Real judges: the heuristic; the packaged SmolLM2 only for repeats."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from rag_experiments.cli.judge import main as judge_main
from rag_experiments.core.cache import StageCache
from rag_experiments.core.types import Verdict
from rag_experiments.evalset.judge_pairs import JudgePair, load_pairs, pairs_digest
from rag_experiments.evaluation.registry import parse
from rag_experiments.judge.card import (
    card_line,
    card_metrics,
    flip_rate,
    judge_card,
    kappa_interval,
    point_figures,
)
from rag_experiments.judge.repeats import query_flip_rate, repeat_columns
from rag_experiments.judge.validity import (
    EARLY_STOP_CONFIDENCE,
    build_judge,
    judge_config,
    repeat_judges,
    select_pairs,
    sequential_stop,
    stratified_order,
    validity_card,
)
from tests.llm_fixtures import ChatServer, closed_port_url, fake_llm, requires_smollm2, smollm2_path  # noqa: F401
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args

# (claim, context, label, type): sentences of the bundled sample's refunds page
REFUND_CTX = (
    "Annual plans can be cancelled within 30 days of purchase or renewal for a prorated refund. "
    "The refund covers the unused months of the term."
)
MONTHLY_CTX = (
    "Monthly plans are not refunded except for billing errors. When you cancel a monthly plan, you keep "
    "access to the paid features until the end of the billing period."
)
RAW_PAIRS = [
    (
        "Annual plans can be cancelled within 30 days for a prorated refund.",
        REFUND_CTX,
        "supported",
        "support",
    ),
    (
        "Annual plans can be cancelled within 90 days for a prorated refund.",
        REFUND_CTX,
        "unsupported",
        "number",
    ),
    ("Annual plans cannot be cancelled for a refund.", REFUND_CTX, "unsupported", "negation"),
    ("The refund covers the unused months of the term.", REFUND_CTX, "supported", "support"),
    ("Monthly plans are not refunded except for billing errors.", MONTHLY_CTX, "supported", "support"),
    ("Monthly plans are always refunded in full.", MONTHLY_CTX, "unsupported", "negation"),
    (
        "You keep access to paid features until the end of the billing period.",
        MONTHLY_CTX,
        "supported",
        "support",
    ),
    ("Webhooks are retried 12 times over 3 days.", MONTHLY_CTX, "unsupported", "other_document"),
    ("Refunds are paid in bitcoin to the account owner.", REFUND_CTX, "unsupported", "other_document"),
    ("Monthly plans keep paid features until the billing period ends.", MONTHLY_CTX, "supported", "support"),
]


def write_pairs(path: Path, rows=RAW_PAIRS) -> Path:
    path.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "claim": c, "context": x, "label": lab, "type": t}) + "\n"
            for i, (c, x, lab, t) in enumerate(rows)
        )
    )
    return path


# ----------------------------------------------------------------------------- pure figures


def test_unparseable_is_a_disagreement_never_a_no():
    gold = ["supported", "unsupported", "unsupported", "supported"]
    as_no = point_figures(gold, ["supported", "unsupported", "unsupported", "unsupported"])
    unparsed = point_figures(gold, ["supported", "unsupported", "unparseable", "unsupported"])
    assert as_no["accuracy"] == 0.75 and unparsed["accuracy"] == 0.5  # "unparseable" is not a "no"
    assert unparsed["unparseable_rate"] == 0.25
    assert unparsed["balanced_accuracy"] == pytest.approx((0.5 + 0.5) / 2)
    # κ on 2 labels per class is too few to say (evaluation.intervals.kappa_too_few): NaN, not a figure
    assert math.isnan(unparsed["kappa"]) and math.isnan(as_no["kappa"])
    big = gold * 3  # 6 per class: κ is said, and an unparseable verdict lowers it like a disagreement
    kn = point_figures(big, ["supported", "unsupported", "unsupported", "unsupported"] * 3)["kappa"]
    ku = point_figures(big, ["supported", "unsupported", "unparseable", "unsupported"] * 3)["kappa"]
    assert ku < kn
    assert as_no["precision_supported"] == 1.0 and as_no["recall_supported"] == 0.5


def test_cluster_bootstrap_is_seeded_and_brackets_the_value():
    rng = np.random.default_rng(1)
    gold = rng.choice(["supported", "unsupported"], 120).tolist()
    pred = [g if rng.random() < 0.8 else "unsupported" for g in gold]
    groups = [f"c{i // 3}" for i in range(120)]  # 3 pairs per claim
    types = ["a" if i % 2 else "b" for i in range(120)]
    args = (gold, pred, types, groups, [0.01] * 120)
    c1, c2 = judge_card(*args, n_resamples=300, seed=3), judge_card(*args, n_resamples=300, seed=3)
    assert c1 == c2 and c1["n"] == 120 and c1["n_groups"] == 40
    for key in ("kappa", "balanced_accuracy", "accuracy", "unparseable_rate"):
        lo, hi = c1[key]["ci"]
        assert lo <= c1[key]["value"] <= hi
    assert c1["kappa"]["ci"][1] - c1["kappa"]["ci"][0] > 0.05  # an interval, not a point
    assert math.isnan(c1["flip_rate"]["value"])  # no repeats: nothing to flip
    metrics = card_metrics(c1)
    assert all(parse(k) is not None for k in metrics), [k for k in metrics if parse(k) is None]
    assert "judge_card/kappa/ci_low" in metrics and "judge_card/accept/a" in metrics
    assert "judge_card/flip_rate" not in metrics  # NaN is left out, never logged


def test_flip_rate_counts_items_whose_repeats_differ():
    reps = [["supported", "unsupported", "supported"], ["supported", "supported", "unparseable"]]
    assert flip_rate(reps) == pytest.approx(2 / 3)
    assert math.isnan(flip_rate(reps[:1]))
    assert query_flip_rate([["supported", "supported"], ["supported", "unsupported"]]) == 0.5
    assert math.isnan(query_flip_rate([]))


def test_select_pairs_is_deterministic_and_covers_every_type(tmp_path):
    pairs = load_pairs(write_pairs(tmp_path / "p.jsonl"))
    chosen = select_pairs(pairs, 4)
    assert len(chosen) == 4 and {p.type for p in chosen} == {p.type for p in pairs}
    assert select_pairs(list(reversed(pairs)), 4) == chosen  # the file order does not matter


# ----------------------------------------------------------------------------- the sequential card


def _population(rng, n: int, p_supported: float = 0.3, accuracy: float = 0.8):
    """Gold labels with ``p_supported`` positives and a judge right with probability ``accuracy``
    (symmetric errors): population κ = (a − p_e) / (1 − p_e), p_e from the two marginals."""
    gold = np.where(rng.random(n) < p_supported, "supported", "unsupported")
    flip = np.where(gold == "supported", "unsupported", "supported")
    pred = np.where(rng.random(n) < accuracy, gold, flip)
    p_pred = p_supported * accuracy + (1 - p_supported) * (1 - accuracy)
    p_e = p_supported * p_pred + (1 - p_supported) * (1 - p_pred)
    return gold, pred, (accuracy - p_e) / (1 - p_e)


def test_kappa_interval_is_the_cards_own_interval():
    """The sequential card looks with the card's κ interval (same draws, same too-few rule)."""
    rng = np.random.default_rng(5)
    gold, pred, _ = _population(rng, 90)
    pred[:6] = "unparseable"  # a third predicted class
    groups = [f"c{i // 2}" for i in range(90)]
    card = judge_card(gold, pred, ["t"] * 90, groups, [0.0] * 90, n_resamples=300, seed=2)
    assert kappa_interval(gold, pred, groups, 300, 2) == pytest.approx(card["kappa"]["ci"], abs=1e-12)
    one_class = ["unsupported"] * 43  # κ too few to say in every resample
    assert all(math.isnan(x) for x in kappa_interval(one_class, pred[:43], [str(i) for i in range(43)], 100, 0))


def test_stratified_order_keeps_the_label_mix_in_every_prefix():
    pairs = [JudgePair(f"p{i}", f"claim {i}", "ctx", "supported" if i % 10 < 3 else "unsupported", f"t{i % 10}")
             for i in range(100)]  # fmt: skip
    order = stratified_order(select_pairs(pairs, None))
    assert sorted(p.id for p in order) == sorted(p.id for p in pairs)
    for n in range(1, 101):
        assert abs(sum(p.label == "supported" for p in order[:n]) - 0.3 * n) <= 1


def test_sequential_stop_stops_at_the_first_narrow_look_and_says_why():
    widths = {40: 0.41, 80: 0.27, 120: 0.19, 160: 0.15}
    n, looks, why = sequential_stop(160, 40, 0.2, widths.__getitem__)
    assert n == 120 and looks == [[40, 0.41], [80, 0.27], [120, 0.19]]
    assert "0.190 ≤ target 0.2 at 120 pairs" in why
    n, looks, why = sequential_stop(100, 40, 0.1, lambda n: math.nan if n < 100 else 0.3)
    assert n == 100 and [x[0] for x in looks] == [40, 80, 100] and "all 100 pairs judged" in why
    assert "0.300 > target 0.1" in why


def test_sequential_stopping_keeps_the_kappa_interval_honest():
    """Coverage by simulation: a population with a known κ, 120 pools of 200 pairs, looks every 40
    pairs, target 0.27 (so most pools stop early). Stopping when the 95 % interval is narrow
    enough under-covers (over 400 pools: 0.905 against 0.93 for the same n fixed in advance), so a
    card stopped early reports its 97.5 % interval; that one covers at least as often as the fixed
    n's 95 % one. Seeded: the outcome is fixed."""
    rng = np.random.default_rng(11)
    covered_seq = covered_fixed = 0
    stopped_early = 0
    for s in range(120):
        gold, pred, k_true = _population(rng, 200)
        groups = [str(i) for i in range(200)]

        def ci(n, gold=gold, pred=pred, groups=groups, s=s):
            return kappa_interval(gold[:n], pred[:n], groups[:n], 200, s)

        n, _, _ = sequential_stop(200, 40, 0.27, lambda n, ci=ci: -np.subtract(*ci(n)))
        stopped_early += n < 200
        lo, hi = kappa_interval(gold[:n], pred[:n], groups[:n], 200, s, EARLY_STOP_CONFIDENCE if n < 200 else 0.95)
        covered_seq += lo <= k_true <= hi
        lo, hi = ci(n)
        covered_fixed += lo <= k_true <= hi  # as if n had been fixed in advance: the 95 % interval
    assert stopped_early >= 60  # the rule did stop early, so this checks it
    assert covered_seq / 120 >= 0.92 and covered_seq >= covered_fixed


class _Oracle:
    """A judge whose verdict of each claim is fixed in advance (the pure rule under test)."""

    remote = False

    def __init__(self, labels: dict[str, str]) -> None:
        self.labels, self.identity, self.asked = labels, "oracle-judge", 0

    def verdicts(self, claims, context):
        self.asked += len(claims)
        return [Verdict(c, self.labels[c]) for c in claims]


def test_sequential_card_judges_only_the_pairs_its_interval_needs(tmp_path):
    rng = np.random.default_rng(3)
    gold, pred, _ = _population(rng, 200, accuracy=0.9)
    pairs = [JudgePair(f"p{i}", f"claim number {i}", "ctx", g, "t") for i, g in enumerate(gold)]
    judge = _Oracle({p.claim: x for p, x in zip(pairs, pred, strict=True)})
    cache = StageCache(tmp_path / "cache")
    card = validity_card(judge, pairs, cache, n_resamples=200, progress=False, target_width=0.3, batch=40)
    assert card["n"] < 200 and judge.asked == card["n"] and card["n"] % 40 == 0
    assert card["stop"]["n_pool"] == 200 and card["stop"]["looks"][-1][0] == card["n"]
    assert card["stop"]["looks"][-1][1] <= 0.3 and "≤ target 0.3" in card["stop"]["why"]
    lo, hi = card["kappa"]["ci"]  # stopped early: its intervals at 97.5 %, wider than the 95 % one it looked at
    assert card["confidence"] == 0.975 and hi - lo > card["stop"]["looks"][-1][1]
    assert "stopped: κ 95% CI width" in card_line(card, "synthetic") and "sequential" in card["ci_method"]
    again = validity_card(judge, pairs, cache, n_resamples=200, progress=False, target_width=0.3, batch=40)
    assert again["cached"] and judge.asked == card["n"]  # cached per (judge, pairs, target, batch)
    every = validity_card(judge, pairs, cache, n_resamples=200, progress=False, target_width=0.01, batch=40)
    assert every["n"] == 200 and "all 200 pairs judged" in every["stop"]["why"]
    assert judge.asked == 200  # the pairs judged before came from the verdict cache


def test_a_cached_cards_synthetic_pairs_are_not_made_again(tmp_path):
    from rag_experiments.evalset.corpus import load_corpus
    from rag_experiments.evalset.load import sample_dir
    from rag_experiments.judge.validity import card_pairs

    docs = load_corpus(sample_dir() / "docs")
    cache = StageCache(tmp_path / "cache")
    made, source = card_pairs(None, docs, seed=0, n_max=200, cache=cache)
    again, _ = card_pairs(None, docs, seed=0, n_max=200, cache=cache)
    assert source == "synthetic" and again == made and cache.stats["synthetic_pairs.hit"] == 1
    assert pairs_digest(again) == pairs_digest(card_pairs(None, docs, seed=0, n_max=200)[0])  # as made anew


# ----------------------------------------------------------------------------- the CLI


def test_card_cli_json_keys_and_ci_shapes(tmp_path, capsys):
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    argv = ["card", "--judge", "heuristic", "--pairs", str(pairs), "--json", "--resamples", "200"]
    assert judge_main([*argv, "--cache-dir", str(tmp_path / "cache")]) == 0
    card = json.loads(capsys.readouterr().out)
    need = (
        "n",
        "kappa",
        "balanced_accuracy",
        "accuracy",
        "accept_by_type",
        "unparseable_rate",
        "seconds_per_verdict",
    )
    assert set(need) <= set(card)
    assert card["n"] == len(RAW_PAIRS)
    assert card["pairs_digest"] == pairs_digest(load_pairs(pairs))
    for key in need[1:]:
        cells = card[key].values() if key == "accept_by_type" else [card[key]]
        for cell in cells:
            assert set(cell) == {"value", "ci"} and len(cell["ci"]) == 2
    assert set(card["accept_by_type"]) == {t for *_, t in RAW_PAIRS}
    assert card["seconds_per_verdict"]["value"] > 0 and card["unparseable_rate"]["value"] == 0.0
    # the heuristic judges its own sentences supported more often than other documents' claims
    acc = card["accept_by_type"]
    assert acc["support"]["value"] > acc["other_document"]["value"]
    # again: the cached card, same figures
    assert judge_main([*argv, "--cache-dir", str(tmp_path / "cache")]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["cached"] and again["kappa"] == card["kappa"]
    # the table names what the pairs are: human labels here (a synthetic card says it is a bound)
    assert judge_main([a for a in argv if a != "--json"] + ["--cache-dir", str(tmp_path / "cache")]) == 0
    assert "claim groups, human-labelled pairs, pairs.jsonl;" in capsys.readouterr().out


def _llm_card(tmp_path, capsys, base_url: str, *extra: str) -> dict:
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    argv = ["card", "--judge", "openai", "--pairs", str(pairs), "--json", "--resamples", "50"]
    judge = [f"base_url={base_url}", "api_key_env=null", "model=m", "decompose=false", "max_retries=0",
             "timeout_s=5", "use_logprobs=false", "constrained=none"]  # fmt: skip
    assert judge_main([*argv, *extra, "--cache-dir", str(tmp_path / "cache"), *judge]) == 0
    out = capsys.readouterr()
    return {**json.loads(out.out), "stderr": out.err}


def test_card_measured_while_the_judge_failed_is_not_cached_and_says_so(tmp_path, capsys, closed_port_url):  # noqa: F811
    """A dead judge endpoint gives κ 0 and unparseable 1.000: that card says why it is unsound and
    is measured again next time, so a later run never shows it beside its faithfulness."""
    dead = _llm_card(tmp_path, capsys, closed_port_url)
    assert dead["unparseable_rate"]["value"] == 1.0 and dead["n_judge_errors"] == len(RAW_PAIRS)
    assert dead["unsound"].startswith(f"{len(RAW_PAIRS)} of {len(RAW_PAIRS)} verdicts failed")
    assert "judge card not cached" in dead["stderr"]
    again = _llm_card(tmp_path, capsys, closed_port_url)
    assert again["cached"] is False and again["unsound"]  # nothing was cached: asked again
    from rag_experiments.judge.card import card_line

    assert "NOT A SOUND CARD (not cached)" in card_line(again, "file:pairs.jsonl")
    # the endpoint is back: its verdicts make a sound card, cached from then on
    server = ChatServer(lambda body: "yes")
    try:
        up = _llm_card(tmp_path, capsys, server.url)
        assert up["unsound"] is None and up["n_judge_errors"] == 0 and up["unparseable_rate"]["value"] == 0.0
        assert _llm_card(tmp_path, capsys, server.url)["cached"] is True
    finally:
        server.close()


def test_card_of_garbage_replies_above_the_limit_is_not_cached(tmp_path, capsys):
    server = ChatServer(lambda body: "%%% garbage %%%")
    try:
        card = _llm_card(tmp_path, capsys, server.url)
        assert card["n_judge_errors"] == 0 and card["unparseable_rate"]["value"] == 1.0
        assert "unparseable share 1.000 above" in card["unsound"]
        assert _llm_card(tmp_path, capsys, server.url)["cached"] is False
        calls = server.calls
        lenient = _llm_card(tmp_path, capsys, server.url, "--max-unparseable", "1")
        assert lenient["unsound"] is None and server.calls == calls + len(RAW_PAIRS)  # asked again
        assert _llm_card(tmp_path, capsys, server.url, "--max-unparseable", "1")["cached"] is True
    finally:
        server.close()


def test_card_cli_bad_labels_exit_2_with_file_line(tmp_path, capsys):
    pairs = write_pairs(tmp_path / "bad.jsonl", RAW_PAIRS[:3])
    lines = pairs.read_text().splitlines()
    lines[1] = lines[1].replace('"unsupported"', '"maybe"')
    pairs.write_text("\n".join(lines) + "\n")
    assert judge_main(["card", "--judge", "heuristic", "--pairs", str(pairs)]) == 2
    err = capsys.readouterr().err
    assert f"{pairs}:2: unknown label 'maybe'" in err


def test_card_cli_unknown_judge_exits_2(tmp_path, capsys):
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    assert judge_main(["card", "--judge", "nosuch", "--pairs", str(pairs)]) == 2
    assert "unknown judge 'nosuch'" in capsys.readouterr().err


# ----------------------------------------------------------------------------- repeats


def test_deterministic_judge_repeats_warn_and_cost_nothing():
    judges, warning = repeat_judges(judge_config("heuristic", ["repeats=3"]), 3)
    assert judges == [] and "deterministic: it has no temperature" in warning
    judges, warning = repeat_judges(judge_config("local", ["temperature=0"]), 3)
    assert judges == [] and "temperature is 0" in warning
    seeds, warning = repeat_judges(
        judge_config("local", ["temperature=0.8", "seed=5"]), 3, lambda c, seed: seed
    )
    assert seeds == [6, 7] and warning is None  # one distinct seed per repeat
    assert repeat_judges(judge_config("heuristic"), 1) == ([], None)
    judges, warning = repeat_judges(judge_config("mlflow", ["temperature=0.7"]), 2)
    assert judges == [] and "takes no seed" in warning


@requires_smollm2
def test_stochastic_judge_repeats_flip_rate_cached_per_repeat(tmp_path):
    cfg = judge_config("local", ["temperature=1.0", "use_logprobs=false", "decompose=false", "max_tokens=16"])
    judge = build_judge(
        "local", ["temperature=1.0", "use_logprobs=false", "decompose=false", "max_tokens=16"]
    )
    repeats, warning = repeat_judges(cfg, 3)
    assert warning is None and len({judge.identity, *(j.identity for j in repeats)}) == 3
    pairs = select_pairs(load_pairs(write_pairs(tmp_path / "p.jsonl")), 3)
    cache = StageCache(tmp_path / "cache")
    card = validity_card(judge, pairs, cache, repeats, n_resamples=100, progress=False)
    assert card["repeats"] == 3 and 0.0 <= card["flip_rate"]["value"] <= 1.0
    assert cache.stats["card_verdict.miss"] == 3 * len(pairs)  # each repeat asked, cached apart
    # per query in the pipeline: the repeats' labels per claim, and the flip rate they imply
    from collections import Counter

    from rag_experiments.judge.cached import JudgedAnswer

    claims = [p.claim for p in pairs[:2]]
    verdicts = judge.verdicts(claims, REFUND_CTX)
    judged = JudgedAnswer(claims, verdicts, 0.0, "", 0.0, {})
    cols = repeat_columns(repeats, [judged], [REFUND_CTX], cache, Counter())
    labels = cols[0]["judge_repeat_labels"]
    assert len(labels) == 2 and all(len(ls) == 3 for ls in labels)
    assert cols[0]["judge_flip_rate"] == query_flip_rate(labels)


# ----------------------------------------------------------------------------- a run logs its card


def test_run_logs_judge_card_digest_and_identity(tmp_path, fake_llm):  # noqa: F811
    from mlflow.tracking import MlflowClient

    docs, ev = make_tiny(tmp_path, n_items=4)
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    p = run_sweep(
        tmp_path,
        *sweep_args(tmp_path, docs, ev),
        "generator=openai",
        f"generator.base_url={fake_llm.base_url}",
        "generator.model=ok",
        "generator.api_key_env=null",
        "generator.max_retries=0",
        "retriever=bm25",
        "generation_subset=2",
        "metrics.bootstrap_resamples=100",
        f"judge_card.pairs={pairs}",
        "judge_card.bootstrap_resamples=200",
        "judge.repeats=2",
    )
    assert "deterministic" in p.stderr  # heuristic + repeats=2: warned, judged once
    assert "judge card (10 file:pairs.jsonl pairs" in p.stdout
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("test").experiment_id])
    m, tags = run.data.metrics, run.data.tags
    assert {"judge_card/kappa", "judge_card/kappa/ci_low", "judge_card/balanced_accuracy"} <= set(m)
    assert m["judge_card/n_pairs"] == len(RAW_PAIRS)
    assert tags["judge_card_pairs_digest"] == pairs_digest(load_pairs(pairs))
    assert tags["judge_card_source"] == "file:pairs.jsonl"
    assert len(tags["judge_identity"]) == 16 and tags["judge_repeats"] == "1"
    assert "judge_flip_rate" not in m  # deterministic: no flip rate


def test_config_rejects_bad_judge_card_and_repeats():
    from rag_experiments.evalset.load import conf_dir
    from rag_experiments.run.config_schema import validate

    cfg = OmegaConf.to_container(OmegaConf.load(conf_dir() / "config.yaml"))
    cfg["judge_card"].update(pairs="/no/such/pairs.jsonl", max_pairs=0, typo=1, target_width=-0.1, batch_pairs=0)
    cfg["generator"] = {"_target_": "rag_experiments.stages.generation.OpenAICompatibleGenerator"}
    cfg["judge"] = {
        **OmegaConf.to_container(OmegaConf.load(conf_dir() / "judge" / "heuristic.yaml")),
        "repeats": 0,
    }
    problems = "\n".join(validate(cfg))
    assert "conf/config: judge_card.pairs: file not found" in problems
    assert "conf/config: judge_card.max_pairs: must be an integer >= 1" in problems
    assert "conf/config: judge_card.typo: unknown key" in problems
    assert "conf/config: judge_card.target_width: must be a number in [0, 2]" in problems
    assert "conf/config: judge_card.batch_pairs: must be an integer >= 1" in problems
    assert "target_width: unknown" not in problems  # the keys come from CardSettings
    assert "conf/judge: repeats: must be an integer >= 1" in problems


def test_default_run_shows_a_synthetic_card_as_a_bound_and_says_it_is_unvalidated(tmp_path, fake_llm):  # noqa: F811
    """No human labels: the run summary and the report label the card synthetic (an optimistic
    bound) and say once that the generation metrics are unvalidated, with the spotcheck command."""
    from mlflow.tracking import MlflowClient

    from rag_experiments.analysis.judge_trust import labels_needed
    from rag_experiments.report import cli as report_cli

    docs, ev = make_tiny(tmp_path, n_items=4)
    p = run_sweep(
        tmp_path,
        *sweep_args(tmp_path, docs, ev),
        "generator=openai",
        f"generator.base_url={fake_llm.base_url}",
        "generator.model=ok",
        "generator.api_key_env=null",
        "generator.max_retries=0",
        "retriever=bm25",
        "generation_subset=2",
        "metrics.bootstrap_resamples=100",
        "judge_card.max_pairs=40",
        "judge_card.bootstrap_resamples=100",
    )
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("test").experiment_id])
    rid = run.info.run_id
    assert run.data.tags["judge_card_source"] == "synthetic"
    assert "judge card (40 synthetic pairs: an optimistic bound, not accuracy on this corpus" in p.stdout
    n = labels_needed(0.1)
    assert n == 97  # ⌈1.96² · 0.25 / 0.1²⌉
    note = "note: generation metrics unvalidated on this corpus"
    assert p.stdout.count(note) == 1, p.stdout
    assert f"python -m rag_experiments.spotcheck sample {rid} -n {n}" in p.stdout

    out = tmp_path / "report"
    assert report_cli.main([rid, "--tracking-uri", uri, "--out", str(out), "--no-log"]) == 0
    md = (out / "report.md").read_text()
    assert md.count("generation metrics unvalidated on this corpus") == 1
    assert f"spotcheck sample {rid} -n {n}" in md
    assert "synthetic pairs: an optimistic bound, not this corpus's accuracy (40)" in md
    assert "conclusions unreliable" not in md  # no human κ: no marker, the note instead

"""The trained claim verifier (``judge=verifier``), its fit CLI, and the cascade (``judge=cascade``).

Real parts: synthetic pairs from sample documents, MiniLM features, the numpy logistic fit, a
sqlite MLflow store, the packaged SmolLM2 on the llama.cpp server as the cascade's LLM stage.
Fits are tiny (about 120 synthetic pairs of four sample documents) so the module stays fast.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient

from rag_experiments.cli.judge import main as judge_main
from rag_experiments.evalset.corpus import load_corpus
from rag_experiments.evalset.load import sample_dir
from rag_experiments.evalset.synthetic_pairs import (
    MIN_SENTENCES,
    NEGATIVE_TYPES,
    POSITIVE_TYPES,
    SyntheticPairsError,
    change_number,
    drop_clause,
    negate,
    paraphrase,
    synthetic_pairs,
)
from rag_experiments.judge import CascadeJudge, VerifierJudge
from rag_experiments.judge.verifier import VerifierError, fit_logistic, predict_logistic
from rag_experiments.judge.verifier_fit import Recipe, fit_identity
from tests.llm_fixtures import requires_smollm2
from tests.sweep_helpers import TINY_DOCS, make_tiny

N_SYN = "120"


@pytest.fixture(scope="module")
def sample_pairs():
    return synthetic_pairs(load_corpus(sample_dir() / "docs"), seed=0)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """One CLI fit on the tiny corpus, logged to a temporary sqlite MLflow store."""
    root = tmp_path_factory.mktemp("verifier")
    docs, _ = make_tiny(root, n_items=2)
    argv = [
        "fit", "--corpus", str(docs), "--synthetic-max", N_SYN, "--cache-dir", str(root / "cache"),
        "--tracking-uri", f"sqlite:///{root}/mlflow.db", "--artifact-root", str(root / "mlruns"), "--no-progress",
    ]  # fmt: skip
    assert judge_main(argv) == 0
    (latest,) = (root / "cache" / "verifiers").glob("*/latest.json")
    path = Path(json.loads(latest.read_text())["path"])
    return {"root": root, "docs": docs, "argv": argv, "path": path}


# -- synthetic pairs -------------------------------------------------------------------------------


def _words(text):
    return re.findall(r"[a-z][a-z'\-]*", text.lower())


def _source(pairs, p):
    return next(q for q in pairs if q.group == p.group and q.type == "sentence").claim


def test_each_perturbation_changes_what_it_claims_to(sample_pairs):
    pairs = sample_pairs
    types = {p.type for p in pairs}
    assert types == set(POSITIVE_TYPES + NEGATIVE_TYPES)
    for p in pairs:
        src = _source(pairs, p)
        assert p.label == ("supported" if p.type in POSITIVE_TYPES else "unsupported")
        if p.type == "sentence":
            assert p.claim in p.context
        elif p.type == "clause_drop":
            assert src.startswith(p.claim[:-1]) and len(p.claim) < len(src)
        elif p.type == "negation":
            negs = re.compile(r"\b(?:not|cannot|never)\b|n't", re.I)
            assert len(negs.findall(p.claim)) != len(negs.findall(src)) or "always" in src, (src, p.claim)
        elif p.type == "number":
            assert p.claim != src and (re.findall(r"[\d,.]+", p.claim) != re.findall(r"[\d,.]+", src)
                                       or re.sub(r"\d", "", p.claim) != re.sub(r"\d", "", src))  # fmt: skip
        elif p.type == "entity":
            new = set(re.findall(r"\w+", p.claim)) - set(re.findall(r"\w+", src))
            assert new and not any(w.lower() in p.context.lower().split() for w in new), (src, p.claim)
        elif p.type == "antonym":
            assert p.claim != src and len(p.claim.split()) == len(src.split())
        elif p.type == "paraphrase":  # reworded, never a verbatim copy: a word the window lacks
            assert p.claim != src and set(_words(p.claim)) - set(_words(p.context)), (src, p.claim)
        elif p.type in ("other_doc", "same_doc"):
            assert p.claim not in p.context  # a sentence of another document / outside the window
        elif p.type == "added_clause":
            assert p.claim.startswith(src.rstrip(".!?")) and ", and " in p.claim[len(src) - 1 :]


def test_pairs_are_grouped_by_source_sentence_deterministic_and_capped(sample_pairs):
    assert all(p.group and p.group.split("#")[0] for p in sample_pairs)
    again = synthetic_pairs(load_corpus(sample_dir() / "docs"), seed=0)
    assert [p.id for p in again] == [p.id for p in sample_pairs]
    capped = synthetic_pairs(load_corpus(sample_dir() / "docs"), seed=0, n_max=300)
    assert 250 <= len(capped) <= 300
    full = {}
    for p in sample_pairs:
        full.setdefault(p.group, set()).add(p.type)
    kept = {}
    for p in capped:
        kept.setdefault(p.group, set()).add(p.type)
    assert all(kept[g] <= full[g] and "sentence" in kept[g] for g in kept)  # whole groups


def test_perturbation_helpers():
    assert negate("Refunds are issued within 5 days.") == "Refunds are not issued within 5 days."
    assert negate("The key cannot be restored.") == "The key can be restored."
    assert negate("Nothing here to flip at all today.") is None
    import random

    assert change_number("Refunds take 14 days.", random.Random(0)) == "Refunds take 28 days."
    assert drop_clause("Webhooks are retried five times, and each retry waits longer.") == "Webhooks are retried five times."


def test_paraphrase_rewrites_without_copying():
    import random

    rng = random.Random(0)
    s = "The service is able to retry 3 times (with backoff) because requests often fail."
    out = paraphrase(s, s, rng)
    assert out and out != s and "(" not in out and "three" in out
    assert set(_words(out)) - set(_words(s))  # new words: the lesson is "reworded is still supported"
    # nothing to rewrite: a reporting frame still makes it a non-verbatim claim
    plain = "Refunds reach the original card within five business days."
    framed = paraphrase(plain, plain, rng)
    assert framed.endswith("refunds reach the original card within five business days.") and framed != plain


def test_too_small_corpus_is_an_error_with_the_count(tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("Refunds are issued within five business days of the request.\n")
    (docs / "b.md").write_text("Webhooks are retried up to eight times with exponential backoff.\n")
    with pytest.raises(SyntheticPairsError, match=rf"2 usable sentences in 2 documents \(minimum {MIN_SENTENCES}"):
        synthetic_pairs(load_corpus(docs))
    assert judge_main(["fit", "--corpus", str(docs), "--no-mlflow", "--cache-dir", str(tmp_path / "c")]) == 2
    assert "2 usable sentences" in capsys.readouterr().err


# -- features ---------------------------------------------------------------------------------------


def test_features_flag_negation_and_number_swaps_and_keep_a_paraphrase_aligned():
    """Hand-made pairs: the soft alignment keeps a reworded claim close to its evidence (exact
    word coverage does not), an unrelated claim far; the checks flag a negation and a number swap."""
    from rag_experiments.judge.verifier import FEATURES, FeatureExtractor

    ctx = "Failed webhook deliveries are retried up to 8 times. Each retry waits twice as long as the previous one."
    claims = {
        "same": "Failed webhook deliveries are retried up to 8 times.",
        "paraphrase": "Webhook deliveries that fail are attempted again as many as 8 times.",
        "negation": "Failed webhook deliveries are not retried.",
        "number": "Failed webhook deliveries are retried up to 20 times.",
        "unrelated": "Invoices are emailed to the billing contact every month.",
    }
    X = FeatureExtractor().matrix(list(claims.values()), [ctx] * len(claims))
    f = {name: dict(zip(FEATURES, row, strict=True)) for name, row in zip(claims, X, strict=True)}
    assert f["same"]["soft_recall"] > 0.9 and f["same"]["soft_unaligned_50"] == 0
    assert f["paraphrase"]["cov_ctx"] < 0.8  # exact coverage misses the rewording ...
    assert f["paraphrase"]["soft_recall"] > f["unrelated"]["soft_recall"] + 0.15  # ... soft alignment does not
    assert f["unrelated"]["soft_unaligned_70"] > f["paraphrase"]["soft_unaligned_70"]
    assert f["negation"]["neg_mismatch"] == 1 and f["same"]["neg_mismatch"] == 0
    assert f["number"]["num_mismatch_ctx"] == 1 and f["same"]["num_mismatch_ctx"] == 0


def test_one_pass_sentence_embedding_is_sentence_transformers_and_windows_are_close():
    """The shared pass's sentence embedding is exactly SentenceTransformer.encode's (mean pooling +
    normalisation); a window's (mean of its sentences' token vectors) is an approximation."""
    from rag_experiments.judge.token_pass import TokenPass, window_embedding

    tp = TokenPass()
    sents = [
        "Failed webhook deliveries are retried up to 8 times.",
        "Each retry waits twice as long as the previous one.",
        "Refunds of annual plans are prorated by the remaining days, minus a processing fee of 2 %.",
        "Yes.",
    ]
    got, want = tp.embeddings(sents), tp.embedder.encode(sents)
    assert np.abs(got - want).max() < 1e-5  # float noise only (batch padding)
    window = tp.embedder.encode([f"{sents[0]} {sents[1]}"])[0]
    cos = float(window_embedding(tp.encode(sents[:2])) @ window)
    assert 0.9 < cos < 0.9999  # close, and not the same thing


def test_bfloat16_pass_is_close_to_float32_and_has_its_own_identity():
    from rag_experiments.judge.token_pass import TokenPass

    sents = ["Failed webhook deliveries are retried up to 8 times.", "Refunds take five days."]
    f32, b16 = TokenPass(), TokenPass(precision="bfloat16")
    assert float((f32.embeddings(sents) * b16.embeddings(sents)).sum(1).min()) > 0.999
    assert f32.identity != b16.identity and "precision" not in json.loads(f32.identity)
    with pytest.raises(ValueError, match="judge.precision: 'float16'"):
        TokenPass(precision="float16")


def test_one_pass_features_equal_the_two_pass_features_on_one_sentence_contexts():
    """Without windows and with a one-sentence context, the one-pass features (v3) must be what
    the two-pass reference (v2) computes; on longer contexts they differ (windows, tokens)."""
    from rag_experiments.judge.verifier import FeatureExtractor

    claims = ["Failed webhook deliveries are retried up to 8 times.", "Invoices are not emailed monthly.",
              "Webhook deliveries that fail are attempted again as many as 20 times."]
    ctxs = ["Failed webhook deliveries are retried up to 8 times.", "Invoices are emailed every month.",
            "Failed webhook deliveries are retried up to 8 times."]
    one = FeatureExtractor(one_pass=True)
    two = FeatureExtractor(one_pass=False)
    assert np.abs(one.matrix(claims, ctxs) - two.matrix(claims, ctxs)).max() < 1e-4
    assert one.identity != two.identity and json.loads(one.identity)["features"] == 3
    long_ctx = [f"{ctxs[0]} Each retry waits twice as long as the previous one."] * 3
    assert np.abs(one.matrix(claims, long_ctx) - two.matrix(claims, long_ctx)).max() > 1e-3


# -- fit ------------------------------------------------------------------------------------------


def test_logistic_fit_separates_and_is_calibrated_on_a_balanced_prior():
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(1, 1, (200, 2)), rng.normal(-1, 1, (200, 2))])
    y = np.r_[np.ones(200), np.zeros(200)]
    m = fit_logistic(X, y)
    p = predict_logistic(m, X)
    assert ((p >= 0.5) == y).mean() > 0.85 and abs(p.mean() - 0.5) < 0.05


def test_fit_is_content_hashed_cached_and_logged(fitted, capsys):
    path = fitted["path"]
    manifest = json.loads((path / "manifest.json").read_text())
    assert path.name == manifest["fit_id"][:16] and len(manifest["weights_sha256"]) == 64
    assert (path / "model.json").stat().st_size < 4000  # tiny: coefficients only
    assert manifest["data"]["n_synthetic"] <= int(N_SYN) and manifest["code_version"]
    assert "kappa" in manifest["card"]["fit_data"]  # grouped-CV card on held-out source sentences
    mtime = (path / "model.json").stat().st_mtime_ns
    capsys.readouterr()
    assert judge_main(fitted["argv"]) == 0  # same inputs: a cache hit, nothing trained or re-logged
    out = capsys.readouterr().out
    assert "cache hit" in out and "already logged" in out
    assert (path / "model.json").stat().st_mtime_ns == mtime
    c = MlflowClient(f"sqlite:///{fitted['root']}/mlflow.db")
    exp = c.get_experiment_by_name("judge-verifiers")
    (model,) = c.search_logged_models([exp.experiment_id])
    assert model.tags["fit_id"] == manifest["fit_id"] and model.status.to_proto() == 2 or str(model.status) == "READY"
    run = c.get_run(model.source_run_id)
    assert run.info.status == "FINISHED" and "card/fit_data/kappa" in run.data.metrics
    # identity is content: other pairs or another recipe -> another fit id
    syn = synthetic_pairs(load_corpus(fitted["docs"]), n_max=int(N_SYN))
    base = fit_identity(syn, Recipe(synthetic_max=int(N_SYN)), "e")
    assert base == fit_identity(list(syn), Recipe(synthetic_max=int(N_SYN)), "e")
    assert base != fit_identity(syn[1:], Recipe(synthetic_max=int(N_SYN)), "e")
    assert base != fit_identity(syn, Recipe(synthetic_max=int(N_SYN), l2=2.0), "e")


def test_bad_labels_file_exits_2_with_file_and_line(fitted, tmp_path, capsys):
    bad = tmp_path / "labels.jsonl"
    good = {"id": "a", "claim": "Refunds take 5 days.", "context": "Refunds take 5 days.", "label": "supported"}
    bad.write_text(json.dumps(good) + "\n" + json.dumps({**good, "id": "b", "label": "maybe"}) + "\n")
    argv = ["fit", "--corpus", str(fitted["docs"]), "--labels", str(bad), "--no-mlflow", "--cache-dir", str(tmp_path)]
    assert judge_main(argv) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2: unknown label 'maybe'" in err
    assert not (tmp_path / "verifiers").exists()  # nothing trained


def test_missing_or_altered_verifier_refused(fitted, tmp_path):
    with pytest.raises(VerifierError, match="not found"):
        VerifierJudge(path=str(tmp_path / "nope"))
    tampered = tmp_path / "tampered"
    shutil.copytree(fitted["path"], tampered)
    model = json.loads((tampered / "model.json").read_text())
    model["intercept"] += 1.0
    (tampered / "model.json").write_text(json.dumps(model))
    with pytest.raises(VerifierError, match="does not match the manifest"):
        VerifierJudge(path=str(tampered))


def test_a_fit_of_another_feature_version_is_refused_not_reused(fitted, tmp_path):
    """Features changed meaning (v2: two passes, v3: one shared pass) under the same names: an old
    fit, even with a consistent manifest, must be re-fitted, never scored with the new features."""
    from rag_experiments.judge.verifier import FEATURE_VERSION, weights_sha256

    assert json.loads((fitted["path"] / "model.json").read_text())["feature_version"] == FEATURE_VERSION
    old = tmp_path / "v2"
    shutil.copytree(fitted["path"], old)
    model = json.loads((old / "model.json").read_text())
    del model["feature_version"]  # what a fit before version 3 wrote
    (old / "model.json").write_text(json.dumps(model))
    manifest = json.loads((old / "manifest.json").read_text())
    (old / "manifest.json").write_text(json.dumps({**manifest, "weights_sha256": weights_sha256(old)}))
    with pytest.raises(VerifierError, match="feature version 2, this code computes version 3"):
        VerifierJudge(path=str(old))


def test_a_stale_corpus_only_fit_is_refitted_by_auto_fit_a_labelled_one_is_not(fitted, tmp_path, capsys):
    """auto_fit re-fits a latest fit of an older feature version only when it came from the corpus
    alone with the default recipe (the same data); anything else is left for loading to refuse."""
    from rag_experiments.judge.verifier import weights_sha256
    from rag_experiments.judge.verifier_fit import resolve_verifier

    (latest,) = (fitted["root"] / "cache" / "verifiers").glob("*/latest.json")
    root = tmp_path / "verifiers" / latest.parent.name
    stale = root / "stale"
    shutil.copytree(fitted["path"], stale)
    model = json.loads((stale / "model.json").read_text())
    del model["feature_version"]
    (stale / "model.json").write_text(json.dumps(model))
    manifest = json.loads((stale / "manifest.json").read_text())
    manifest["weights_sha256"] = weights_sha256(stale)
    (root / "latest.json").write_text(json.dumps({"path": str(stale), "fit_id": manifest["fit_id"]}))
    (stale / "manifest.json").write_text(json.dumps(manifest))  # recipe: synthetic_max 120, not the default
    assert resolve_verifier(None, str(fitted["docs"]), str(tmp_path), auto_fit=True) == stale
    manifest["recipe"] = Recipe().as_dict()
    (stale / "manifest.json").write_text(json.dumps(manifest))
    assert resolve_verifier(None, str(fitted["docs"]), str(tmp_path), auto_fit=False) == stale
    fresh = resolve_verifier(None, str(fitted["docs"]), str(tmp_path), auto_fit=True)
    assert fresh != stale and "computed older features: re-fitting" in capsys.readouterr().err
    VerifierJudge(path=str(fresh))  # loads: the current feature version


def test_sweep_inputs_exit_2_for_missing_and_tampered_verifier(fitted, tmp_path):
    """What ``load_inputs`` turns into exit 2: the problems, no stages built, no run."""
    from hydra import compose, initialize_config_dir

    from rag_experiments.run.assemble import input_problems

    tampered = tmp_path / "t"
    shutil.copytree(fitted["path"], tampered)
    (tampered / "model.json").write_text((tampered / "model.json").read_text() + " ")
    docs, ev = fitted["docs"], next(fitted["root"].glob("evalset.jsonl"))
    base = ["corpus=dir", f"corpus.path={docs}", "evalset=file", f"evalset.path={ev}", f"cache_dir={tmp_path}/c"]
    with initialize_config_dir(str(sample_dir().parent.parent / "conf"), version_base="1.3"):
        for path, expect in ((tmp_path / "missing", "not found"), (tampered, "does not match")):
            cfg = compose("config", overrides=[*base, "judge=verifier", f"judge.path={path}"])
            problems, loaded = input_problems(cfg)
            assert loaded is None and any(expect in p for p in problems), problems


def test_verifier_judges_in_the_pipeline_and_its_identity_is_in_the_cache_keys(fitted, tmp_path):
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from rag_experiments.stages.generation import OpenAICompatibleGenerator
    from tests.llm_fixtures import FakeLLM
    from tests.sweep_helpers import tiny_inputs, tiny_pipeline

    fake = FakeLLM()
    fake.thread.start()
    try:
        tiny = tiny_inputs(tmp_path, n_items=3)
        judge = VerifierJudge(path=str(fitted["path"]))
        manifest = json.loads((fitted["path"] / "manifest.json").read_text())
        assert manifest["fit_id"] in judge.identity and manifest["weights_sha256"] in judge.identity
        gen = OpenAICompatibleGenerator(base_url=fake.base_url, model="ok", max_retries=0, timeout_s=10)
        prompt = instantiate(OmegaConf.load(sample_dir().parent.parent / "conf" / "prompt" / "concise.yaml"))
        res = tiny_pipeline(tiny, generator=gen, prompt=prompt, judge=judge)
    finally:
        fake.server.shutdown()
        fake.server.server_close()
    verdicts = [v for s in res.per_query["verdicts"].dropna() for v in s]
    assert verdicts and all(0 <= v["score"] <= 1 for v in verdicts)
    assert all(v["rationale"].startswith("P(supported)=") for v in verdicts)
    assert res.aggregates["n_escalated_verdicts"] == 0
    assert 0 <= res.aggregates["faithfulness"] <= 1


def test_verifier_without_path_uses_the_latest_fit_for_the_corpus(fitted):
    judge = VerifierJudge(corpus_path=str(fitted["docs"]), cache_dir=str(fitted["root"] / "cache"), auto_fit=False)
    assert judge.path == fitted["path"]


def test_card_of_a_missing_verifier_exits_2_not_a_traceback(tmp_path, capsys):
    argv = ["card", "--judge", "verifier", "--cache-dir", str(tmp_path), f"path={tmp_path / 'nope'}"]
    assert judge_main(argv) == 2
    assert "verifier directory not found" in capsys.readouterr().err


def test_no_fit_for_the_corpus_and_no_auto_fit_is_an_error(tmp_path):
    docs, _ = make_tiny(tmp_path, n_items=2)
    with pytest.raises(VerifierError, match="no verifier fitted for corpus"):
        VerifierJudge(corpus_path=str(docs), cache_dir=str(tmp_path / "c"), auto_fit=False)
    assert len(TINY_DOCS) == 4


# -- cascade ------------------------------------------------------------------------------------------


@requires_smollm2
def test_cascade_asks_the_llm_only_inside_the_band_and_records_the_stage(fitted):
    from rag_experiments.judge import LocalLLMJudge

    verifier = VerifierJudge(path=str(fitted["path"]))
    context = (
        "Refunds are issued within 5 business days. Webhooks are retried up to 8 times. "
        "Rate limits reset every minute."
    )
    claims = [
        "Refunds are issued within 5 business days.",
        "Refunds are not issued within 5 business days.",
        "Webhooks are retried up to 8 times.",
        "The Enterprise plan includes phone support.",
    ]
    scores = [v.score for v in verifier.verdicts(claims, context)]

    class CountingLLM(LocalLLMJudge):  # the real SmolLM2 judge; counts the claims it is asked
        asked: list[str] = []

        def verdicts(self, cs, ctx):
            CountingLLM.asked += list(cs)
            return super().verdicts(cs, ctx)

    llm = CountingLLM(max_tokens=8, decompose=False, n_parallel=1, n_threads=1)
    lo, hi = sorted(scores)[1] - 1e-9, sorted(scores)[2] + 1e-9  # the two middle claims are unsure
    cascade = CascadeJudge(verifier, llm, band=[lo, hi])
    out = cascade.verdicts(claims, context)
    inside = [c for c, s in zip(claims, scores, strict=True) if lo <= s <= hi]
    assert CountingLLM.asked == inside and len(inside) == 2
    for v, s in zip(out, scores, strict=True):
        assert v.stage == ("llm" if lo <= s <= hi else "verifier")
        assert (v.rationale.startswith("escalated") and v.score != s) if v.stage == "llm" else v.score == s
    assert json.loads(cascade.identity)["band"] == [lo, hi]
    with pytest.raises(ValueError, match="band"):
        CascadeJudge(verifier, llm, band=[0.8, 0.2])


def test_verifier_and_cascade_configs_validate_and_a_bad_band_is_named():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import rag_experiments.run.sweep  # noqa: F401  (registers the sample_dir resolver)
    from rag_experiments.run.config_schema import validate

    with initialize_config_dir(str(sample_dir().parent.parent / "conf"), version_base="1.3"):
        for judge in ("verifier", "cascade"):
            cfg = OmegaConf.to_container(compose("config", overrides=[f"judge={judge}"]), resolve=True)
            assert validate({k: v for k, v in cfg.items() if k != "hydra"}) == []
        cfg = compose("config", overrides=["judge=cascade", "judge.band=[0.9,0.1]"])
        problems = validate({k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k != "hydra"})
        assert any(p.startswith("conf/judge: band") for p in problems), problems
        for judge, key in (("verifier", "precision"), ("cascade", "verifier.precision")):
            cfg = compose("config", overrides=[f"judge={judge}", f"judge.{key}=float16"])
            problems = validate({k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k != "hydra"})
            assert any(p.startswith(f"conf/judge: {key}") and "float32, bfloat16" in p for p in problems), problems


# -- spot-check CSVs as training labels -----------------------------------------------------------


def _label_csv(path, rows):
    import csv

    from rag_experiments.spotcheck.claims import COLUMNS

    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in COLUMNS})


def test_spotcheck_csv_labels_load_as_pairs_and_bad_rows_exit_2_with_file_and_line(fitted, tmp_path, capsys):
    from rag_experiments.evalset.label_csv import load_labels

    ctx = "Refunds are issued within 5 business days."
    good = tmp_path / "labels.csv"
    _label_csv(good, [
        {"item_id": "q1#0", "claim": "Refunds take 5 business days.", "context": ctx, "human_verdict": "supported"},
        {"item_id": "q1#1", "claim": "Refunds take 9 days.", "context": ctx, "human_verdict": "Unsupported"},
        {"item_id": "q2#0", "claim": "Not labelled yet.", "context": ctx, "human_verdict": ""},
    ])  # fmt: skip
    pairs = load_labels(good)
    assert [(p.label, p.type) for p in pairs] == [("supported", "spotcheck"), ("unsupported", "spotcheck")]
    assert pairs[0].group == pairs[1].group  # one answer's claims share a CV fold
    out = tmp_path / "fit"
    ok = ["fit", "--corpus", str(fitted["docs"]), "--labels", str(good), "--no-mlflow", "--no-progress",
          "--cache-dir", str(tmp_path / "c"), "--out", str(out), "--synthetic-max", N_SYN]  # fmt: skip
    assert judge_main(ok) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["data"]["n_labelled"] == 2 and manifest["data"]["labels"][0]["file"] == "labels.csv"
    bad = tmp_path / "bad.csv"
    _label_csv(bad, [
        {"item_id": "q1#0", "claim": "A claim.", "context": ctx, "human_verdict": "maybe"},
        {"item_id": "q1#1", "claim": "", "context": ctx, "human_verdict": "supported"},
        {"item_id": "q1#2", "claim": "A claim without evidence.", "context": "", "human_verdict": "supported"},
    ])  # fmt: skip
    argv = ["fit", "--corpus", str(fitted["docs"]), "--labels", str(bad), "--no-mlflow", "--cache-dir", str(tmp_path)]
    assert judge_main(argv) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2: human_verdict: 'maybe'" in err and f"{bad}:3: claim: empty" in err
    assert f"{bad}:4: context: empty" in err
    assert not (tmp_path / "verifiers").exists()  # nothing trained


def test_alignment_memo_is_bounded_and_a_full_memo_still_serves_every_text(monkeypatch):
    from rag_experiments.judge import alignment, token_pass

    aligner = alignment.TokenAligner()
    aligner.prepare(["Refunds take five days.", "Webhooks are retried."], [])
    monkeypatch.setattr(token_pass, "MEMO_BYTES", 1)  # over the bound: the next call starts afresh
    out = aligner.features(["Refunds take five days."], ["Refunds are issued within five days."])
    assert out.shape == (1, len(alignment.ALIGN_FEATURES)) and out[0, 0] > 0.8
    assert len(token_pass._MEMO[aligner.passes.identity]) == 2  # cleared, then the two texts of this call

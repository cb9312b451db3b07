"""Headlines follow what was swept, on a real prompt × k sweep; defaults that fit one's own data.

One generating sweep (prompt=concise,cite × retriever.k=3,5) on a corpus directory of our own
(``acme-docs``: four sample documents, six eval items), answered by a local OpenAI-compatible
endpoint (tests/llm_fixtures.FakeLLM) so it runs in about a minute; one retrieval-only single run on
the same corpus. No experiment name is given: both land in the experiment named after the corpus.
"""

from __future__ import annotations

import json
import re

import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from rag_experiments.analysis.stats import holm
from rag_experiments.cli import compare
from rag_experiments.evaluation.aggregate import metric_columns
from rag_experiments.evaluation.headline import GENERATION_HEADLINE, table_metrics
from rag_experiments.report import cli as report_cli
from rag_experiments.report.load import sweep_override_keys
from rag_experiments.tracking.run_reader import MlflowRunReader
from rag_experiments.tracking.runs import as_record, load_per_query
from tests.llm_fixtures import FakeLLM
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args

CORPUS = "acme-docs"
DEFAULT_LINE = "baseline: prompt=concise, retriever.k=5 (the default config)"


@pytest.fixture(scope="module")
def own_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("headlines")
    docs, ev = make_tiny(root, n_items=6)
    docs = docs.rename(root / CORPUS)
    common = [a for a in sweep_args(root, docs, ev) if not a.startswith("experiment_name=")]
    fake = FakeLLM()
    fake.thread.start()
    try:
        run_sweep(
            root,
            "-m",
            *common,
            "generator=openai",
            f"generator.base_url={fake.base_url}",
            "generator.model=ok",
            "generator.api_key_env=null",
            "generator.max_retries=0",
            "retriever=bm25",
            "generation_subset=5",
            "metrics.bootstrap_resamples=100",
            "judge_card.enabled=false",
            "prompt=concise,cite",
            "retriever.k=3,5",
        )
    finally:
        fake.server.shutdown()
        fake.server.server_close()
    run_sweep(root, *common, "generator=none", "retriever=bm25", "metrics.bootstrap_resamples=100")
    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(CORPUS)
    assert exp is not None, [e.name for e in client.search_experiments()]
    runs = client.search_runs([exp.experiment_id])
    parent = next(r for r in runs if r.data.tags.get("is_parent") == "true")
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    single = [r for r in runs if r.data.tags.get("is_parent") != "true" and r not in children]
    return root, uri, client, parent, children, single


def _child(children, prompt: str, k: str):
    return next(
        r for r in children if r.data.params["prompt"] == prompt and r.data.params["retriever.k"] == k
    )


def test_runs_on_a_corpus_directory_land_in_its_experiment_with_no_path_in_their_names(own_corpus):
    root, _, client, parent, children, single = own_corpus
    assert client.get_experiment_by_name("rag-sample") is None  # nothing went to the sample's
    assert len(children) == 4 and len(single) == 1
    names = sorted(r.info.run_name for r in children)
    assert names == [f"prompt={p},retriever.k={k}" for p in ("cite", "concise") for k in (3, 5)]
    (run,) = single
    assert str(root) not in run.info.run_name and "/" not in run.info.run_name
    assert "corpus.path" not in run.info.run_name and "evalset.path" not in run.info.run_name
    assert (
        run.info.run_name
        == "corpus=dir,evalset=file,generator=none,retriever=bm25,metrics.bootstrap_resamples=100"
    )
    assert run.data.params["experiment_name"] == CORPUS  # the resolved default, logged as a param


def test_prompt_by_k_report_leads_with_generation_and_keeps_k_out_of_held_fixed(own_corpus, capsys):
    root, uri, _, parent, _, _ = own_corpus
    out = root / "report"
    sweep_id = parent.data.tags["sweep_id"]
    assert (
        report_cli.main(
            [sweep_id, "--tracking-uri", uri, "--out", str(out), "--no-log", "--resamples", "199"]
        )
        == 0
    )
    printed = capsys.readouterr().out.splitlines()
    assert DEFAULT_LINE in printed
    assert "primary metric: correctness" in printed
    md = (out / "report.md").read_text()
    question = md.split("## Results per config")[0]
    (held,) = [line for line in question.splitlines() if line.startswith("Held fixed:")]
    assert "retriever.k" not in held and "`prompt=" not in held and "`generator=openai`" in held
    assert "Context k (`retriever.k`) is swept" in question
    brief = question.split("In brief:")[1].split("Each level against")[0]
    assert "correctness = " in brief and "faithfulness = " in brief
    assert "(the default config)" in brief and "hit_at_5" not in brief
    # the generation tables come first in the results; the levels table leads with correctness
    results = md.split("## Results per config")[1]
    assert results.index("### Generation") < results.index("### Retrieval")
    levels_header = next(
        line for line in brief.splitlines() + question.splitlines() if line.startswith("| level |")
    )
    assert levels_header.startswith("| level | correctness |")


def test_compare_sweep_needs_no_baseline_and_picks_the_reports(own_corpus, capsys):
    _, uri, _, parent, children, _ = own_corpus
    sweep_id = parent.data.tags["sweep_id"]
    assert compare.main(["--sweep", sweep_id, "--tracking-uri", uri, "--resamples", "199"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == DEFAULT_LINE
    base = _child(children, "concise", "5")
    assert f"Baseline: {base.info.run_name} ({base.info.run_id[:8]}): the default config" in out
    header = next(line for line in out.splitlines() if line.startswith("level "))
    # the generation columns lead; one constant across the configs is listed once, not a column
    const = next((line for line in out.splitlines() if line.startswith("Constant across the configs")), "")
    lead = [m for m in GENERATION_HEADLINE if f"{m} = " not in const]
    assert lead and header.split()[1 : 1 + len(lead)] == lead, (header, const)
    # an explicit baseline still wins, and says so
    other = _child(children, "cite", "3")
    assert (
        compare.main(
            ["--sweep", sweep_id, "--baseline", other.info.run_id, "--tracking-uri", uri, "--resamples", "99"]
        )
        == 0
    )
    assert (
        capsys.readouterr().out.splitlines()[0]
        == "baseline: prompt=cite, retriever.k=3 (given with --baseline)"
    )


def test_compare_two_runs_tests_the_headline_family_and_holm_over_it(own_corpus, capsys):
    _, uri, client, _, children, _ = own_corpus
    a, b = _child(children, "concise", "5"), _child(children, "concise", "3")  # only k differs
    reader = MlflowRunReader(uri)
    ra, rb = reader.resolve(a.info.run_id), reader.resolve(b.info.run_id)
    family = compare.build_comparison(reader, ra, rb, n_resamples=199)
    available = metric_columns(load_per_query(client, a), load_per_query(client, b))
    shown = [r.metric for r in family.results]
    # k with generation: generation first; retrieval at the larger k of the two
    assert shown == table_metrics(available, ["retriever.k"], k=5)
    assert shown[:3] == list(GENERATION_HEADLINE) and len(shown) < len(available)
    assert [r.p_holm for r in family.results] == pytest.approx(
        list(holm([r.p_value for r in family.results]))
    )
    every = compare.build_comparison(reader, ra, rb, n_resamples=199, every_metric=True)
    assert len(every.results) > len(family.results) and "ndcg_at_5" in {r.metric for r in every.results}
    assert [r.p_holm for r in every.results] == pytest.approx(list(holm([r.p_value for r in every.results])))
    # the CLI says which family it tested and how to widen it
    assert compare.main([a.info.run_id, b.info.run_id, "--tracking-uri", uri, "--resamples", "99"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"Metrics: the headline family of what differs \(\d+; a generation setting is swept", out)
    assert "more with --all" in out
    table = out.split("== Metrics (paired, B − A) ==")[1]
    assert "ndcg_at_5" not in table.split("delta = mean(B)")[0]
    assert (
        compare.main([a.info.run_id, b.info.run_id, "--all", "--tracking-uri", uri, "--resamples", "99"]) == 0
    )
    out = capsys.readouterr().out
    assert "every common metric" in out and "ndcg_at_5" in out


def test_a_swept_key_is_never_held_fixed_even_with_one_level_left(own_corpus, tmp_path, capsys):
    """The k=3 configs of the prompt × k sweep never finished (racing stopped them, the endpoint
    died): the report compares the two k=5 configs, whose only factor is the prompt. k was swept
    all the same, so it is not "held fixed" (it was, when Held fixed left out only the factors the
    compared runs vary)."""
    _, uri, client, parent, children, _ = own_corpus
    assert sweep_override_keys(as_record(parent)) == ["prompt", "retriever.k"]
    exp = parent.info.experiment_id
    tags = {k: v for k, v in parent.data.tags.items() if not k.startswith("mlflow.")}
    half = client.create_run(exp, run_name="half sweep", tags={**tags, "sweep_id": "half-sweep"}).info.run_id
    for kid in (r for r in children if r.data.params["retriever.k"] == "5"):
        kid_tags = {k: v for k, v in kid.data.tags.items() if not k.startswith("mlflow.")}
        kid_tags.update({"mlflow.parentRunId": half, "sweep_id": "half-sweep"})
        rid = client.create_run(exp, run_name=kid.info.run_name, tags=kid_tags).info.run_id
        client.log_batch(
            rid,
            metrics=[Metric(k, v, 0, 0) for k, v in kid.data.metrics.items()],
            params=[Param(k, v) for k, v in kid.data.params.items()],
        )
        client.log_artifact(
            rid, client.download_artifacts(kid.info.run_id, "per_query.parquet", str(tmp_path))
        )
        client.set_terminated(rid, "FINISHED")
    out = tmp_path / "report"
    assert (
        report_cli.main(
            ["half-sweep", "--tracking-uri", uri, "--out", str(out), "--no-log", "--resamples", "99"]
        )
        == 0
    )
    assert "baseline: prompt=concise (the default config)" in capsys.readouterr().out
    question = (out / "report.md").read_text().split("## Results per config")[0]
    (held,) = [line for line in question.splitlines() if line.startswith("Held fixed:")]
    assert "retriever.k" not in held and "`generator=openai`" in held
    assert (
        "Swept, with one level among the configs compared (others stopped or unfinished): `retriever.k=5`"
        in question
    )
    # a hand-written tag: only the keys swept over several values count, place keys never
    tagged = {"sweep_overrides": json.dumps(["retriever.k=3,5", "cache_dir=/x,/y", "seed=0"])}
    rid = client.create_run(exp, run_name="hand-made parent", tags=tagged).info.run_id
    assert sweep_override_keys(as_record(client.get_run(rid))) == ["retriever.k"]
    client.delete_run(rid)

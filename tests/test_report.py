"""The sweep report on a real tiny sweep, rendered in real headless Chromium."""

from __future__ import annotations

import html as html_lib
import importlib.util
import os
import re
import struct
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from rag_experiments.core.query_table import read_per_query, write_per_query
from rag_experiments.report import cli, figures, load
from rag_experiments.report.model import (
    Bullets,
    CodeBlock,
    Paragraph,
    Report,
    Section,
    Subsection,
    bold,
    code,
    table,
    text,
)
from rag_experiments.report.render import md_cell, render_html, render_markdown
from rag_experiments.report.sections import build_report
from rag_experiments.tracking.run_reader import MlflowRunReader
from tests.sweep_helpers import REPO, make_tiny, run_sweep, sweep_args

HEADINGS = [
    "## Question",
    "## Results per config",
    "## Attribution (one factor at a time)",
    "## Plots",
    "## Worst queries",
    "## Metric definitions",
    "## Reproducibility",
]
SECTION_IDS = ["question", "results", "attribution", "plots", "worst", "definitions", "reproducibility"]
SCREENSHOT = REPO / "reports" / "screenshots" / "report_chromium.png"  # reports/ is git-ignored


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("report_sweep")
    docs, ev = make_tiny(root)
    run_sweep(root, "-m", "chunking=fixed,markdown", "generator=none", *sweep_args(root, docs, ev))
    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("test")
    parent = client.search_runs([exp.experiment_id], "tags.is_parent = 'true'")[0]
    return root, uri, client, parent


@pytest.fixture(scope="module")
def sweep_report(tiny_sweep):
    root, uri, client, parent = tiny_sweep
    out = root / "report"
    sweep_id = parent.data.tags["sweep_id"]
    assert cli.main([sweep_id, "--tracking-uri", uri, "--out", str(out), "--resamples", "999"]) == 0
    return out, parent


def test_report_files_sections_and_logging(tiny_sweep, sweep_report):
    _, uri, client, _ = tiny_sweep
    out, parent = sweep_report
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert {
        "hit_at_k.png",
        "recall_vs_mrr.png",
        "failure_labels.png",
        "per_tag.png",
        "main_effects.png",
    } <= set(pngs)
    # sections present, in order
    pos = [md.index(h + "\n") for h in HEADINGS]
    assert pos == sorted(pos)
    assert "| chunking | fixed, markdown |" in md
    assert "hit_at_5" in md and "95% CI" in md and "p_holm" in md
    assert "cost_usd" in md and "latency_p95_ms/retrieval" in md  # the Cost table of the results
    assert "def " not in md and "rag_experiments.evaluation.metrics.ndcg_at_k" in md  # docstrings, not source
    assert "Generation" not in md and "faithfulness" not in md.split("## Metric definitions")[0]
    assert parent.data.tags["git_commit"] in md and "corpus digest" in md and "cache_key.rankings" in md
    assert "python -m rag_experiments.sweep" in md and "chunking=markdown" in md
    # self-contained: no external asset, every image inline
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html, re.I)
    assert "<link" not in html and "<script" not in html
    imgs = re.findall(r'<img src="([^"]+)"', html)
    assert len(imgs) == len(pngs) and all(s.startswith("data:image/png;base64,") for s in imgs)
    arts = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/report.md", "report/report.html", "report/hit_at_k.png"} <= arts


def test_hit_curve_matches_logged_metrics(tiny_sweep):
    _, uri, client, parent = tiny_sweep
    reader = MlflowRunReader(uri)
    target = load.resolve_target(reader, parent.info.run_id)  # a parent run id works too
    assert target.sweep_id == parent.data.tags["sweep_id"] and len(target.runs) == 2
    configs, factors = load.load_configs(reader, target.runs)
    assert factors == ["chunking"]
    curves, notes = figures.hit_curves(configs)
    assert notes == []
    for c in configs:
        curve = curves[c.label]
        assert len(curve) == 10 and all(a <= b for a, b in zip(curve, curve[1:], strict=False))
        for k in (1, 3, 5, 10):
            assert curve[k - 1] == pytest.approx(c.metrics[f"hit_at_{k}"])


def test_single_run_and_unknown_target(tiny_sweep, tmp_path, capsys):
    _, uri, client, parent = tiny_sweep
    child = client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )[0]
    out = tmp_path / "single"
    assert cli.main([child.info.run_id, "--tracking-uri", uri, "--out", str(out), "--no-log"]) == 0
    md = (out / "report.md").read_text()
    assert "a single run: no factor varies" in md and "## Reproducibility" in md
    assert not (out / "main_effects.png").exists()
    assert not [a for a in client.list_artifacts(child.info.run_id) if a.path == "report"]
    capsys.readouterr()
    assert cli.main(["no-such-sweep", "--tracking-uri", uri, "--out", str(tmp_path / "x")]) == 2
    assert "unknown run 'no-such-sweep'" in capsys.readouterr().err


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_report_renders_in_headless_chromium(sweep_report):
    out, _ = sweep_report
    spec = importlib.util.spec_from_file_location("render_html", REPO / "scripts" / "render_html.py")
    render_html = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render_html)
    if render_html.find_chromium() is None:
        pytest.fail("chromium is not installed: scripts/test.sh installs it (apt-get install chromium)")
    res = render_html.render(out / "report.html", SCREENSHOT)
    print(f"\nChromium screenshot: {SCREENSHOT}")
    assert res["sections"] == SECTION_IDS
    assert res["images"] >= 4 and res["broken"] == 0
    assert res["external"] == 0  # no request left the page
    for title in ("Results per config", "Worst queries", "Metric definitions"):
        assert title in res["dom"]
    assert SCREENSHOT.stat().st_size > 50_000
    assert _png_size(SCREENSHOT) == (1280, 4000)


# ------------------------------------------------------------------ model and rendering


def _numbers(s: str) -> Counter:
    return Counter(re.findall(r"[-+]?\d+(?:\.\d+)?", s))


def _html_text(page: str) -> str:
    body = page.split("</nav>", 1)[1]  # after the title and the table of contents
    return html_lib.unescape(re.sub(r"<[^>]+>", " ", body))


def test_markdown_and_html_of_one_model_carry_the_same_numbers(tiny_sweep):
    _, uri, client, parent = tiny_sweep
    reader = MlflowRunReader(uri)
    rep = build_report(load.load_input(reader, load.resolve_target(reader, parent.info.run_id)), n_resamples=199)
    assert [s.anchor for s in rep.sections] == SECTION_IDS
    # a chunking sweep: the equal-budget figure leads, hit@k and MRR follow with why (issue 43)
    assert [f.file for f in rep.figures][:3] == ["evidence_recall_by_budget.png", "hit_at_k.png", "recall_vs_mrr.png"]
    md = render_markdown(rep)
    page = render_html(rep, {f.file: "data:image/png;base64,AAAA" for f in rep.figures})
    md_body = "\n".join(
        line for line in md.splitlines()[1:] if not line.startswith("![") and not line.startswith("|---")
    )
    numbers = _numbers(md_body)
    assert numbers == _numbers(_html_text(page))
    # the numbers are the logged ones: every config's hit_at_5 and its CI, to 3 decimals, in both
    for c in load.load_configs(reader, load.resolve_target(reader, parent.info.run_id).runs)[0]:
        m = c.metrics
        cell = f"{m['hit_at_5']:.3f} [{m['hit_at_5_ci_low']:.3f}, {m['hit_at_5_ci_high']:.3f}]"
        assert cell in md and cell in page


def test_render_escapes_and_styles_rich_text():
    rep = Report(
        title="T <1>",
        sections=[
            Section(
                "question",
                "Q",
                [
                    Paragraph(text("a ", code("x|y"), " and ", bold("<b>"))),
                    Bullets([text("one"), text("two")]),
                ],
                [
                    Subsection(
                        "S", [table(["h|1", "h2"], [["a|b", bold("1.000")]]), CodeBlock("line 1\n\nline 3\n")]
                    )
                ],
            )
        ],
        footer=text("end"),
        baseline="b",
        primary="p",
        notes=[],
    )
    md = render_markdown(rep)
    assert md == (
        "# T <1>\n\n## Q\n\na `x|y` and **\\<b>**\n\n- one\n- two\n\n### S\n\n"
        "| h\\|1 | h2 |\n|---|---|\n| a\\|b | **1.000** |\n\n```\nline 1\n\nline 3\n```\n\nend\n"
    )
    page = render_html(rep, {})
    assert "<p>a <code>x|y</code> and <strong>&lt;b&gt;</strong></p>" in page
    assert "<td>a|b</td><td><strong>1.000</strong></td>" in page and "<title>T &lt;1&gt;</title>" in page
    assert '<section id="question"><h2>Q</h2>' in page and "<pre>line 1\n\nline 3\n</pre>" in page
    assert md_cell("a\nb|c") == "a b\\|c"


def test_module_entry_point(tiny_sweep):
    """``python -m rag_experiments.report`` runs the CLI (bad input: exit 2, no traceback)."""
    _, uri, _, _ = tiny_sweep
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run(
        [sys.executable, "-m", "rag_experiments.report", "no-such-sweep", "--tracking-uri", uri, "--no-log"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert p.returncode == 2 and "unknown run 'no-such-sweep'" in p.stderr and "Traceback" not in p.stderr


# ------------------------------------------------------------------ generation sections (hand-logged runs)


def test_generation_sections_appear_with_generation_metrics(tiny_sweep, tmp_path):
    """Re-log the tiny sweep's children with generation columns under a new parent."""
    _, uri, client, parent = tiny_sweep
    exp_id = parent.info.experiment_id
    kids = client.search_runs([exp_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    new_parent = client.create_run(
        exp_id,
        run_name="gen sweep",
        tags={
            "is_parent": "true",
            "sweep_id": "gen-sweep",
            "command": "python -m rag_experiments.sweep -m x",
            "git_commit": "abc",
            "git_dirty": "false",
        },
    )
    rng = np.random.default_rng(0)
    for i_kid, kid in enumerate(kids):
        with tempfile.TemporaryDirectory() as tmp:
            path = client.download_artifacts(kid.info.run_id, "per_query.parquet", tmp)
            t = read_per_query(path)
        n = len(t)
        t["answer"] = [f"Answer {i}. It retries for 24 hours." for i in range(n)]
        t["context"] = "Webhooks retry with exponential backoff for 24 hours."
        verdict = {"claim": "It retries for 24 hours.", "label": "supported", "score": 0.8, "rationale": "matches"}
        t["verdicts"] = [[verdict] for _ in range(n)]
        t["faithfulness"] = rng.integers(0, 2, n).astype(float)
        t["correctness"] = rng.random(n)
        t["answer_relevance"] = rng.random(n)
        t["claim_recall"] = rng.random(n)
        t["hallucination"] = rng.random(n)
        t["diagnostics_nan_reason"] = [{"hallucination": "declining answer"}] + [{} for _ in range(n - 1)]
        t["failure_label"] = np.where(t["hit_at_5"] == 1, "ok", "retrieval_failure")
        t.loc[0, "failure_label"] = "generation_failure"
        tags = {k: v for k, v in kid.data.tags.items() if not k.startswith("mlflow.")}
        tags.update(
            {
                "mlflow.parentRunId": new_parent.info.run_id,
                "sweep_id": "gen-sweep",
                "generator_model": "SmolLM2",
                "judge_model": "SmolLM2",
                "judge_is_generator": "true",
                "judge_card_source": "synthetic",
            }
        )
        run = client.create_run(exp_id, run_name=kid.info.run_name, tags=tags)
        rid = run.info.run_id
        client.log_batch(rid, params=[Param(k, v) for k, v in kid.data.params.items()])
        metrics = dict(kid.data.metrics)
        for m in ("faithfulness", "correctness", "answer_relevance", "claim_recall", "hallucination"):
            metrics.update(
                {
                    m: t[m].mean(),
                    f"{m}_ci_low": t[m].mean() - 0.1,
                    f"{m}_ci_high": t[m].mean() + 0.1,
                    f"by_tag/exact/{m}": 0.5,
                }
            )
        metrics["rate_ok"] = float((t["failure_label"] == "ok").mean())
        card = {"kappa": 0.31, "balanced_accuracy": 0.65, "unparseable_rate": 0.0, "seconds_per_verdict": 0.01}
        for k, v in card.items():  # the judge card a run logs (judge_card/*, docs/judges.md)
            metrics.update({f"judge_card/{k}": v, f"judge_card/{k}/ci_low": v / 2, f"judge_card/{k}/ci_high": v})
        # human labels: κ 0.40 on the first config, 0.05 on the others (below 0.4: marked)
        metrics.update({"judge_card/n_pairs": 200, "spotcheck/kappa": 0.4 if i_kid == 0 else 0.05})
        client.log_batch(rid, metrics=[Metric(k, float(v), 0, 0) for k, v in metrics.items()])
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / "per_query.parquet"
            write_per_query(t, p)
            client.log_artifact(rid, str(p))
        client.set_terminated(rid, "FINISHED")
    out = tmp_path / "gen"
    assert (
        cli.main(
            [
                "gen-sweep",
                "--tracking-uri",
                uri,
                "--out",
                str(out),
                "--resamples",
                "499",
                "--baseline",
                "chunking=fixed",
            ]
        )
        == 0
    )
    md = (out / "report.md").read_text()
    assert "### Generation" in md and "| config | faithfulness | answer_relevance | correctness |" in md
    # the judge's card beside the generation metrics, with the spot-check κ joined
    card_md = md.split("### Judge validity: human labels first")[1].split("###")[0]
    assert "| human κ (spot-check, this run) | card pairs (n) | card κ | card balanced accuracy |" in card_md
    assert "0.310 [0.155, 0.310]" in card_md and "0.400" in card_md
    assert "synthetic pairs: an optimistic bound, not this corpus's accuracy (200)" in card_md
    # human labels exist: no unvalidated note; the lowest human κ (0.05 < 0.4) marks the report
    assert "generation metrics unvalidated" not in md
    # correctness was never checked against answer labels: the validity section says so, with the n
    assert "correctness unvalidated: key-fact matching was never checked" in card_md
    assert "spotcheck sample-answers" in card_md and " -n 97 " in card_md
    assert "judge κ=0.05 vs your labels (spot-check): generation conclusions unreliable" in md
    assert "baseline = **chunking=fixed** (given with --baseline)" in md
    assert "chunking=markdown | faithfulness |" in md  # attributed
    assert "rag_experiments.evaluation.answer_scores.faithfulness_score" in md and "HeuristicJudge" in md
    assert "(same as generator!)" in md and "| answer |" in md
    # claim-level diagnostics: means with CIs per config, an explanation each, why values are undefined
    assert "## Claim-level diagnostics" in md and "| config | claim_recall | hallucination |" in md
    assert "`hallucination`: share of answer claims in no retrieved chunk and wrong" in md
    assert "| chunking=fixed | declining answer | 1 |" in md
    assert (out / "generation.png").exists() and (out / "per_tag_correctness.png").exists()
    assert {a.path for a in client.list_artifacts(new_parent.info.run_id, "report")} >= {"report/report.html"}


def test_held_fixed_lists_only_keys_of_stages_that_ran():
    """A BM25 retrieval-only sweep never calls the embedder nor generates: ``embedding`` and the
    generation keys are not "held fixed"; as soon as one config's retriever embeds, it is."""
    from types import SimpleNamespace

    from rag_experiments.report.sections import held_fixed

    base = {
        "chunking": "fixed", "embedding": "minilm", "embedding.name": "all-MiniLM-L6-v2", "generator": "none",
        "prompt": "concise", "judge": "heuristic", "retriever.k": "5",
    }  # fmt: skip
    bm25 = {**base, "retriever": "bm25", "retriever._target_": "rag_experiments.stages.retrieval.BM25Retriever"}
    dense = {**base, "retriever": "dense", "retriever._target_": "rag_experiments.stages.retrieval.DenseRetriever"}
    custom = {**base, "retriever": "mine", "retriever._target_": "my_package.MyRetriever"}  # not importable

    def held(*params, factors=("chunking",), generated=False):
        return held_fixed([SimpleNamespace(params=p) for p in params], list(factors), generated)

    chunker_sweep = held(bm25, {**bm25, "chunking": "sentence"})
    assert chunker_sweep == {"generator": "none", "retriever": "bm25", "retriever.k": "5"}
    with_gen = held(bm25, {**bm25, "chunking": "sentence"}, generated=True)
    assert "embedding" not in with_gen and with_gen["prompt"] == "concise"  # BM25 still embeds nothing
    retriever_sweep = held(bm25, dense, factors=("retriever",))
    assert retriever_sweep["embedding"] == "minilm" and retriever_sweep["embedding.name"] == "all-MiniLM-L6-v2"
    assert held(dense, {**dense, "chunking": "sentence"})["embedding"] == "minilm"
    assert held(custom, {**custom, "chunking": "sentence"})["embedding"] == "minilm"  # shown, not hidden


def test_the_report_says_first_when_the_eval_set_cannot_separate_the_configs():
    """Issue 27: the report leads with select's underpowered verdict (same rule as select/gate).
    Issue 43: it is select's verdict itself (``analysis.verdict.pick_verdict``), caveat for caveat."""
    import numpy as np

    from rag_experiments.analysis.verdict import pick_verdict
    from rag_experiments.core.run_record import RunData
    from rag_experiments.evaluation.registry import higher_is_better

    rng = np.random.default_rng(0)

    def cfg(name, p, n=12):
        table = pd.DataFrame({"id": [f"q{i}" for i in range(n)], "hit_at_5": (rng.random(n) < p).astype(float)})
        return RunData(name, name, {}, {}, table)

    noisy = [cfg(f"c{i}", 0.5 + 0.02 * i) for i in range(4)]  # 12 queries, differences of 0.02
    (note,) = pick_verdict(noisy, "hit_at_5", "given", higher_is_better, n_resamples=999).caveat_lines()
    assert note.startswith("UNDERPOWERED") and "n ≈" in note and "`plan --" in note
    same = [cfg("a", 1.0, 200), cfg("b", 1.0, 200)]  # identical on 200 queries: shown equal
    assert pick_verdict(same, "hit_at_5", "given", higher_is_better, n_resamples=999).caveat_lines() == []


def test_bold_marks_the_best_mean_in_the_metrics_own_direction():
    from types import SimpleNamespace

    from rag_experiments.report.model import plain
    from rag_experiments.report.sections import results_table

    a = SimpleNamespace(label="a", metrics={"hit_at_5": 0.8, "rate_retrieval_failure": 0.1})
    b = SimpleNamespace(label="b", metrics={"hit_at_5": 0.6, "rate_retrieval_failure": 0.3})
    t = results_table(SimpleNamespace(configs=[a, b], base=a), ["hit_at_5", "rate_retrieval_failure"])
    rows = {plain(r[0]).split(" ")[0]: r for r in t.rows}

    def is_bold(cell) -> bool:
        return any(span.style == "bold" for span in cell)

    assert is_bold(rows["a"][1]) and not is_bold(rows["b"][1])  # hit@5: higher is better
    assert is_bold(rows["a"][2]) and not is_bold(rows["b"][2])  # a failure rate: lower is better


def test_a_failed_report_leaves_no_partial_folder(tmp_path, monkeypatch):
    """Issue 31 item 12: a report killed while drawing left a folder of some figures and no report;
    now nothing appears until every file is written (fault injected: the second figure fails)."""
    from rag_experiments.report import render

    calls = []

    def failing_draw(plot, path):
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt("signal 15")
        path.write_bytes(b"png")
        return path

    monkeypatch.setattr(render, "draw", failing_draw)
    from types import SimpleNamespace

    report = SimpleNamespace(figures=[SimpleNamespace(plot=None, file=n) for n in ("a.png", "b.png")])
    out = tmp_path / "report"
    try:
        render.write_report(report, out)
    except KeyboardInterrupt:
        pass
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no temporary folder left either

"""Issue 43: one verdict, every surface. A surfaces × scenarios matrix on in-memory runs.

Each scenario is a handful of runs with per-query tables in a ``MemoryStore`` (no sweep, no model);
each surface renders the verdict of ``analysis/verdict.py``:

- ``gate`` (console, ``cli.gate.render``) and ``gate --summary-md`` (``report.gate_summary``,
  parsed back with a CommonMark parser) show the gate's verdict on a baseline/candidate pair;
- ``select`` (console, ``cli.select.render``) and the report (``report.sections.build_report``,
  its Markdown parsed back) show the pick over the scenario's configs.

Every cell asserts the same metric, the same verdict and the same caveats, in the same order. A new
surface adds a column (a function in ``SURFACES``), a new scenario a row (a function in
``SCENARIOS``). The stratified review with a constant stratum (``evalset estimate``) and the
``[plan]`` line are surfaces of the statistics module (issue 43 items 4-6), tested with it.
"""

from __future__ import annotations

import argparse
import re

import numpy as np
import pandas as pd
import pytest
from markdown_it import MarkdownIt

from rag_experiments.cli import compare as compare_cli
from rag_experiments.cli import compare_sweep
from rag_experiments.cli import gate as gate_cli
from rag_experiments.cli import select as select_cli
from rag_experiments.report.gate_summary import build_summary, render_summary
from rag_experiments.report.load import load_input, resolve_target
from rag_experiments.report.render import WORD_JOINER, render_markdown
from rag_experiments.report.sections import build_report
from rag_experiments.tracking.memory import MemoryStore
from rag_experiments.tracking.run_reader import MemoryRunReader
from rag_experiments.tracking.runs import RunInputError

SWEEP = "s43"
BUDGETS = (256, 512, 1024)


def _table(values: dict[str, np.ndarray], n: int) -> pd.DataFrame:
    return pd.DataFrame(
        {"id": [f"q{i:03d}" for i in range(n)], "query": [f"question {i}?" for i in range(n)],
         "latency_retrieval_s": 0.01,
         "retrieved": [[{"rank": 1, "chunk_id": "c0", "doc_id": "d.md", "start": 0, "end": 100, "score": 1.0}]] * n,
         "gold_spans": [[{"doc_id": "d.md", "start": 0, "end": 10}]] * n, **values}
    )  # fmt: skip


class Scenario:
    """Runs in a memory store, the pair gate compares and the flags every surface is given."""

    def __init__(self, allow: bool = False, metric: str | None = None):
        self.store, self.allow, self.metric = MemoryStore(), allow, metric
        self.parent = self.store.new_run("parent", "exp")
        self.parent.tags.update({"is_parent": "true", "sweep_id": SWEEP})
        self.parent.status = "FINISHED"
        self.names: list[str] = []

    def add(self, name: str, params: dict[str, str], values: dict[str, np.ndarray], tags=None) -> None:
        n = len(next(iter(values.values())))
        r = self.store.new_run(name, "exp", self.parent.run_id)
        r.start_time = len(self.names) + 1.0
        r.params.update({"retriever": "dense", "retriever.k": "5", "generator": "none", **params})
        r.tags.update({"sweep_id": SWEEP, "config_hash": name, "evalset_digest": "e1", **(tags or {})})
        r.metrics.update({"n_queries": float(n), **{k: float(np.nanmean(v)) for k, v in values.items()}})
        r.table = _table(values, n)
        r.status = "FINISHED"
        self.names.append(name)

    @property
    def reader(self) -> MemoryRunReader:
        return MemoryRunReader(self.store)


def _budgeted(rng, n, recall: dict[int, float]) -> dict[str, np.ndarray]:
    return {f"evidence_recall_at_{b}tok": (rng.random(n) < p).astype(float) for b, p in recall.items()}


def chunking_sweep() -> Scenario:
    """fixed, sentence, whole: hit@5 favours whole documents; the pick flips between budgets."""
    rng, n, s = np.random.default_rng(1), 120, Scenario()
    base = rng.random(n)
    for name, hit, recall in (
        ("fixed", 0.55, {256: 0.70, 512: 0.72, 1024: 0.80}),
        ("sentence", 0.60, {256: 0.45, 512: 0.85, 1024: 0.95}),
        ("whole", 0.95, {256: 0.20, 512: 0.30, 1024: 0.50}),
    ):
        vals = {"hit_at_5": (base < hit).astype(float), "mrr": (base < hit) / 2.0}
        for b, p in recall.items():
            vals[f"evidence_recall_at_{b}tok"] = (base < p).astype(float)
        s.add(f"chunking={name}", {"chunking": name}, vals)
    s.pair = ("chunking=fixed", "chunking=whole")
    return s


def app_vs_pipeline() -> Scenario:
    """app=python returns whole documents as contexts: hit@5 favours it; the app replaced the chunker."""
    rng, n, s = np.random.default_rng(2), 100, Scenario()
    base = rng.random(n)
    for name, params, hit, rec in (
        ("app=none", {"app": "none", "chunking": "markdown"}, 0.7, 0.8),
        ("app=python", {"app": "python", "app.path": "my_app.py", "chunking": "markdown"}, 0.95, 0.8),
    ):
        vals = {"hit_at_5": (base < hit).astype(float), "mrr": (base < hit) / 2.0}
        vals |= {f"evidence_recall_at_{b}tok": (base < rec).astype(float) for b in BUDGETS}
        s.add(name, params, vals)
    s.pair = ("app=none", "app=python")
    return s


def underpowered() -> Scenario:
    """8 queries: the default margin 1/√8 is wider than 0.15, every surface says UNDERPOWERED."""
    s, rng = Scenario(metric="hit_at_5"), np.random.default_rng(3)
    for name, p in (("retriever=bm25", 0.6), ("retriever=dense", 0.5)):
        s.add(name, {"retriever": name.split("=")[1]}, {"hit_at_5": (rng.random(8) < p).astype(float)})
    s.pair = ("retriever=bm25", "retriever=dense")
    return s


def zero_variance() -> Scenario:
    """Two configs identical on every one of 400 queries: tied, PASS, nothing to warn about."""
    s = Scenario(metric="hit_at_5")
    hits = (np.arange(400) % 4 != 0).astype(float)
    for name in ("retriever=bm25", "retriever=dense"):
        s.add(name, {"retriever": name.split("=")[1]}, {"hit_at_5": hits})
    s.pair = ("retriever=bm25", "retriever=dense")
    return s


def binary_vs_fractional() -> Scenario:
    """A 0/1 metric and a fractional one (a two-span item scores 0.5): one test each, named alike."""
    s, rng = Scenario(metric="evidence_recall_at_5"), np.random.default_rng(4)
    for name, p in (("retriever=bm25", 0.7), ("retriever=dense", 0.72)):
        hits = (rng.random(300) < p).astype(float)
        rec = np.where(rng.random(300) < 0.2, 0.5, hits)
        s.add(name, {"retriever": name.split("=")[1]}, {"hit_at_5": hits, "evidence_recall_at_5": rec})
    s.pair = ("retriever=bm25", "retriever=dense")
    return s


def duplicate_configs() -> Scenario:
    """Two runs with the same per-query values (a factor no metric depends on): tied everywhere."""
    s, rng = Scenario(metric="hit_at_5"), np.random.default_rng(5)
    hits = (rng.random(300) < 0.7).astype(float)
    for k in ("3", "5"):
        s.add(f"retriever.k={k}", {"retriever.k": k}, {"hit_at_5": hits})
    s.pair = ("retriever.k=3", "retriever.k=5")
    return s


def different_corpora(allow: bool) -> Scenario:
    """Same eval set, different corpus_digest: refused everywhere, or allowed with the caveat first."""
    s, rng = Scenario(allow=allow, metric="hit_at_5"), np.random.default_rng(6)
    for name, digest in (("corpus=a", "a" * 64), ("corpus=b", "b" * 64)):
        s.add(name, {"retriever": "dense", "corpus.path": name}, {"hit_at_5": (rng.random(200) < 0.7).astype(float)},
              tags={"corpus_digest": digest})  # fmt: skip
    s.pair = ("corpus=a", "corpus=b")
    return s


SCENARIOS = {
    "chunking sweep": chunking_sweep,
    "app vs pipeline": app_vs_pipeline,
    "underpowered": underpowered,
    "zero variance": zero_variance,
    "binary vs fractional": binary_vs_fractional,
    "duplicate configs": duplicate_configs,
    "different corpora, allowed": lambda: different_corpora(True),
}

# ----------------------------------------------------------------------------- the surfaces


def _gate_args(s: Scenario) -> argparse.Namespace:
    metric = [s.metric] if s.metric else None
    return gate_cli.build_parser().parse_args(
        ["--baseline", s.pair[0], "--candidate", s.pair[1], "--resamples", "999"]
        + [a for m in metric or [] for a in ("--metric", m)]
        + (["--allow-incomparable"] if s.allow else [])
    )


def _select_args(s: Scenario) -> argparse.Namespace:
    return select_cli.build_parser().parse_args(
        [SWEEP, "--resamples", "9999"] + (["--metric", s.metric] if s.metric else [])
        + (["--allow-incomparable"] if s.allow else [])
    )  # fmt: skip


def _inline_texts(md: str) -> list[tuple[str, str]]:
    """(enclosing block, rendered text) of every inline run, word joiners dropped."""
    toks = MarkdownIt("commonmark").enable("table").parse(md)
    out, stack = [], []
    for t in toks:
        if t.nesting == 1:
            stack.append(t.type)
        elif t.nesting == -1:
            stack.pop()
        elif t.type == "inline":
            txt = "".join(c.content if c.type in ("text", "code_inline") else " " if "break" in c.type else ""
                          for c in t.children or [])  # fmt: skip
            block = next((b for b in reversed(stack) if b != "paragraph_open"), "paragraph_open")
            out.append((block, txt.replace(WORD_JOINER, "")))
    return out


def gate_console(s: Scenario) -> dict:
    v, header = gate_cli.gate_verdict_of(s.reader, _gate_args(s))
    text = gate_cli.render(v, header)
    lines = text.splitlines()
    shown = [c for c in v.caveat_lines() if c in lines]
    verdict = "PASS" if "GATE PASSED" in text else "FAIL"
    metrics = [m for m in (x.metric for x in v.metrics) if re.search(rf"^{re.escape(m)} ", text, re.M)]
    return {"verdict": verdict, "metrics": metrics, "caveats": shown, "all": v.caveat_lines(), "v": v}


def gate_summary_md(s: Scenario) -> dict:
    rd = s.reader
    v, _ = gate_cli.gate_verdict_of(rd, _gate_args(s))
    rb, rc = rd.resolve(s.pair[0]), rd.resolve(s.pair[1])
    md = render_summary(
        build_summary("sqlite:///unused.db", rb, rc, rd.per_query(rb), rd.per_query(rc), v, top=0)
    )
    texts = _inline_texts(md)
    heading = [t for b, t in texts if b == "heading_open" and t.startswith("Regression gate")]
    caveats = [t for b, t in texts if b == "list_item_open"]
    metrics = [t for b, t in texts if b == "td_open" and t in {m.metric for m in v.metrics}]
    return {"verdict": heading[0].split()[-1], "metrics": metrics, "caveats": caveats, "md": md}


def select_console(s: Scenario) -> dict:
    v, _ = select_cli.run_select(s.reader, _select_args(s))
    text = select_cli.render(v)
    lines = text.splitlines()
    return {"metric": v.choice.metric, "pick": v.chosen or v.best, "ties": v.tie.text(),
            "caveats": [c for c in v.caveat_lines() if c in lines], "all": v.caveat_lines(),
            "budget": v.budget_text, "text": text}  # fmt: skip


def report_md(s: Scenario) -> dict:
    rd = s.reader
    inp = load_input(rd, resolve_target(rd, SWEEP))
    rep = build_report(inp, primary=s.metric, allow_incomparable=s.allow)
    md = render_markdown(rep)
    texts = [t for _, t in _inline_texts(md)]
    warnings = [t.removeprefix("warning: ") for t in texts if t.startswith("warning: ")]
    verdict = next(t for t in texts if t.startswith("Verdict on "))
    return {"metric": rep.primary, "pick": verdict.split(" keeps ")[1].split(";")[0],
            "ties": re.search(r"\d+ of \d+ configs tied with the best.*? indistinguishable", verdict).group(0),
            "caveats": warnings, "md": md}  # fmt: skip


def _plain(caveat: str) -> str:
    """A caveat as the report prints it ("note: " dropped) with blanks as one space."""
    return " ".join(caveat.removeprefix("note: ").split())


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_surface_shows_one_verdict(name):
    s = SCENARIOS[name]()
    gc, gm = gate_console(s), gate_summary_md(s)
    # the gate's two surfaces: one verdict, the same metrics and caveats, in the same order
    assert gc["verdict"] == gm["verdict"], name
    assert gc["metrics"] == gm["metrics"] == [m.metric for m in gc["v"].metrics], name
    assert gc["caveats"] == gc["all"], name  # every caveat on the console, in order
    assert gm["caveats"] == [" ".join(c.split()) for c in gc["all"]], name
    assert ("UNDERPOWERED" in gm["md"]) == any(c.startswith("UNDERPOWERED") for c in gc["all"]), name
    # the pick's two surfaces: the same metric, pick, tie count and caveats, in the same order
    sc, rp = select_console(s), report_md(s)
    assert sc["metric"] == rp["metric"], name
    assert sc["pick"] == rp["pick"] and sc["ties"] == rp["ties"], name
    assert sc["caveats"] == sc["all"], name
    assert [_plain(c) for c in sc["all"]] == rp["caveats"][: len(sc["all"])], name
    # a caveat on one surface is on all of them: UNDERPOWERED, forced comparisons
    for word in ("UNDERPOWERED", "--allow-incomparable"):
        said = [any(word in c for c in x["caveats"]) for x in (gc, gm, sc, rp)]
        assert len(set(said)) == 1, (name, word, said)


def test_the_chunking_sweep_is_budget_sensitive_and_says_so_first_on_select_and_report():
    s = chunking_sweep()
    sc, rp = select_console(s), report_md(s)
    assert sc["metric"] == "evidence_recall_at_256tok"  # no run measured its context: the smallest
    assert sc["budget"] == (
        "budget-sensitive: at 256 tokens chunking=fixed, at 512 and 1024 tokens chunking=sentence"
    )
    # said first after UNDERPOWERED (the one caveat that leads every surface), on both surfaces
    first = sum(c.startswith("UNDERPOWERED") for c in sc["all"])
    assert sc["all"][first] == sc["budget"] and rp["caveats"][first] == sc["budget"]
    # gate's defaults replace hit@5 and mrr by the equal-budget metric, on both of its surfaces
    gc = gate_console(s)
    assert gc["metrics"] == ["evidence_recall_at_256tok"]


def test_the_default_budget_is_the_one_the_generator_reads():
    s = chunking_sweep()
    for r in s.store.runs.values():
        if r.table is not None:
            r.table["tokens_in_generation"] = 830.0  # the prompt the generator read, per query
    sc = select_console(s)
    assert sc["metric"] == "evidence_recall_at_1024tok" and "830 prompt tokens" in sc["text"]


def test_an_app_against_the_pipeline_refuses_hit_at_5_and_names_the_substitute():
    s = app_vs_pipeline()
    s.metric = "hit_at_5"
    with pytest.raises(RunInputError, match=r"hit_at_5 is not comparable.*app returns its own contexts.*"
                       r"Use evidence_recall_at_256tok instead"):  # fmt: skip
        gate_cli.gate_verdict_of(s.reader, _gate_args(s))
    s.metric = None  # the defaults: the substitute, said
    assert gate_console(s)["metrics"] == ["evidence_recall_at_256tok"]
    # the report's "held fixed" is the effective pipeline's: the app replaced chunking and retriever
    md = report_md(s)["md"]
    held = next(line for line in md.splitlines() if line.startswith("Held fixed"))
    assert "chunking=" not in held and "retriever=" not in held
    assert "Replaced by the application (app=python" in md


def test_different_corpora_are_refused_everywhere_unless_allowed():
    s = different_corpora(allow=False)
    with pytest.raises(RunInputError, match="the corpora differ"):
        gate_cli.gate_verdict_of(s.reader, _gate_args(s))
    with pytest.raises(RunInputError, match="the corpora differ"):
        select_cli.run_select(s.reader, _select_args(s))
    with pytest.raises(RunInputError, match="the corpora differ"):
        report_md(s)
    rd = s.reader
    with pytest.raises(RunInputError, match="the corpora differ"):
        compare_cli.build_comparison(rd, rd.resolve(s.pair[0]), rd.resolve(s.pair[1]), n_resamples=99)
    with pytest.raises(RunInputError, match="the corpora differ"):
        compare_sweep.build_sweep_comparison(rd, SWEEP, n_resamples=99)
    allowed = different_corpora(allow=True)
    for surface in (gate_console, select_console):
        assert surface(allowed)["all"][0].startswith(
            "note: --allow-incomparable: hit_at_5 compared across configs where the corpora differ"
        )


def test_views_follow_the_verdict():
    """The report's plots lead with the comparable metric and say why hit@k is shown at all."""
    md = report_md(chunking_sweep())["md"]
    assert md.index("evidence_recall_by_budget.png") < md.index("hit_at_k.png")
    assert md.count("Not for comparing configs: the chunks differ") >= 2  # hit@k curves, hit@5 vs MRR
    assert "Not for comparing configs" not in report_md(zero_variance())["md"]  # same chunks: comparable


def test_thirty_configs_get_one_panel_each(tmp_path):
    """A legend of 30 colours covers the plot (and tab20 repeats colours): facets instead."""
    from PIL import Image

    from rag_experiments.report.plots import FACET_ABOVE, HitCurves, draw

    labels = [f"chunking=c{i},retriever=r{i % 3}" for i in range(30)]
    curves = {x: list(np.linspace(0.2 + i / 100, 0.9, 5)) for i, x in enumerate(labels)}
    png = draw(HitCurves(labels, curves, {}), tmp_path / "hit_at_k.png")
    w, h = Image.open(png).size
    assert len(labels) > FACET_ABOVE and h > 1000 and w >= 1200  # 6 rows of 5 panels, titled per config

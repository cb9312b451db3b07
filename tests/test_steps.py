"""The run loop (run/steps.py): records summed per slot, every duty derived from the records and
the slot declarations, and no module keeping its own list of stage names."""

from __future__ import annotations

import ast
from pathlib import Path

import pandas as pd

from rag_experiments.core.slots import SLOTS, steps
from rag_experiments.run.run_summary import first_stage_lines, summary_table
from rag_experiments.run.steps import Ledger, StepRecord, failure_reason, step_summary

PKG = Path(__file__).resolve().parent.parent / "rag_experiments"


class _Step:
    def __init__(self, slot, items, failed, calls):
        self.slot, self.args = slot, (items, failed, calls)

    def run(self, state, ctx):
        state.append(self.slot)
        items, failed, calls = self.args
        return StepRecord(self.slot, items, failed, calls, first_error="boom" if failed else "")


def test_ledger_derives_timings_calls_errors_and_status_from_records():
    led, state = Ledger(), []
    led.run(_Step("chunker", 4, 0, {}), state, None)
    led.run(_Step("reranker", 8, 3, {"rerank": 8}), state, None)
    for _ in range(2):  # two replicates of the generation step: summed per slot
        led.run(_Step("generator", 5, 1, {"generation": 5}), state, None)
    assert state == ["chunker", "reranker", "generator", "generator"]
    assert list(led.timings()) == ["chunking_s", "rerank_s", "generation_s"]  # run order, from the slots
    assert led.calls() == {"rerank": 8, "generation": 10}
    assert led.error_counts() == {"n_rerank_errors": 3, "n_errors": 2}
    assert failure_reason(led.records) == ""
    assert [ln.split(":")[0] for ln in step_summary(led.records)] == ["rerank", "generation"]
    led.add(StepRecord("query_transform", 8, 8, {"query": 8}, first_error="no rewrite"))
    why = failure_reason(led.records)
    assert "every one of the 8 transformed questions errored (query step" in why and "no rewrite" in why


def test_summary_names_every_step_error_count_and_the_first_stage_line_is_a_paired_test():
    agg = {"n_queries": 3, "n_errors": 0, "n_unparseable_verdicts": 0, "n_rerank_errors": 2, "hit_at_1": 0.5}
    assert "rerank errors 2" in summary_table(agg, 1, [1])
    df = pd.DataFrame({"id": ["a", "b", "c", "d"], "hit_at_1": [1.0, 1.0, 0.0, 1.0],
                       "first_stage/hit_at_1": [0.0, 1.0, 0.0, 0.0]})  # fmt: skip
    (line,) = first_stage_lines(df, agg, 1, [1])
    assert "0.250 →  0.750" in line and "+0.500" in line and "mcnemar" in line and "n=4" in line
    from rag_experiments.analysis.stats import first_stage_deltas

    (r,) = first_stage_deltas(pd.concat([df, df]), ["hit_at_1", "mrr"])  # replicated rows count once
    assert (r.metric, r.mean_a, r.mean_b, r.n_pairs) == ("hit_at_1", 0.25, 0.75, 4) and r.p_holm is not None
    assert first_stage_deltas(df.drop(columns=["first_stage/hit_at_1"]), ["hit_at_1"]) == []


def _names() -> set[str]:
    out = set()
    for s in SLOTS:
        out |= {s.name, s.group} | ({s.step, s.column} - {""})
    return out


#: Lists of the same words that are not stages: the variance components (query = the eval item's
#: own difficulty, then generation and judge sampling; analysis/variance.py) and their figure.
NOT_STAGES = {"analysis/variance.py", "report/figures.py"}


def test_no_module_keeps_a_list_of_stage_names():
    """A new slot is declared once (core/slots.py); a tuple, list or set literal naming three or more
    stages elsewhere is a copy that the next slot would miss (as query and rerank once did)."""
    names, found = _names(), []
    for path in PKG.rglob("*.py"):
        if path.name == "slots.py" or str(path.relative_to(PKG)) in NOT_STAGES:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typed = {id(n.slice) for n in ast.walk(tree) if isinstance(n, ast.Subscript)}  # Literal[...]: types
        for node in ast.walk(tree):
            if isinstance(node, ast.Tuple | ast.List | ast.Set) and id(node) not in typed:
                hits = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names]
                if len(set(hits)) >= 3:
                    found.append(f"{path.relative_to(PKG)}:{node.lineno} {hits}")
    assert not found, "\n".join(found)


#: Places that still name a slot in code (issue 42, item 7), each with why; this list may only
#: shrink. Key: "path:kind:name" (kind: a dict literal's keys, a comparison, a getattr on stages).
SPECIAL_CASED = {
    # the built-in slots' rich trace spans (documents, chat messages); any other slot: _step_span
    "tracking/traces.py:dict:generator,judge,query_transform,reranker,retriever",
    # the version name leaves prompt and judge out of retrieval-only runs
    "tracking/app_versions.py:==:generator",
    # a generation-only factor leads with generation metrics (analysis: the verdict rules)
    "evaluation/headline.py:==:generator",
    "analysis/comparability.py:==:judge",
    "run/config_schema.py:dict:generator,history,judge,prompt,retriever",  # GROUP_CHECKS: a range rule per group
}


def _special_cases() -> set[str]:
    """Every dict literal keyed by three or more slot names, ``==``/``!=`` against a slot name, and
    ``getattr(stages, "<slot>")`` in the package, as ``path:kind:names``."""
    names, found = {s.name for s in SLOTS}, set()
    for path in PKG.rglob("*.py"):
        if path.name == "slots.py":
            continue
        rel = str(path.relative_to(PKG))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Dict):
                keys = sorted({k.value for k in node.keys if isinstance(k, ast.Constant) and k.value in names})
                if len(keys) >= 3:
                    found.add(f"{rel}:dict:{','.join(keys)}")
            elif isinstance(node, ast.Compare) and any(isinstance(o, ast.Eq | ast.NotEq) for o in node.ops):
                for c in (node.left, *node.comparators):
                    if isinstance(c, ast.Constant) and c.value in names:
                        found.add(f"{rel}:==:{c.value}")
            elif isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("getattr", "hasattr"):
                obj, attr = (node.args + [None, None])[:2]
                owner = getattr(obj, "id", None) or getattr(obj, "attr", None)
                if owner == "stages" and isinstance(attr, ast.Constant) and attr.value in names:
                    found.add(f"{rel}:getattr:{attr.value}")
    return found


def test_no_module_special_cases_a_stage_name_beyond_the_shrinking_list():
    """A slot is declared once: a dict keyed by stage names, a comparison with one or a
    ``getattr(stages, "<slot>")`` elsewhere is a copy the next slot misses. The known ones are
    listed with their reason; a new one fails, and so does a listed one that is gone (shrink it)."""
    found = _special_cases()
    assert found - SPECIAL_CASED == set(), "new special cases of a stage name"
    assert SPECIAL_CASED - found == set(), "gone: remove them from SPECIAL_CASED"


def test_steps_are_ordered_by_position():
    assert [s.position for s in steps()] == sorted(s.position for s in steps())
    assert all(s.step for s in steps()) and len({s.step for s in steps()}) == len(steps())


# -- a slot declared in one place ------------------------------------------------------------------

class Shout:
    """A trivial stage of a fake slot: it fails on questions with a digit in them."""

    identity = "shout"

    def shout(self, q: str) -> str:
        if any(ch.isdigit() for ch in q):
            raise ValueError("digits")
        return q.upper()


class ShoutStep:
    """The fake slot's runner: one 'call' per question, per-query columns of its own (its output
    and the tokens its calls report; its latency column is the run loop's)."""

    slot = "shouter"

    def run(self, st, ctx) -> StepRecord:
        self.out, failed = [], []
        for q in st.queries:
            try:
                self.out.append(ctx.stages.shouter.shout(q))
            except ValueError as e:
                self.out.append(None)
                failed.append(str(e))
        return StepRecord(self.slot, len(st.queries), len(failed), {"shout": len(st.queries)},
                          first_error=failed[0] if failed else "")  # fmt: skip

    def columns(self, st, rows) -> None:
        for row, o, q in zip(rows, self.out, st.queries, strict=True):
            row.update(shouted=o, tokens_in_shout=float(len(q.split())), tokens_out_shout=1.0)


PRICE = {"price_per_1k_in": 1.0, "price_per_1k_out": 2.0}


def _run_the_fake_slot(tmp_path, monkeypatch):
    """Declare the fake slot in ONE place (here; nowhere in the package) and run the tiny pipeline
    with it, priced: (the pipeline result, the tiny inputs)."""
    import dataclasses

    from rag_experiments.core import slots
    from rag_experiments.core.slots import Slot
    from rag_experiments.run import types
    from tests.sweep_helpers import tiny_inputs, tiny_pipeline

    fake = Slot("shouter", "shout", "tests.test_steps.Shout", (), (), optional=True, step="shouting",
                errors="n_shout_errors", noun="shouted questions", position=2, column="shout", priced=True,
                runner="tests.test_steps.ShoutStep", span="TOOL", outputs=("shouted",))  # fmt: skip
    monkeypatch.setattr(slots, "SLOTS", (*slots.SLOTS, fake))  # the one place a slot is declared
    # the built stage's field (run/types.py) and its construction (run/assemble.py) are the other two
    stages_cls = dataclasses.make_dataclass("S", [("shouter", object, None)], bases=(types.Stages,), frozen=True)
    monkeypatch.setattr("tests.sweep_helpers.Stages", stages_cls)
    inputs = tiny_inputs(tmp_path, n_items=4)
    return tiny_pipeline(inputs, shouter=Shout(), pricing={"shout": PRICE}), inputs


def test_a_slot_declared_once_is_run_timed_counted_costed_and_reported(tmp_path, monkeypatch):
    """Issue 36: a slot declared in one place (:func:`_run_the_fake_slot`) is run in its place,
    timed (its ``<step>_s`` and a per-query latency), counted (calls, its error metric, the status
    rule), costed (its tokens and cost in cost_usd, its row of the ``steps`` tag) and reported (a
    row of the report's per-step table, its columns in the Cost table)."""
    import json
    import math
    from types import SimpleNamespace

    from rag_experiments.core.progress import timing_table
    from rag_experiments.evaluation import registry
    from rag_experiments.report.model import plain
    from rag_experiments.report.steps_table import cost_keys, step_table

    res, _ = _run_the_fake_slot(tmp_path, monkeypatch)
    df, rec = res.per_query, res.records["shouter"]
    # run and timed, in its place
    assert list(res.timings)[:3] == ["chunking_s", "shouting_s", "retrieval_s"]
    assert "shouting" in timing_table(res.timings) and df["shouted"].notna().any()
    assert df["latency_shout_s"].eq(rec.seconds / len(df)).all()  # the loop's batch time / n
    assert "latency_p95_ms/shout" in res.aggregates
    # counted, under the status rule
    assert res.calls["shout"] == 4
    n_digit = sum(any(ch.isdigit() for ch in q) for q in df["query"])
    assert rec.failed == n_digit and res.aggregates["n_shout_errors"] == n_digit
    if 0 < n_digit < 4:  # some failed: finished, counted, and the resume rule reads its metric
        assert not failure_reason(res.records) and any("shouting" in ln for ln in step_summary(res.records))
    # costed: its tokens are registered metrics, priced into cost_usd, and a row of the step table
    tin = float(sum(len(q.split()) for q in df["query"]))
    assert res.aggregates["tokens_in/shout"] == tin and res.aggregates["tokens_out/shout"] == 4.0
    assert registry.parse("tokens_in/shout") and registry.parse("n_shout_errors")  # {stage}: the slots at use
    assert math.isclose(res.aggregates["cost_usd"], tin / 1000 * 1.0 + 4.0 / 1000 * 2.0)
    rows = {r["step"]: r for r in json.loads(res.tags["steps"])}
    assert list(rows)[:3] == ["chunking", "shouting", "retrieval"]
    assert (rows["shouting"]["calls"], rows["shouting"]["errors"]) == (4, n_digit)
    assert math.isclose(rows["shouting"]["cost_usd"], res.aggregates["cost_usd"])
    # reported: its row in the report's per-step table, its tokens among the cost columns
    cfg = SimpleNamespace(label="shout=on", tags=res.tags, metrics=res.aggregates)
    _, tbl = step_table(SimpleNamespace(configs=[cfg]))
    cells = [[plain(c) for c in r] for r in tbl.rows]
    assert ["shout=on", "shouting"] in [r[:2] for r in cells] and dict((r[1], r[3]) for r in cells)["shouting"] == "4"
    assert "tokens_in/shout" in cost_keys() and "latency_p95_ms/shout" in cost_keys()
    rec.failed = rec.items  # every item failed: the run fails, naming it
    assert "every one of the 4 shouted questions errored (shouting step" in failure_reason(res.records)


def test_a_slot_declared_once_is_traced_in_a_real_store(tmp_path, monkeypatch):
    """The same slot's span, from its declaration alone: its type, its declared output column, its
    tokens, in run order, in a trace read back from a real sqlite MLflow store."""
    import mlflow
    from mlflow import MlflowClient

    from rag_experiments.tracking.traces import TraceJob, TraceSettings, write_traces

    res, (corpus, items, _) = _run_the_fake_slot(tmp_path, monkeypatch)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp_id = client.create_experiment("fake-slot", artifact_location=str(tmp_path / "mlruns"))
    run_id = client.create_run(exp_id).info.run_id
    job = TraceJob(TraceSettings(k=3, path="public"), items, corpus.docs, "digest")
    assert len(write_traces(uri, run_id, exp_id, res.per_query, job)) == len(res.per_query)
    mlflow.set_tracking_uri(uri)
    traces = mlflow.search_traces(locations=[exp_id], run_id=run_id, return_type="list")
    assert len(traces) == len(res.per_query)
    for t in traces:
        names = [sp.name for sp in t.data.spans]
        (span,) = [sp for sp in t.data.spans if sp.name == "shouting"]
        assert span.span_type == "TOOL" and "shouted" in span.outputs
        assert names.index("shouting") < names.index("retrieve")  # in run order
        usage = span.get_attribute("mlflow.chat.tokenUsage")
        assert usage["output_tokens"] == 1 and usage["input_tokens"] >= 1


def test_compare_shows_what_each_runs_reranker_added_with_the_paired_test():
    from rag_experiments.cli.compare import build_comparison, render
    from rag_experiments.core.run_record import RunData

    ids = [f"q{i}" for i in range(6)]
    a = RunData("a" * 32, "bm25", {"rerank": "none"}, {"evalset_digest": "d"},
                pd.DataFrame({"id": ids, "hit_at_1": [0.0, 1.0, 0.0, 0.0, 1.0, 0.0]}))  # fmt: skip
    b = RunData("b" * 32, "bm25+dense", {"rerank": "dense"}, {"evalset_digest": "d"},
                pd.DataFrame({"id": ids, "hit_at_1": [1.0, 1.0, 1.0, 0.0, 1.0, 1.0],
                              "first_stage/hit_at_1": [0.0, 1.0, 0.0, 0.0, 1.0, 0.0]}))  # fmt: skip

    class Reader:
        def per_query(self, run):
            return run.table

    comp = build_comparison(Reader(), a, b, metrics=["hit_at_1"], n_resamples=999)
    assert list(comp.first_stage) == ["B"]  # only B has a reranker
    (r,) = comp.first_stage["B"]
    assert (r.mean_a, r.mean_b, r.n_pairs) == (2 / 6, 5 / 6, 6) and "mcnemar" in r.test
    text = render(comp, markdown=False)
    assert "Reranker of B: first stage (mean A) → final list (mean B)" in text and "Holm over 1" in text


def test_the_report_shows_first_stage_beside_final_for_a_reranked_config():
    from types import SimpleNamespace

    from rag_experiments.report.sections import first_stage_table

    df = pd.DataFrame({"id": list("abcd"), "hit_at_1": [1.0, 1.0, 0.0, 1.0], "mrr": [1.0, 1.0, 0.2, 1.0],
                       "first_stage/hit_at_1": [0.0, 1.0, 0.0, 0.0], "first_stage/mrr": [0.5, 1.0, 0.2, 0.5]})  # fmt: skip
    cfg = SimpleNamespace(label="rerank=dense", table=df, metrics={"hit_at_1": 0.75, "mrr": 0.8})
    plain = SimpleNamespace(label="rerank=none", table=df.drop(columns=["first_stage/hit_at_1", "first_stage/mrr"]),
                            metrics={"hit_at_1": 0.25})  # fmt: skip
    _, tbl = first_stage_table(SimpleNamespace(configs=[plain, cfg], k=1))
    rendered = str(tbl.rows) if hasattr(tbl, "rows") else str(tbl)
    assert "rerank=dense" in rendered and "rerank=none" not in rendered and "Holm over 2" in rendered
    assert first_stage_table(SimpleNamespace(configs=[plain], k=1)) == []


def test_the_report_per_step_table_reads_a_run_logged_before_the_steps_tag():
    """A run without the ``steps`` tag still gets its per-step rows: seconds from ``timings``,
    errors and tokens from its metrics, in run order (calls and cost unknown: "–", never 0)."""
    from types import SimpleNamespace

    from rag_experiments.report.model import plain
    from rag_experiments.report.steps_table import step_table

    old = SimpleNamespace(label="old", tags={"timings": '{"retrieval_s": 1.5, "chunking_s": 0.2, "rerank_s": 2.0}'},
                          metrics={"n_rerank_errors": 3.0})  # fmt: skip
    _, tbl = step_table(SimpleNamespace(configs=[old]))
    rows = [[plain(c) for c in r] for r in tbl.rows]
    assert [r[1] for r in rows] == ["chunking", "retrieval", "rerank"]
    assert rows[2][2:5] == ["2.0", "–", "3"]
    assert step_table(SimpleNamespace(configs=[SimpleNamespace(label="x", tags={}, metrics={})])) == []


# -- an answer-side slot, declared in one place --------------------------------------------------

LEAK = "sk-proj-abcdefghijklmnopqrstuvwxyz012345"


class Tidy:
    """A trivial stage of a fake answer-side slot: it marks answers, and fails on those naming a key."""

    identity = "tidy"

    def tidy(self, answer: str) -> str:
        if "key" in answer.lower():
            raise ValueError("keys")
        return f"{LEAK} {answer.strip()} [tidied]"  # a key it should never have written


class TidyStep:
    """The fake answer-side slot's runner: it rewrites the answers the generate step left."""

    slot = "tidier"

    def run(self, seg, ctx) -> StepRecord:
        todo = [i for i, a in enumerate(seg.answers) if a is not None]
        self.failed = []
        for i in todo:
            try:
                seg.answers[i] = ctx.stages.tidier.tidy(seg.answers[i])
            except ValueError as e:
                self.failed.append(i)
                first = str(e)
        return StepRecord(self.slot, len(todo), len(self.failed), {"tidy": len(todo)},
                          first_error=first if self.failed else "")  # fmt: skip

    def columns(self, seg, rows) -> None:
        for i, row in enumerate(rows):
            row["tidy_failed"] = i in self.failed


def test_an_answer_side_slot_declared_once_runs_after_the_answer_and_before_the_judge(tmp_path, monkeypatch):
    """Issue 42: a slot of phase ``after_answer`` is declared in one place (here) and runs in the
    answer half's loop with no edit to ``run/``: after the answer, before the judge (who judges
    what it left), timed, counted, its columns and per-query latency in the table."""
    import dataclasses

    from rag_experiments.core import slots
    from rag_experiments.core.slots import Slot
    from rag_experiments.judge.validity import build_judge
    from rag_experiments.run import types
    from rag_experiments.stages.app import PythonApp
    from tests.sweep_helpers import tiny_inputs, tiny_pipeline

    fake = Slot("tidier", "tidy", "tests.test_steps.Tidy", (), (), optional=True, step="tidying",
                errors="n_tidy_errors", noun="tidied answers", position=1, column="tidy", phase="after_answer",
                runner="tests.test_steps.TidyStep", span="TOOL", outputs=("answer",))  # fmt: skip
    monkeypatch.setattr(slots, "SLOTS", (*slots.SLOTS, fake))
    stages_cls = dataclasses.make_dataclass("S", [("tidier", object, None)], bases=(types.Stages,), frozen=True)
    monkeypatch.setattr("tests.sweep_helpers.Stages", stages_cls)
    inputs = tiny_inputs(tmp_path, n_items=5)
    res = tiny_pipeline(inputs, app=PythonApp("tests.app_fixture:answer"), tidier=Tidy(),
                        judge=build_judge("heuristic"))  # fmt: skip
    df, rec = res.per_query, res.records["tidier"]
    assert list(res.timings)[:4] == ["app_s", "generation_s", "tidying_s", "judging_s"]  # run order, by phase
    answered = df["error"].isna()
    ok = answered & ~df["tidy_failed"]
    assert rec.items == answered.sum() and rec.failed == (answered & df["tidy_failed"]).sum()
    assert df.loc[ok, "answer"].str.endswith("[tidied]").all() and ok.any()  # the table has what it left
    assert not df["answer"].str.contains(LEAK).any() and df.loc[ok, "answer"].str.startswith("sk-[REDACTED]").all()
    assert res.aggregates["n_tidy_errors"] == rec.failed and res.calls["tidy"] == rec.items
    assert df.loc[answered, "latency_tidy_s"].eq(rec.seconds / len(df)).all()  # the loop's batch time / n
    tidied = [c for cl in df.loc[ok, "claims"] for c in cl]
    assert any("[tidied]" in c for c in tidied)  # the judge judged the tidied answer
    rec.failed = rec.items
    assert "every one of" in failure_reason(res.records) and "tidying step" in failure_reason(res.records)

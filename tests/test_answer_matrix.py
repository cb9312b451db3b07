"""The answer matrix (report/answer_matrix.py, issue 45): items × configs, ordered by the sweep's
factors, every text inert, and the page loads in headless Chromium with its rows drawn."""

from __future__ import annotations

import json
import re
import time
from types import SimpleNamespace

import pandas as pd

from rag_experiments.report.answer_matrix import answer_matrix, matrix_json, render_answer_matrix

HOSTILE = "</script><script>alert(1)</script> & <b>bold</b>"


def _config(label: str, params: dict, rows: list[dict]) -> SimpleNamespace:
    run = SimpleNamespace(params=params, run_id=f"run-{label}", experiment_id="1")
    return SimpleNamespace(label=label, table=pd.DataFrame(rows), run=run)


def _row(i: int, answer: str | None, label: str = "ok", **kw) -> dict:
    return {"id": f"q{i}", "query": f"question {i}", "tags": ["exact"] if i % 2 else ["paraphrase"],
            "answer": answer, "failure_label": label, "correctness": 1.0, "faithfulness": 0.5,
            "hit_at_3": 0.0, "hit_at_5": 1.0, "error": None, **kw}  # fmt: skip


def test_columns_follow_the_factors_and_missing_items_are_cells_of_their_own():
    b = _config("k=5", {"retriever.k": "5"}, [_row(0, "a"), _row(1, "b", "generation_failure")])
    a = _config("k=3", {"retriever.k": "3"}, [_row(0, "a")])
    checks = [{"index": 0, "type": "not_contains", "value": "never", "critical": True, "passed": False,
               "detail": "found 'never'"}]  # fmt: skip
    b.table.at[1, "assertions"] = None
    b.table["assertions"] = [[], checks]
    m = answer_matrix([b, a], ["retriever.k"], 5, "sweep", {"run-k=5": {"q1": "http://ui/#/t1"}})
    assert [c.label for c in m.configs] == ["k=3", "k=5"]  # by the factor's level
    q0, q1 = m.rows
    assert q1.cells[0] is None and q1.cells[1].trace == "http://ui/#/t1"  # q1 only in k=5
    assert q1.cells[1].checks[0]["passed"] is False and q1.cells[1].checks[0]["critical"] is True
    assert m.labels == ["generation_failure", "ok"] and m.tags == ["exact", "paraphrase"]
    # "gold in top k" at each config's own k (k=3 reads hit_at_3, k=5 hit_at_5)
    assert q0.cells[0].hit is False and q0.cells[1].hit is True and q0.cells[0].correctness == 1.0
    assert [c.k for c in m.configs] == [3, 5] and m.answered_only is False  # every row answered


def test_every_text_is_inert_in_the_page():
    c = _config("x", {}, [_row(0, HOSTILE), {**_row(1, None), "query": HOSTILE}])
    m = answer_matrix([c], [], 5, HOSTILE)
    page = render_answer_matrix(m)
    assert "<script>alert(1)" not in page and page.count("</script>") == 2  # the data and the code
    data = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S).group(1)
    assert json.loads(data)["rows"][0]["cells"][0]["answer"] == HOSTILE  # the text itself, intact
    assert json.loads(matrix_json(m))["rows"][1]["cells"][0]["answer"] is None  # not generated
    assert m.answered_only is True  # q1 was never generated: the page opens on the answered rows


def test_a_168_by_30_matrix_opens_in_chromium_with_its_rows(tmp_path):
    """Items × configs of a 30-config sweep: the page draws the first configs' columns and every
    row, the filters cut rows, and it loads in headless Chromium (the load time is printed)."""
    import subprocess

    from tests.mlflow_ui import HEADLESS

    configs = [
        _config(f"chunking=c{j}, k={k}", {"chunking": f"c{j}", "retriever.k": str(k)},
                [_row(i, f"answer {i} of config {j}/{k} " * 8 if i < 160 else None,
                      "ok" if (i + j) % 3 else "retrieval_failure") for i in range(168)])
        for j in range(10) for k in (1, 3, 5)
    ]  # fmt: skip
    page = tmp_path / "answers.html"
    page.write_text(render_answer_matrix(answer_matrix(configs, ["chunking", "retriever.k"], 5, "sweep")))
    t0 = time.perf_counter()
    dom = subprocess.run(
        ["chromium", *HEADLESS, f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=20000",
         "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=300,
    ).stdout  # fmt: skip
    print(
        f"answer matrix 168 × 30: {page.stat().st_size / 1e6:.1f} MB, dumped in {time.perf_counter() - t0:.1f} s"
    )
    # 8 items no config answered (outside generation_subset): hidden when the page opens
    assert 'data-rows="160"' in dom and dom.count('<tr class="item">') == 160
    assert "160 of 168 items, 6 of 30 configs" in dom
    assert dom.count('class="cell"') == 160 * 6
    # a pivot header: chunking=c0 and chunking=c1 each span their three retriever.k columns
    assert dom.count('colspan="3"') == 2 and "<th>retriever.k=1</th>" in dom

"""The spot-check's review queue in MLflow's own Review tab: a real ``mlflow server``, headless Chromium.

``sample --to-mlflow`` against the server; the Review tab (``#/experiments/<id>/review-queue``, the
route of mlflow 3.17.2's UI; ``?selectedQueueId=`` / ``&selectedItemId=`` are the parameters the UI
itself sets) lists the queue with its items; a reviewer labels claims there with real clicks (the
``claim_support`` question, a rationale, Submit), and ``score --from-mlflow`` scores exactly those
answers, with the figures the CSV path gives for the same labels.
"""

from __future__ import annotations

import csv
import tempfile
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from rag_experiments import spotcheck
from rag_experiments.spotcheck import review
from rag_experiments.tracking import review_queue as rq
from tests.mlflow_ui import SCREENSHOTS, Page, mlflow_server, visible_text
from tests.test_spotcheck import _per_query

LOAD_S = 120  # a page of a real server rendered on a loaded 2-core machine: generous, still bounded
_SUBMIT = "Array.from(document.querySelectorAll('button')).find(e => e.innerText.trim() === 'Submit')"


def _click(page: Page, expr: str) -> None:
    """A real mouse click (press + release) at the centre of the element ``expr`` finds."""
    xy = page.js(
        f"(() => {{ const e = {expr}; if (!e) return null; e.scrollIntoView({{block: 'center'}});"
        " const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
    )
    assert xy, f"nothing to click: {expr}"
    for kind in ("mousePressed", "mouseReleased"):
        page.call("Input.dispatchMouseEvent", type=kind, x=xy[0], y=xy[1], button="left", clickCount=1)


def _label(page: Page, verdict: str, rationale: str) -> None:
    """What a reviewer does on an open item: pick the verdict, write why, Submit. A pick the
    loaded-down page missed (the list still opening) is tried again, as a user would."""
    placeholder = (
        "Array.from(document.querySelectorAll('span')).find(e => e.innerText.trim() === 'Select an option')"
    )
    option = f"Array.from(document.querySelectorAll('[role=option]')).find(e => e.innerText.trim() === '{verdict}')"
    page.wait_for(placeholder, timeout=LOAD_S)
    for attempt in range(3):
        if page.js(f"!!({placeholder})"):
            _click(page, placeholder)
            page.wait_for(option)
            _click(page, option)
        try:
            page.wait_for(f"!({placeholder})", timeout=10)
            break
        except AssertionError:
            assert attempt < 2, f"could not pick {verdict!r}"
    _click(
        page,
        "Array.from(document.querySelectorAll('textarea')).find(e => (e.placeholder || '').startsWith('Rationale'))",
    )
    page.call("Input.insertText", text=rationale)
    page.wait_for(f"{_SUBMIT} && !{_SUBMIT}.disabled")
    _click(page, _SUBMIT)


def test_queue_in_review_tab_labelled_there_and_scored(tmp_path, capsys):
    with mlflow_server(tmp_path) as base:
        client = MlflowClient(tracking_uri=base)
        exp = client.create_experiment("spot")
        run = client.create_run(exp, run_name="gen-run")
        client.log_param(run.info.run_id, "judge.threshold", "0.0")
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / "per_query.parquet"
            _per_query().to_parquet(p, index=False)
            client.log_artifact(run.info.run_id, str(p))
        client.set_terminated(run.info.run_id)
        rid, out = run.info.run_id, tmp_path / "sample.csv"
        argv = ["--tracking-uri", base, "sample", rid, "-n", "4", "--out", str(out), "--to-mlflow"]
        assert spotcheck.main(argv) == 0
        queue_id = capsys.readouterr().out.split("score --from-mlflow ")[1].split()[0]
        queue = rq.find_queue(base, queue_id, [exp])
        items = rq.read_items(base, queue, review.SCHEMA)
        claim_of = {it.trace_id: it.record["claim"] for it in items}
        item_of = {it.trace_id: it.tags[review.ITEM] for it in items}

        page = Page(tmp_path / "profile")
        try:
            # the Review tab lists the queue with 4 items to do
            page.goto(f"{base}/#/experiments/{exp}/review-queue")
            page.wait_for(f"document.body.innerText.includes({queue.name!r})", timeout=LOAD_S)
            tab = visible_text(page.html())
            assert "Review" in tab and queue.name in tab
            # the queue's items: every sampled claim, waiting for review
            page.goto(f"{base}/#/experiments/{exp}/review-queue?selectedQueueId={queue.queue_id}")
            page.wait_for("document.body.innerText.includes('Needs review (4)')", timeout=LOAD_S)
            # each row's request: the claim the reviewer judges (previews load after the rows)
            page.wait_for(
                " && ".join(f"document.body.innerText.includes({c!r})" for c in claim_of.values()),
                timeout=LOAD_S,
            )
            page.screenshot(SCREENSHOTS / "review_queue.png")
            # a reviewer labels two claims in the UI: HUMAN feedback, the item marked complete
            labelled = {}
            for trace_id, verdict in zip(list(claim_of)[:2], ("unsupported", "supported"), strict=True):
                # a full load per item: a hash-only change keeps the previous item's form mounted
                page.goto("about:blank")
                page.wait_for("location.href === 'about:blank'", timeout=LOAD_S)
                page.goto(
                    f"{base}/#/experiments/{exp}/review-queue?selectedQueueId={queue.queue_id}"
                    f"&selectedItemId={trace_id}"
                )
                page.wait_for(f"document.body.innerText.includes({claim_of[trace_id]!r})", timeout=LOAD_S)
                page.wait_for("document.body.innerText.includes('claim_support')", timeout=LOAD_S)
                _label(page, verdict, f"reviewer says {verdict}")
                labelled[item_of[trace_id]] = verdict
                try:
                    _wait_feedback(base, queue, trace_id)
                except AssertionError:
                    page.screenshot(SCREENSHOTS / "review_item_failed.png")
                    raise
            page.screenshot(SCREENSHOTS / "review_item.png")
        finally:
            page.close()

        statuses = {it.item_id: it.status.value for it in rq.queue_items(base, queue.queue_id)}
        assert sorted(statuses.values()) == ["complete", "complete", "pending", "pending"]
        # scored from the queue: exactly the CSV path's figures for the same two labels
        rows = list(csv.DictReader(open(out, encoding="utf-8")))
        for r in rows:
            r["human_verdict"] = labelled.get(r["item_id"], "")
        with open(out, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        claims = spotcheck.judged_claims(_per_query())
        ql = review.read_queue(base, queue.queue_id, [exp])
        a = spotcheck.score_labels(review.queue_labels(ql, claims, tmp_path / "q.csv"), n_resamples=200)
        b = spotcheck.score_labels(spotcheck.read_labels(out, claims), n_resamples=200)
        assert (a.n, a.n_blank) == (b.n, b.n_blank) == (2, 2)
        same = lambda x, y: x == y or (x != x and y != y)  # noqa: E731 - NaN (κ too few to say) equals NaN
        assert all(map(same, (a.agreement, a.kappa, *a.kappa_ci, a.leniency), (b.agreement, b.kappa, *b.kappa_ci, b.leniency)))
        assert a.kappa_too_few == b.kappa_too_few
        assert spotcheck.main(["--tracking-uri", base, "score", "--from-mlflow", queue.queue_id]) == 0


def _wait_feedback(base: str, queue, trace_id: str, timeout: float = 90.0) -> None:
    end = time.monotonic() + timeout
    while not [
        it for it in rq.read_items(base, queue, review.SCHEMA) if it.trace_id == trace_id and it.feedback
    ]:
        assert time.monotonic() < end, f"the UI's answer on {trace_id} never reached the store"
        time.sleep(0.25)

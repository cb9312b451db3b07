"""Racing sweeps at run time: settings, validation, and the batched generation loop (docs/racing.md).

``racing=true`` on a multirun: every config generates and judges its items in the same seeded
batches (``analysis.racing.batch_order`` over the generation subset), publishes each batch's
per-query primary-metric values on the sweep's board (``tracking.race_board``), waits for the
peers that have started to publish that batch, and stops when it is significantly worse than the
leader (``analysis.racing.decide``: anytime-valid betting confidence sequence, α/(K − 1)).
Retrieval is scored on every item first as always (it is cheap); racing only saves generation and
judging. A stopped config's run is FINISHED with its partial per-query table (``generated`` marks
the items it answered) and tags ``racing.*``.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rag_experiments.analysis.racing import batch_order, decide
from rag_experiments.run.types import RaceSettings

#: Run tags a racing config carries (compare / select / report read them).
TAG_STATUS = "racing.status"  # "stopped" | "survived"
TAG_STOPPED_AT = "racing.stopped_at_n"
TAG_STOPPED_BY = "racing.stopped_by"
TAG_PRIMARY = "racing.primary"


def rewrite_argv(argv: list[str]) -> list[str]:
    """``racing=true|false`` → ``racing.enabled=...`` (``racing`` is a block of keys, and Hydra
    would replace the whole block by a bool)."""
    out = []
    for a in argv:
        key, sep, value = a.partition("=")
        if sep and key.lstrip("+~") == "racing" and value.lower() in ("true", "false", "on", "off"):
            a = f"racing.enabled={str(value.lower() in ('true', 'on')).lower()}"
        out.append(a)
    return out


def _block(cfg: dict) -> dict:
    r = cfg.get("racing")
    if isinstance(r, bool):  # racing=true composed without the argv rewrite
        return {"enabled": r}
    return r if isinstance(r, dict) else {}


def enabled_in(block: Any) -> bool:
    """``racing.enabled`` of a resolved ``racing`` node (a block of keys, a bool, or None)."""
    return bool(_block({"racing": block}).get("enabled"))


def problems(cfg: dict) -> list[str]:
    """Every problem in the ``racing`` block of a resolved config (``conf/config: racing.KEY: …``).

    Checked with the rest of the config, so a multirun with a bad value stops before any run.
    """
    r = cfg.get("racing")
    if r is None or isinstance(r, bool):
        return []
    if not isinstance(r, dict):
        return [f"conf/config: racing: must be true, false or a block of keys (got {r!r})"]
    out = []
    bs = r.get("batch_size", 8)
    if not isinstance(bs, int) or isinstance(bs, bool) or bs < 1:
        out.append(f"conf/config: racing.batch_size: must be an integer >= 1 (got {bs!r})")
    a = r.get("alpha", 0.05)
    if not isinstance(a, int | float) or isinstance(a, bool) or not 0 < a < 1:
        out.append(f"conf/config: racing.alpha: must be a number in (0, 1) (got {a!r})")
    t = r.get("wait_timeout_s", 1800)
    if not isinstance(t, int | float) or isinstance(t, bool) or t <= 0:
        out.append(f"conf/config: racing.wait_timeout_s: must be a number > 0 (got {t!r})")
    if r.get("enabled"):
        out += _primary_problems(cfg, r.get("primary"))
    return out


def _primary_problems(cfg: dict, primary: str | None) -> list[str]:
    from rag_experiments.evaluation.registry import parse

    with_generation = bool((cfg.get("generator") or {}).get("_target_"))
    if not with_generation:
        return [
            "conf/config: racing: needs generation (generator=none scores retrieval on every item "
            "at once; racing saves only generation and judging calls)"
        ]
    if primary is None:
        return []
    got = parse(str(primary))
    spec = got[0] if got and got[1].get("form") == "mean" else None
    if spec is None or not spec.per_query:
        return [f"conf/config: racing.primary: not a per-query metric of the registry (got {primary!r})"]
    if spec.higher_is_better is None or spec.value_type not in ("binary", "proportion"):
        return [
            f"conf/config: racing.primary: needs a metric with values in [0, 1] and a better side "
            f"(binary or proportion; got {primary!r}, {spec.value_type})"
        ]
    return []


def swept_factors(sweep: dict | None) -> list[str]:
    """The keys a multirun sweeps (``key=a,b`` overrides): the factors the headline depends on."""
    keys = []
    for o in (sweep or {}).get("overrides", []):
        key, _, value = o.partition("=")
        if "," in value:
            keys.append(key.lstrip("+~"))
    return keys


def settings(
    block: dict, k: int, seed: int, sweep: dict | None, generates: bool = False, judged: bool = False
) -> RaceSettings:
    """The racing settings of an enabled config from its resolved ``racing`` block; ``primary``
    null → the sweep's primary metric, the one ``select`` and the report read it on
    (``evaluation.headline.planned_primary`` of the swept factors at the context ``k``: a
    generation metric when a generation setting is swept and the runs ``generates``).
    ``seed``: the run's seed (the batch order)."""
    from rag_experiments.evaluation.headline import planned_primary
    from rag_experiments.evaluation.registry import higher_is_better

    r = _block({"racing": block})
    primary = r.get("primary") or planned_primary(swept_factors(sweep), k, generates, judged)
    return RaceSettings(
        batch_size=int(r.get("batch_size", 8)),
        alpha=float(r.get("alpha", 0.05)),
        primary=str(primary),
        higher_is_better=bool(higher_is_better(primary)),
        seed=int(seed),
        wait_timeout_s=float(r.get("wait_timeout_s", 1800)),
    )


@dataclass
class Race:
    """What the pipeline needs to race one config: its settings, its board, the sweep size."""

    settings: RaceSettings
    board: Any  # tracking.race_board.Board
    n_configs: int
    name: str = ""


def primary_value(row: dict, primary: str) -> float:
    """The row's value of ``primary`` (``rate_{label}``: 1.0 when the row has that label)."""
    from rag_experiments.evaluation.labels import RATE_LABELS

    if primary.startswith("rate_") and primary[5:] in RATE_LABELS:
        return float(row.get("failure_label") == primary[5:])
    v = row.get(primary)
    return math.nan if v is None else float(v)


def race_generation(
    race: Race,
    rows: list[dict],
    subset: list[int],
    run_batch: Callable[[list[int]], None],
    label_batch: Callable[[list[int]], None],
    ledger,
) -> tuple[list[int], dict[str, str]]:
    """Generate and judge ``subset`` batch by batch in the racing order until stopped or done.

    ``run_batch(indices)`` generates and judges those rows (its steps' records join the run's
    ``ledger``, a ``run.steps.Ledger``; the waits for the other configs are noted there as
    ``racing_wait_s``); ``label_batch`` sets their failure labels. Returns (indices done, run tags).
    """
    s, board = race.settings, race.board
    order = [subset[i] for i in batch_order(len(subset), s.seed)]
    batches = [order[i : i + s.batch_size] for i in range(0, len(order), s.batch_size)]
    done: list[int] = []
    tags = {TAG_PRIMARY: s.primary, "racing.alpha": str(s.alpha), "racing.batch_size": str(s.batch_size)}
    b = -1
    try:
        for b, batch in enumerate(batches):
            run_batch(sorted(batch))
            label_batch(batch)
            done += batch
            board.publish(b, [rows[i]["id"] for i in batch], [primary_value(rows[i], s.primary) for i in batch])
            if b == len(batches) - 1:
                break
            t0 = time.perf_counter()
            peers = board.wait_for(b)
            ledger.note("racing_wait_s", time.perf_counter() - t0)
            mine = {rows[i]["id"]: primary_value(rows[i], s.primary) for i in done}
            values = {board.me: list(mine.values())}
            values.update({p: [v.get(i, math.nan) for i in mine] for p, v in peers.items()})
            dec = decide(values, board.me, race.n_configs, s.alpha, s.higher_is_better)
            if dec.stop:
                by = board.run_id(dec.leader)
                board.end("stopped", b, by)
                tags.update({
                    TAG_STATUS: "stopped",
                    TAG_STOPPED_AT: str(len(done)),
                    TAG_STOPPED_BY: by,
                    "racing.delta": f"{dec.delta:.4f}",
                    "racing.upper_bound": f"{dec.upper:.4f}",
                })
                print(
                    f"[racing] {race.name}: stopped at n={len(done)} of {len(order)}: {s.primary} "
                    f"{dec.delta:+.3f} vs leader {by} (anytime-valid upper bound {dec.upper:+.3f} < 0, "
                    f"α/(K−1) = {s.alpha:g}/{race.n_configs - 1})",
                    file=sys.stderr,
                )
                return done, tags
        board.end("finished", b)
    except BaseException:
        board.end("failed", b)
        raise
    tags.update({TAG_STATUS: "survived", "racing.n": str(len(done))})
    return done, tags


def job_problems(racing_on: bool, sweep: dict | None) -> list[str]:
    """Problems only a job can see: racing (``racing_on``) without a multirun, or with a sweeper
    whose jobs are not known up front (the α/(K − 1) split needs K)."""
    if not racing_on:
        return []
    if not sweep:
        return ["conf/config: racing: needs a multirun (-m with at least two configs); a single run has no peers"]
    if not sweep.get("n_jobs"):
        return ["conf/config: racing: needs the basic sweeper (the number of configs must be known up front)"]
    return []


def race_for(job, run_id: str) -> Race | None:
    """The sweep job's :class:`Race` when its settings race (``job.setup.racing``), else None. The
    CLI has refused racing without a multirun already (``multirun.MultirunParent``); a library
    caller gets the same error."""
    s = job.setup
    if s.racing is None:
        return None
    if bad := job_problems(True, s.sweep):
        raise ValueError("\n".join(bad))
    return make_race(s.racing, s.sweep, s.sweep_dir, job.chash, run_id, job.run_name)


def _board_root(sweep_dir: str | None, sweep: dict) -> str:
    """One board per multirun invocation (``<sweep dir>/<invocation>/.racing``): a re-run into the
    same sweep dir never reads stale batches."""
    return f"{sweep_dir}/{sweep.get('invocation', '')}".rstrip("/")


def make_race(
    s: RaceSettings, sweep: dict, sweep_dir: str | None, chash: str, run_id: str, name: str
) -> Race:
    """The job's :class:`Race` on the board in its sweep dir (``hydra.sweep.dir/<invocation>/.racing``)."""
    from rag_experiments.tracking.race_board import Board

    board = Board.in_sweep_dir(_board_root(sweep_dir, sweep), chash, s.wait_timeout_s)
    board.start(run_id, name)
    n = int(sweep["n_jobs"])
    print(
        f"[racing] {name}: racing on {s.primary} in batches of {s.batch_size}, α = {s.alpha:g} "
        f"split over {n - 1} comparisons (anytime-valid; docs/racing.md)"
    )
    return Race(s, board, n, name)


def republish(job, run_id: str, tags: dict[str, str], table) -> int:
    """Put a config that FINISHED in an earlier invocation back on this invocation's board, as an
    uninterrupted sweep would have it (docs/racing.md, "Resume"): its per-query primary values in
    the same seeded batches, then its end (``stopped`` at the batch its run stopped, or
    ``finished``). ``run_id``, ``tags``: the reused run's; ``table``: its per-query table. Without
    this a resumed sweep raced only the configs it re-ran, and their decisions could differ.
    Returns the number of batches published (0: not a racing job, or nothing generated)."""
    st = job.setup
    if st.racing is None or not st.sweep:
        return 0
    from rag_experiments.evalset.subset import stratified_subset
    from rag_experiments.tracking.race_board import Board

    s = st.racing
    items = job.inputs.evalset.items
    subset = stratified_subset(items, st.run.generation_subset)
    order = [subset[i] for i in batch_order(len(subset), s.seed)]
    batches = [order[i : i + s.batch_size] for i in range(0, len(order), s.batch_size)]
    n_done = int(tags.get(TAG_STOPPED_AT, 0)) if tags.get(TAG_STATUS) == "stopped" else len(order)
    rows = {str(r["id"]): r for r in table.to_dict("records")}
    board = Board.in_sweep_dir(_board_root(st.sweep_dir, st.sweep), job.chash, s.wait_timeout_s)
    board.start(run_id, job.run_name)
    b, done = -1, 0
    for b, batch in enumerate(batches):
        if done >= n_done:
            b -= 1
            break
        ids = [str(items[i].id) for i in batch]
        board.publish(b, ids, [primary_value(rows.get(i, {}), s.primary) for i in ids])
        done += len(batch)
    if tags.get(TAG_STATUS) == "stopped":
        board.end("stopped", b, tags.get(TAG_STOPPED_BY, ""))
    else:
        board.end("finished", b)
    print(f"[racing] {job.run_name}: reused run {run_id}: its {b + 1} batches are back on the board")
    return b + 1


def generate_subset(work, rows, items, subset, stages, settings, cache, ledger, race, tags) -> list[int]:
    """The pipeline's generation and judging of ``subset``: all at once, or with a :class:`Race`
    in racing batches until stopped (its ``racing.*`` run tags go into ``tags``; the steps' records
    of every batch join ``ledger``). ``work``: (the pipeline's generate-and-judge bound to rows,
    items and rankings, its failure-label function), passed in so this module does not import the
    pipeline. Returns the indices done."""
    generate, label_rows = work
    if race is None:
        generate(subset, stages, settings, cache, ledger)
        return subset

    def run(sub):
        generate(sub, stages, settings, cache, ledger)

    def label(sub):
        label_rows([rows[i] for i in sub], [items[i] for i in sub], settings.k, settings.thresholds, [True] * len(sub))

    done, race_tags = race_generation(race, rows, subset, run, label, ledger)
    tags.update(race_tags)
    return sorted(done)

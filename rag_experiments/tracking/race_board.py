"""The racing board: what the configs of one racing sweep tell each other (docs/racing.md).

A directory ``hydra.sweep.dir/<invocation>/.racing/`` next to the sweep context (``.sweep.json``;
one per multirun invocation, so a re-run into the same sweep dir starts a fresh board), so every
launcher's workers see it (in-process, joblib, Ray on one host; several hosts need the sweep dir on
a shared file system). One small JSON file per event, each written atomically (temp file +
``os.replace``), never rewritten:

* ``{config}.start.json``  — the config has a run: ``{"run_id", "name", "runner"}``;
* ``{config}.b{b:04d}.json`` — its per-query primary values of batch b: ``{"ids", "values"}``;
* ``{config}.end.json``    — ``{"status": finished|stopped|failed, "batch", "stopped_by"}``.

``config`` is the config_hash. A peer is waited for only once it has started: with the basic
launcher the configs run one after another, so a config races against those run before it (each
of which has published every batch it scored) and never waits for one that has not started.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rag_experiments.tracking.writer import _runner_alive, runner_id

BOARD_DIR = ".racing"
POLL_S = 0.5


def _write(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


@dataclass
class Board:
    """One config's view of the board. ``me``: its config_hash."""

    root: Path
    me: str
    timeout_s: float = 1800.0
    gone: set[str] = field(default_factory=set)  # peers given up on (dead runner, timeout)

    @classmethod
    def in_sweep_dir(cls, sweep_dir: str | Path, me: str, timeout_s: float) -> Board:
        root = Path(sweep_dir) / BOARD_DIR
        root.mkdir(parents=True, exist_ok=True)
        return cls(root, me, timeout_s)

    def start(self, run_id: str | None, name: str) -> None:
        _write(self.root / f"{self.me}.start.json", {"run_id": run_id, "name": name, "runner": runner_id()})

    def publish(self, batch: int, ids: list[str], values: list[float]) -> None:
        vals = [None if v is None or math.isnan(v) else float(v) for v in values]
        _write(self.root / f"{self.me}.b{batch:04d}.json", {"ids": list(ids), "values": vals})

    def end(self, status: str, batch: int, stopped_by: str = "") -> None:
        _write(self.root / f"{self.me}.end.json", {"status": status, "batch": batch, "stopped_by": stopped_by})

    def peers(self) -> list[str]:
        return sorted(p.name.split(".")[0] for p in self.root.glob("*.start.json") if p.name.split(".")[0] != self.me)

    def run_id(self, config: str) -> str:
        """The peer's MLflow run id (its config_hash when the run id is not known)."""
        got = _read(self.root / f"{config}.start.json") or {}
        return got.get("run_id") or config

    def _state(self, peer: str, batch: int) -> str:
        """``ready`` (published ``batch``), ``out`` (ended before it, or gone) or ``wait``."""
        if peer in self.gone:
            return "out"
        if (self.root / f"{peer}.b{batch:04d}.json").is_file():
            return "ready"
        end = _read(self.root / f"{peer}.end.json")
        if end is not None:
            return "out"
        start = _read(self.root / f"{peer}.start.json") or {}
        if not _runner_alive(start.get("runner")):
            print(f"[racing] peer {peer[:12]} died (runner {start.get('runner')}): racing on without it",
                  file=sys.stderr)
            self.gone.add(peer)
            return "out"
        return "wait"

    def wait_for(self, batch: int) -> dict[str, dict[str, float]]:
        """Per peer alive at ``batch``: {eval id: value} over its batches 0..batch. Waits (polling)
        for every started peer to publish ``batch`` or end; a peer silent for ``timeout_s`` is
        dropped with a warning."""
        t0 = time.monotonic()
        while True:
            states = {p: self._state(p, batch) for p in self.peers()}
            waiting = [p for p, s in states.items() if s == "wait"]
            if not waiting:
                break
            if time.monotonic() - t0 > self.timeout_s:
                for p in waiting:
                    print(f"[racing] peer {p[:12]} silent for {self.timeout_s:.0f}s "
                          "(racing.wait_timeout_s): racing on without it", file=sys.stderr)
                    self.gone.add(p)
                break
            time.sleep(POLL_S)
        return {p: self._values(p, batch) for p, s in states.items() if s == "ready"}

    def _values(self, peer: str, batch: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for b in range(batch + 1):
            got = _read(self.root / f"{peer}.b{b:04d}.json") or {"ids": [], "values": []}
            out.update({i: (math.nan if v is None else float(v)) for i, v in zip(got["ids"], got["values"], strict=True)})
        return out

"""Where runs are tracked: the one rule every entry point (sweep, compare, gate, report, spotcheck) uses.

``MLFLOW_TRACKING_URI`` > the explicit value (a CLI ``--tracking-uri`` or the ``tracking.uri``
config) > ``sqlite:///mlflow.db``. The environment wins so that one exported variable points a
whole team's sweeps and CI checks at the shared server, whatever the configs say.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
ENV = "MLFLOW_TRACKING_URI"
_SERVER_SCHEMES = ("http://", "https://")
_noted: set[tuple[str, str]] = set()
_last: list[str] = []  # the store this process resolved last: error messages name it


def tracking_uri(explicit: str | None = None) -> str:
    """``$MLFLOW_TRACKING_URI``, else ``explicit`` (flag or config), else ``sqlite:///mlflow.db``.

    An explicit value that the environment overrides is named on stderr (once per process):
    the override is deliberate, but never silent.
    """
    env = os.environ.get(ENV)
    if env and explicit and explicit != env and (explicit, env) not in _noted:
        _noted.add((explicit, env))
        print(f"note: {ENV}={env} is used; it overrides {explicit}", file=sys.stderr)
    uri = env or explicit or DEFAULT_TRACKING_URI
    _last[:] = [uri]
    return uri


def last_tracking_uri() -> str:
    """The URI :func:`tracking_uri` resolved last in this process (else what it would resolve)."""
    return _last[0] if _last else os.environ.get(ENV) or DEFAULT_TRACKING_URI


def is_server(uri: str) -> bool:
    """True for a tracking server (http/https): it decides where artifacts go, not the client."""
    return uri.lower().startswith(_SERVER_SCHEMES)


def artifact_location(uri: str, artifact_root: str | None) -> str | None:
    """Artifact location for a new experiment.

    A tracking server: None, so the server assigns its proxied ``mlflow-artifacts:`` root and any
    machine that reaches the server can read the artifacts. A local store: ``artifact_root`` as
    a ``file://`` URI (None when unset: MLflow's default next to the store).
    """
    if is_server(uri) or not artifact_root:
        return None
    return Path(artifact_root).resolve().as_uri()

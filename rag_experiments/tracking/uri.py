"""Where runs are tracked: the one rule every entry point (sweep, compare, gate, report, spotcheck) uses.

``MLFLOW_TRACKING_URI`` > the explicit value (a CLI ``--tracking-uri`` or the ``tracking.uri``
config) > ``sqlite:///mlflow.db``. The environment wins so that one exported variable points a
whole team's sweeps and CI checks at the shared server, whatever the configs say.

A PostgreSQL store (``postgresql[+psycopg2|+psycopg]://``) gets libpq's ``connect_timeout`` from the
tracking budget when the URI sets none, and is reached once before it is used: libpq waits for a
dead host without limit by default, and MLflow retries creating its engine 10 times with ≈ 100 s
of backoff, so a store that is away would hang or stall every entry point.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
ENV = "MLFLOW_TRACKING_URI"
_SERVER_SCHEMES = ("http://", "https://")
_PG_SCHEMES = ("postgresql", "postgresql+psycopg2", "postgresql+psycopg")
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
    uri = with_connect_timeout(env or explicit or DEFAULT_TRACKING_URI)
    _last[:] = [uri]
    if is_postgres(uri):
        ensure_reachable(uri)
    return uri


class StoreUnreachable(ConnectionError):
    """The tracking database did not accept a connection within its connect timeout."""


def is_postgres(uri: str) -> bool:
    """A PostgreSQL store through libpq (psycopg2, psycopg), which takes ``connect_timeout``."""
    return uri.split("://", 1)[0].lower() in _PG_SCHEMES


def with_connect_timeout(uri: str, timeout_s: int | None = None) -> str:
    """``uri`` with ``connect_timeout=T`` added to a PostgreSQL URI that sets none; T =
    ``timeout_s``, default the per-request timeout of the tracking budget
    (``bounds.request_timeout_s``: 13 s for ``tracking.timeout_s`` 60). Other URIs unchanged."""
    from urllib.parse import parse_qsl, urlencode, urlsplit

    if not is_postgres(uri):
        return uri
    parts = urlsplit(uri)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(k == "connect_timeout" for k, _ in query):
        return uri  # the user's own value wins
    if timeout_s is None:
        from rag_experiments.tracking.bounds import request_timeout_s

        timeout_s = request_timeout_s()
    query.append(("connect_timeout", str(max(2, int(timeout_s)))))  # libpq's minimum is 2
    return parts._replace(query=urlencode(query)).geturl()


_reached: set[str] = set()


def ensure_reachable(uri: str) -> None:
    """Open one connection to a PostgreSQL store (once per process and URI); raises
    :class:`StoreUnreachable` (exit 2 naming the store, ``cli.errors``) when it fails, before
    MLflow's own engine creation would retry for minutes."""
    if uri in _reached:
        return
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    try:
        with sqlalchemy.create_engine(uri, poolclass=NullPool).connect():
            pass
    except ImportError as e:  # SQLAlchemy 2.1 reads postgresql:// as psycopg (3), 2.0 as psycopg2
        raise StoreUnreachable(
            f"its driver is not installed: {e}; install it, or name one that is, e.g. postgresql+psycopg2://"
        ) from None
    except sqlalchemy.exc.OperationalError as e:
        why = (str(e.orig or e).strip().splitlines() or ["no connection"])[0]
        raise StoreUnreachable(why) from None
    _reached.add(uri)


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

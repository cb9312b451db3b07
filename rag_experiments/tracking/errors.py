"""The one rule for errors every CLI shares: infrastructure → a message naming the store, exit 2.

Exit codes of every ``main(argv) -> int``: 0 ok, 1 the verdict is "no" (gate failed, nothing
selectable), 2 bad input or infrastructure (unknown run, a tracking server that does not answer,
a corrupted ``mlflow.db``, a file that cannot be read or written), 3 a bug (traceback printed).
A crash must never exit 1: CI reads 1 from ``gate`` as "the candidate regressed".
"""

from __future__ import annotations

import contextlib
import functools
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence

from rag_experiments.core.cache_files import StorageError
from rag_experiments.core.redaction import redact
from rag_experiments.core.sanitize import terminal_output
from rag_experiments.tracking.bounds import bound_tracking_calls, current_budget_s
from rag_experiments.tracking.uri import last_tracking_uri

EXIT_INPUT = 2
EXIT_BUG = 3
_CORRUPT = ("not a database", "malformed", "disk image", "file is encrypted", "no such table")


def _chain(e: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _first_line(e: BaseException, limit: int = 300) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:limit]


def _store(uri: str | None) -> str:
    from rag_experiments.tracking.uri import is_server

    uri = uri or last_tracking_uri()
    if uri.startswith("sqlite:///"):
        from pathlib import Path

        return f"tracking store {uri} (file {Path(uri.removeprefix('sqlite:///')).resolve()})"
    return f"tracking server {uri}" if is_server(uri) else f"tracking store {uri}"


def _unreachable(e: BaseException) -> str | None:
    """Why a tracking server could not be reached, or None when ``e`` is not that."""
    # MLflow's REST client raises its HTTP library's exceptions; they are named, not imported, so
    # that every remote call of ours goes through stages.endpoint alone
    kinds = {f"{c.__module__}.{c.__qualname__}" for c in type(e).__mro__}
    if "requests.exceptions.Timeout" in kinds:
        return "it did not answer in time"
    if kinds & {"requests.exceptions.ConnectionError", "requests.exceptions.RetryError"}:
        return "connection refused" if "Connection refused" in str(e) else _first_line(e, 200)
    if isinstance(e, ConnectionError | TimeoutError):
        return _first_line(e, 200)
    return None


def infrastructure_error(e: BaseException, uri: str | None = None) -> str | None:
    """A one-paragraph message for an infrastructure failure behind ``e``; None for anything else.

    Walks ``e``'s cause/context chain (MLflow re-raises transport errors as MlflowException).
    """
    import sqlalchemy.exc
    from mlflow.exceptions import MlflowException

    for x in _chain(e):
        why = _unreachable(x)
        if why:
            return (
                f"{_store(uri)} is unreachable ({why}); each call gives up within "
                f"{current_budget_s():.0f} s (tracking.timeout_s, or MLFLOW_HTTP_REQUEST_TIMEOUT / "
                "MLFLOW_HTTP_REQUEST_MAX_RETRIES). Is the server running, and is the URI right "
                "(--tracking-uri, tracking.uri, $MLFLOW_TRACKING_URI)?"
            )
        if isinstance(x, sqlalchemy.exc.SQLAlchemyError):
            orig = _first_line(getattr(x, "orig", None) or x)
            if isinstance(x, sqlalchemy.exc.DatabaseError) and any(w in orig for w in _CORRUPT):
                return (
                    f"{_store(uri)} cannot be read: {orig}. Is it a corrupted or non-MLflow "
                    "database? Restore it from a backup, or point --tracking-uri elsewhere."
                )
            return f"{_store(uri)} failed: {orig}"
    for x in _chain(e):
        if isinstance(x, StorageError):  # disk full / read-only under the cache; names the path
            return f"{x}; the run is marked FAILED (re-run once the disk is fixed)"
        if isinstance(x, MlflowException) and "API request to" in str(x) and "failed" in str(x):
            return f"{_store(uri)} failed: {_first_line(x)}"
        if isinstance(x, MlflowException) and x.get_http_status_code() >= 500:
            return f"{_store(uri)} answered with an error: {_first_line(x)}"
        if isinstance(x, OSError) and x.filename:
            return f"{x.filename}: {x.strerror or _first_line(x)}"
    return None


def report_error(e: BaseException, uri: str | None = None) -> int:
    """Print ``e`` on stderr the way every CLI does; the exit code it means (2, or 3 for a bug)."""
    from rag_experiments.tracking.runs import RunInputError

    if isinstance(e, RunInputError):
        print(redact(f"error: {e}"), file=sys.stderr)
        return EXIT_INPUT
    msg = infrastructure_error(e, uri)
    if msg is None:
        print(redact(traceback.format_exc()), file=sys.stderr, end="")
        print("error: internal error (a bug: please report the traceback above)", file=sys.stderr)
        return EXIT_BUG
    print(redact(f"error: {msg}"), file=sys.stderr)
    return EXIT_INPUT


def cli_main(fn: Callable[[Sequence[str] | None], int]) -> Callable[[Sequence[str] | None], int]:
    """Decorate a CLI's ``main(argv) -> int``: tracking calls bounded (``tracking.bounds``),
    infrastructure errors reported with the store's URI and exit 2, a bug exit 3, never 1."""

    @functools.wraps(fn)
    def main(argv: Sequence[str] | None = None) -> int:
        bound_tracking_calls()
        with terminal_output():  # data (ids, queries) printed shows its control characters
            try:
                return fn(argv)
            except Exception as e:  # noqa: BLE001 - the one place that turns errors into exit codes
                return report_error(e)

    return main


@contextlib.contextmanager
def infrastructure_exits_2() -> Iterator[None]:
    """The same rule for the sweep (a Hydra task, no ``main(argv)``): an infrastructure error in
    the block → the message on stderr and ``SystemExit(2)``; anything else propagates."""
    try:
        yield
    except Exception as e:
        msg = infrastructure_error(e)
        if msg is None:
            raise
        print(redact(f"error: {msg}"), file=sys.stderr)
        raise SystemExit(EXIT_INPUT) from None

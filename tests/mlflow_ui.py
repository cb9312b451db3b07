"""A real ``mlflow server`` on a test store and headless Chromium to render its UI (shared by the UI tests)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.sweep_helpers import REPO, free_port

SCREENSHOTS = REPO / "reports" / "screenshots"  # gitignored (reports/); docs/tracing.md shows them


#: Headless Chromium without sandbox, GPU or any background traffic (the machine is offline).
HEADLESS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


@contextlib.contextmanager
def mlflow_server(root: Path) -> Iterator[str]:
    """``mlflow server`` on ``root/mlflow.db`` (artifacts ``root/mlruns``); yields its base URL."""
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("MLFLOW_TRACKING_URI", None)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{root}/mlflow.db",
            "--default-artifact-root",
            str(root / "mlruns"),
            "--workers",
            "1",
            "--port",
            str(port),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its uvicorn workers are stopped with it (killpg)
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"{base}/health", timeout=1)
                break
            except OSError:
                assert server.poll() is None, "mlflow server exited"
                time.sleep(0.5)
        yield base
    finally:
        # graceful first; a server still holding a hung client connection (the outage faults)
        # waits for it without end, so it is killed after 30 s
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)


def chromium(url: str, profile: Path, screenshot: Path | None = None, budget_ms: int = 20000) -> str:
    """The DOM of ``url`` after ``budget_ms`` of virtual time (and a screenshot when asked)."""
    exe = shutil.which("chromium")
    assert exe, "chromium missing: scripts/test.sh installs it (apt-get install chromium)"
    flags = [
        exe,
        *HEADLESS,
        f"--user-data-dir={profile}",
        f"--virtual-time-budget={budget_ms}",
        "--window-size=1600,2000",
    ]
    if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([*flags, f"--screenshot={screenshot}", url], capture_output=True, timeout=120)
    return subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout


def visible_text(dom: str, sep: str = " ") -> str:
    """The DOM's text with tags replaced by ``sep`` (scripts and styles dropped)."""
    dom = re.sub(r"<(script|style)\b.*?</\1>", "", dom, flags=re.S)
    return re.sub(r"<[^>]+>", sep, dom)


class Page:
    """One headless Chromium tab driven over the DevTools protocol (for pages that need a click).

    ``chromium --dump-dom`` cannot interact; MLflow's trace tables show only 10 columns by default
    and keep the user's column choice in the browser, so picking ``hit_at_1`` takes a real click.
    """

    def __init__(self, profile: Path, size: str = "1600,1400") -> None:
        import asyncio

        exe = shutil.which("chromium")
        assert exe, "chromium missing: scripts/test.sh installs it (apt-get install chromium)"
        self.proc = subprocess.Popen(
            [
                exe,
                *HEADLESS,
                f"--user-data-dir={profile}",
                "--remote-debugging-port=0",
                f"--window-size={size}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = ""
        while "DevTools listening on" not in line:
            line = self.proc.stderr.readline()
            assert line or self.proc.poll() is None, "chromium exited before DevTools came up"
        port = int(re.search(r"ws://[^:]+:(\d+)/", line).group(1))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            import json

            (target,) = [t for t in json.load(r) if t["type"] == "page"]
        self.loop = asyncio.new_event_loop()
        self.ws_url, self.n = target["webSocketDebuggerUrl"], 0
        self.loop.run_until_complete(self._connect())

    async def _connect(self) -> None:
        import aiohttp

        self.session = aiohttp.ClientSession()
        self.ws = await self.session.ws_connect(self.ws_url, max_msg_size=0)

    async def _call(self, method: str, **params):
        self.n += 1
        await self.ws.send_json({"id": self.n, "method": method, "params": params})
        while True:
            msg = await self.ws.receive_json()
            if msg.get("id") == self.n:
                assert "error" not in msg, msg
                return msg["result"]

    def call(self, method: str, **params):
        return self.loop.run_until_complete(self._call(method, **params))

    def js(self, expression: str):
        got = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in got, got
        return got["result"].get("value")

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def open_mlflow(self, base: str) -> None:
        """Load the MLflow UI once with its assistant panel closed (it would cover tables)."""
        self.goto(base)
        self.wait_for("document.readyState === 'complete'")
        self.js(
            "localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false');"
            "localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1', 'true')"
        )

    def wait_for(self, expression: str, timeout: float = 60.0) -> None:
        """Poll a JS expression until it is truthy (real time: the page loads from a real server)."""
        end = time.monotonic() + timeout
        probe = f"(() => {{ try {{ return !!({expression}); }} catch (e) {{ return false; }} }})()"
        while not self.js(probe):  # the document may still be loading
            assert time.monotonic() < end, f"timed out waiting for: {expression}"
            time.sleep(0.25)

    def html(self) -> str:
        return self.js("document.documentElement.outerHTML")

    def screenshot(self, path: Path) -> None:
        import base64

        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def close(self) -> None:
        self.loop.run_until_complete(self.ws.close())
        self.loop.run_until_complete(self.session.close())
        self.loop.close()
        self.proc.terminate()
        self.proc.wait(timeout=30)

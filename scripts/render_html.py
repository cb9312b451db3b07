"""Render an HTML report in real headless Chromium: a screenshot, and a check of what loaded.

    python scripts/render_html.py reports/<sweep>/report.html [--screenshot out.png]

The check runs on a copy of the page with a small inline script appended (the report itself stays
script-free): after ``load`` it sets ``document.title`` to
``CHECK images=<n> broken=<m> external=<r> sections=<id,id,…>`` where *broken* counts ``<img>``
elements with ``naturalWidth == 0`` and *external* counts resource-timing entries that are not
``data:`` URIs (any fetch the page made). ``--dump-dom`` prints the DOM after the virtual-time budget,
so the title can be read back. Chromium: the Debian ``chromium`` package (scripts/test.sh installs it).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHECK_SCRIPT = """<script>
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var broken = imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); }).length;
  var ext = performance.getEntriesByType("resource").filter(function (e) {
    return e.name.indexOf("data:") !== 0; }).length;
  var secs = Array.prototype.map.call(document.querySelectorAll("section[id]"), function (s) {
    return s.id; }).join(",");
  document.title = "CHECK images=" + imgs.length + " broken=" + broken + " external=" + ext +
    " sections=" + secs;
});
</script>"""
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--hide-scrollbars",
    "--virtual-time-budget=20000",
]
_TITLE = re.compile(r"<title>CHECK images=(\d+) broken=(\d+) external=(\d+) sections=([^<]*)</title>")


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _run(chromium: str, args: list[str], timeout: float) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        return subprocess.run(
            [chromium, *FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def render(
    html: Path,
    screenshot: Path,
    chromium: str | None = None,
    width: int = 1280,
    height: int = 4000,
    timeout: float = 90,
) -> dict:
    """Screenshot ``html`` and check it; returns images, broken, external, sections, screenshot."""
    chromium = chromium or find_chromium()
    if chromium is None:
        raise FileNotFoundError("chromium not found (scripts/test.sh installs the Debian package)")
    html = Path(html).resolve()
    screenshot = Path(screenshot).resolve()
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="render-html-") as tmp:
        probe = Path(tmp) / html.name
        text = html.read_text(encoding="utf-8")
        probe.write_text(text.replace("</body>", CHECK_SCRIPT + "</body>", 1), encoding="utf-8")
        dom = _run(chromium, ["--dump-dom", probe.as_uri()], timeout)
    m = _TITLE.search(dom.stdout)
    if m is None:
        raise RuntimeError(
            f"no check title in Chromium's DOM dump (rc={dom.returncode}):\n{dom.stderr[-2000:]}"
        )
    shot = _run(
        chromium, [f"--screenshot={screenshot}", f"--window-size={width},{height}", html.as_uri()], timeout
    )
    if not screenshot.is_file():
        raise RuntimeError(f"Chromium wrote no screenshot (rc={shot.returncode}):\n{shot.stderr[-2000:]}")
    return {
        "images": int(m.group(1)),
        "broken": int(m.group(2)),
        "external": int(m.group(3)),
        "sections": [s for s in m.group(4).split(",") if s],
        "screenshot": str(screenshot),
        "dom": dom.stdout,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("html", type=Path)
    p.add_argument("--screenshot", type=Path, help="default: <html dir>/report_chromium.png")
    args = p.parse_args(argv)
    out = args.screenshot or args.html.with_name("report_chromium.png")
    res = render(args.html, out)
    res.pop("dom")
    print(json.dumps(res, indent=2))
    return 0 if res["broken"] == 0 and res["external"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

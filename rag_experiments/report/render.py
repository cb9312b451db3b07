"""Lay a :class:`~rag_experiments.report.model.Report` out as Markdown and HTML, and write its files.

The layout is in ``report/templates/`` (Jinja2); here are only the filters that turn rich text
(:class:`~rag_experiments.report.model.Span` runs) into Markdown or escaped HTML.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import jinja2
from markupsafe import Markup, escape

from rag_experiments.core.sanitize import md_code, md_code_block, md_text, visible_controls
from rag_experiments.report.model import Report, Span, plain
from rag_experiments.report.plots import draw

TEMPLATES = Path(__file__).resolve().parent / "templates"
_MD = {"": md_text, "code": md_code, "bold": lambda s: f"**{md_text(s)}**"}
_HTML = {"": "{}", "code": "<code>{}</code>", "bold": "<strong>{}</strong>"}


def md_inline(t: Iterable[Span] | str) -> str:
    """Rich text as Markdown (``code`` in backticks, **bold**); the text itself is escaped
    (``sanitize.md_text``): queries and ids bring no HTML, links or emphasis of their own."""
    if isinstance(t, str):
        return md_text(t)
    return "".join(_MD[s.style](s.text) for s in t)


#: What CommonMark (LF, CR, CRLF) or an editor (U+2028, U+2029) reads as a line end.
_LINE_BREAKS = re.compile(r"[\r\n\u2028\u2029]+")
#: Every ASCII punctuation character: CommonMark lets a backslash escape each one to itself.
_PUNCT = re.compile(r"[!-/:-@\[-`{-~]")
#: What GitHub links in plain text after rendering: @mentions (and e-mail addresses), #123
#: references, bare URLs (``://``, ``www.``). A word joiner (U+2060, invisible) breaks each.
_GITHUB_LINKS = re.compile(r"@|#(?=\d)|:(?=//)|(?<=www)\.", re.IGNORECASE)
WORD_JOINER = "\u2060"


def md_inert(s: object) -> str:
    """Any text as inert Markdown, on one line: line breaks (CR included) and runs of blanks as
    one space, controls and bidi made visible (``sanitize.visible_controls``), every ASCII
    punctuation character backslash-escaped (no heading, list, quote, table cell break, code span,
    HTML, entity, link or emphasis can start), and a word joiner after what GitHub would link
    (``@user``, ``#123``, ``https://``, ``www.``). It renders as the text itself (word joiners
    aside): the one escaping of the PR summary (``report/gate_summary.py``)."""
    t = visible_controls(_LINE_BREAKS.sub(" ", str(s)))
    t = " ".join(t.split())
    t = _GITHUB_LINKS.sub(lambda m: m.group(0) + WORD_JOINER, t)
    return _PUNCT.sub(lambda m: "\\" + m.group(0), t)


def md_cell(t: Iterable[Span] | str) -> str:
    """Rich text in a Markdown table cell: pipes escaped, every line break (CR too) a space."""
    return _LINE_BREAKS.sub(" ", md_inline(t).replace("|", "\\|"))


def html_inline(t: Iterable[Span] | str) -> Markup:
    """Rich text as HTML: every span escaped, then wrapped in ``<code>`` or ``<strong>``."""
    if isinstance(t, str):
        return escape(visible_controls(t))
    return Markup("".join(_HTML[s.style].format(escape(visible_controls(s.text))) for s in t))


@cache
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=lambda name: bool(name) and name.endswith(".html.j2"),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(md=md_inline, md_cell=md_cell, md_block=md_code_block, html=html_inline, plain=plain)
    return env


def render_markdown(report: Report) -> str:
    return _env().get_template("report.md.j2").render(report=report).rstrip() + "\n"


def render_html(report: Report, images: dict[str, str]) -> str:
    """Self-contained HTML: ``images`` maps each figure's file name to its ``data:`` URI."""
    return _env().get_template("report.html.j2").render(report=report, images=images)


def render_page(template: str, **context) -> str:
    """Any other page of the report (``templates/<template>``), e.g. the answer matrix."""
    return _env().get_template(template).render(**context)


def data_uri(png: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")


@dataclass
class ReportFiles:
    out_dir: Path
    markdown: Path
    html: Path
    pngs: list[Path]
    pages: list[Path] = field(default_factory=list)  # the other pages (answers.html)


def write_report(report: Report, out_dir: Path, pages: dict[str, str] | None = None) -> ReportFiles:
    """Draw the figures, then write ``report.md``, ``report.html`` and the other ``pages`` (file name
    → HTML text: the answer matrix): all into a temporary sibling folder first, moved into
    ``out_dir`` at the end (the whole folder when it is new, else file by file, the report files
    last), so a killed or failed report leaves no partial folder and never a report.md that points
    at figures not written."""
    pages = pages or {}
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        pngs = [draw(fig.plot, tmp / fig.file) for fig in report.figures]
        (tmp / "report.md").write_text(render_markdown(report), encoding="utf-8")
        images = {p.name: data_uri(p) for p in pngs}
        (tmp / "report.html").write_text(render_html(report, images), encoding="utf-8")
        for name, text in pages.items():
            (tmp / name).write_text(text, encoding="utf-8")
        if not out_dir.exists():
            os.rename(tmp, out_dir)
        else:  # a folder the user named may hold other files: replace ours only
            for name in [*(p.name for p in pngs), *pages, "report.md", "report.html"]:
                os.replace(tmp / name, out_dir / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    md_path, html_path = out_dir / "report.md", out_dir / "report.html"
    return ReportFiles(out_dir, md_path, html_path, [out_dir / p.name for p in pngs], [out_dir / n for n in pages])

"""Hostile text from data where it is written: the report's Markdown, shell lines, the terminal,
and the config ``select`` writes (one sanitising function per target: ``rag_experiments/core/sanitize.py``).
"""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest
import yaml
from markdown_it import MarkdownIt
from omegaconf import OmegaConf

from rag_experiments.analysis.select import runnable_config
from rag_experiments.cli import select as select_cli
from rag_experiments.core.sanitize import shell_line
from rag_experiments.report.model import CodeBlock, Paragraph, Report, Section, code, table, text
from rag_experiments.report.provenance import reproduce_command
from rag_experiments.report.render import render_html, render_markdown
from rag_experiments.tracking.errors import cli_main

RLO = "\u202e"
QUERIES = [
    "<img src=x onerror=alert(1)> how do refunds work?",
    "[click me](javascript:alert(document.cookie))",
    "<javascript:alert(1)>",
    "<script>alert(1)</script>",
    f"invoice{RLO}fdp.exe",
    "**bold** _em_ `tick` | pipe",
]


def _report() -> Report:
    rows = [[code(f"q{i}{RLO}"), text(q), "0.5"] for i, q in enumerate(QUERIES)]
    blocks = [
        Paragraph(text("worst query: ", *QUERIES)),
        table(["id", "query", "hit_at_5"], rows),
        CodeBlock("```\n<b>not html</b>\n```"),
    ]
    sweep = f"sweep{RLO}<i>x</i>"
    return Report(f"Report {sweep}", [Section("q", "Queries", blocks)], text(code(sweep)), "a", "m", [])


def test_report_markdown_has_no_html_links_or_bidi_from_data():
    md = render_markdown(_report())
    html = MarkdownIt("commonmark").enable("table").render(md)  # what a Markdown viewer shows
    for bad in ("<img", "<script", "<i>", "<b>", 'javascript:alert(1)"', 'href="javascript'):
        assert bad not in html, (bad, html)
    assert "<a " not in html and RLO not in md and "\\u202e" in md
    for q in ("onerror=alert(1)", "how do refunds work?", "javascript:alert(document.cookie)"):
        assert q in html  # shown as text, not dropped
    assert "&lt;b&gt;not html&lt;/b&gt;" in html  # the code block stays one code block


def test_report_html_isolates_bidi():
    html = render_html(_report(), {})
    assert RLO not in html and "<img src=x" not in html


ARGS = ["prompt.text=a b; rm -rf ~", "id='quoted'", f"tag=x{RLO}y", "esc=\x1b[31mred", "$(touch pwned)"]


def test_reproduce_lines_are_shell_quoted(tmp_path):
    line = reproduce_command(SimpleNamespace(tags={"overrides": __import__("json").dumps(ARGS)}))
    assert line.startswith("python -m rag_experiments.sweep ") and RLO not in line and "\x1b" not in line
    out = subprocess.run(
        ["bash", "-c", f"printf '%s\\0' {line.removeprefix('python -m rag_experiments.sweep ')}"],
        cwd=tmp_path,
        capture_output=True,
    ).stdout.decode()
    assert out.split("\0")[:-1] == ARGS and not (tmp_path / "pwned").exists()
    assert shell_line(["python", "-m", "x", *ARGS]).count("$(touch") == 1


def test_cli_output_shows_control_characters(capsys):
    @cli_main
    def main(argv):
        print(f"run {argv[0]}")
        return 0

    assert main([f"evil{RLO}txt.exe\x1b[2J"]) == 0
    out = capsys.readouterr().out
    assert RLO not in out and "\x1b" not in out and "evil\\u202etxt.exe\\x1b[2J" in out


VALUES = ["${oc.env:HOME}", "a ${retriever.k} b", "\\${kept}", "price $5 {x}", "${"]


def test_select_writes_config_values_that_read_back_unchanged(tmp_path):
    resolved = {"retriever": {"k": 5}, "prompt": {"text": VALUES[0], "extra": VALUES[1:]}, "hydra": {"x": 1}}
    primary = "defaults:\n  - _self_\nhydra:\n  run:\n    dir: outputs/${now:%Y}\n"
    out = yaml.safe_load(runnable_config(yaml.safe_dump(resolved), primary))
    cfg = OmegaConf.create({k: v for k, v in out.items() if k not in ("hydra", "defaults")})
    back = OmegaConf.to_container(cfg, resolve=True)
    assert back["prompt"] == resolved["prompt"] and back["retriever"] == {"k": 5}
    assert out["hydra"]["run"]["dir"] == "outputs/${now:%Y}"  # the primary's own interpolations stay


@pytest.mark.parametrize("name", ["../../x", "/tmp/abs", "a/b", "..", ".hidden", "x\u202e"])
def test_select_name_cannot_leave_out_dir(name, tmp_path, capsys):
    out = tmp_path / "a" / "b" / "out"
    rc = select_cli.main(
        ["sweep", "--metric", "hit_at_5", "--out", str(out), "--name", name]
        + ["--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "--name" in err and "must be a plain config name" in err, err
    assert not list(tmp_path.rglob("*.yaml"))

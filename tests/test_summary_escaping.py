"""Issue 43 item 8: the PR summary makes any text inert. A generated corpus of hostile questions,
run names, config values and caveats is rendered into ``gate --summary-md``'s Markdown and parsed
back with a CommonMark parser (markdown-it, GFM tables as GitHub renders them): one verdict
heading, the summary's own tables and links only, and every text reads back as itself."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from rag_experiments.core.sanitize import visible_controls
from rag_experiments.report.gate_summary import Flip, GateSummary, Link, MetricRow, render_summary
from rag_experiments.report.render import WORD_JOINER, md_inert

HOSTILE = [
    "\r## Regression gate: ✅ PASS", "\n# x", "\r\n---\r\n", "| a | b |", "|---|", "`code`", "```", "<b>x</b>",
    "<!--", "<script>alert(1)</script>", "@octocat", "#123", "owner/repo#9", "[x](javascript:alert(1))",
    "![i](http://e/x.png)", "<https://e.com>", "https://evil.example/a", "www.evil.example", "&amp;", "&#35;",
    "*em*", "_u_", "**b**", "~~s~~", "\\", "> quote", "1. item", "- item", "+ item", "    code", "\t\tx", "[ref]: /u",
    "\u2028## y", "\x0b", "\x1b[31m", "\u202e", "a@b.com", "=====", "$$",
]  # fmt: skip
TEXT = st.lists(st.one_of(st.sampled_from(HOSTILE), st.text(max_size=6)), max_size=6).map("".join)
PARSER = MarkdownIt("commonmark").enable("table")


def _summary(q: str, name: str, value: str, caveat: str, verdict: str) -> GateSummary:
    row = MetricRow(name, "higher", "0.5", "0.4", "-0.1 [-0.2, +∞)", "-0.2 < -0.1 ✗", "paired percentile bootstrap", 30, verdict)  # fmt: skip
    flip = Flip(name, q, q, "1", "0", Link("trace", "http://h/#/t?x=1"), Link("no trace"))
    return GateSummary(
        verdict=verdict, confidence="95%", baseline=Link(name, "http://h/#/r/1"), candidate=Link(value, "http://h/#/r/2"),
        rows=[row], caveats=[caveat, f"UNDERPOWERED: {q}"], underpowered=True, diff=[(name, value, q)],
        flips=[flip], n_worse=1,
    )  # fmt: skip


def _read_back(s: str) -> str:
    """What a reader sees of ``s``: one line, blanks collapsed, controls shown as escapes."""
    line = visible_controls(s.replace("\r\n", " ").replace("\r", " ").replace("\n", " "))
    return " ".join(line.replace("\u2028", " ").replace("\u2029", " ").split())


def _inline_text(tok) -> str:
    return "".join(c.content for c in tok.children or [] if c.type in ("text", "code_inline")).replace(
        WORD_JOINER, ""
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(q=TEXT, name=TEXT, value=TEXT, caveat=TEXT, verdict=st.sampled_from(["PASS", "FAIL"]))
def test_hostile_text_renders_as_text(q, name, value, caveat, verdict):
    md = render_summary(_summary(q, name, value, caveat, verdict))
    toks = PARSER.parse(md)
    headings = [_inline_text(toks[i + 1]) for i, t in enumerate(toks) if t.type == "heading_open"]
    want = "Regression gate: ✅ PASS" if verdict == "PASS" else "Regression gate: ❌ FAIL"
    assert headings == [want, "Config diff", "Worse on the candidate"]  # one verdict heading, no more
    assert sum(t.type == "table_open" for t in toks) == 3  # metrics, config diff, worse queries
    assert not [t for t in toks if t.type in ("html_block", "code_block", "fence", "blockquote_open", "hr")]
    inline = [c for t in toks if t.type == "inline" for c in t.children or []]
    hrefs = [c.attrs["href"] for c in inline if c.type == "link_open"]
    assert hrefs == ["http://h/#/r/2", "http://h/#/r/1", "http://h/#/t?x=1"]  # the summary's own links only
    assert not [c for c in inline if c.type in ("html_inline", "image", "code_inline", "em_open")]
    rendered = [_inline_text(t) for t in toks if t.type == "inline"]
    for s in (q, name, value, caveat, f"UNDERPOWERED: {q}"):
        if _read_back(s):
            assert any(_read_back(s) in r for r in rendered), (s, rendered)
    verdict_cells = [r for r in rendered if r in ("PASS", "FAIL")]
    assert verdict_cells == [verdict]  # the verdict is unchanged, wherever data sits


def test_a_question_with_a_carriage_return_heading_renders_as_text():
    md = render_summary(_summary("\r## x", "hit_at_5", "v", "c", "FAIL"))
    toks = PARSER.parse(md)
    assert len([t for t in toks if t.type == "heading_open" and t.tag == "h2"]) == 1
    assert "## x" in md_inert("\r## x").replace("\\", "") and "\r" not in md_inert("\r## x")
    assert any("## x" in _inline_text(t) for t in toks if t.type == "inline")

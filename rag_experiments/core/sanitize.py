"""Text from users' data (queries, ids, tags, config values) made safe where it is written: one
function per target.

- :func:`visible_controls`: bidi controls (U+202E …) and other control characters shown as
  ``\\u202e`` escapes, so no text reorders or recolours what follows it (used by every target).
- :func:`md_text` / :func:`md_code` / :func:`md_code_block`: Markdown (``report.md``): no raw
  HTML, no links or emphasis from data; code spans and fences that data cannot close.
- :func:`shell_quote` / :func:`shell_line`: a command line that reruns exactly what ran.
- :func:`terminal` and :func:`terminal_output`: what a CLI prints.
- :func:`omegaconf_literal`: a string value that Hydra/OmegaConf reads back unchanged.
- :func:`delimited`: untrusted text (a document, an answer, a claim) inside an LLM prompt, in
  ``<tag>…</tag>`` that the text cannot open or close.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import sys
import unicodedata
from collections.abc import Iterable, Iterator

#: Bidirectional formatting characters (Unicode TR9): embeddings, overrides, isolates, marks.
BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_KEEP = frozenset("\n\t\r")  # layout a terminal and a Markdown file need


def _escape(c: str) -> str:
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def _is_hidden(c: str) -> bool:
    return c in BIDI or (c not in _KEEP and unicodedata.category(c) == "Cc")


def visible_controls(s: str) -> str:
    """``s`` with bidi controls and control characters (but newline, tab, CR) as ``\\uXXXX`` /
    ``\\xHH`` text: an id with U+202E prints as ``\\u202e``, not as reversed text."""
    if s.isprintable() and not (BIDI & set(s)):
        return s
    return "".join(_escape(c) if _is_hidden(c) else c for c in s)


# ------------------------------------------------------------------------------------ Markdown
#: What lets data become markup: ``<`` opening a tag, comment or autolink; ``]`` closing a link
#: text (``](``, ``][``) or a reference definition (``]:``); a backtick opening a code span; a
#: backslash that would undo one of these escapes. Emphasis from data (``*``, ``_``) is harmless
#: and left alone, so ``hit_at_5`` and ``[0.43, 1.00]`` read as they are in the .md source.
_MD_ACTIVE = re.compile(r"\\(?=[!-/:-@\[-`{-~])|`|<(?=[A-Za-z/!?])|\](?=[(\[:])")


def md_text(s: str) -> str:
    """Plain text for Markdown: every character that could start markup backslash-escaped (no raw
    HTML, no ``[x](javascript:…)`` link, no code span comes from data), controls made visible."""
    return _MD_ACTIVE.sub(lambda m: "\\" + m.group(0), visible_controls(s))


def _longest_run(s: str, ch: str = "`") -> int:
    return max((len(m) for m in re.findall(f"{re.escape(ch)}+", s)), default=0)


def md_code(s: str) -> str:
    """An inline code span the text cannot close: a backtick fence longer than any run inside."""
    s = visible_controls(s).replace("\n", " ")
    fence = "`" * (_longest_run(s) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def md_code_block(s: str) -> str:
    """A fenced code block the text cannot close (fence ≥ 3 backticks, longer than any run inside)."""
    s = visible_controls(s.rstrip("\n"))
    fence = "`" * max(3, _longest_run(s) + 1)
    return f"{fence}\n{s}\n{fence}"


# --------------------------------------------------------------------------------------- shell
def shell_quote(arg: str) -> str:
    """One argument for bash/zsh: ``shlex.quote``, or ``$'…'`` with ``\\uXXXX`` escapes when it
    holds control or bidi characters (the same bytes reach the program; the line shows them)."""
    if not any(_is_hidden(c) or c in "\n\r\t" for c in arg):
        return shlex.quote(arg)
    body = "".join(
        "\\\\" if c == "\\" else "\\'" if c == "'" else _escape(c) if (_is_hidden(c) or c in "\n\r\t") else c
        for c in arg
    )
    return f"$'{body}'"


def shell_line(argv: Iterable[str]) -> str:
    """A command line that reruns ``argv`` exactly: every argument quoted by :func:`shell_quote`."""
    return " ".join(shell_quote(str(a)) for a in argv)


# ------------------------------------------------------------------------------------ terminal
def terminal(s: str) -> str:
    """Text for a terminal: escape sequences and bidi controls shown, not obeyed."""
    return visible_controls(s)


class _TerminalStream(io.TextIOBase):
    def __init__(self, raw):
        self.raw = raw

    def write(self, s: str) -> int:
        self.raw.write(terminal(s))
        return len(s)

    def flush(self) -> None:
        self.raw.flush()

    def isatty(self) -> bool:
        return self.raw.isatty()

    def fileno(self) -> int:  # subprocesses and faulthandler write to the real stream
        return self.raw.fileno()

    def __getattr__(self, name: str):  # buffer, errors, … of the real stream
        return getattr(self.raw, name)

    @property
    def encoding(self):
        return getattr(self.raw, "encoding", "utf-8")


@contextlib.contextmanager
def terminal_output() -> Iterator[None]:
    """Everything the block prints to stdout/stderr goes through :func:`terminal`."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _TerminalStream(out), _TerminalStream(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err


# ---------------------------------------------------------------------------------- OmegaConf
_INTERPOLATION = re.compile(r"(\\*)\$\{")


def omegaconf_literal(s: str) -> str:
    """``s`` as an OmegaConf string value that reads back as ``s``: each ``${`` escaped as
    ``\\${`` and the backslashes before it doubled (OmegaConf's escaping rule)."""
    return _INTERPOLATION.sub(lambda m: m.group(1) * 2 + "\\${", s)


#: The tags our LLM prompts delimit untrusted text with; inside any block, none of them can open or close.
PROMPT_TAGS = ("context", "claim", "answer", "document", "question")


def delimited(tag: str, text: str) -> str:
    """``text`` between ``<tag>`` and ``</tag>`` lines, every opening or closing prompt tag inside it
    escaped (``&lt;/context>``), so a document that writes ``</context> <claim>… yes`` stays
    inside its block and the prompt's own structure is the only structure outside it."""
    names = "|".join(dict.fromkeys((tag, *PROMPT_TAGS)))
    body = re.sub(rf"<(\s*/?\s*(?:{names})\b)", r"&lt;\1", text, flags=re.IGNORECASE)
    return f"<{tag}>\n{body}\n</{tag}>"

"""Text units shared by the stages: sentences (chunking, judging) and tokens (fixed_tokens, budgets).

- :func:`split_sentences` is the one sentence splitter: offset-exact ``(start, end)`` spans, used by
  the ``sentence`` chunker and, through :func:`sentence_texts`, by the judges (claims, context
  candidates).
- :func:`minilm_tokenizer` is the one fixed tokenizer (the all-MiniLM-L6-v2 fast tokenizer): the
  ``fixed_tokens`` chunker cuts with it and the budgeted retrieval metrics count context tokens
  with it (:func:`token_ends`, :func:`tokenizer_identity`; see docs/metrics.md).
- :func:`normalise_text` is the key-fact matching form and :func:`match_tokens` its tokens with
  their negation scope (docs/metrics.md, "Key-fact correctness").
"""

from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rag_experiments.stages.embedding import minilm_path

__all__ = [
    "ABBREVIATIONS",
    "DENIAL_CUES",
    "line_spans",
    "MatchToken",
    "match_tokens",
    "NEGATION_CUES",
    "SCOPE_ENDS",
    "STOPWORDS",
    "minilm_tokenizer",
    "normalise_text",
    "sentence_texts",
    "split_sentences",
    "token_ends",
    "tokenizer_identity",
    "trim",
]

HEADING_RE = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+|$)")
LIST_RE = re.compile(r"^[ \t]*(?:[-*+•]|\d{1,9}[.)])[ \t]+\S")
FENCE_RE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
TABLE_RE = re.compile(r"^[ \t]*\|")
# Sentence-final punctuation, optional closing quotes/brackets, then whitespace.
_SENT_END_RE = re.compile(r"[.!?]+[\"'”’)\]]*(\s+)")
#: Words ending in "." that do not end a sentence (lower-cased; "et al." is matched by "al.").
ABBREVIATIONS = frozenset(
    "e.g. i.e. etc. vs. cf. ca. mr. mrs. ms. dr. prof. st. no. fig. approx. al. inc. ltd. jr. sr. "
    "jan. feb. mar. apr. jun. jul. aug. sep. sept. oct. nov. dec.".split()
)


def trim(text: str, start: int, end: int) -> tuple[int, int] | None:
    """Shrink [start, end) past leading/trailing whitespace; None when nothing is left."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if start < end else None


def line_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each line, end excluding the newline."""
    out, pos = [], 0
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
        out.append((pos, pos + len(body)))
        pos += len(line)
    return out


def _blocks(text: str) -> list[tuple[int, int]]:
    """Structural blocks: paragraphs separated by blank lines; each heading line, list item, table
    row and fence line starts a new block; headings are blocks of their own."""
    blocks: list[tuple[int, int]] = []
    cur: int | None = None
    last_end = 0
    for s, e in line_spans(text):
        line = text[s:e]
        if not line.strip():
            if cur is not None:
                blocks.append((cur, last_end))
                cur = None
            continue
        if HEADING_RE.match(line):
            if cur is not None:
                blocks.append((cur, last_end))
            blocks.append((s, e))
            cur = None
            continue
        if cur is not None and (LIST_RE.match(line) or FENCE_RE.match(line) or TABLE_RE.match(line)):
            blocks.append((cur, last_end))
            cur = None
        if cur is None:
            cur = s
        last_end = e
    if cur is not None:
        blocks.append((cur, last_end))
    return blocks


def _is_boundary(text: str, punct_start: int, next_pos: int, block_end: int) -> bool:
    if next_pos >= block_end:
        return False
    nxt = text[next_pos]
    if nxt in "\"'“‘([" and next_pos + 1 < block_end:
        nxt = text[next_pos + 1]
    if not (nxt.isupper() or nxt.isdigit()):
        return False
    if text[punct_start] != ".":
        return True
    # The word ending in this period: an abbreviation or an initial ("J. Smith") is not an end.
    w = punct_start
    while w > 0 and not text[w - 1].isspace():
        w -= 1
    raw = text[w : punct_start + 1].lstrip("\"'“‘([")
    word = raw.lower()
    if word in ABBREVIATIONS:
        return False
    line_start = text.rfind("\n", 0, w) + 1
    if word[:-1].isdigit() and not text[line_start:w].strip():
        return False  # an ordered-list marker ("1. Go to …"), not a sentence
    return not (len(raw) == 2 and raw[0].isupper())  # an initial: "J. Smith"


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Sentence spans ``(start, end)`` with exact offsets, trimmed of whitespace.

    Boundaries: ``.``, ``!`` or ``?`` (plus closing quotes/brackets) followed by whitespace and an
    upper-case letter or digit; blank lines; markdown headings (one sentence each), list items
    (``-``, ``*``, ``+``, ``•``, ``1.``, ``1)``), table rows and code-fence lines start a new
    sentence. Not boundaries: abbreviations (:data:`ABBREVIATIONS`: "e.g.", "i.e.", "Dr.", "et
    al." ...), initials ("J. Smith"), ordered-list markers, and periods without following
    whitespace (decimals "2.5", versions "v2.1", URLs). Empty or blank text: no sentence.
    """
    out: list[tuple[int, int]] = []
    for bs, be in _blocks(text):
        s = bs
        for m in _SENT_END_RE.finditer(text, bs, be):
            if _is_boundary(text, m.start(), m.end(), be):
                t = trim(text, s, m.start(1))
                if t:
                    out.append(t)
                s = m.end()
        t = trim(text, s, be)
        if t:
            out.append(t)
    return out


def sentence_texts(text: str) -> list[str]:
    """The sentences of :func:`split_sentences` as strings, internal whitespace collapsed to one
    space (what the judges compare and show)."""
    return [" ".join(text[s:e].split()) for s, e in split_sentences(text or "")]


# --------------------------------------------------------------------------- tokens


@functools.lru_cache(maxsize=2)
def minilm_tokenizer():
    """MiniLM's fast tokenizer (Rust backend), loaded once per process, without truncation/padding.

    The shipped tokenizer.json truncates at 128 tokens and pads; we need whole texts' offsets, so
    both are switched off. Read with ``tokenizers`` directly: the same JSON (and identity) as
    ``transformers.AutoTokenizer``'s backend, without importing transformers (~5 s a process).
    """
    from tokenizers import Tokenizer

    backend = Tokenizer.from_file(str(minilm_path() / "tokenizer.json"))
    backend.no_truncation()
    backend.no_padding()
    return backend


def tokenizer_identity(tokenizer=None) -> str:
    """``all-MiniLM-L6-v2-fast:<sha256[:16] of the tokenizer's JSON>``: changes when the vocabulary,
    normaliser or pre-tokeniser changes (content, not path). Default: :func:`minilm_tokenizer`."""
    tok = tokenizer if tokenizer is not None else minilm_tokenizer()
    digest = hashlib.sha256(tok.to_str().encode()).hexdigest()[:16]
    return f"all-MiniLM-L6-v2-fast:{digest}"


def token_ends(texts: Sequence[str], tokenizer=None) -> tuple[np.ndarray, np.ndarray]:
    """Token end offsets of each text, flattened: ``(ends, ptr)``.

    ``ends[ptr[i]:ptr[i+1]]`` are the character offsets (within ``texts[i]``) where each token of
    text i ends, in order, so text i has ``ptr[i+1] - ptr[i]`` tokens and its first t tokens are
    ``texts[i][:ends[ptr[i] + t - 1]]``. No special tokens ([CLS]/[SEP]) are counted.
    """
    tok = tokenizer if tokenizer is not None else minilm_tokenizer()
    encs = tok.encode_batch(list(texts), add_special_tokens=False) if texts else []
    counts = np.array([len(e.offsets) for e in encs], dtype=np.int64)
    ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    ends = np.array([o[1] for e in encs for o in e.offsets], dtype=np.int64)
    return ends, ptr


# ------------------------------------------------------------------------------ matching form

#: NLTK's English stopword list (nltk.corpus.stopwords "english", 179 words), lower case,
#: apostrophes removed ("don't" → "dont"). Content tokens drop them; a key fact made only of them is weak.
STOPWORDS = frozenset(
    """i me my myself we our ours ourselves you youre youve youll youd your yours yourself
    yourselves he him his himself she shes her hers herself it its itself they them their theirs
    themselves what which who whom this that thatll these those am is are was were be been being
    have has had having do does did doing a an the and but if or because as until while of at by
    for with about against between into through during before after above below to from up down in
    out on off over under again further then once here there when where why how all any both each
    few more most other some such no nor not only own same so than too very s t can will just don
    dont should shouldve now d ll m o re ve y ain aren arent couldn couldnt didn didnt doesn doesnt
    hadn hadnt hasn hasnt haven havent isn isnt ma mightn mightnt mustn mustnt needn neednt shan
    shant shouldn shouldnt wasn wasnt weren werent won wont wouldn wouldnt""".split()
)


def normalise_text(text: str) -> str:
    """Matching form of key facts and answers: NFKC, casefold; thousands separators dropped inside
    numbers ("1,000" → "1000", "$1,791" → "1791"); "%" its own token ("50%" → "50 %"); other
    punctuation, hyphens and underscores to spaces, except a decimal point or comma between digits
    ("2.5", "3.9", "1,5"); whitespace collapsed; a final "s" dropped from alphabetic words longer than
    3 letters (not "ss"), so "24 hours", "24-hour" and "24 hour" all match.

    Matched with spaces around both sides (whole tokens), so a number matches only as that number:
    "15" is not in "150", "1.5" or "15th". No unit is declared equal to another: "24 h" does not
    match "24 hours" (docs/metrics.md, "Key-fact correctness"). Numbers in words are digits:
    "three", "3" and "3.0" all match (:func:`_numbers_as_digits`)."""
    t = unicodedata.normalize("NFKC", text or "").casefold()
    t = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", t)  # thousands separators: "1,000" → "1000"
    # protect decimal points and decimal commas inside numbers
    t = re.sub(r"(?<=\d)\.(?=\d)", "\x00", t)
    t = re.sub(r"(?<=\d),(?=\d)", "\x01", t)
    t = t.replace("%", " % ")
    t = re.sub(r"[^\w\s%\x00\x01]", " ", t).replace("_", " ").replace("\x00", ".").replace("\x01", ",")
    words = [
        w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") and w.isalpha() else w
        for w in _numbers_as_digits(t.split())
    ]
    return " ".join(words)


# Numbers in words, read as digits by :func:`normalise_text` ("three" = "3" = "3.0").
_SMALL = {
    w: i
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen".split()
    )
}
_TENS = {w: 10 * i for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), 2)}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 1_000_000}
_WHOLE_DECIMAL = re.compile(r"^(\d+)\.0+$")


def _small_at(words: list[str], i: int) -> tuple[int, int] | None:
    """``(value, next index)`` of "seven", "twenty", "twenty five" at ``words[i]``; None if none."""
    w = words[i]
    if w in _SMALL:
        return _SMALL[w], i + 1
    if w in _TENS:
        if i + 1 < len(words) and words[i + 1] in _SMALL and 0 < _SMALL[words[i + 1]] < 10:
            return _TENS[w] + _SMALL[words[i + 1]], i + 2
        return _TENS[w], i + 1
    return None


def _numbers_as_digits(words: list[str]) -> list[str]:
    """Number words as digits: "three" → "3", "twenty five" → "25", "two hundred fifty" → "250",
    "five thousand" → "5000"; a decimal with only zeros after the point as its whole number
    ("3.0", "3.00" → "3"; "3.10" stays, a version is not "3.1"). Where a word is not clearly a
    number it stays: "one" alone (a pronoun: "which one", "one of them", "one or two") is 1 only
    before a word that is not a stop word ("one hour", "one retry")."""
    out: list[str] = []
    i = 0
    while i < len(words):
        got = _small_at(words, i)
        if got is None:
            m = _WHOLE_DECIMAL.match(words[i])
            out.append(m.group(1) if m else words[i])
            i += 1
            continue
        value, j = got
        if j < len(words) and words[j] in _SCALES:
            value, j = value * _SCALES[words[j]], j + 1
            rest = _small_at(words, j) if j < len(words) else None
            if rest is not None and rest[0] < 100:
                value, j = value + rest[0], rest[1]
        elif words[i] == "one" and j == i + 1 and (j >= len(words) or words[j] in STOPWORDS):
            out.append("one")
            i += 1
            continue
        out.append(str(value))
        i = j
    return out


# ------------------------------------------------------------------------- negation scope

#: Words that negate what follows them in their clause (matching form: "isn't" is "isn t", read
#: by :data:`_NT`). "without" negates but does not deny ("without a signature the request fails"
#: says nothing against a signature), so it is not a :data:`DENIAL_CUES` word.
NEGATION_CUES = frozenset(
    "not never no without none neither nor cannot nothing nobody nowhere dont doesnt didnt isnt arent "
    "wasnt werent wont wouldnt cant couldnt shouldnt hasnt havent hadnt mustnt neednt".split()
)
DENIAL_CUES = NEGATION_CUES - {"without"}
#: Cues that negate a noun phrase, not the rest of the clause: their scope is at most
#: :data:`_NP_SCOPE` words ("a path without the trailing slash is answered with a 307" asserts 307).
_NP_CUES = frozenset({"without", "no", "none"})
_NP_SCOPE = 4
#: The first halves of "n't" contractions: "isn t", "don t", "won t", "can t" …
_NT = frozenset(
    "isn aren wasn weren don doesn didn won wouldn can couldn shouldn hasn haven hadn mustn needn ain shan "
    "mightn".split()
)
#: Two-word cues: "use 307 rather than 302", "307 instead of 302" negate what follows.
_PAIR_CUES = {("rather", "than"), ("instead", "of")}
#: Words that end a negation's scope inside a clause: what follows is said of a limit or a
#: condition, not denied ("not retried after 24 hours", "no more than 15 attempts", "not only X").
SCOPE_ENDS = frozenset(
    "after before until till once if when unless because since so which who whose where than only just "
    "within beyond past except also exceed exceeding longer later".split()
)
#: Where a clause ends: sentence-internal punctuation (not a thousands comma "1,000" or a decimal
#: point), a dash between spaces, and the conjunctions that start a new assertion.
_CLAUSE_BREAK = re.compile(
    r"[;:()\[\]!?\n]|,(?=\s)|\.(?=\s|$)|\s[-–—]\s|[–—]|\b(?=(?:but|however|whereas|although|though|while|yet)\b)",
    re.I,
)


@dataclass(frozen=True)
class MatchToken:
    """One token of the matching form (:func:`normalise_text`) with where it stands: its
    sentence, whether a negation cue governs it (``negated``: an odd number of cues before it in
    its clause since the last :data:`SCOPE_ENDS` word) and whether that cue denies it directly
    (``denied``: a :data:`DENIAL_CUES` word at most two stop words before it: "never 307",
    "not a 403", "isn't 24 hours")."""

    word: str
    sentence: int
    negated: bool
    denied: bool


def _clause_tokens(words: list[str], sentence: int, opens: bool) -> list[MatchToken]:
    """The tokens of one clause; ``opens``: the clause opens its sentence, where "without" states a
    condition ("Without an Idempotency-Key header, a retry is processed twice"), not a negation."""
    out: list[MatchToken] = []
    cues, last_cue, denial, np_end = 0, -1, False, None
    i = 0
    while i < len(words):
        w = words[i]
        if np_end is not None and i > np_end:  # a noun phrase's negation ends
            cues, np_end = max(cues - 1, 0), None
        pair = i + 1 < len(words) and (w, words[i + 1]) in _PAIR_CUES
        condition = opens and i == 0 and w == "without"
        if not condition and (pair or w in NEGATION_CUES or (w == "t" and i > 0 and words[i - 1] in _NT)):
            span = 2 if pair else 1
            out += [MatchToken(x, sentence, cues % 2 == 1, False) for x in words[i : i + span]]
            cues, last_cue, denial = cues + 1, i + span - 1, pair or w in DENIAL_CUES or w == "t"
            np_end = i + _NP_SCOPE if w in _NP_CUES else None
            i += span
            continue
        if w in SCOPE_ENDS:
            cues, np_end = 0, None
        negated = cues % 2 == 1
        between = words[last_cue + 1 : i]
        denied = negated and denial and len(between) <= 2 and all(x in STOPWORDS for x in between)
        out.append(MatchToken(w, sentence, negated, denied))
        i += 1
    return out


def match_tokens(text: str) -> list[MatchToken]:
    """The text as tokens of the key-fact matching form (:func:`normalise_text`), each with its
    sentence (:func:`split_sentences`) and negation scope. A scope opens at a negation cue
    (:data:`NEGATION_CUES`, an "n't" contraction, "rather than", "instead of") and runs to the end
    of the clause (:data:`_CLAUSE_BREAK`: ``, ; : ( ) —``, "but", "however" …) or to a
    :data:`SCOPE_ENDS` word; two cues in one scope cancel ("not accepted without a signature"). A
    sentence that opens with "Without …," states a condition, not a negation."""
    out: list[MatchToken] = []
    for n, (s, e) in enumerate(split_sentences(text or "")):
        sentence = text[s:e]
        cuts = [0, *(m.start() if m.group(0) == "" else m.end() for m in _CLAUSE_BREAK.finditer(sentence))]
        for a, b in zip(cuts, [*cuts[1:], len(sentence)], strict=True):
            out += _clause_tokens(normalise_text(sentence[a:b]).split(), n, a == 0)
    return out

"""Synthetic (claim, evidence) pairs from a corpus, no labels needed (FactCC-style perturbations).

Every usable sentence of a document (prose, 6-60 words; headings, tables and code skipped) becomes
the source of a small group of pairs whose context is its *evidence window* (the sentence with its
neighbours in the same document):

positives (``supported``)
  ``sentence``      the sentence itself;
  ``clause_drop``   the sentence with a trailing clause dropped (a paraphrase-like shorter claim);
  ``paraphrase``    the sentence reworded by meaning-preserving rules (phrase rewrites such as
                    "is able to" -> "can", "shows" -> "demonstrates", small numbers spelled out, a
                    parenthesis dropped, a reporting frame "According to the text, ..."): it always
                    contains a word the window lacks, so "a new word" alone does not mean unsupported;
negatives (``unsupported``), each a copy that the window no longer supports
  ``negation``      a negation flipped ("is" <-> "is not", "can" <-> "cannot", "always" <-> "never");
  ``number``        a number, date or unit changed ("30 days" -> "60 days", "MB" -> "GB", 2023 -> 2025);
  ``entity``        a name swapped for another name of the corpus that the window does not contain;
  ``antonym``       a word swapped for its antonym (increase/decrease, before/after, public/private);
  ``other_doc``     the most similar sentence (BM25) of another document: on topic, not evidence;
  ``same_doc``      a sentence of the same document outside the window: same topic and vocabulary,
                    not evidence (the window does not state it);
  ``added_clause``  the sentence plus a clause from another document (an unsupported addition).

A pair's ``type`` is the perturbation name and its ``group`` the source sentence id, so a sentence
and its perturbations always fall in the same cross-validation fold. Deterministic in ``seed``.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import Counter

from rag_experiments.core.types import Document
from rag_experiments.evalset.judge_pairs import JudgePair
from rag_experiments.stages.text import sentence_texts

MIN_SENTENCES = 20
MIN_DOCUMENTS = 2
POSITIVE_TYPES = ("sentence", "clause_drop", "paraphrase")
NEGATIVE_TYPES = ("negation", "number", "entity", "antonym", "other_doc", "same_doc", "added_clause")
TYPES = POSITIVE_TYPES + NEGATIVE_TYPES


class SyntheticPairsError(ValueError):
    """The corpus is too small to build synthetic pairs from (the message gives count and minimum)."""


# -- sentence cleaning ------------------------------------------------------------------------------

_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")
_MARKUP = re.compile(r"\*\*|__|`")
_LEAD = re.compile(r"^\s*(?:[-*+>]\s+|\d+[.)]\s+)+")
_NOTE = re.compile(r"^(?:note|tip|warning|important)\s*:\s*", re.I)
_WORD = re.compile(r"[A-Za-z][A-Za-z'\-]*")


def clean_sentence(s: str) -> str | None:
    """Prose form of a markdown sentence; None for headings, table rows, code and fragments."""
    s = s.strip()
    if not s or s[0] in "#|`" or s.startswith(("```", "    ")) or "|" in s or "{" in s:
        return None
    s = _NOTE.sub("", _MARKUP.sub("", _LEAD.sub("", _LINK.sub(r"\1", s)))).strip()
    words = s.split()
    if not 6 <= len(words) <= 60 or s[-1:] not in ".!?" or len(_WORD.findall(s)) < 0.6 * len(words):
        return None
    return s


def _sentences(doc: Document) -> list[str]:
    """The document's sentences in order, cleaned; None kept as a placeholder for skipped ones."""
    return [clean_sentence(s) for s in sentence_texts(doc.text)]


def _window(sents: list[str | None], i: int) -> str:
    """The sentence with its usable neighbours in the same document (the evidence window)."""
    return " ".join(s for s in sents[max(0, i - 1) : i + 2] if s)


# -- perturbations: each returns the changed claim, or None when it does not apply -----------------

_AUX = re.compile(
    r"\b(is|are|was|were|can|could|will|would|should|must|does|do|did|has|have|may)( not|n't)?\b", re.I
)
_NEVER = {"always": "never", "never": "always"}


def negate(s: str) -> str | None:
    """Flip a negation: drop the sentence's first one ("is not" -> "is", "cannot" -> "can"), or,
    when it has none, add one after the first auxiliary ("is" -> "is not"); else always <-> never."""
    m = re.search(r"\bcannot\b", s, re.I)
    negated = [x for x in _AUX.finditer(s) if x.group(2)]
    if m and not (negated and negated[0].start() < m.start()):
        return s[: m.start()] + s[m.start() : m.start() + 3] + s[m.end() :]
    if negated:
        x = negated[0]
        return s[: x.start()] + x.group(1) + s[x.end() :]
    m = _AUX.search(s)
    if m:
        return s[: m.start()] + f"{m.group(1)} not" + s[m.end() :]
    for w, o in _NEVER.items():
        m = re.search(rf"\b{w}\b", s, re.I)
        if m:
            return s[: m.start()] + o + s[m.end() :]
    return None


_NUMBER = re.compile(r"(?<![\w.,$])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)(?![\w.,]\d)")
_UNITS = [("MB", "GB"), ("KB", "MB"), ("seconds", "minutes"), ("minutes", "hours"), ("hours", "days")]
_UNITS += [("days", "weeks"), ("weeks", "months"), ("months", "years"), ("%", " percentage points")]
_MONTHS = "January February March April May June July August September October November December".split()
_NUM_WORDS = {"one": "two", "two": "three", "three": "five", "five": "ten", "ten": "twelve"}
_NUM_WORDS |= {"twice": "three times", "once": "twice", "first": "second", "second": "third"}


def change_number(s: str, rng: random.Random) -> str | None:
    """Change a number (years by 1-5, other values x2 or +1), a month, a unit, or a number word."""
    nums = list(_NUMBER.finditer(s))
    if nums:
        m = rng.choice(nums)
        raw = m.group(1).replace(",", "")
        v = float(raw)
        if "." in raw:
            new = f"{v * 2:g}"
        elif 1900 <= v <= 2100:
            new = str(int(v) + rng.choice([-3, -2, -1, 1, 2, 3]))
        else:
            n = int(v) * 2 if v >= 2 else int(v) + 1
            new = f"{n:,}" if "," in m.group(1) else str(n)
        return s[: m.start(1)] + new + s[m.end(1) :]
    for month in _MONTHS:
        if re.search(rf"\b{month}\b", s):
            other = _MONTHS[(_MONTHS.index(month) + rng.randint(1, 11)) % 12]
            return re.sub(rf"\b{month}\b", other, s, count=1)
    for a, b in _UNITS:
        if re.search(rf"\d\s*{re.escape(a)}\b" if a != "%" else r"\d%", s):
            return re.sub(rf"(?<=\d)(\s*){re.escape(a)}", rf"\g<1>{b}", s, count=1)
    for w, o in _NUM_WORDS.items():
        m = re.search(rf"\b{w}\b", s, re.I)
        if m:
            return s[: m.start()] + o + s[m.end() :]
    return None


_ANTONYMS = [
    tuple(p.split(":"))
    for p in """
    increase:decrease increases:decreases increased:decreased higher:lower more:fewer before:after
    enable:disable enabled:disabled allow:block allows:blocks allowed:blocked public:private
    minimum:maximum first:last required:optional synchronous:asynchronous accept:reject
    accepts:rejects accepted:rejected include:exclude includes:excludes included:excluded start:end
    starts:ends earlier:later oldest:newest success:failure succeeds:fails valid:invalid
    automatically:manually inside:outside upper:lower add:remove adds:removes added:removed
    free:paid monthly:annual read:write same:different up:down activate:inhibit activates:inhibits
    promotes:suppresses positive:negative larger:smaller longer:shorter greater:smaller high:low
    reduces:increases reduced:increased less:more lowest:highest
    """.split()
]
_ANTONYM = {a: b for a, b in _ANTONYMS} | {b: a for a, b in _ANTONYMS}


def antonym(s: str, window: str, rng: random.Random) -> str | None:
    """Swap one word for its antonym, when the antonym is not already in the window."""
    low_window = set(re.findall(r"[a-z]+", window.lower()))
    hits = [m for m in re.finditer(r"[A-Za-z]+", s) if m.group().lower() in _ANTONYM]
    hits = [m for m in hits if _ANTONYM[m.group().lower()] not in low_window]
    if not hits:
        return None
    m = rng.choice(hits)
    new = _ANTONYM[m.group().lower()]
    new = new.capitalize() if m.group()[0].isupper() else new
    return s[: m.start()] + new + s[m.end() :]


_ENTITY = re.compile(r"\b(?:[A-Z][a-z]+[A-Z]\w*|[A-Z]{2,}\w*|[A-Z][a-z]{2,}|\w*\d\w*[A-Za-z]\w*)\b")


def entities(s: str) -> list[str]:
    """Names in a sentence: acronyms, CamelCase, mixed letters+digits, capitalised non-initial words."""
    out = []
    for m in _ENTITY.finditer(s):
        if m.start() == 0 or s[max(0, m.start() - 2) : m.start()].strip() in (".", ":"):
            continue
        out.append(m.group())
    return out


def swap_entity(s: str, window: str, pool: list[str], rng: random.Random) -> str | None:
    """Replace a name with another name of the corpus that does not occur in the window."""
    ents = entities(s)
    if not ents:
        return None
    target = rng.choice(ents)
    choices = [e for e in pool if e != target and e.lower() not in window.lower()]
    same_kind = [e for e in choices if e.isupper() == target.isupper()]
    choices = same_kind or choices
    if not choices:
        return None
    return re.sub(rf"\b{re.escape(target)}\b", rng.choice(choices), s, count=1)


_CLAUSE = re.compile(r",\s+(?:and|but|which|so|while|because|unless|although|or|then)\s+|;\s+|:\s+|,\s+")


_SUBORDINATE = re.compile(
    r"^(?:if|when|whenever|unless|although|though|while|because|once|after|before|for|to|as|since|until)\b",
    re.I,
)


def drop_clause(s: str) -> str | None:
    """The sentence up to its last clause break, when at least 5 words remain (never a bare
    "If ..." / "When ..." condition, whose consequence would be the part dropped)."""
    if _SUBORDINATE.match(s):
        return None
    cuts = [m.start() for m in _CLAUSE.finditer(s)]
    for cut in reversed(cuts):
        head = s[:cut].rstrip(" ,;:")
        if len(head.split()) >= 5 and head.count("(") == head.count(")"):
            return head + "."
    return None


# meaning-preserving rewrites (domain-general English; each direction keeps the meaning)
_REWRITES = [
    tuple(p.split("="))
    for p in """
    in order to=to|is able to=can|are able to=can|a number of=several|approximately=about
    roughly=about|because=since|therefore=so|however=but|in addition=also|additionally=also
    requires=needs|required=needed|require=need|uses=employs|use=employ|used=employed
    shows=demonstrates|showed=demonstrated|show=demonstrate|helps=assists|help=assist
    obtain=get|obtains=gets|begin=start|begins=starts|large=big|many=numerous|method=approach
    methods=approaches|quickly=rapidly|rapid=fast|often=frequently|must=has to|provides=gives
    provide=give|contains=includes|contain=include|creates=makes|create=make|results in=leads to
    resulted in=led to|is used to=serves to|are used to=serve to|ensures=makes sure|each=every
    whether=if|lets=allows|receive=get|receives=gets|select=choose|selects=chooses|about=around
    """.replace("\n", "|").split("|")
    if "=" in p
]
_SPELL = {"2": "two", "3": "three", "4": "four", "5": "five", "6": "six", "7": "seven", "8": "eight", "9": "nine"}
_FRAMES = ("According to the text, ", "The source states that ", "It is reported that ", "As described, ")


def paraphrase(s: str, window: str, rng: random.Random) -> str | None:
    """``s`` reworded by up to two meaning-preserving rules (phrase rewrites, small numbers
    spelled out, a parenthesis dropped) or a reporting frame, so that it contains at least one
    word the window lacks; None when nothing applies."""
    out = s
    rewrites = [(a, b) for a, b in _REWRITES if re.search(rf"\b{re.escape(a)}\b", out, re.I)]
    for a, b in rng.sample(rewrites, min(2, len(rewrites))):
        m = re.search(rf"\b{re.escape(a)}\b", out, re.I)
        if m:
            new = b.capitalize() if m.group()[0].isupper() else b
            out = out[: m.start()] + new + out[m.end() :]
    m = re.search(r"(?<![\d.,])\b([2-9])\s+([a-z]{3,})", out)
    if m:
        out = out[: m.start(1)] + _SPELL[m.group(1)] + out[m.end(1) :]
    out = re.sub(r"\s*\([^()]{1,60}\)", "", out)
    win = set(_WORD.findall(window.lower()))
    if out == s or not set(_WORD.findall(out.lower())) - win:
        frames = [f for f in _FRAMES if set(_WORD.findall(f.lower())) - win]
        if not frames:
            return None
        first = out.split()[0]
        keep_case = first.isupper() or any(c.isupper() for c in first[1:]) or bool(entities(". " + first))
        out = rng.choice(frames) + (out if keep_case else out[0].lower() + out[1:])
    return out if out != s else None


def add_clause(s: str, other: str) -> str:
    """``s`` + ", and " + the first 12 words of ``other`` (from another document)."""
    words = other.rstrip(".!?").split()[:12]
    tail = " ".join(words).rstrip(",;:-–— ")
    tail = tail[0].lower() + tail[1:] if tail[:1].isupper() and not tail[1:2].isupper() else tail
    return f"{s.rstrip('.!?')}, and {tail}."


# -- the generator ------------------------------------------------------------------------------


def _nearest_other_doc(texts: list[str], doc_of: list[int]) -> list[int | None]:
    """Per sentence, the most similar sentence (BM25) of another document; None when none scores."""
    import bm25s

    tokens = bm25s.tokenize(texts, stopwords="en", show_progress=False)
    index = bm25s.BM25()
    index.index(tokens, show_progress=False)
    k = min(len(texts), 10)
    ids, scores = index.retrieve(tokens, k=k, show_progress=False, n_threads=1)
    out: list[int | None] = []
    for i in range(len(texts)):
        hit = next((int(j) for j, sc in zip(ids[i], scores[i], strict=True)
                    if sc > 0 and doc_of[int(j)] != doc_of[i]), None)
        out.append(hit)
    return out


def _pid(kind: str, sid: str, claim: str) -> str:
    return "syn-" + hashlib.sha256(f"{kind}\0{sid}\0{claim}".encode()).hexdigest()[:16]


def _overlap(a: str, b: str) -> float:
    wa, wb = set(_WORD.findall(a.lower())), set(_WORD.findall(b.lower()))
    return len(wa & wb) / max(1, min(len(wa), len(wb)))


def synthetic_pairs(documents: list[Document], *, seed: int = 0, n_max: int | None = None) -> list[JudgePair]:
    """Labelled pairs from ``documents`` (module docstring); raise :class:`SyntheticPairsError` when
    fewer than ``MIN_SENTENCES`` usable sentences or ``MIN_DOCUMENTS`` documents have any.

    ``n_max`` keeps whole source-sentence groups, sampled with ``seed``, until ``n_max`` pairs.
    """
    rng = random.Random(seed)
    per_doc = [_sentences(d) for d in documents]
    src = [(di, i) for di, sents in enumerate(per_doc) for i, s in enumerate(sents) if s]
    n_docs = len({di for di, _ in src})
    if len(src) < MIN_SENTENCES or n_docs < MIN_DOCUMENTS:
        raise SyntheticPairsError(
            f"corpus too small for synthetic judge pairs: {len(src)} usable sentences in {n_docs} "
            f"documents (minimum {MIN_SENTENCES} sentences in {MIN_DOCUMENTS} documents; a usable "
            "sentence is prose of 6-60 words, not a heading, table row or code)"
        )
    texts = [per_doc[di][i] for di, i in src]
    doc_of = [di for di, _ in src]
    nearest = _nearest_other_doc(texts, doc_of)
    by_doc: dict[int, list[int]] = {}
    for k, di in enumerate(doc_of):
        by_doc.setdefault(di, []).append(k)
    pool = sorted({e for t in texts for e in entities(t)})
    groups: list[list[JudgePair]] = []
    for k, (di, i) in enumerate(src):
        s = texts[k]
        sid = f"{documents[di].doc_id}#{i}"
        window = _window(per_doc[di], i)
        cands: list[tuple[str, str | None]] = [("sentence", s), ("clause_drop", drop_clause(s))]
        cands.append(("paraphrase", paraphrase(s, window, rng)))
        cands += [("negation", negate(s)), ("number", change_number(s, rng))]
        cands += [("entity", swap_entity(s, window, pool, rng)), ("antonym", antonym(s, window, rng))]
        other = texts[nearest[k]] if nearest[k] is not None else None
        if other is not None and _overlap(other, window) < 0.6:  # a near-duplicate could be evidence
            cands.append(("other_doc", other))
        far = [j for j in by_doc[di] if abs(src[j][1] - i) > 2 and _overlap(texts[j], window) < 0.6]
        if far and rng.random() < 0.5:
            cands.append(("same_doc", texts[rng.choice(far)]))
        if other is not None and rng.random() < 0.5:
            cands.append(("added_clause", add_clause(s, other)))
        group = []
        for kind, claim in cands:
            if not claim or (kind not in ("sentence", "other_doc", "same_doc") and claim == s):
                continue
            label = "supported" if kind in POSITIVE_TYPES else "unsupported"
            group.append(JudgePair(_pid(kind, sid, claim), claim, window, label, kind, sid, sid))
        groups.append(group)
    if n_max is not None and sum(map(len, groups)) > n_max:
        rng.shuffle(groups)
        kept, total = [], 0
        for g in groups:
            if total + len(g) > n_max:
                continue
            kept.append(g)
            total += len(g)
        groups = kept
    return [p for g in groups for p in g]


def type_shares(pairs: list[JudgePair]) -> dict[str, float]:
    """Share of each pair type (for the docs and the fit's card)."""
    c = Counter(p.type for p in pairs)
    return {t: c[t] / len(pairs) for t in TYPES if c[t]}

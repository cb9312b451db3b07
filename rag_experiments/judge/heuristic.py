"""The heuristic judge: deterministic, no LLM (the offline default).

A claim is supported when some context sentence (or window of two adjacent sentences) is
semantically close (MiniLM cosine), covers the claim's content words, and agrees on numbers with
units, negation/direction and named entities. Thresholds are calibrated on human-labelled pairs
(``scripts/judge_agreement.py``). It is a proxy for an LLM judge: good at numeric and negation
mismatches, blind to paraphrased contradictions it has no cue for.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any

import numpy as np

from rag_experiments.core.cache import encode_counted
from rag_experiments.core.progress import Progress
from rag_experiments.core.redaction import error_text
from rag_experiments.core.types import Verdict
from rag_experiments.judge.claims import _plain, split_claims
from rag_experiments.stages.embedding import metric_embedder
from rag_experiments.stages.text import sentence_texts

# -- heuristic judge ----------------------------------------------------------------------------

_STOPWORDS = frozenset(
    """a an the and or but if then else of to in on at by for with from into onto about as is are was
    were be been being am do does did doing have has had having it its this that these those there
    here which who whom whose what when where why how can could should would will shall may might
    must also than so such very more most less least just only both each either any all some i you
    he she we they them their our your his her my me us him one s t via per upon within between
    among through during after before over under again further once same other own too not no nor
    never without""".split()
)
_NEGATIONS = frozenset("not no never none nobody nothing neither nor without cannot cant".split())
# direction words: a claim saying "increases" against a context saying "decreases" is a
# contradiction that similarity and word coverage cannot see
_POLES = [
    (
        {
            "increas",
            "rais",
            "higher",
            "greater",
            "more",
            "elevat",
            "enhanc",
            "promot",
            "upregul",
            "activ",
            "stimul",
            "induc",
            "improv",
            "gain",
            "larger",
            "longer",
            "posit",
        },
        {
            "decreas",
            "reduc",
            "lower",
            "less",
            "fewer",
            "diminish",
            "impair",
            "inhibit",
            "suppress",
            "downregul",
            "block",
            "prevent",
            "attenu",
            "worsen",
            "loss",
            "smaller",
            "shorter",
            "negat",
        },
    ),
]
_NUMBER_WORDS = {
    "zero": 0,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "thirteen": 13,
    "fourteen": 14,
    "fifteen": 15,
    "sixteen": 16,
    "seventeen": 17,
    "eighteen": 18,
    "nineteen": 19,
    "twenty": 20,
    "thirty": 30,
    "forty": 40,
    "fifty": 50,
    "sixty": 60,
    "seventy": 70,
    "eighty": 80,
    "ninety": 90,
    "hundred": 100,
    "thousand": 1000,
    "million": 1_000_000,
    "dozen": 12,
    "once": 1,
    "twice": 2,
    "single": 1,
    "double": 2,
    "half": 0.5,
}
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9'\-]*|\d+(?:[.,]\d+)*%?")
_NUM = re.compile(r"(?<![\w.\-])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)(?:\s*-\s*|\s*)(%|[A-Za-z]+)?")


def _stem(word: str) -> str:
    """Light suffix stripping: enough for plural/tense variants, not a real stemmer."""
    w = word.lower().strip("'-")
    if w.endswith("n't"):
        return "not"
    for suf, rep in (
        ("ies", "y"),
        ("ied", "y"),
        ("ing", ""),
        ("ed", ""),
        ("es", ""),
        ("s", ""),
        ("ly", ""),
        ("ation", ""),
    ):
        if w.endswith(suf) and len(w) - len(suf) >= 3:
            w = w[: -len(suf)] + rep
            break
    if len(w) > 4 and w.endswith("e"):
        w = w[:-1]
    return w


def _tokens(text: str) -> list[str]:
    return [t for t in _WORD.findall(_plain(text))]


def _content_stems(text: str) -> list[str]:
    out = []
    for t in _tokens(text):
        lt = t.lower()
        if lt in _STOPWORDS or lt in _NEGATIONS or lt.endswith("n't"):
            continue
        if lt in _NUMBER_WORDS or re.fullmatch(r"[\d.,%]+", lt):
            continue  # numbers are checked separately, with their units
        out.append(_stem(lt))
    return out


def _unit(u: str | None) -> str | None:
    if not u:
        return None
    u = u.lower()
    if u in ("%", "percent", "pct"):
        return "%"
    if u in _STOPWORDS or u in ("and", "or", "to"):
        return None
    return _stem(u)


def _numbers(text: str) -> list[tuple[float, str | None]]:
    """(value, unit) pairs: digits ("1,000", "2.5", "50%") and number words ("two days", "a dozen")."""
    t = _plain(text)
    out: list[tuple[float, str | None]] = []
    for m in _NUM.finditer(t):
        raw = m.group(1).replace(",", "")
        unit = m.group(2)
        if unit and unit.isalpha() and unit.lower() in _NUMBER_WORDS:
            unit = None
        out.append((float(raw), _unit(unit)))
    words = re.findall(r"[A-Za-z%]+", t)
    for i, w in enumerate(words):
        lw = w.lower()
        # only "<number word> <unit>" ("two days"): a bare "one" is usually a pronoun ("one of")
        if lw in _NUMBER_WORDS and lw not in ("single", "double", "half", "once") and i + 1 < len(words):
            unit = _unit(words[i + 1])
            if unit is not None and words[i + 1].lower() not in _NUMBER_WORDS:
                out.append((float(_NUMBER_WORDS[lw]), unit))
    return out


def _numbers_agree(claim: str, cand: str) -> tuple[bool, str]:
    cn = _numbers(claim)
    if not cn:
        return True, ""
    kn = _numbers(cand)
    for value, unit in cn:
        ok = any(
            math.isclose(value, v, rel_tol=1e-9) and (unit is None or u is None or unit == u) for v, u in kn
        )
        if not ok:
            shown = f"{value:g}{' ' + unit if unit else ''}"
            return False, f"number {shown!r} not in context"
    return True, ""


def _near_negation(tokens: list[str], shared: set[str], window: int = 4) -> bool:
    """A negation cue within ``window`` tokens before a shared content word (the matched content)."""
    low = [t.lower() for t in tokens]
    for i, t in enumerate(low):
        if t in _NEGATIONS or t.endswith("n't"):
            for j in range(i + 1, min(len(low), i + 1 + window)):
                if _stem(low[j]) in shared:
                    return True
    return False


def _poles(stems: Iterable[str]) -> tuple[set[int], set[int]]:
    up, down = set(), set()
    for s in stems:
        for k, (pos, neg) in enumerate(_POLES):
            if any(s.startswith(p) for p in pos):
                up.add(k)
            if any(s.startswith(n) for n in neg):
                down.add(k)
    return up, down


def _entities(claim: str) -> list[str]:
    """Acronyms, tokens with digits or inner capitals, and capitalised words not opening the claim."""
    toks = _WORD.findall(_plain(claim))
    out = []
    for i, t in enumerate(toks):
        if re.fullmatch(r"[\d.,%]+", t):
            continue
        acronym = sum(c.isupper() for c in t) >= 2 or (
            any(c.isdigit() for c in t) and any(c.isalpha() for c in t)
        )
        proper = t[0].isupper() and i > 0 and t.lower() not in _STOPWORDS
        if acronym or proper:
            out.append(t)
    return out


_VEC_MEMO: dict[str, dict[str, np.ndarray]] = {}


class HeuristicJudge:
    """Deterministic, LLM-free faithfulness judge (the offline default). See the module docstring.

    Candidates are the context's sentences and windows of two adjacent sentences. The matched
    candidate is the most similar one with cosine(claim, candidate) >= ``sim_threshold`` (metric
    embedder) and content-word coverage >= ``coverage_threshold``. The claim is ``supported`` when
    the matched candidate also contains every number of the claim with a compatible unit ("48
    hours" vs "24 hours" fails), has the same polarity (a negation near the shared words in one but
    not the other, or opposite direction words such as increases/decreases, fails) and covers at
    least ``entity_threshold`` of the claim's entities (acronyms, capitalised names). ``score`` is
    the similarity of the matched candidate, else of the most similar one; ``rationale`` says which
    check failed.
    """

    remote = False  # a local model only: no request to count (a dry run skips it, run.dry_run)

    model = None

    def __init__(
        self,
        sim_threshold: float = 0.5,
        coverage_threshold: float = 0.5,
        entity_threshold: float = 1.0,
        check_polarity: bool = True,
        embedder: Any = None,
    ) -> None:
        self.sim_threshold = float(sim_threshold)
        self.coverage_threshold = float(coverage_threshold)
        self.entity_threshold = float(entity_threshold)
        self.check_polarity = bool(check_polarity)
        if embedder is None:  # cheap: the model itself loads on first encode
            embedder = metric_embedder()
        self.embedder = embedder
        self.identity = json.dumps(
            {
                "kind": "heuristic",
                "version": 2,
                "sim_threshold": self.sim_threshold,
                "coverage_threshold": self.coverage_threshold,
                "entity_threshold": self.entity_threshold,
                "check_polarity": self.check_polarity,
                "embedder": self.embedder_identity,
            },
            sort_keys=True,
        )

    @property
    def embedder_identity(self) -> str:
        return getattr(self.embedder, "identity", type(self.embedder).__name__)

    def _encode(self, texts: list[str], desc: str = "", progress: bool = False, cache=None) -> np.ndarray:
        """Embed with a per-text memo: contexts recur across queries, prompts and k in a sweep;
        with a ``cache`` (``core.cache.StageCache``) also across runs, per text. ``desc``: the
        progress line of the texts it embeds (count and ETA, per model batch)."""
        # per process and embedder, so the configs of a sweep (new judge instances) share it
        memo = _VEC_MEMO.setdefault(self.embedder_identity, {})
        if len(memo) > 100_000:  # bound memory on very large sweeps; cleared before choosing what
            memo.clear()  # to encode, so every text asked for is in the memo afterwards
        todo = list(dict.fromkeys(t for t in texts if t not in memo))
        if todo and cache is not None:
            memo.update(cache.get_vectors(self.embedder_identity, todo))
            todo = [t for t in todo if t not in memo]
        if todo:
            with Progress(desc, len(todo), enabled=progress and bool(desc), unit="texts") as bar:
                vectors = encode_counted(self.embedder, todo, "passage", bar)
            memo.update(zip(todo, vectors, strict=True))
            if cache is not None:
                cache.put_vectors(self.embedder_identity, todo, vectors)
        return np.stack([memo[t] for t in texts])

    def _vectors(self, claims: list[str], context: str, cands: list[str]) -> np.ndarray:
        """Unit vectors of the claims, then of the context's candidates (the verifier's checks
        derive them from its shared token pass instead: ``verifier.SharedPassChecks``)."""
        return self._encode(claims + cands)

    def split(self, answer: str) -> list[str]:
        return split_claims(answer)

    def prepare(
        self, answers: list[str], contexts: list[str], progress: bool = False, desc: str = "judge: embedding",
        cache=None,
    ) -> None:  # fmt: skip
        """Embed every claim and context candidate of a run in one batch (fills the memo), with a
        progress line ``desc`` (texts to embed, ETA) when ``progress``; a text whose vector the
        stage ``cache`` holds (an earlier run) is not embedded again.

        One large call lets the embedder sort all texts by length and pad little; per-query calls
        (about 60 candidates each) spend most of their time on call overhead and padding.
        """
        texts = [c for a in answers for c in self.split(a)]
        texts += [cand for ctx in dict.fromkeys(contexts) for cand in self.candidates(ctx)]
        if texts:
            self._encode(list(dict.fromkeys(texts)), desc, progress, cache)

    @staticmethod
    def candidates(context: str) -> list[str]:
        sents = sentence_texts(context)
        return sents + [f"{a} {b}" for a, b in zip(sents, sents[1:], strict=False)]

    def features(self, claims: list[str], context: str) -> list[list[dict]]:
        """Per claim, per candidate: similarity and the outcome of every check (thresholds aside)."""
        cands = self.candidates(context)
        if not claims:
            return []
        if not cands:
            return [[] for _ in claims]
        vecs = self._vectors(list(claims), context, cands)
        sims = vecs[: len(claims)] @ vecs[len(claims) :].T
        cand_tokens = [_tokens(c) for c in cands]
        cand_stems = [set(_content_stems(c)) for c in cands]
        cand_low = [{t.lower() for t in toks} for toks in cand_tokens]
        out = []
        for ci, claim in enumerate(claims):
            c_tokens = _tokens(claim)
            c_stems = _content_stems(claim)
            ents = _entities(claim)
            c_up, c_down = _poles(c_stems)
            rows = []
            for k, cand in enumerate(cands):
                stems = cand_stems[k]
                covered = [
                    s
                    for s in c_stems
                    if s in stems or any(len(s) >= 5 and x.startswith(s[:5]) for x in stems)
                ]
                coverage = len(covered) / len(c_stems) if c_stems else 1.0
                num_ok, num_why = _numbers_agree(claim, cand)
                shared = set(covered)
                polarity_ok, pol_why = True, ""
                if _near_negation(c_tokens, shared) != _near_negation(cand_tokens[k], shared):
                    polarity_ok, pol_why = False, "negation differs"
                else:
                    k_up, k_down = _poles(stems)
                    if (c_up & k_down and not c_up & k_up) or (c_down & k_up and not c_down & k_down):
                        polarity_ok, pol_why = False, "direction differs (increase vs decrease)"
                if ents:
                    found = [e for e in ents if e.lower() in cand_low[k] or e.lower() in cand.lower()]
                    ent_cov = len(found) / len(ents)
                    missing = [e for e in ents if e not in found]
                else:
                    ent_cov, missing = 1.0, []
                rows.append(
                    {
                        "sim": float(sims[ci, k]),
                        "coverage": coverage,
                        "numbers_ok": num_ok,
                        "numbers_why": num_why,
                        "polarity_ok": polarity_ok,
                        "polarity_why": pol_why,
                        "entity_coverage": ent_cov,
                        "missing_entities": missing,
                        "candidate": cand,
                    }
                )
            out.append(rows)
        return out

    def _passes(self, r: dict) -> tuple[bool, str]:
        if r["sim"] < self.sim_threshold:
            return False, f"similarity {r['sim']:.2f} < {self.sim_threshold:.2f}"
        if r["coverage"] < self.coverage_threshold:
            return False, f"content-word coverage {r['coverage']:.2f} < {self.coverage_threshold:.2f}"
        if not r["numbers_ok"]:
            return False, r["numbers_why"]
        if self.check_polarity and not r["polarity_ok"]:
            return False, r["polarity_why"]
        if r["entity_coverage"] < self.entity_threshold:
            return False, f"entities not in context: {', '.join(r['missing_entities'])}"
        return True, ""

    def decide(self, rows: list[dict]) -> tuple[str, float | None, str]:
        """(label, score, rationale) for one claim's candidate rows.

        The matching candidate is the most similar one among those passing the similarity and
        coverage thresholds; it must then agree on numbers, polarity and entities. A contradicting
        sentence is thus not rescued by a looser neighbour that omits the contradiction.
        """
        if not rows:
            return "unsupported", None, "empty context"
        close = [
            r for r in rows if r["sim"] >= self.sim_threshold and r["coverage"] >= self.coverage_threshold
        ]
        if not close:
            best = max(rows, key=lambda r: r["sim"])
            return "unsupported", best["sim"], f"{self._passes(best)[1]} (closest: {best['candidate'][:120]})"
        best = max(close, key=lambda r: r["sim"])
        ok, why = self._passes(best)
        if ok:
            return "supported", best["sim"], f"matches: {best['candidate'][:160]}"
        return "unsupported", best["sim"], f"{why} (in: {best['candidate'][:120]})"

    def verdicts(self, claims: list[str], context: str) -> list[Verdict]:
        try:
            feats = self.features(claims, context)
        except Exception as exc:  # noqa: BLE001 - a judge never raises per claim
            return [Verdict(c, "unparseable", error=error_text(exc)) for c in claims]
        out = []
        for claim, rows in zip(claims, feats, strict=True):
            label, score, why = self.decide(rows)
            out.append(Verdict(claim=claim, label=label, score=score, rationale=why))
        return out

    def answer_relevance(self, query: str, answer: str) -> tuple[float, str]:
        method = "cosine(answer, query)"
        if not answer or not answer.strip():
            return float("nan"), method
        v = self.embedder.encode([answer, query], kind="passage")
        return float(np.dot(v[0], v[1])), method

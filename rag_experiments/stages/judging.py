"""Judges: claim decomposition, per-claim verdicts, answer relevance, and correctness helpers.

Verdicts are ``supported`` / ``unsupported`` / ``unparseable`` (docs/metrics.md). An unparseable reply is
counted and excluded from faithfulness, never read as "no".

Backends behind the :class:`Judge` protocol:

* :class:`HeuristicJudge` (offline default): deterministic, no LLM. A claim is supported when some
  context sentence (or window of two adjacent sentences) is semantically close (MiniLM cosine),
  covers the claim's content words, and agrees on numbers with units, negation/direction and named
  entities. Thresholds are calibrated on human-labelled pairs (``scripts/judge_agreement.py``).
  It is a proxy for an LLM judge: good at numeric and negation mismatches, blind to paraphrased
  contradictions it has no cue for.
* :class:`LLMJudge` (any OpenAI-compatible endpoint) and :class:`LocalLLMJudge` (any GGUF file via
  the embedded llama.cpp server): yes/no verdict scored by log P(yes) - log P(no) of the first
  answer token when the endpoint returns logprobs; otherwise a constrained (JSON schema) verdict
  read by the strict :func:`parse_verdict`.

Why one module of ~880 lines: every backend implements the same claim/verdict contract and
shares its parsing, decline detection and text normalisation; the heuristic judge alone is half of
it (its cue lexicons). Splitting backends apart would scatter one concept, the verdict, over files.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import unicodedata
from collections.abc import Iterable
from typing import Any, Protocol

import numpy as np

from rag_experiments.stages.text import sentence_texts
from rag_experiments.types import Verdict

# -- text utilities -----------------------------------------------------------------------------

_CITATION = re.compile(r"\s*\[(?:\d+(?:\s*[-,–]\s*\d+)*)\](?:\s*\[\d+\])*")
# The shared splitter keeps "1. " with its list item; claims drop the marker, as before the merge.
_ORDERED_MARKER = re.compile(r"^\s*\d{1,9}[.)]\s+")
_LABEL = re.compile(
    r"^\s*(?:[-*•]\s+|\d+[.)]\s+)?(?:\*\*)?(?:answer|quote|final answer|claim)\s*:?(?:\*\*)?\s*", re.I
)


_DECLINE_PATTERNS = [
    r"\bi (?:do not|don't|dont) know\b",
    r"\bi (?:am not|'m not|m not) sure\b",
    r"\b(?:i|we) (?:cannot|can't|can not|am unable to|are unable to) (?:answer|find|tell|say|determine)",
    r"\bunable to (?:answer|find|determine)\b",
    r"\bno (?:relevant )?information (?:about|on|regarding|in|is|was)\b",
    r"\b(?:not|never) (?:mentioned|specified|stated|provided|covered|included|given|described|"
    r"discussed|addressed|available|found|present) (?:in|by) the (?:provided |given )?"
    r"(?:context|documentation|docs|passages?|text|documents?|sources?)\b",
    r"\bthe (?:provided |given )?(?:context|documentation|docs|passages?|text|documents?|sources?) "
    r"(?:does not|doesn't|do not|don't|did not|didn't) (?:say|mention|specify|state|contain|provide|"
    r"include|cover|answer|describe|discuss|address|tell)\b",
    r"\b(?:not enough|insufficient) (?:information|context)\b",
    r"\bcannot be (?:determined|answered|found)\b",
]
_DECLINE = re.compile("|".join(_DECLINE_PATTERNS), re.I)


def _plain(text: str) -> str:
    return unicodedata.normalize("NFKC", text).replace("’", "'").replace("‘", "'")


def is_decline(answer: str) -> bool:
    """True when the answer declines: its first sentence, or every sentence, is a decline.

    Declines: "I don't know", "not mentioned in the context", "the documentation does not say ...",
    "cannot be determined", "not enough information" ... An empty answer is not a decline (it is a
    failed generation). "Refunds take 5 days; the docs do not say more" is *not* a decline: its
    first sentence answers.
    """
    sents = sentence_texts(_plain(answer or ""))
    if not sents:
        return False
    if _DECLINE.search(sents[0]):
        return True
    return all(_DECLINE.search(s) for s in sents)


def split_claims(answer: str) -> list[str]:
    """Claims of an answer = its sentences, without citations, labels, declines or fragments.

    Drops ``[1]``/``[1, 2]`` citations, "Answer:"/"Quote:" labels, decline sentences and fragments
    of fewer than 3 words. A declining answer has no claims.
    """
    text = _plain(answer or "")
    if not text.strip() or is_decline(text):
        return []
    claims = []
    for s in sentence_texts(text):
        s = _ORDERED_MARKER.sub("", _CITATION.sub("", s))
        s = _LABEL.sub("", s).strip().strip("\"'“”").strip()
        if not s or _DECLINE.search(s):
            continue
        if len(re.findall(r"\w+", s)) < 3:
            continue
        claims.append(s)
    return claims


# -- verdict parsing ----------------------------------------------------------------------------

_YESNO = re.compile(r"^(yes|no|supported|unsupported|not supported)[.!]*$", re.I)
_LABELS = {"yes": "supported", "supported": "supported", "no": "unsupported"}
_LABELS.update({"unsupported": "unsupported", "not supported": "unsupported"})


def parse_verdict(text: str) -> str:
    """Read a judge reply strictly: "supported", "unsupported" or "unparseable".

    Accepted: a bare yes/no (any case, trailing "." or "!", optional surrounding quotes, ``**`` or a
    code fence), the bare words supported/unsupported, JSON ``{"verdict": "supported"|
    "unsupported"}`` or ``{"supported": true|false}``. Everything else is unparseable, including
    hedges ("yes, but it depends"), prose ("Sure! The answer is yes"), empty replies and garbage:
    guessing a label from prose is how "no"-biased parsers inflate unfaithfulness.
    """
    if not isinstance(text, str):
        return "unparseable"
    s = text.strip()
    fence = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", s, re.S)
    if fence:
        s = fence.group(1).strip()
    if s.startswith("{"):
        try:
            obj = json.loads(s)
        except ValueError:
            return "unparseable"
        if not isinstance(obj, dict) or len(obj) != 1:
            return "unparseable"
        if "verdict" in obj and isinstance(obj["verdict"], str):
            v = obj["verdict"].strip().lower()
            return v if v in ("supported", "unsupported") else "unparseable"
        if "supported" in obj and isinstance(obj["supported"], bool):
            return "supported" if obj["supported"] else "unsupported"
        return "unparseable"
    s = s.strip("*\"'` \t\n")
    m = _YESNO.fullmatch(s)
    if not m:
        return "unparseable"
    return _LABELS[m.group(1).lower()]


# -- protocol -----------------------------------------------------------------------------------


class Judge(Protocol):
    identity: str
    model: str | None

    def verdicts(self, claims: list[str], context: str) -> list[Verdict]: ...

    def answer_relevance(self, query: str, answer: str) -> tuple[float, str]: ...

    def split(self, answer: str) -> list[str]: ...


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
            from rag_experiments.stages.embedding import metric_embedder

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

    def _encode(self, texts: list[str]) -> np.ndarray:
        """Embed with a per-text memo: contexts recur across queries, prompts and k in a sweep."""
        # per process and embedder, so the configs of a sweep (new judge instances) share it
        memo = _VEC_MEMO.setdefault(self.embedder_identity, {})
        todo = list(dict.fromkeys(t for t in texts if t not in memo))
        if todo:
            if len(memo) > 100_000:  # bound memory on very large sweeps
                memo.clear()
            memo.update(zip(todo, self.embedder.encode(todo, kind="passage"), strict=True))
        return np.stack([memo[t] for t in texts])

    def split(self, answer: str) -> list[str]:
        return split_claims(answer)

    def prepare(self, answers: list[str], contexts: list[str]) -> None:
        """Embed every claim and context candidate of a run in one batch (fills the memo).

        One large call lets the embedder sort all texts by length and pad little; per-query calls
        (about 60 candidates each) spend most of their time on call overhead and padding.
        """
        texts = [c for a in answers for c in self.split(a)]
        texts += [cand for ctx in dict.fromkeys(contexts) for cand in self.candidates(ctx)]
        if texts:
            self._encode(list(dict.fromkeys(texts)))

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
        vecs = self._encode(list(claims) + cands)
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
            return [Verdict(c, "unparseable", error=f"{type(exc).__name__}: {exc}") for c in claims]
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


# -- LLM judge ----------------------------------------------------------------------------------

VERDICT_SYSTEM = (
    "You check whether a claim is supported by a context. A claim is supported only if the context "
    "states it or it follows directly from the context; if the context contradicts it or does not "
    "mention it, it is not supported. Reply with one word: yes or no."
)
VERDICT_USER = (
    "Context:\n{context}\n\nClaim: {claim}\n\nIs the claim supported by the context? Answer yes or no."
)
DECOMPOSE_USER = (
    "Break the answer below into short, self-contained factual claims, one per line, each starting "
    'with "- ". Do not add anything that is not in the answer.\n\nAnswer: {answer}\n\nClaims:'
)
QUESTIONS_USER = (
    "Write {n} different questions that the following answer would answer. One question per line, "
    "each ending with a question mark, nothing else.\n\nAnswer: {answer}\n\nQuestions:"
)
VERDICT_SCHEMA = {
    "type": "object",
    "properties": {"verdict": {"type": "string", "enum": ["supported", "unsupported"]}},
    "required": ["verdict"],
    "additionalProperties": False,
}
LOGPROB_FLOOR = -20.0


def yes_no_score(top: list[tuple[str, float]], floor: float = LOGPROB_FLOOR) -> float | None:
    """log P(yes) - log P(no) of the first token, summing case/space variants ("Yes", " yes", "YES").

    A side absent from the top logprobs gets ``floor``; None when neither appears (unparseable).
    """

    def lse(values: list[float]) -> float:
        if not values:
            return floor
        m = max(values)
        return m + math.log(sum(math.exp(v - m) for v in values))

    yes = [lp for tok, lp in top if tok.strip().lower() == "yes"]
    no = [lp for tok, lp in top if tok.strip().lower() == "no"]
    if not yes and not no:
        return None
    return max(lse(yes), floor) - max(lse(no), floor)


class LLMJudge:
    """A judge backed by any OpenAI-compatible chat endpoint.

    Verdicts: a yes/no prompt per claim. With ``use_logprobs`` the request asks for
    ``top_logprobs=20`` and the score is log P(yes) - log P(no) of the first answer token; the
    label is ``score >= threshold``. If the endpoint returns no logprobs (or ``use_logprobs`` is
    off) a constrained request is made instead: ``constrained="json_schema"`` (llama.cpp) or
    ``"response_format"`` (OpenAI structured outputs) or ``"none"``; its reply goes through the
    strict :func:`parse_verdict`. A failed call or an unreadable reply is ``unparseable``.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        threshold: float = 0.0,
        use_logprobs: bool = True,
        n_questions: int = 3,
        decompose: bool = True,
        constrained: str = "json_schema",
        temperature: float = 0.0,
        seed: int = 0,
        max_tokens: int = 256,
        concurrency: int = 4,
        timeout_s: float = 60.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        embedder: Any = None,
        _identity_model: dict | None = None,
    ) -> None:
        from rag_experiments.stages.generation import OpenAICompatibleGenerator

        if constrained not in ("json_schema", "response_format", "none"):
            raise ValueError("judge.constrained must be json_schema, response_format or none")
        self.model = model
        self.threshold = float(threshold)
        self.use_logprobs = bool(use_logprobs)
        self.n_questions = int(n_questions)
        self.decompose = bool(decompose)
        self.constrained = constrained
        self.client = OpenAICompatibleGenerator(
            base_url=base_url,
            model=model,
            api_key_env=api_key_env,
            temperature=temperature,
            seed=seed,
            max_tokens=max_tokens,
            concurrency=concurrency,
            timeout_s=timeout_s,
            max_retries=max_retries,
            backoff_s=backoff_s,
        )
        self._embedder = embedder
        prompts = VERDICT_SYSTEM + VERDICT_USER + DECOMPOSE_USER + QUESTIONS_USER
        ident = {
            "kind": "llm",
            **(_identity_model or {"base_url": self.client.base_url, "model": model}),
            "threshold": self.threshold,
            "use_logprobs": self.use_logprobs,
            "n_questions": self.n_questions,
            "decompose": self.decompose,
            "constrained": constrained,
            "temperature": float(temperature),
            "seed": int(seed),
            "prompts": hashlib.sha256(prompts.encode()).hexdigest()[:16],
        }
        self.identity = json.dumps(ident, sort_keys=True)

    @property
    def embedder(self):
        if self._embedder is None:
            from rag_experiments.stages.embedding import metric_embedder

            self._embedder = metric_embedder()
        return self._embedder

    # verdicts ------------------------------------------------------------------------------------
    def _verdict_messages(self, claim: str, context: str) -> list[dict]:
        return [
            {"role": "system", "content": VERDICT_SYSTEM},
            {"role": "user", "content": VERDICT_USER.format(context=context, claim=claim)},
        ]

    def _constrained(self, messages: list[dict]):
        if self.constrained == "json_schema":  # llama.cpp server extension
            return self.client.complete(
                messages, max_tokens=32, extra_body={"json_schema": VERDICT_SCHEMA}, allow_empty=True
            )
        if self.constrained == "response_format":  # OpenAI structured outputs
            fmt = {
                "type": "json_schema",
                "json_schema": {"name": "verdict", "schema": VERDICT_SCHEMA, "strict": True},
            }
            return self.client.complete(messages, max_tokens=32, response_format=fmt, allow_empty=True)
        return self.client.complete(messages, max_tokens=8, allow_empty=True)

    def _one_verdict(self, claim: str, context: str) -> Verdict:
        messages = self._verdict_messages(claim, context)
        try:
            if self.use_logprobs:
                c = self.client.complete(
                    messages, max_tokens=3, logprobs=True, top_logprobs=20, allow_empty=True
                )
                if c.error:
                    return Verdict(claim, "unparseable", raw="", error=c.error)
                if c.first_token_logprobs:
                    score = yes_no_score(c.first_token_logprobs)
                    if score is None:
                        return Verdict(
                            claim,
                            "unparseable",
                            raw=c.text,
                            rationale="no yes/no among the top-20 first tokens",
                        )
                    label = "supported" if score >= self.threshold else "unsupported"
                    return Verdict(claim, label, score=score, raw=c.text, rationale="logprob")
            c = self._constrained(messages)
            if c.error:
                return Verdict(claim, "unparseable", error=c.error)
            return Verdict(claim, parse_verdict(c.text), raw=c.text, rationale="constrained")
        except Exception as exc:  # noqa: BLE001 - a judge never raises per claim
            return Verdict(claim, "unparseable", error=f"{type(exc).__name__}: {exc}")

    def verdicts(self, claims: list[str], context: str) -> list[Verdict]:
        return self.client._map(lambda c: self._one_verdict(c, context), list(claims))

    # decomposition -------------------------------------------------------------------------------
    def split(self, answer: str) -> list[str]:
        """LLM-listed atomic claims; falls back to :func:`split_claims` when the reply is unusable."""
        fallback = split_claims(answer)
        if not self.decompose or not fallback:  # declines and empty answers have no claims
            return fallback
        c = self.client.complete([{"role": "user", "content": DECOMPOSE_USER.format(answer=answer.strip())}])
        if c.error:
            return fallback
        claims = []
        for line in c.text.splitlines():
            m = re.match(r"^\s*(?:[-*•]|\d+[.)])\s+(.+)$", line)
            if m and len(re.findall(r"\w+", m.group(1))) >= 3:
                claims.append(_CITATION.sub("", m.group(1)).strip())
        return claims or fallback

    # answer relevance ----------------------------------------------------------------------------
    def answer_relevance(self, query: str, answer: str) -> tuple[float, str]:
        """Mean cosine (metric embedder) between the query and up to n LLM-written questions.

        NaN when the answer is empty or no question could be read from the reply.
        """
        method = f"generated-questions({self.n_questions})"
        if not answer or not answer.strip():
            return float("nan"), method
        c = self.client.complete(
            [{"role": "user", "content": QUESTIONS_USER.format(n=self.n_questions, answer=answer.strip())}]
        )
        if c.error:
            return float("nan"), method
        questions = []
        for line in c.text.splitlines():
            q = re.sub(r"^\s*(?:[-*•]|\d+[.)]|Q\d*[:.])\s*", "", line).strip()
            if q.endswith("?") and len(q) > 3:
                questions.append(q)
        questions = questions[: self.n_questions]
        if not questions:
            return float("nan"), method
        v = self.embedder.encode([query, *questions], kind="query")
        return float(np.mean(v[1:] @ v[0])), method


class LocalLLMJudge(LLMJudge):
    """:class:`LLMJudge` on any GGUF file, served by the embedded llama.cpp server (shared with the
    local generator when both name the same file and ctx_size). ``model_path=None`` = the packaged
    SmolLM2-135M, which loads offline but is at chance as a judge."""

    def __init__(
        self,
        model_path: str | None = None,
        ctx_size: int = 4096,
        n_threads: int = 2,
        n_parallel: int = 2,
        **kwargs: Any,
    ) -> None:
        from rag_experiments.identity import file_sha256
        from rag_experiments.stages.generation import local_server, resolve_model_path

        path = resolve_model_path(model_path)
        base_url = local_server(path, ctx_size=ctx_size, n_threads=n_threads, n_parallel=n_parallel)
        kwargs.setdefault("constrained", "json_schema")
        kwargs.setdefault("concurrency", n_parallel)
        super().__init__(
            base_url=base_url,
            model=path.name,
            api_key_env="RAG_EXPERIMENTS_NO_KEY",
            _identity_model={  # the file's content, not its name, is the model
                "model_sha256": file_sha256(path),
                "ctx_size": int(ctx_size),
            },
            **kwargs,
        )


# -- metrics helpers ----------------------------------------------------------------------------


def faithfulness(verdicts: list[Verdict]) -> tuple[float, int, int]:
    """(supported / (supported + unsupported), n_claims, n_unparseable).

    Unparseable verdicts are excluded from the ratio and counted; NaN when no claim is scorable
    (no claims, or all unparseable).
    """
    sup = sum(v.label == "supported" for v in verdicts)
    uns = sum(v.label == "unsupported" for v in verdicts)
    unp = sum(v.label == "unparseable" for v in verdicts)
    score = sup / (sup + uns) if sup + uns else float("nan")
    return score, len(verdicts), unp


def normalise_text(text: str) -> str:
    """Matching form for key facts: NFKC, casefold, hyphens and punctuation to spaces (except inside
    numbers: "2.5", "1,000", "50%"), whitespace collapsed, and a final "s" dropped from words longer
    than 3 letters (so "24 hours", "24-hour" and "24 hour" all match)."""
    t = unicodedata.normalize("NFKC", text or "").casefold()
    # protect decimal points and thousands separators inside numbers
    t = re.sub(r"(?<=\d)\.(?=\d)", "\x00", t)
    t = re.sub(r"(?<=\d),(?=\d)", "\x01", t)
    t = re.sub(r"[^\w\s%\x00\x01]", " ", t).replace("_", " ").replace("\x00", ".").replace("\x01", ",")
    words = [
        w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") and w.isalpha() else w
        for w in t.split()
    ]
    return " ".join(words)


def key_fact_recall(answer: str, key_facts: list[str]) -> float:
    """Fraction of ``key_facts`` found in the answer as whole words after :func:`normalise_text`.

    NaN when there are no key facts.
    """
    facts = [f for f in key_facts if f and f.strip()]
    if not facts:
        return float("nan")
    hay = f" {normalise_text(answer)} "
    found = sum(f" {normalise_text(f)} " in hay for f in facts)
    return found / len(facts)


def correctness(answer: str, key_facts: list[str], answerable: bool) -> float:
    """Answerable items: :func:`key_fact_recall` (a declining answer scores 0).
    Unanswerable items: 1.0 if the answer declines (:func:`is_decline`), else 0.0."""
    if not answerable:
        return 1.0 if is_decline(answer) else 0.0
    if is_decline(answer):
        return 0.0 if [f for f in key_facts if f and f.strip()] else float("nan")
    return key_fact_recall(answer, key_facts)

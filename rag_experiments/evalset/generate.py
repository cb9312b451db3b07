"""Bootstrapping an eval set from the corpus: an LLM proposes, the resolver and a human dispose.

``generate`` samples passages from the corpus (seeded), asks a generator for one question grounded
in a verbatim quote of each passage (JSON ``{question, quote, answer}``, progress with an ETA),
keeps only replies whose quote resolves to exactly one span of the document (the eval-set
resolver, so what survives here loads later) or, failing that, is a *near miss*
(``datasets.near_miss``: the passage's most similar span, kept with its similarity for the
reviewer), drops near-duplicate questions (cosine ≥ threshold with the fixed MiniLM metric
embedder), tags what is left heuristically and writes a review CSV; an empty result says why and
what to do (:func:`empty_advice`). Every rejected reply is
counted by reason and written, with its reason, to a JSONL beside the review CSV (``--rejected``).
``accept`` turns the rows a human marked ``keep`` into eval-set items and runs
the eval-set validator on them. Rules and their limits: ``docs/evalset-generation.md``.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rag_experiments.core.parallel import as_they_complete
from rag_experiments.core.progress import Progress
from rag_experiments.core.redaction import redact
from rag_experiments.core.types import Document
from rag_experiments.evalset.corpus import CorpusError, load_corpus
from rag_experiments.evalset.csv_text import numbered_rows
from rag_experiments.evalset.load import EvalSetError, Normalised, load_evalset, normalise_ws
from rag_experiments.evalset.near_miss import NEAR_MISS_THRESHOLD, near_miss
from rag_experiments.stages.embedding import metric_embedder
from rag_experiments.stages.generation import LocalLlamaGenerator, OpenAICompatibleGenerator
from rag_experiments.stages.text import split_sentences

#: The review CSV; ``accept`` needs :data:`REQUIRED_COLUMNS` (hand-made files may omit the rest).
REVIEW_COLUMNS = ["id", "query", "doc_id", "quote", "answer", "tags", "similarity", "generated_quote", "keep"]
REQUIRED_COLUMNS = ["id", "query", "doc_id", "quote", "answer", "tags", "keep"]
KEEP_YES, KEEP_NO = ("yes", "y", "1", "true"), ("", "no", "n", "0", "false")
REJECT_REASONS = (
    "generation_error",
    "no_json",
    "missing_field",
    "quote_not_found",
    "quote_ambiguous",
    "near_duplicate",
)
REPLY_SCHEMA = {
    "type": "object",
    "properties": {k: {"type": "string", "minLength": 1} for k in ("question", "quote", "answer")},
    "required": ["question", "quote", "answer"],
}
_PARA = re.compile(r"\n[ \t]*\n")
_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset(
    "the a an and or of to in on for with by at from is are was were be been does do did what which who "
    "how when where why can could should would will shall may might that this these those it its as "
    "into about there their than then after before not no yes if any all each per".split()
)
SYSTEM = "You write test questions for a search system. Reply with one JSON object and nothing else."
USER = (
    "Passage from document {doc_id!r}:\n\n{passage}\n\n"
    'Copy one sentence of the passage verbatim as "quote", write a question that the quote answers '
    '(in your own words) as "question", and its short answer as "answer". Reply only with JSON: '
    '{{"question": "...", "quote": "...", "answer": "..."}}'
)


@dataclass(frozen=True)
class Passage:
    doc_id: str
    start: int
    end: int
    text: str


@dataclass
class Candidate:
    id: str
    query: str
    doc_id: str
    quote: str
    answer: str
    start: int = 0
    end: int = 0
    tags: list[str] = field(default_factory=list)
    similarity: float | None = None  # a near miss: ratio of the generated quote to the span kept
    generated_quote: str = ""  # a near miss: what the generator wrote (``quote`` is the document's)


@dataclass
class GenerationReport:
    calls: int = 0
    kept: list[Candidate] = field(default_factory=list)
    rejected: Counter = field(default_factory=Counter)  # reason -> count
    rejects: list[dict] = field(default_factory=list)  # one record per rejected reply (``--rejected``)

    def reject(self, reason: str, p: Passage, reply: str, **detail) -> None:
        """Count ``reason`` and keep the reply: ``{reason, doc_id, passage_start, passage_end, reply, …}``
        (secrets redacted: an endpoint may echo its key)."""
        self.rejected[reason] += 1
        rec = dict(reason=reason, doc_id=p.doc_id, passage_start=p.start, passage_end=p.end, reply=redact(reply))
        self.rejects.append({**rec, **{k: redact(str(v)) for k, v in detail.items()}})

    def summary(self) -> str:
        rej = ", ".join(f"{r}: {self.rejected.get(r, 0)}" for r in REJECT_REASONS)
        near = sum(c.similarity is not None for c in self.kept)
        return (
            f"{self.calls} generator calls, {len(self.kept)} kept ({near} near-miss quotes, "
            f"similarity ≥ {NEAR_MISS_THRESHOLD:g}: check them); rejected {rej}"
        )


# --------------------------------------------------------------------------------------- passages


def paragraphs(text: str) -> list[tuple[int, int]]:
    """(start, end) of the blank-line separated blocks of ``text``, surrounding whitespace trimmed."""
    out, pos = [], 0
    for m in [*_PARA.finditer(text), None]:
        end = m.start() if m else len(text)
        block = text[pos:end]
        if block.strip():
            s = pos + len(block) - len(block.lstrip())
            out.append((s, pos + len(block.rstrip())))
        pos = m.end() if m else len(text)
    return out


def sample_passages(docs: list[Document], n: int, seed: int = 0, max_chars: int = 700) -> list[Passage]:
    """n passages drawn without replacement (seeded) from every document's windows of consecutive
    paragraphs (each window grows from a paragraph while it stays ≤ max_chars; a lone longer
    paragraph is cut at max_chars). Fewer than n when the corpus has fewer windows."""
    windows: list[Passage] = []
    for d in sorted(docs, key=lambda d: d.doc_id):  # document order does not change the draw
        paras = paragraphs(d.text)
        for i, (s, e) in enumerate(paras):
            j = i
            while j + 1 < len(paras) and paras[j + 1][1] - s <= max_chars:
                j += 1
            end = paras[j][1] if j > i else min(e, s + max_chars)
            windows.append(Passage(d.doc_id, s, end, d.text[s:end]))
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(windows), size=min(n, len(windows)), replace=False) if windows else []
    return [windows[i] for i in sorted(pick)]


def prompt(p: Passage) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": USER.format(doc_id=p.doc_id, passage=p.text)},
    ]


# --------------------------------------------------------------------------------------- replies


def parse_reply(text: str) -> tuple[dict[str, str] | None, str | None]:
    """({question, quote, answer}, None) or (None, reason): the first JSON object in the reply that
    decodes; its three fields must be non-empty strings."""
    dec = json.JSONDecoder()
    obj = None
    for m in re.finditer(r"\{", text):
        try:
            obj, _ = dec.raw_decode(text, m.start())
            break
        except ValueError:
            continue
    if not isinstance(obj, dict):
        return None, "no_json"
    vals = {k: obj.get(k) for k in ("question", "quote", "answer")}
    if not all(isinstance(v, str) and v.strip() for v in vals.values()):
        return None, "missing_field"
    return {k: v.strip() for k, v in vals.items()}, None


def resolve_quote(doc: Document, quote: str, norm: Normalised | None = None) -> tuple[int, int] | str:
    """The one span the quote occupies (the eval-set resolver's whitespace-normalised match), else
    the reason: ``quote_not_found`` or ``quote_ambiguous``."""
    hits = (norm or Normalised.of(doc.text)).find_all(normalise_ws(quote))
    if not hits:
        return "quote_not_found"
    return hits[0] if len(hits) == 1 else "quote_ambiguous"


def _words(s: str) -> list[str]:
    return [w for w in _WORD.findall(s.lower()) if w not in _STOP and len(w) > 2]


def heuristic_tags(
    doc: Document, c: Candidate, paraphrase_overlap: float = 0.5, multi_chunk_chars: int = 400
) -> list[str]:
    """Tags by the rules in ``docs/evalset-generation.md``.

    overlap = share of the question's content words (lower-cased, ≥ 3 letters, no stop words) that
    occur in the quote. ``synonym``: some question content word occurs nowhere in the document
    (not even as a 5-letter prefix), with overlap ≥ the threshold; ``paraphrase``: overlap below
    it; ``exact``: neither. ``boundary``: the quote crosses a sentence or paragraph boundary.
    ``multi_chunk``: the quote crosses a paragraph break or is longer than multi_chunk_chars.
    """
    q, quote = _words(c.query), set(_words(c.quote))
    overlap = sum(w in quote for w in q) / len(q) if q else 1.0
    doc_prefixes = {w[:5] for w in _words(doc.text)}
    tags = []
    if overlap < paraphrase_overlap:
        tags.append("paraphrase")
    elif any(w[:5] not in doc_prefixes for w in q):
        tags.append("synonym")
    else:
        tags.append("exact")
    sentences = [s for s, e in split_sentences(doc.text) if s < c.end and e > c.start]
    crosses_para = "\n\n" in re.sub(r"\n[ \t]*\n", "\n\n", doc.text[c.start : c.end])
    if len(sentences) > 1 or crosses_para:
        tags.append("boundary")
    if crosses_para or c.end - c.start > multi_chunk_chars:
        tags.append("multi_chunk")
    return tags


def drop_near_duplicates(
    cands: list[Candidate], encode: Callable[[list[str]], np.ndarray], threshold: float
) -> tuple[list[Candidate], int]:
    """Greedy, in order: a question is dropped when its cosine with a kept one is ≥ threshold
    (``encode`` returns unit vectors)."""
    if not cands:
        return [], 0
    vecs = np.asarray(encode([c.query for c in cands]), float)
    kept: list[int] = []
    for i in range(len(cands)):
        if not kept or float(np.max(vecs[kept] @ vecs[i])) < threshold:
            kept.append(i)
    return [cands[i] for i in kept], len(cands) - len(kept)


def generate_candidates(
    docs: list[Document],
    generator,
    n: int,
    seed: int = 0,
    dedup_threshold: float = 0.9,
    encode: Callable[[list[str]], np.ndarray] | None = None,
    near_threshold: float = NEAR_MISS_THRESHOLD,
    progress: bool = True,
) -> GenerationReport:
    """One generator call per sampled passage; replies parsed, resolved (exactly, else as a near
    miss with its similarity), de-duplicated, tagged."""
    by_id = {d.doc_id: d for d in docs}
    passages = sample_passages(docs, n, seed)
    rep = GenerationReport(calls=len(passages))
    gens = _generate(generator, passages, progress)
    cands: list[Candidate] = []
    norms: dict[str, Normalised] = {}
    origins: list[tuple[Passage, str]] = []  # each candidate's passage and reply, for near duplicates
    for p, g in zip(passages, gens, strict=True):
        if g.error:
            rep.reject("generation_error", p, g.text or "", error=g.error)
            continue
        obj, why = parse_reply(g.text)
        if obj is None:
            rep.reject(why, p, g.text)
            continue
        doc = by_id[p.doc_id]
        norm = norms.setdefault(p.doc_id, Normalised.of(doc.text))
        span, quote, sim = resolve_quote(doc, obj["quote"], norm), obj["quote"], None
        if span == "quote_not_found" and (near := near_miss(p.text, p.start, obj["quote"], near_threshold)):
            # kept for review: the document's own span (it loads), the generated text beside it
            quote, sim = doc.text[near[0] : near[1]], round(near[2], 3)
            span = resolve_quote(doc, quote, norm)
        if isinstance(span, str):
            rep.reject(span, p, g.text)
            continue
        key = f"{p.doc_id}\0{obj['quote']}\0{obj['question']}".encode()
        cid = "gen-" + hashlib.sha256(key).hexdigest()[:10]
        c = Candidate(cid, obj["question"], p.doc_id, quote, obj["answer"], *span, similarity=sim)
        c.generated_quote = obj["quote"] if sim is not None else ""
        cands.append(c)
        origins.append((p, g.text))
    if encode is None:
        emb = metric_embedder()
        encode = lambda texts: emb.encode(texts, kind="query")  # noqa: E731
    kept, _ = drop_near_duplicates(cands, encode, dedup_threshold)
    kept_ids = {id(c) for c in kept}
    for c, (p, reply) in zip(cands, origins, strict=True):
        if id(c) not in kept_ids:
            rep.reject("near_duplicate", p, reply, question=c.query)
    for c in kept:
        c.tags = heuristic_tags(by_id[c.doc_id], c) + (["near_miss"] if c.similarity is not None else [])
    rep.kept = kept
    return rep


def _generate(generator, passages: list[Passage], progress: bool) -> list:
    """One generation per passage, ``generator.concurrency`` at a time, in passage order, with a
    progress line and ETA (``progress.Progress``: the mean rate so far) as replies arrive."""
    out: list = [None] * len(passages)
    workers = max(1, int(getattr(generator, "concurrency", 1) or 1))
    asked = [prompt(p) for p in passages]
    with Progress("evalset generate", len(asked), enabled=progress, unit="passages") as bar:
        for i, g in as_they_complete(lambda m: generator.generate([m])[0], asked, workers):
            out[i] = g
            bar.update()
    return out


def rejected_path(out: Path) -> Path:
    """Where the rejected replies go by default: beside the review CSV, ``review.rejected.jsonl``."""
    return out.with_name(out.stem + ".rejected.jsonl")


def write_rejected(path: Path, rejects: list[dict]) -> None:
    """One JSON object per rejected reply (written even when empty: no stale file from a last run)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rejects), encoding="utf-8")


def write_review_csv(path: Path, cands: list[Candidate]) -> None:
    """One row per candidate; tags ``;``-separated; ``keep`` blank for the reviewer."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(REVIEW_COLUMNS)
        for c in cands:
            sim = "" if c.similarity is None else f"{c.similarity:.3f}"
            w.writerow(
                [c.id, c.query, c.doc_id, c.quote, c.answer, ";".join(c.tags), sim, c.generated_quote, ""]
            )


# --------------------------------------------------------------------------------------- accept


def _review_rows(path: Path) -> tuple[list[tuple[int, dict]], list[str]]:
    """(line, row) of the rows marked keep, and ``FILE:LINE: field: problem`` lines."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        return [], [f"{path}:0: file: cannot read ({e})"]
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    header = [h.strip() for h in next(reader, [])]
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        return [], [f"{path}:1: {c}: missing column" for c in missing]
    rows, problems = [], []
    for line, values in numbered_rows(reader, path, problems):
        rec = {k: (v or "").strip() for k, v in zip(header, values, strict=False)}
        keep = rec.get("keep", "").lower()
        if keep not in KEEP_YES + KEEP_NO:
            problems.append(f"{path}:{line}: keep: {rec.get('keep')!r} is not yes/1/true or no/0/false/blank")
        elif keep in KEEP_YES:
            rows.append((line, rec))
    return rows, problems


def accept(review: Path, docs: list[Document]) -> tuple[list[dict], list[str]]:
    """(items, problems): kept rows as eval-set items, validated by the eval-set loader; problems
    name the review file and line."""
    rows, problems = _review_rows(review)
    if problems:
        return [], problems
    if not rows:
        return [], [f"{review}: keep: no row marked yes/1/true"]
    items = [
        {
            "id": r["id"],
            "query": r["query"],
            "gold_evidence": [{"doc_id": r["doc_id"], "quote": r["quote"]}],
            "gold_answer": r["answer"] or None,
            "key_facts": [],
            "tags": [t for t in re.split(r"[;,\s]+", r["tags"]) if t],
        }
        for _, r in rows
    ]
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "items.jsonl"
        p.write_text("".join(json.dumps(it, ensure_ascii=False) + "\n" for it in items), encoding="utf-8")
        try:
            load_evalset(p, docs)
        except EvalSetError as e:  # the loader names items.jsonl:N; map N back to the CSV line
            pat = re.compile(re.escape(str(p)) + r":(\d+)")
            for msg in e.problems:
                m = pat.match(msg)
                line = rows[int(m.group(1)) - 1][0] if m else 0
                problems.append(f"{review}:{line}" + (msg[m.end() :] if m else f": {msg}"))
            return [], problems
    return items, []


# --------------------------------------------------------------------------------------- CLI


def make_generator(args):
    """``--base-url`` + ``--model``: an OpenAI-compatible endpoint; else the local llama.cpp server."""
    common = dict(temperature=args.temperature, seed=args.seed, max_tokens=args.max_tokens)
    if args.base_url:
        return OpenAICompatibleGenerator(args.base_url, args.model, api_key_env=args.api_key_env, **common)
    # llama.cpp constrains sampling to this schema, so even a tiny model replies with parseable JSON
    return LocalLlamaGenerator(model_path=args.model_path, extra_body={"json_schema": REPLY_SCHEMA}, **common)


#: An example capable endpoint for the advice (any OpenAI-compatible server works).
EXAMPLE_ENDPOINT = "--base-url http://localhost:8000/v1 --model qwen2.5-7b-instruct"


def empty_advice(rep: GenerationReport, args) -> list[str]:
    """Why nothing was kept (the rejections, largest first) and what to do about each cause."""
    rejected = [(r, n) for r, n in rep.rejected.most_common() if n]
    lines = ["nothing kept: " + (", ".join(f"{n} {r}" for r, n in rejected) or "no passage sampled")]
    local = not getattr(args, "base_url", None)
    fix = {
        "quote_not_found": (
            "the model did not copy a sentence of the passage verbatim (nor within similarity "
            f"{NEAR_MISS_THRESHOLD:g}). "
            + (
                "The packaged 135M model rarely can: use a capable model behind an OpenAI-compatible "
                f"endpoint, e.g. {EXAMPLE_ENDPOINT} [--api-key-env VAR], or --model-path a 7B+ "
                "instruct GGUF"
                if local
                else f"Use a more capable --model at {args.base_url} (7B+ instruct)"
            )
        ),
        "no_json": f"replies held no JSON object: raise --max-tokens (now {getattr(args, 'max_tokens', '?')}) "
        "or use a model that follows the format",
        "missing_field": "replies lacked question / quote / answer: use a model that follows the format",
        "quote_ambiguous": "the quotes occur more than once in their document: the model copied too "
        "little; a more capable model gives longer quotes",
        "generation_error": "the generator failed: check the endpoint (--base-url, --model, --api-key-env)",
        "near_duplicate": f"the questions repeat each other: raise --dedup-threshold (now "
        f"{getattr(args, 'dedup_threshold', '?')}) or sample more passages (--n)",
    }
    lines += [f"{r}: {fix[r]}" for r, _ in rejected if r in fix]
    if not rejected:
        lines.append("the corpus has no paragraphs to sample: check --corpus")
    return lines


def cli(args, generator=None) -> int:
    """``generate`` and ``accept`` subcommands of ``python -m rag_experiments.evalset``."""
    import sys

    try:
        docs = load_corpus(args.corpus)
    except CorpusError as e:
        print(e, file=sys.stderr)
        return 2
    if args.cmd == "generate":
        if args.n < 1 or (args.base_url and not args.model):
            print("error: --n must be >= 1; --base-url needs --model", file=sys.stderr)
            return 2
        rep = generate_candidates(
            docs,
            generator or make_generator(args),
            args.n,
            args.seed,
            args.dedup_threshold,
            near_threshold=getattr(args, "near_miss", NEAR_MISS_THRESHOLD),
            progress=getattr(args, "progress", True),
        )
        write_review_csv(Path(args.out), rep.kept)
        rejected = Path(getattr(args, "rejected", None) or rejected_path(Path(args.out)))
        write_rejected(rejected, rep.rejects)
        print(rep.summary())
        by_reason = ", ".join(f"{n} {r}" for r, n in rep.rejected.most_common() if n)
        print(f"wrote {len(rep.rejects)} rejected replies to {rejected}" + (f" ({by_reason})" if by_reason else ""))
        if not rep.kept:
            print(f"wrote an empty review CSV {args.out}: nothing to review.")
            for line in empty_advice(rep, args):
                print(f"  {line}")
            return 0
        print(
            f"wrote {len(rep.kept)} rows to {args.out}; set keep=yes on the rows to accept, then: "
            f"python -m rag_experiments.evalset accept {args.out} --corpus {args.corpus} --out evalset.jsonl"
        )
        return 0
    items, problems = accept(Path(args.review), docs)
    if problems:
        for p in problems:
            print(p, file=sys.stderr)
        print(f"{len(problems)} problem(s) in {args.review}; nothing written", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(it, ensure_ascii=False) + "\n" for it in items), encoding="utf-8")
    print(f"wrote {len(items)} items to {out} (validated against {args.corpus})")
    return 0

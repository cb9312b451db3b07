"""Token-level and budgeted retrieval metrics: the worked example of docs/metrics.md, a brute-force
cross-check on random corpora (hypothesis), and the pipeline wiring (cache, MRR depth)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_experiments.core.cache import StageCache
from rag_experiments.core.types import Chunk, Span
from rag_experiments.evalset.corpus import Corpus
from rag_experiments.evalset.load import EvalSet
from rag_experiments.evaluation.budget import budget_ends, budgeted_metrics
from rag_experiments.evaluation.headline import headline_metrics, headline_reason
from rag_experiments.evaluation.metrics import check_metrics_config, token_metrics
from rag_experiments.run.pipeline import run_pipeline
from rag_experiments.run.types import PipelineData, RunSettings, Stages
from rag_experiments.stages.chunking import MarkdownChunker, WholeDocumentChunker
from rag_experiments.stages.retrieval import BM25Retriever
from rag_experiments.stages.text import token_ends, tokenizer_identity
from tests.sweep_helpers import make_tiny


def chunk(doc: str, start: int, end: int) -> Chunk:
    return Chunk(f"{doc}#{start}-{end}", doc, start, end, "x" * (end - start))


def five_char_tokens(chunks: list[Chunk]) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic tokenizer for hand computation: one token per 5 characters (last one shorter)."""
    ends = [list(range(5, len(c.text), 5)) + [len(c.text)] for c in chunks]
    ptr = np.concatenate([[0], np.cumsum([len(e) for e in ends])])
    return np.array([x for e in ends for x in e], dtype=np.int64), ptr


# --------------------------------------------------------------------------- worked example


def test_worked_example_from_docs() -> None:
    """docs/metrics.md, "Token-level and budgeted retrieval metrics": gold [40, 60) of document d;
    ranking [30, 50), [45, 65), [0, 20)."""
    r1, r2, r3 = chunk("d", 30, 50), chunk("d", 45, 65), chunk("d", 0, 20)
    gold = [[Span("d", 40, 60)]]
    m = token_metrics([[r1, r2, r3]], gold, ks=[1, 2, 3])
    # k=1: union [30,50) = 20 chars, 10 of them gold
    assert (m["token_recall_at_1"][0], m["token_precision_at_1"][0]) == (0.5, 0.5)
    assert m["token_iou_at_1"][0] == pytest.approx(10 / 30)
    # k=2: union [30,65) = 35 chars (5 shared chars counted once), all 20 gold chars
    assert m["token_recall_at_2"][0] == 1.0
    assert m["token_precision_at_2"][0] == pytest.approx(20 / 35)
    assert m["token_iou_at_2"][0] == pytest.approx(20 / 35)
    # k=3: 20 more characters, none gold
    assert m["token_precision_at_3"][0] == pytest.approx(20 / 55)

    # Budget of 6 tokens (5 characters each): r1 whole (4 tokens), r2 cut after 2 tokens -> [45, 55)
    chunks = [r1, r2, r3]
    ends, ptr = five_char_tokens(chunks)
    cut = budget_ends(np.array([[0, 1, 2]]), np.array([[30, 45, 0]]), np.array([[50, 65, 20]]), ends, ptr, 6)
    assert cut.tolist() == [[50, 55, 0]]
    b = budgeted_metrics(np.array([[0, 1, 2]]), chunks, gold, ends, ptr, [6, 4, 3])
    # context [30,50) + [45,55): union [30,55) = 25 chars, gold part [40,55) = 15
    assert b["token_precision_at_6tok"][0] == pytest.approx(15 / 25)
    assert b["evidence_recall_at_6tok"][0] == 1.0  # 15/20 = 0.75 >= min_coverage 0.5
    assert b["hit_at_6tok"][0] == 1.0
    # 4 tokens: only r1, covering 10/20 of the span -> still recalled (0.5), precision 10/20
    assert (b["evidence_recall_at_4tok"][0], b["token_precision_at_4tok"][0]) == (1.0, 0.5)
    # 3 tokens: r1 cut to [30,45): 5/20 of the span -> not recalled; the piece is not relevant
    assert (b["evidence_recall_at_3tok"][0], b["hit_at_3tok"][0]) == (0.0, 0.0)
    assert b["token_precision_at_3tok"][0] == pytest.approx(5 / 15)


def test_edges_unanswerable_empty_and_other_documents() -> None:
    gold = [[], [Span("d", 0, 10)], [Span("d", 0, 10)]]
    ranked = [[chunk("d", 0, 10)], [], [chunk("e", 0, 10)]]
    m = token_metrics(ranked, gold, ks=[1, 5])
    assert np.isnan(m["token_recall_at_1"][0]) and np.isnan(m["token_precision_at_5"][0])
    # nothing retrieved: recall 0, precision 0, IoU 0; another document covers nothing
    for q in (1, 2):
        assert [m[f"token_{x}_at_5"][q] for x in ("recall", "precision", "iou")] == [0.0, 0.0, 0.0]
    chunks = [chunk("d", 0, 10), chunk("e", 0, 10)]
    ends, ptr = five_char_tokens(chunks)
    b = budgeted_metrics(np.array([[0], [-1], [1]]), chunks, gold, ends, ptr, [256])
    assert np.isnan(b["hit_at_256tok"][0])
    assert b["hit_at_256tok"][1:].tolist() == [0.0, 0.0]
    assert b["token_precision_at_256tok"][1:].tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="token offsets"):
        budgeted_metrics(np.array([[0]]), chunks[:1], gold[:1], ends, ptr, [8])
    with pytest.raises(ValueError, match="metrics.token_budgets"):
        check_metrics_config([1, 5], 5, 100, [256, 0])
    with pytest.raises(ValueError, match="metrics.rank_depth"):
        check_metrics_config([1, 5], 5, 0, [256])


# --------------------------------------------------------------------------- properties


@st.composite
def corpora(draw):
    """1-3 documents, 1-12 random (possibly overlapping) chunks, 1-3 queries with 1-3 gold spans
    each (or none), a random ranking of the chunks per query, random token ends per chunk."""
    lens = draw(st.lists(st.integers(1, 120), min_size=1, max_size=3))
    docs = [f"d{i}" for i in range(len(lens))]

    def interval(d):
        a = draw(st.integers(0, lens[d] - 1))
        return a, draw(st.integers(a + 1, lens[d]))

    chunks = []
    for _ in range(draw(st.integers(1, 12))):
        d = draw(st.integers(0, len(docs) - 1))
        chunks.append(chunk(docs[d], *interval(d)))
    gold, idx = [], []
    for _ in range(draw(st.integers(1, 3))):
        spans = []
        for _ in range(draw(st.integers(0, 3))):
            d = draw(st.integers(0, len(docs) - 1))
            spans.append(Span(docs[d], *interval(d)))
        gold.append(spans)
        order = draw(st.permutations(range(len(chunks))))
        idx.append(list(order[: draw(st.integers(0, len(chunks)))]))
    tok = []
    for c in chunks:
        n = len(c.text)
        cuts = sorted(set(draw(st.lists(st.integers(1, n), max_size=6))) | {n})
        tok.append(cuts)
    ptr = np.concatenate([[0], np.cumsum([len(t) for t in tok])])
    return chunks, gold, idx, np.array([x for t in tok for x in t], dtype=np.int64), ptr


def chars(pieces) -> set[tuple[str, int]]:
    return {(doc, i) for doc, s, e in pieces for i in range(s, e)}


@settings(max_examples=150, deadline=None)
@given(corpora())
def test_token_metrics_match_character_sets(data) -> None:
    chunks, gold, idx, _, _ = data
    ranked = [[chunks[i] for i in row] for row in idx]
    n_max = max(len(r) for r in ranked) or 1
    ks = list(range(1, n_max + 1))
    m = token_metrics(ranked, gold, ks)
    for q, (row, spans) in enumerate(zip(ranked, gold, strict=True)):
        g = chars((s.doc_id, s.start, s.end) for s in spans)
        prev_recall = 0.0
        for k in ks:
            u = chars((c.doc_id, c.start, c.end) for c in row[:k])
            r, p, iou = (m[f"token_{x}_at_{k}"][q] for x in ("recall", "precision", "iou"))
            if not spans:
                assert np.isnan(r) and np.isnan(p) and np.isnan(iou)
                continue
            assert r == pytest.approx(len(g & u) / len(g))
            assert p == pytest.approx(len(g & u) / len(u) if u else 0.0)
            assert iou == pytest.approx(len(g & u) / len(g | u))
            assert 0.0 <= iou <= min(p, r) + 1e-12 and 0 <= p <= 1 and 0 <= r <= 1
            assert r >= prev_recall - 1e-12  # recall never drops as k grows
            prev_recall = r


@settings(max_examples=150, deadline=None)
@given(corpora(), st.integers(1, 40))
def test_budgeted_metrics_match_a_direct_fill(data, budget) -> None:
    chunks, gold, idx, ends, ptr = data
    width = max(len(r) for r in idx) or 1
    idx_arr = np.array([r + [-1] * (width - len(r)) for r in idx], dtype=np.int64)
    b = budgeted_metrics(idx_arr, chunks, gold, ends, ptr, [budget, budget + 7])
    for q, (row, spans) in enumerate(zip(idx, gold, strict=True)):
        left, pieces = budget, []
        for i in row:  # fill the context the plain way
            toks = ends[ptr[i] : ptr[i + 1]]
            c = chunks[i]
            if left >= len(toks) and (len(toks) or left):
                pieces.append((c.doc_id, c.start, c.end))
                left -= len(toks)
            elif left > 0:
                pieces.append((c.doc_id, c.start, c.start + int(toks[left - 1])))
                left = 0
        if not spans:
            assert np.isnan(b[f"hit_at_{budget}tok"][q])
            continue
        u, g = chars(pieces), chars((s.doc_id, s.start, s.end) for s in spans)
        assert b[f"token_precision_at_{budget}tok"][q] == pytest.approx(len(g & u) / len(u) if u else 0.0)
        recalled = [
            len(chars([(s.doc_id, s.start, s.end)]) & u) >= max(0.5 * (s.end - s.start), 1e-9) for s in spans
        ]
        assert b[f"evidence_recall_at_{budget}tok"][q] == pytest.approx(np.mean(recalled))
        for key in ("evidence_recall", "hit"):  # a larger budget never loses evidence
            assert b[f"{key}_at_{budget + 7}tok"][q] >= b[f"{key}_at_{budget}tok"][q]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 300), min_size=1, max_size=4),
    st.data(),
)
def test_whole_documents_never_beat_gold_sized_chunks_on_precision(lens, data) -> None:
    """One gold span per query; chunkings: whole documents vs tiles as long as the span (any
    phase); both ranked by an oracle (token precision, best first). By the mediant inequality the
    best tile of the gold document is at least as precise as the whole document."""
    docs = [f"d{i}" for i in range(len(lens))]
    d = data.draw(st.integers(0, len(docs) - 1))
    a = data.draw(st.integers(0, lens[d] - 1))
    span = Span(docs[d], a, data.draw(st.integers(a + 1, lens[d])))
    size = span.end - span.start
    whole = [chunk(x, 0, n) for x, n in zip(docs, lens, strict=True)]
    phase = data.draw(st.integers(0, size - 1))
    tiles = []
    for x, n in zip(docs, lens, strict=True):
        cuts = sorted({0, n, *range(phase, n, size)})
        tiles += [chunk(x, s, e) for s, e in zip(cuts, cuts[1:], strict=False)]

    def oracle(cs):
        g = chars([(span.doc_id, span.start, span.end)])

        def prec(c):
            return len(chars([(c.doc_id, c.start, c.end)]) & g) / (c.end - c.start)

        return sorted(cs, key=lambda c: (-prec(c), c.doc_id, c.start))

    k = data.draw(st.integers(1, 3))
    pw = token_metrics([oracle(whole)], [[span]], [k])[f"token_precision_at_{k}"][0]
    pt = token_metrics([oracle(tiles)], [[span]], [1])["token_precision_at_1"][0]
    assert pw <= pt + 1e-12


# --------------------------------------------------------------------------- pipeline


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    docs, ev = make_tiny(root, n_items=8)
    corpus = Corpus(str(docs))
    return corpus, EvalSet(str(ev), corpus).items, root


def _run(tiny, cache, chunker, ks, k=3, **kw):
    corpus, items, _ = tiny
    stages = Stages(
        chunker=chunker, chunking_cfg={"_target_": type(chunker).__name__}, retriever=BM25Retriever(k=k)
    )
    settings = RunSettings(k=k, ks=tuple(ks), n_resamples=50, progress=False, **kw)
    return run_pipeline(stages, PipelineData(corpus.docs, corpus.digest, items), settings, cache)


def test_pipeline_mrr_independent_of_ks_and_tokens_cached(tiny) -> None:
    cache = StageCache(tiny[2] / "cache")
    a = _run(tiny, cache, MarkdownChunker(), ks=[1, 3])
    before = cache.stats["chunk_tokens.hit"]
    b = _run(tiny, cache, MarkdownChunker(), ks=[5, 10])
    np.testing.assert_array_equal(a.per_query["mrr"].to_numpy(), b.per_query["mrr"].to_numpy())
    assert a.aggregates["mrr"] == b.aggregates["mrr"]
    assert cache.stats["chunk_tokens.hit"] == before + 1  # same chunk set: token counts reused
    assert a.tags["token_budget_tokenizer"] == tokenizer_identity()
    assert a.cache_keys["chunk_tokens"] == b.cache_keys["chunk_tokens"]
    for key in ("evidence_recall_at_256tok", "hit_at_512tok", "token_precision_at_1024tok", "token_iou_at_3"):
        assert key in a.aggregates and f"{key}_ci_low" in a.aggregates
        assert a.aggregates[f"n_scored/{key}"] == len(tiny[1]) - 1  # the unanswerable item is excluded
    # the retrieved list in the table stays at max(ks ∪ {k}) although the ranking is 100 deep
    assert a.per_query["retrieved"].map(lambda s: s.count('"rank"')).max() <= 3


def test_pipeline_budget_uses_real_token_counts(tiny) -> None:
    """The 256-token context of the whole-document chunker is a prefix of the top document whose
    MiniLM token count is exactly 256 (the documents are longer than that)."""
    corpus, items, root = tiny
    cache = StageCache(root / "cache2")
    res = _run(tiny, cache, WholeDocumentChunker(), ks=[1], token_budgets=[256])
    chunks = [c for d in corpus.docs for c in WholeDocumentChunker().split(d)]
    ends, ptr = token_ends([c.text for c in chunks])
    assert (np.diff(ptr) > 256).all()
    top = chunks[0]
    cut = budget_ends(np.array([[0]]), np.array([[top.start]]), np.array([[top.end]]), ends, ptr, 256)[0, 0]
    assert len(token_ends([top.text[: cut - top.start]])[0]) == 256
    # the context is a prefix of the top document: it can only lose what the whole document has
    df = res.per_query.dropna(subset=["hit_at_1"])
    assert (df["hit_at_256tok"] <= df["hit_at_1"]).all()
    assert (df["evidence_recall_at_256tok"] <= df["evidence_recall_at_1"]).all()
    assert (df["token_precision_at_256tok"] > 0).any()


# --------------------------------------------------------------------------- headline


def test_headline_metrics_lead_with_budgets_when_chunking_varies() -> None:
    assert headline_metrics(["retriever"]) == ["hit_at_5", "mrr", "evidence_recall_at_5"]
    assert headline_reason(["retriever", "embedding"]) == ""
    lead = headline_metrics(["chunking.size", "retriever"])
    assert lead[:3] == [
        "evidence_recall_at_256tok",
        "evidence_recall_at_512tok",
        "evidence_recall_at_1024tok",
    ]
    assert lead[-3:] == ["hit_at_5", "mrr", "evidence_recall_at_5"] and len(lead) == 12
    assert headline_reason(["chunking"]) == "chunkers of different sizes compared at equal context cost"
    # budgets come from the keys that exist, and only those are returned
    avail = ["mrr", "hit_at_5", "hit_at_300tok", "token_precision_at_300tok", "hit_at_100tok"]
    assert headline_metrics(["chunking"], available=avail) == [
        "hit_at_100tok",
        "hit_at_300tok",
        "token_precision_at_300tok",
        "hit_at_5",
        "mrr",
    ]


def test_compare_sweep_default_metrics_follow_the_headline() -> None:
    import pandas as pd

    from rag_experiments.evaluation.aggregate import metric_columns
    from rag_experiments.evaluation.headline import sweep_metrics

    cols = [
        "hit_at_1",
        "hit_at_5",
        "mrr",
        "evidence_recall_at_5",
        "hit_at_256tok",
        "token_precision_at_256tok",
    ]
    table = pd.DataFrame({c: [0.5, 1.0] for c in cols} | {"id": ["a", "b"], "tags": [[], []]})
    plain = sweep_metrics(metric_columns(table), ["retriever"])
    chunked = sweep_metrics(metric_columns(table), ["chunking"])
    assert sorted(plain) == sorted(chunked)  # the same metrics, reordered
    assert plain[0] == "hit_at_5"
    assert chunked[:2] == ["hit_at_256tok", "token_precision_at_256tok"]


def test_bad_budget_config_exits_2_without_any_mlflow_run(tmp_path) -> None:
    from mlflow.tracking import MlflowClient

    from tests.sweep_helpers import run_sweep, sweep_args

    docs, ev = make_tiny(tmp_path, n_items=3)
    args = [*sweep_args(tmp_path, docs, ev), "generator=none", "metrics.token_budgets=[256,0]"]
    p = run_sweep(tmp_path, *args, check=False)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "metrics.token_budgets: every value must be an integer >= 1, got 0" in p.stderr
    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exp = c.get_experiment_by_name("test")
    assert exp is None or not c.search_runs([exp.experiment_id])


def test_a_cut_chunk_straddling_the_span_is_no_hit_at_any_budget() -> None:
    """Found by hypothesis: span d0[0:4], chunk d0[3:5] (2 tokens) cut to d0[3:4] at B=1 lay
    "inside" the span and counted as a hit that vanished at B=8 (the whole chunk covers 25 %)."""
    chunks = [Chunk("d0#0-1", "d0", 0, 1, "x", {}), Chunk("d0#3-5", "d0", 3, 5, "xx", {})]
    b = budgeted_metrics(
        np.array([[1]]), chunks, [[Span("d0", 0, 4)]], np.array([1, 1, 2]), np.array([0, 1, 3]), [1, 8]
    )
    assert b["hit_at_1tok"][0] == b["hit_at_8tok"][0] == 0.0


def test_the_budget_tokenizer_read_from_its_json_is_the_one_transformers_builds():
    """``minilm_tokenizer`` reads tokenizer.json with ``tokenizers`` (no transformers import): its
    JSON, identity and token ends equal those of ``AutoTokenizer``'s backend with the same switches."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from rag_experiments.stages.embedding import minilm_path

    backend = Tokenizer.from_str(AutoTokenizer.from_pretrained(str(minilm_path())).backend_tokenizer.to_str())
    backend.no_truncation()
    backend.no_padding()
    assert tokenizer_identity(backend) == tokenizer_identity() == "all-MiniLM-L6-v2-fast:9114256b104cca80"
    texts = ["Webhooks are retried for 24 hours.", "Ünïcode — and a URL: https://x.io/a?b=1", ""]
    for a, b in zip(token_ends(texts, backend), token_ends(texts), strict=True):
        assert a.tolist() == b.tolist()

"""A progress block's last line says how it ended: ``done`` only when it was (issue 37:
``[retrieval] done`` printed just before ``[interrupted]``)."""

from __future__ import annotations

import io

import pytest

from rag_experiments.core.progress import Progress, outcome, track


def _last_line(out: io.StringIO) -> str:
    return out.getvalue().splitlines()[-1]


def test_ctrl_c_inside_the_block_says_interrupted_with_how_far_it_got():
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt), Progress("generation", 20, stream=out, unit="answers") as bar:
        bar.update(7)
        raise KeyboardInterrupt
    assert _last_line(out).startswith("[generation] interrupted: 7/20 answers, ")
    assert "done" not in out.getvalue()


def test_a_block_without_a_total_says_interrupted_too():
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt), Progress("retrieval", None, stream=out):
        raise KeyboardInterrupt
    assert out.getvalue().splitlines()[0] == "[retrieval] started"
    assert _last_line(out).startswith("[retrieval] interrupted: ")


def test_an_exception_names_itself():
    out = io.StringIO()
    with pytest.raises(ValueError), Progress("reranking", 4, stream=out, unit="queries") as bar:
        bar.update()
        raise ValueError("bad")
    assert _last_line(out).startswith("[reranking] interrupted by ValueError: 1/4 queries, ")


def test_a_track_loop_left_by_an_exception_says_interrupted(capsys):
    def consume():
        for i in track(range(10), "judging", unit="answers"):
            if i == 3:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        consume()
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("[judging] interrupted: 3/10 answers, "), err


def test_a_finished_block_still_says_done():
    out = io.StringIO()
    with Progress("generation", 2, stream=out, unit="answers") as bar:
        bar.update(2)
    assert _last_line(out).startswith("[generation] done: 2 answers, ")
    assert list(track([1, 2], "x", enabled=False)) == [1, 2]
    assert outcome(None) == "done" and outcome(SystemExit) == "interrupted"


def _embedding_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("[embedding passages]")]


def test_embedding_one_block_prints_progress_with_an_eta(tmp_path, capsys):
    """Issue 36: embedding the corpus printed nothing for 93 s, because one block of texts is one
    model call. The line now moves per model batch (a forward hook that only counts), and the
    vectors are those of a call without it: through the vector cache's blocks and through the
    dense retriever's memmap (the corpus), where a cached matrix prints nothing."""
    import numpy as np

    from rag_experiments.core.cache import CachedEmbedder, StageCache
    from rag_experiments.core.types import Chunk
    from rag_experiments.stages.embedding import SentenceTransformerEmbedder
    from rag_experiments.stages.retrieval import DenseRetriever

    texts = [f"passage {i}: webhook retries" for i in range(256)]  # the threshold for a line
    st = SentenceTransformerEmbedder(batch_size=16, show_progress=False)
    plain = st.encode(texts)
    capsys.readouterr()
    got = CachedEmbedder(st, StageCache(tmp_path / "a")).encode(texts)  # one block of 256: one model call
    lines = _embedding_lines(capsys.readouterr().err)
    assert sum("ETA" in ln for ln in lines) >= 5, lines  # a line per 10 %, each with its ETA
    assert lines[-1].startswith("[embedding passages] done: 256 texts")
    np.testing.assert_array_equal(got, plain)

    chunks = [Chunk(f"d#{i}", "d", i, i + 1, t) for i, t in enumerate(texts)]
    for cached in (False, True):  # the corpus through the memmap: one call of embed_batch texts
        dense = DenseRetriever(CachedEmbedder(st, StageCache(tmp_path / "b")), k=3, embed_batch=512)
        dense.index(chunks)
        lines = _embedding_lines(capsys.readouterr().err)
        if cached:
            assert lines == []  # the matrix was on disk: nothing embedded, nothing said
        else:
            assert sum("ETA" in ln for ln in lines) >= 5 and lines[-1].endswith(" s"), lines
            np.testing.assert_array_equal(np.asarray(dense._matrix), plain)


def test_the_judges_embedding_says_how_many_texts_and_is_not_done_twice(tmp_path, capsys):
    """Issue 45: ``[judging: embedding claims and contexts]`` printed nothing for 149 s. The
    heuristic judge's embedding now counts its texts per model batch with an ETA, and its vectors
    are cached per text (stage ``text_vectors``): a second run embeds only what it has not seen,
    with the same vectors (the judge's verdicts, and the recorded digests, unchanged)."""
    import numpy as np

    from rag_experiments.core.cache import StageCache
    from rag_experiments.judge.heuristic import _VEC_MEMO, HeuristicJudge
    from rag_experiments.stages.embedding import SentenceTransformerEmbedder

    st = SentenceTransformerEmbedder(batch_size=16, show_progress=False)
    judge = HeuristicJudge(embedder=st)
    answers = [f"Webhook deliveries are retried {i} times over three days." for i in range(40)]
    contexts = [f"Failed webhooks are retried up to {i} times. Each retry waits longer. Order {i} ships." for i in range(40)]
    cache = StageCache(tmp_path / "cache")
    _VEC_MEMO.pop(judge.embedder_identity, None)
    judge.prepare(answers, contexts, progress=True, desc="judging: embedding claims and contexts", cache=cache)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("[judging: embedding")]
    n = int(lines[0].split("started: ")[1].split()[0])
    assert n > 100 and sum("ETA" in ln for ln in lines) >= 5, lines  # a line per ~10 %, with its ETA
    assert lines[-1].startswith(f"[judging: embedding claims and contexts] done: {n} texts")
    first = dict(_VEC_MEMO[judge.embedder_identity])

    _VEC_MEMO.pop(judge.embedder_identity)  # a new process: only the stage cache remembers
    calls = []
    st_encode = st.encode
    st.encode = lambda texts, kind="passage": calls.append(len(texts)) or st_encode(texts, kind=kind)
    judge.prepare(answers + ["A new claim about refunds taking five days."], contexts, progress=True,
                  desc="judging: embedding claims and contexts", cache=cache)  # fmt: skip
    assert calls == [1]  # the one text it had not seen
    assert "started: 1 texts" in capsys.readouterr().err
    again = _VEC_MEMO[judge.embedder_identity]
    assert all(np.array_equal(first[t], again[t]) for t in first)

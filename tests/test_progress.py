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


def test_embedding_one_block_prints_progress_with_an_eta(tmp_path, capsys):
    """Issue 36: embedding the corpus printed nothing for 93 s, because one block of up to 1,024
    texts is one model call. The line now moves per model batch (a forward hook that only counts),
    and the vectors are those of a call without it."""
    import numpy as np

    from rag_experiments.core.cache import CachedEmbedder, StageCache
    from rag_experiments.stages.embedding import SentenceTransformerEmbedder

    texts = [f"passage {i}: webhook retries" for i in range(256)]  # the cache's threshold for a line
    st = SentenceTransformerEmbedder(batch_size=32, show_progress=False)
    plain = st.encode(texts)
    capsys.readouterr()
    got = CachedEmbedder(st, StageCache(tmp_path)).encode(texts)  # one block of 256: one model call
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("[embedding passages]")]
    assert sum("ETA" in ln for ln in lines) >= 5, lines  # a line per 10 %, each with its ETA
    assert lines[-1].startswith("[embedding passages] done: 256 texts") and st.on_batch is None
    np.testing.assert_array_equal(got, plain)

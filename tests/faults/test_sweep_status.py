"""A multirun is the set of its configs: a FAILED config makes the sweep exit non-zero and the
end-of-sweep summary lists every config with its status."""

from __future__ import annotations

from tests.llm_fixtures import closed_port_url, fake_llm  # noqa: F401 - fixtures
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args


def test_a_failed_config_fails_the_multirun_and_is_listed(fake_llm, closed_port_url, tmp_path):  # noqa: F811
    docs, ev = make_tiny(tmp_path, n_items=3)
    p = run_sweep(
        tmp_path,
        "-m",
        "generator=openai",
        f"generator.base_url={fake_llm.base_url},{closed_port_url}",  # the second level is dead
        "generator.model=ok",
        "generator.max_retries=0",
        "generator.timeout_s=2",
        "generation_subset=null",
        "retriever=bm25",
        "judge=heuristic",
        *sweep_args(tmp_path, docs, ev),
        check=False,
    )
    out = p.stdout
    assert p.returncode == 1, out[-3000:] + p.stderr[-3000:]
    assert "configs finished 1/2" in out, out[-3000:]
    summary = out[out.index("configs finished 1/2") :]
    first_block = summary.split("\n\n")[0]  # wide tables continue in column blocks
    assert "(FAILED)" in first_block and first_block.count("generator.base_url=") == 2, summary

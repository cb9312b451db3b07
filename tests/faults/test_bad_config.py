"""Bad config values: ``conf/<group>: <key>: what is wrong (got X)``, exit 2, no MLflow run.

Most cases compose the real config with Hydra's compose API and run the schema in-process (the
callbacks run the same ``config_schema.check``); four go through the sweep CLI end to end.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import rag_experiments.run.sweep  # noqa: F401 - registers the sample_dir resolver
from rag_experiments.core.conf_groups import conf_dir
from rag_experiments.run.config_schema import ConfigError, check
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args

KEY = "sk-proj-Zx81qQ3lM0vN2bT7yU4wE9rA6sD5fG1hJ0kL"

# (case id, overrides, expected message prefix)
CASES = [
    (
        "chunk-size-0",
        ["chunking=fixed", "chunking.size=0"],
        "conf/chunking: size: must be an integer >= 1 (got 0)",
    ),
    (
        "chunk-size-negative",
        ["chunking=recursive", "chunking.size=-5"],
        "conf/chunking: size: must be an integer >= 1 (got -5)",
    ),
    (
        "overlap-equals-size",
        ["chunking=fixed", "chunking.overlap=800"],
        "conf/chunking: overlap: must be an integer in [0, size=800) (got 800)",
    ),
    (
        "overlap-above-size",
        ["chunking=fixed", "chunking.size=100", "chunking.overlap=150"],
        "conf/chunking: overlap:",
    ),
    ("overlap-negative", ["chunking=fixed", "chunking.overlap=-1"], "conf/chunking: overlap:"),
    (
        "markdown-max-size-0",
        ["chunking.max_size=0"],
        "conf/chunking: max_size: must be an integer >= 1 (got 0)",
    ),
    (
        "sentence-stride-above-window",
        ["chunking=sentence", "chunking.stride=5"],
        "conf/chunking: stride: must be an integer in [1, window=3] (got 5)",
    ),
    (
        "chunk-unit-unknown",
        ["chunking=fixed", "chunking.unit=bytes"],
        "conf/chunking: unit: must be one of chars, tokens (got 'bytes')",
    ),
    ("chunk-size-string", ["chunking=fixed", "chunking.size=big"], "conf/chunking: size: must be an integer"),
    (
        "unknown-chunking-key",
        ["chunking=fixed", "+chunking.sizee=5"],
        "conf/chunking: sizee: unknown option for FixedSizeChunker (got 5)",
    ),
    ("retriever-k-0", ["retriever.k=0"], "conf/retriever: k: must be an integer >= 1 (got 0)"),
    (
        "retriever-k-negative",
        ["retriever=bm25", "retriever.k=-3"],
        "conf/retriever: k: must be an integer >= 1 (got -3)",
    ),
    (
        "bm25-method-unknown",
        ["retriever=bm25", "retriever.method=okapi"],
        "conf/retriever: method: must be one of",
    ),
    (
        "bm25-k1-string",
        ["retriever=bm25", "retriever.k1=not-a-number"],
        "conf/retriever: k1: must be a number > 0",
    ),
    (
        "bm25-b-above-1",
        ["retriever=bm25", "retriever.b=1.5"],
        "conf/retriever: b: must be a number in [0, 1] (got 1.5)",
    ),
    ("hybrid-candidates-0", ["retriever=hybrid", "retriever.candidates=0"], "conf/retriever: candidates:"),
    ("injected-embedder-key", ["+retriever.embedder=x"], "conf/retriever: embedder: is set by the sweep"),
    (
        "metrics-ks-zero",
        ["metrics.ks=[0]"],
        "conf/config: metrics.ks: must be a non-empty list of integers >= 1 (got [0])",
    ),
    ("metrics-ks-empty", ["metrics.ks=[]"], "conf/config: metrics.ks: must be a non-empty list"),
    ("metrics-ks-negative", ["metrics.ks=[5,-1]"], "conf/config: metrics.ks:"),
    (
        "min-coverage-0",
        ["metrics.min_coverage=0"],
        "conf/config: metrics.min_coverage: must be a number in (0, 1]",
    ),
    (
        "bootstrap-resamples-10",
        ["metrics.bootstrap_resamples=10"],
        "conf/config: metrics.bootstrap_resamples: must be an integer >= 100 (CIs need resamples) (got 10)",
    ),
    (
        "threshold-above-1",
        ["attribution.correct=1.5"],
        "conf/attribution: correct: must be a number in [0, 1] (got 1.5)",
    ),
    ("threshold-negative", ["attribution.faithful=-0.1"], "conf/attribution: faithful:"),
    (
        "judge-threshold-above-1",
        ["judge.sim_threshold=2"],
        "conf/judge: sim_threshold: must be a number in [0, 1] (got 2)",
    ),
    (
        "embedding-path-missing",
        ["embedding=local", "embedding.path=/no/such/model"],
        "conf/embedding: path: dir not found (got '/no/such/model')",
    ),
    (
        "gguf-path-missing",
        ["generator.model_path=/no/such.gguf"],
        "conf/generator: model_path: file not found",
    ),
    (
        "judge-gguf-missing",
        ["judge=local", "judge.model_path=/no/judge.gguf"],
        "conf/judge: model_path: file not found",
    ),
    (
        "base-url-no-scheme",
        ["generator=openai", "generator.base_url=localhost:8000/v1"],
        "conf/generator: base_url: must be an http(s) URL",
    ),
    (
        "base-url-ftp",
        ["generator=openai", "generator.base_url=ftp://host/v1"],
        "conf/generator: base_url: must be an http(s) URL",
    ),
    (
        "base-url-bad-port",
        ["generator=openai", "generator.base_url=http://host:99999/v1"],
        "conf/generator: base_url: has an invalid port",
    ),
    ("concurrency-0", ["generator=openai", "generator.concurrency=0"], "conf/generator: concurrency:"),
    ("rpm-0", ["generator=openai", "generator.rpm=0"], "conf/generator: rpm: must be a number in (0, 1000000] or null"),
    ("max-concurrency-0", ["judge=openai", "judge.max_concurrency=0"], "conf/judge: max_concurrency: must be an integer in [1, 1024]"),
    (
        "timeout-0",
        ["generator=openai", "generator.timeout_s=0"],
        "conf/generator: timeout_s: must be a number > 0",
    ),
    (
        "judge-constrained-unknown",
        ["judge=openai", "judge.constrained=grammar"],
        "conf/judge: constrained: must be one of",
    ),
    (
        "api-key-pasted",
        ["generator=openai", f"generator.api_key_env={KEY}"],
        "conf/generator: api_key_env: must be the NAME",
    ),
    (
        "api-key-env-unset",
        ["generator=openai", "generator.api_key_env=RAG_FAULTS_UNSET_KEY"],
        "conf/generator: api_key_env: environment variable RAG_FAULTS_UNSET_KEY is not set",
    ),
    (
        "generator-none-extra-key",
        ["generator=none", "+generator.model=x"],
        "conf/generator: model: unknown option for generator=none",
    ),
    ("evalset-limit-negative", ["evalset.limit=-1"], "conf/evalset: limit: must be an integer >= 1 (got -1)"),
    ("evalset-limit-0", ["evalset.limit=0"], "conf/evalset: limit: must be an integer >= 1 (got 0)"),
    (
        "evalset-path-missing",
        ["evalset=file", "evalset.path=/no/evalset.jsonl"],
        "conf/evalset: path: file not found",
    ),
    ("evalset-path-unset", ["evalset=file"], "conf/evalset: path: missing (set evalset.path=...)"),
    ("corpus-path-missing", ["corpus=dir", "corpus.path=/no/docs"], "conf/corpus: path: path not found"),
    (
        "prompt-context-format",
        ["prompt=concise_tagged", "prompt.context_format=boxed"],
        "conf/prompt: context_format: must be one of plain, tagged (got 'boxed')",
    ),
    (
        "prompt-without-context",
        ["prompt.template='Q: {question}'"],
        "conf/prompt: template: must be a string containing {context} and {question}",
    ),
    ("seed-string", ["seed=abc"], "conf/config: seed: must be an integer"),
    # no hand-written check: the constructor's annotation is the type (config_schema.typed_keys)
    (
        "hnsw-m-string",
        ["retriever=dense", "retriever.hnsw_m=many"],
        "conf/retriever: hnsw_m: must be an integer (got 'many')",
    ),
    (
        "include-original-not-bool",
        ["query=multi_query", "query.include_original=maybe"],
        "conf/query: include_original: must be true or false (got 'maybe')",
    ),
    (
        "verifier-threshold-string",
        ["judge=verifier", "judge.threshold=high"],
        "conf/judge: threshold: must be a number or null (got 'high')",
    ),
]


@pytest.fixture(scope="module")
def composer():
    with initialize_config_dir(str(conf_dir()), version_base="1.3"):
        yield lambda overrides: compose("config", overrides=overrides)


@pytest.mark.parametrize("case,overrides,message", [pytest.param(*c, id=c[0]) for c in CASES])
def test_bad_value_names_group_key_and_value(case, overrides, message, composer, monkeypatch):
    monkeypatch.delenv("RAG_FAULTS_UNSET_KEY", raising=False)
    with pytest.raises(ConfigError) as e:
        check(composer(overrides))
    assert any(p.startswith(message) for p in e.value.problems), (case, e.value.problems)
    assert KEY not in str(e.value)


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["chunking=fixed"],
        ["chunking=sentence", "retriever=bm25"],
        ["retriever=hybrid", "embedding=static"],
        ["judge=local"],
        ["prompt=concise_tagged"],
        ["generator=none"],
        ["generator=openai", "generator.base_url=http://127.0.0.1:9/v1"],
    ],
)
def test_shipped_configs_are_valid(overrides, composer):
    check(composer(overrides))


def test_every_shipped_option_fits_its_constructors_annotations():
    """Each conf/<group>/<option>.yaml value has the type its ``_target_``'s constructor declares
    (interpolations aside), so the typed check cannot refuse a shipped default; and a typed problem
    is one line even when a hand-written check names the key too."""

    import yaml
    from hydra.utils import get_class

    from rag_experiments.run.config_schema import GROUP_CHECKS, _Group
    from rag_experiments.run.config_types import conforms, constructor_hints

    checked = 0
    for f in sorted(conf_dir().glob("*/*.yaml")):
        node = yaml.safe_load(f.read_text()) or {}
        if not node.get("_target_"):
            continue
        hints = constructor_hints(get_class(node["_target_"])) or {}
        for key, value in node.items():
            if key in hints and not (isinstance(value, str) and ("${" in value or value == "???")):
                assert conforms(value, hints[key]), (f.name, key, value, hints[key])
                checked += 1
    assert checked > 100
    g = _Group("chunking", {"_target_": "rag_experiments.stages.chunking.FixedSizeChunker", "size": "big"})
    GROUP_CHECKS["chunking"](g)
    g.typed_keys()
    assert [p for p in g.problems if ": size:" in p] == ["conf/chunking: size: must be an integer >= 1 (got 'big')"]


def _runs(root: Path) -> int:
    db = root / "mlflow.db"
    if not db.exists():
        return 0
    with sqlite3.connect(db) as con:
        try:
            return con.execute("select count(*) from runs").fetchone()[0]
        except sqlite3.OperationalError:
            return 0


@pytest.fixture
def tiny(tmp_path):
    docs, ev = make_tiny(tmp_path)
    return tmp_path, docs, ev


def _sweep(root: Path, docs: Path, ev: Path, *args: str):
    """The sweep CLI on the tiny data; an ``evalset.path=`` in ``args`` replaces the default one."""
    base = sweep_args(root, docs, ev)
    if any(a.startswith("evalset.path=") for a in args):
        base = [a for a in base if not a.startswith("evalset.path=")]
    p = run_sweep(root, *args, *base, check=False)
    return p, _runs(root)


def test_single_run_bad_value_exits_2_before_hydra_outputs(tiny):
    root, docs, ev = tiny
    p, n_runs = _sweep(root, docs, ev, "chunking=fixed", "chunking.overlap=900", "generator=none")
    assert p.returncode == 2, p.stderr[-2000:]
    assert "conf/chunking: overlap: must be an integer in [0, size=800) (got 900)" in p.stderr
    assert "Traceback" not in p.stderr and n_runs == 0
    assert not (root / "outputs" / ".hydra").exists()


def test_multirun_with_one_bad_job_creates_nothing(tiny):
    # the probe's case: the second job's size=0 used to leave the first job's parent RUNNING
    root, docs, ev = tiny
    p, n_runs = _sweep(
        root, docs, ev, "-m", "chunking=fixed", "chunking.size=800,0", "retriever.k=0,5", "generator=none"
    )
    assert p.returncode == 2, p.stderr[-2000:]
    assert "no run was created" in p.stderr
    assert "job chunking=fixed,chunking.size=0" in p.stderr and "conf/chunking: size" in p.stderr
    assert "conf/retriever: k: must be an integer >= 1 (got 0)" in p.stderr
    assert n_runs == 0


def test_multirun_with_one_bad_data_file_creates_nothing(tiny):
    root, docs, ev = tiny
    bad = root / "bad.jsonl"
    bad.write_bytes(ev.read_bytes() + b'{"id": "x", "query": "caf\xe9"}\n' + b"\xff" * 8000 + b"\n")
    p, n_runs = _sweep(root, docs, ev, "-m", f"evalset.path={ev},{bad}", "generator=none")
    assert p.returncode == 2, p.stderr[-2000:]
    assert "bad.jsonl:9: encoding: not valid UTF-8" in p.stderr and "bad.jsonl:10: encoding" in p.stderr
    assert len(p.stderr) < 8000 and n_runs == 0


def test_pasted_api_key_is_rejected_and_never_written(tiny):
    root, docs, ev = tiny
    p, n_runs = _sweep(root, docs, ev, "generator=openai", f"generator.api_key_env={KEY}")
    assert p.returncode == 2 and n_runs == 0
    assert "api_key_env: must be the NAME" in p.stderr
    assert KEY not in p.stdout + p.stderr
    for f in root.rglob("*"):
        if f.is_file():
            assert KEY.encode() not in f.read_bytes(), f


@pytest.mark.parametrize(
    "argv,message",
    [
        (["chunking=fixd"], "conf/chunking: unknown option 'fixd' (options: fixed, fixed_tokens, markdown"),
        (["-m", "retriever=dense,bm2"], "conf/retriever: unknown option 'bm2'"),
        (["+experiment=ablate_chunkin"], "conf/experiment: unknown option 'ablate_chunkin'"),
        (["generator=gpt"], "conf/generator: unknown option 'gpt' (options: local, none, openai)"),
    ],
)
def test_unknown_group_option_is_named(argv, message):
    from rag_experiments.run.sweep import unknown_group_options

    assert any(p.startswith(message) for p in unknown_group_options(argv)), unknown_group_options(argv)


def test_known_options_and_sweep_syntax_pass():
    from rag_experiments.run.sweep import unknown_group_options

    argv = [
        "-m",
        "chunking=fixed,markdown",
        "retriever=choice(dense,bm25)",
        "chunking.size=100,200",
        "hydra.x=1",
    ]
    assert unknown_group_options(argv) == []
    assert unknown_group_options(["chunking=mine", "--config-dir", "/my/conf"]) == []


def test_unknown_option_exits_2_through_the_cli(tmp_path):
    p = run_sweep(tmp_path, "chunking=fixd", check=False)
    assert p.returncode == 2 and "conf/chunking: unknown option 'fixd'" in p.stderr
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "outputs").exists()

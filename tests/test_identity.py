"""Identity is content: model bytes, code and config decide cache keys and resume; places never do."""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from rag_experiments.analysis.attribution import config_diff, is_bookkeeping
from rag_experiments.core import identity
from rag_experiments.core.cache import CachedEmbedder, StageCache, stage_key
from rag_experiments.stages.embedding import SentenceTransformerEmbedder, minilm_path
from rag_experiments.stages.generation import LocalLlamaGenerator, packaged_smollm2
from rag_experiments.tracking.writer import config_hash
from tests.sweep_helpers import REPO, make_tiny, run_sweep, sweep_args

TEXTS = ["webhooks are retried for 24 hours", "rate limits reset every minute"]


def _flip_weight_byte(model_dir: Path) -> None:
    """Flip the sign of one LayerNorm weight of the last layer, in place (same size, new bytes)."""
    st = model_dir / "model.safetensors"
    raw = bytearray(st.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    name = next(k for k in header if k.endswith("encoder.layer.5.output.LayerNorm.weight"))
    assert header[name]["dtype"] == "F32"
    start = 8 + n + header[name]["data_offsets"][0]
    raw[start + 3] ^= 0x80  # little-endian float32: byte 3 holds the sign bit
    st.write_bytes(bytes(raw))


@pytest.fixture(scope="module")
def twin_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    a, b = root / "ckpt_a", root / "ckpt_b"
    shutil.copytree(minilm_path(), a)
    shutil.copytree(minilm_path(), b)
    _flip_weight_byte(b)
    return a, b


def test_same_sized_checkpoints_differing_in_one_byte_miss_the_cache_and_embed_differently(
    twin_models, tmp_path
):
    a, b = twin_models
    sizes = [sorted((p.name, p.stat().st_size) for p in d.rglob("*") if p.is_file()) for d in (a, b)]
    assert sizes[0] == sizes[1], "same names and sizes: only the bytes differ"
    cache = StageCache(tmp_path / "cache")
    ea = CachedEmbedder(SentenceTransformerEmbedder(path=str(a), name="local", show_progress=False), cache)
    eb = CachedEmbedder(SentenceTransformerEmbedder(path=str(b), name="local", show_progress=False), cache)
    assert ea.identity != eb.identity
    va, vb = ea.encode(TEXTS), eb.encode(TEXTS)
    assert cache.stats["vectors.miss"] == 2 and cache.stats["vectors.hit"] == 0
    assert not np.allclose(va, vb, atol=1e-4)
    # the unchanged copy is the packaged MiniLM: same content, other path -> same identity
    packaged = SentenceTransformerEmbedder(name="local", show_progress=False)
    assert packaged.identity == ea.inner.identity
    assert np.allclose(ea.encode(TEXTS), va) and cache.stats["vectors.hit"] == 1


def test_file_hash_is_memoised_and_follows_rewrites(tmp_path, monkeypatch):
    f = tmp_path / "w.bin"
    f.write_bytes(b"\x00" * 1000)
    first = identity.file_sha256(f)
    reads = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda *a, **k: reads.append(a[0]) or real_open(*a, **k))
    assert identity.file_sha256(f) == first and not reads, "second call served from the memo"
    monkeypatch.undo()
    st = f.stat()
    f.write_bytes(b"\x00" * 999 + b"\x01")  # same size, new bytes and mtime
    import os

    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert identity.file_sha256(f) != first


def test_local_generator_identity_is_the_gguf_content_not_its_name(tmp_path):
    src = packaged_smollm2()
    same, changed = tmp_path / "renamed.gguf", tmp_path / "changed.gguf"
    shutil.copyfile(src, same)
    raw = bytearray(src.read_bytes())
    raw[-1] ^= 0xFF
    changed.write_bytes(bytes(raw))
    ids = [LocalLlamaGenerator(model_path=str(p)).identity for p in (src, same, changed)]
    assert ids[0] == ids[1] and ids[0] != ids[2]


def test_code_hash_ignores_comments_and_docstrings_but_not_code(tmp_path):
    m = tmp_path / "m.py"
    m.write_text('"""Doc."""\n\ndef f(x):\n    return x + 1\n')
    h0 = identity.source_hash(m)
    m.write_text(
        '"""Other doc."""\n# a comment\n\n\ndef f(x):  # why\n    """Adds one."""\n    return x + 1\n'
    )
    assert identity.source_hash(m) == h0
    m.write_text('"""Doc."""\n\ndef f(x):\n    return x + 2\n')
    assert identity.source_hash(m) != h0


def test_a_modules_hash_is_kept_per_process_until_a_file_changes(tmp_path, monkeypatch):
    """``stage_key`` asks for it per verdict: kept, and made again only when a file's size or mtime
    changed (an edit of real code changes the hash; the memo never serves a stale one)."""
    pkg = tmp_path / "codeid_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    mod = pkg / "m.py"
    mod.write_text("def f(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    h0 = identity._modules_hash(["codeid_pkg"])
    walks = []
    real = identity.module_files
    monkeypatch.setattr(identity, "module_files", lambda name: walks.append(name) or real(name))
    assert identity._modules_hash(["codeid_pkg"]) == h0 and walks == [], "unchanged files: the kept hash"
    mod.write_text("def f(x):\n    return x + 22\n")
    assert identity._modules_hash(["codeid_pkg"]) != h0 and walks == ["codeid_pkg"]


def test_every_cached_stage_has_a_code_version_and_it_is_in_the_key(monkeypatch):
    for stage in ("chunks", "vectors", "rankings", "generation", "claims", "verdict", "relevance"):
        before = stage_key(stage, "x")
        monkeypatch.setitem(identity.STAGE_CODE, stage, ("rag_experiments.core.types",))
        assert stage_key(stage, "x") != before, stage
    with pytest.raises(KeyError):
        stage_key("no-such-stage", "x")


def test_place_keys_at_any_depth_stay_out_of_config_hash_and_diff():
    cfg = {
        "chunking": {"size": 800},
        "embedding": {"pca_dims": 256, "cache_dir": "/a"},
        "cache_dir": "/a",
        "corpus": {"path": "/data/docs"},
    }
    moved = json.loads(json.dumps(cfg).replace("/a", "/elsewhere").replace("/data/docs", "/mnt/docs"))
    assert config_hash(cfg, "c", "e") == config_hash(moved, "c", "e")
    assert config_hash(cfg, "c", "e") != config_hash({**cfg, "chunking": {"size": 400}}, "c", "e")
    assert config_hash(cfg, "c", "e", {"embedder": "m1"}) != config_hash(cfg, "c", "e", {"embedder": "m2"})
    assert is_bookkeeping("embedding.cache_dir") and is_bookkeeping("hydra.run.dir")
    assert not is_bookkeeping("embedding.pca_dims") and not is_bookkeeping("evalset.limit")
    pa = {"embedding.cache_dir": "/a", "cache_dir": "/a", "embedding.pca_dims": "256"}
    pb = {"embedding.cache_dir": "/b", "cache_dir": "/b", "embedding.pca_dims": "256"}
    assert config_diff(pa, pb) == {}


# ------------------------------------------------------------------------------ real sweeps


def _runs(root: Path):
    c = MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")
    return c, c.search_runs([c.get_experiment_by_name("test").experiment_id], max_results=100)


def _params_of(overrides: list[str]) -> dict[str, str]:
    """The params a job with these overrides logs (flattened resolved config), via Hydra's compose."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import rag_experiments.run.sweep  # noqa: F401  (registers the sample_dir resolver)
    from rag_experiments.tracking.writer import flatten

    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "rag_experiments" / "conf")):
        cfg = compose("config", overrides=[o for o in overrides if not o.startswith("hydra.")])
    params = flatten(OmegaConf.to_container(cfg, resolve=True))
    return {k: v for k, v in params.items() if not k.startswith(("tracking.", "hydra."))}


def test_resume_follows_code_and_ignores_places(tmp_path):
    """A copy of the package in the job's working directory (``python -m`` imports it first) lets
    the test change real stage code between sweeps."""
    pkg = tmp_path / "rag_experiments"
    shutil.copytree(REPO / "rag_experiments", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    chunking = pkg / "stages" / "chunking.py"
    docs, ev = make_tiny(tmp_path, n_items=4)
    base = [a for a in sweep_args(tmp_path, docs, ev) if not a.startswith("cache_dir=")]
    # the static embedder's config holds embedding.cache_dir: ${cache_dir}, a place key one level
    # down; its teacher is MiniLM cut to one layer, so distilling it takes seconds, not a minute
    teacher = tmp_path / "teacher"
    shutil.copytree(minilm_path(), teacher)
    config = json.loads((teacher / "config.json").read_text())
    (teacher / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    base += ["generator=none", "chunking=fixed", "embedding=static", f"embedding.teacher_path={teacher}"]
    first = run_sweep(tmp_path, *base, f"cache_dir={tmp_path}/cache_a")
    assert "[skip]" not in first.stdout and "[rerun]" not in first.stdout
    c, runs = _runs(tmp_path)
    (run,) = runs
    fp = run.data.tags["code_fingerprint"]

    # another cache dir, and an edit of the chunker that changes no code (a comment): skipped
    chunking.write_text(chunking.read_text() + "\n# a comment changes no result\n")
    moved = run_sweep(tmp_path, *base, f"cache_dir={tmp_path}/cache_b")
    assert f": config_hash {run.data.tags['config_hash']} and code_fingerprint {fp} already" in moved.stdout
    # the name is over MLflow's 250 characters (a long temp teacher path): data overrides go first
    assert moved.stdout.startswith("[skip] ")
    assert "generator=none,chunking=fixed,embedding=static" in moved.stdout.splitlines()[0]
    moved_params = {**run.data.params, **_params_of([*base, f"cache_dir={tmp_path}/cache_b"])}
    assert moved_params["embedding.cache_dir"] != run.data.params["embedding.cache_dir"]
    assert config_diff(run.data.params, moved_params) == {}, "a moved cache is no factor"

    chunking.write_text(chunking.read_text() + "\nCODE_CHANGED_BY_TEST = 1\n")
    changed = run_sweep(tmp_path, *base, f"cache_dir={tmp_path}/cache_a")
    m = re.search(r"\[rerun\] .*code changed since run (\w+) \(fingerprint (\w+) -> (\w+)\)", changed.stdout)
    assert m, changed.stdout
    assert m.group(1) == run.info.run_id and m.group(2) == fp and m.group(3) != fp
    assert "'chunks.miss': 1" in changed.stdout, "the chunk cache key follows the chunker's code"
    c, runs = _runs(tmp_path)
    assert len(runs) == 2 and {r.data.tags["code_fingerprint"] for r in runs} == {fp, m.group(3)}


#: ``config_hash`` of bundled configs, recorded before the package layout moved ``_target_`` modules
#: (datasets → evalset, stages.judging → judge, stages.mlflow_judge → tracking): a move must not
#: orphan caches, resume or ``[skip]`` (``identity.LEGACY_TARGETS``).
RECORDED_CONFIG_HASHES = {
    (): "3626bd1ff9a84e04",
    ("judge=verifier",): "5e3d01def5fe3ca7",
    ("judge=mlflow",): "43ae70490c8a9ba6",
    ("judge=cascade",): "316fa2ba01e1ff92",
    ("judge=openai",): "01f8e228996deac4",
    ("judge=local",): "28948a99ee6f2212",
    ("corpus=dir", "corpus.path=/tmp/x"): "452690128c136ea5",
    ("evalset=file", "evalset.path=/tmp/e.jsonl"): "688a4f7ec4bb8b85",
    ("prompt=cite", "retriever=hybrid"): "a3925adaa12690fa",
}


def test_config_hash_unchanged_by_the_package_layout():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rag_experiments.core.identity import hashed_target

    got = {}
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "rag_experiments" / "conf")):
        for overrides in RECORDED_CONFIG_HASHES:
            cfg = OmegaConf.to_container(compose("config", overrides=list(overrides)), resolve=False)
            got[overrides] = config_hash(cfg, "c", "e")
    assert got == RECORDED_CONFIG_HASHES
    assert hashed_target("rag_experiments.judge.HeuristicJudge") == "rag_experiments.stages.judging.HeuristicJudge"
    assert hashed_target("rag_experiments.stages.chunking.FixedSizeChunker").endswith("chunking.FixedSizeChunker")


def test_every_module_that_runs_a_step_is_result_code():
    """A step's code decides the per-query table: a module defining one that RESULT_CODE leaves
    out would let an edit of it reuse (``[skip]``) runs its old code computed."""
    import ast

    from rag_experiments.core.identity import RESULT_CODE

    pkg = Path(__file__).resolve().parents[1] / "rag_experiments"
    missing = []
    for path in sorted(pkg.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        runs_a_step = any(
            isinstance(f, ast.FunctionDef) and f.name == "run" and [a.arg for a in f.args.args][:2] == ["self", "st"]
            for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body
        )  # fmt: skip
        mod = ".".join(path.relative_to(pkg.parent).with_suffix("").parts)
        if runs_a_step and not any(mod == r or mod.startswith(r + ".") for r in RESULT_CODE):
            missing.append(mod)
    assert missing == []

"""A full disk under the stage cache: a StorageError naming the file, the temp file removed, the
run FAILED, exit 2. Before, the sparse vector memmap turned ENOSPC into a SIGBUS (nothing printed,
run left RUNNING, an orphan ``.tmp``).

The real fault is a tiny tmpfs (needs root to mount); ``posix_fallocate`` failing with ENOSPC is
injected as well, so the path is covered wherever the suite runs."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from tests.sweep_helpers import make_tiny, run_sweep, sweep_args


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)]).returncode == 0


@pytest.fixture
def full_disk(tmp_path):
    """A directory on a 256 KiB tmpfs."""
    where = tmp_path / "small"
    if not _mount_tmpfs(where, "256k"):
        pytest.skip("mounting a tmpfs needs root (the injected-ENOSPC test covers the path)")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


def _leave_free(where: Path, nbytes: int) -> None:
    """Fill the file system at ``where`` until ``nbytes`` are left."""
    st = os.statvfs(where)
    (where / "filler").write_bytes(bytes(max(0, st.f_bavail * st.f_frsize - nbytes)))


def _leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".tmp")]


def test_fallocate_enospc_is_a_storage_error_naming_the_file(tmp_path, monkeypatch):
    from rag_experiments.core.cache_files import StorageError
    from rag_experiments.stages import vector_store

    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    target = tmp_path / "vectors_mm" / "ab" / "abcd.npy"
    with pytest.raises(StorageError) as err:
        vector_store.embed_to_memmap(
            lambda b: np.ones((len(b), 8), np.float32), ["x"] * 50, target, "float32", 16
        )
    assert str(target) in str(err.value) and "no space left" in str(err.value)
    assert err.value.errno == errno.ENOSPC
    assert not _leftovers(tmp_path) and not list(target.parent.iterdir())


FILL = """
import sys, numpy as np
from pathlib import Path
from rag_experiments.core.cache_files import StorageError
from rag_experiments.stages.vector_store import embed_to_memmap
try:
    embed_to_memmap(lambda b: np.ones((len(b), 384), np.float32), ["x"] * 4000, Path(sys.argv[1]), "float32", 500)
except StorageError as e:
    print("STORAGE", e)
"""


def test_memmap_on_a_full_tmpfs_raises_instead_of_sigbus(full_disk):
    target = full_disk / "vectors_mm" / "ab" / "abcd.npy"  # 6 MB of vectors into 256 KiB
    p = subprocess.run([sys.executable, "-c", FILL, str(target)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"exit {p.returncode} (SIGBUS is -7): {p.stderr[-1500:]}"
    assert f"STORAGE cannot write vector file {target}: no space left on device" in p.stdout, p.stdout
    assert not _leftovers(full_disk)


def test_sweep_on_a_full_disk_fails_with_exit_2(tmp_path, full_disk):
    docs, ev = make_tiny(tmp_path, n_items=3)
    _leave_free(full_disk, 36 * 1024)  # the chunks (20 KB) fit, the vectors (57 KB) do not
    args = [a for a in sweep_args(tmp_path, docs, ev) if not a.startswith("cache_dir=")]
    p = run_sweep(
        tmp_path,
        *args,
        f"cache_dir={full_disk}/cache",
        "generator=none",
        "retriever=dense",
        "retriever.embed_batch=4096",
        check=False,
        timeout=600,
    )
    assert p.returncode == 2, f"exit {p.returncode}\n{p.stderr[-2000:]}"
    assert "no space left on device" in p.stderr and f"{full_disk}/cache/vectors_mm/" in p.stderr, p.stderr[
        -2000:
    ]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("test").experiment_id])
    assert run.info.status == "FAILED" and "no space left" in run.data.tags["error"]
    assert not _leftovers(full_disk)

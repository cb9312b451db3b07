"""scripts/uv_args.py: pip's configuration, as `pip config list` prints it, handed to uv (setup.sh)."""

from __future__ import annotations

import importlib.util

from tests.sweep_helpers import REPO

_spec = importlib.util.spec_from_file_location("uv_args", REPO / "scripts" / "uv_args.py")
uv_args_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(uv_args_mod)

LISTING = """\
:env:.find-links='/opt/wheels /more/wheels'
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/ignored/by/env'
global.index-url='https://global.example/simple'
install.index-url='https://install.example/simple'
"""


def test_the_environment_wins_over_files_and_install_over_global():
    conf = uv_args_mod.pip_config(LISTING)
    assert conf["find-links"] == "/opt/wheels /more/wheels"
    assert conf["index-url"] == "https://install.example/simple"
    assert conf["cert"] == "/etc/ssl/certs/ca-certificates.crt"


def test_every_value_becomes_its_uv_flag_and_the_cert_a_variable():
    args = uv_args_mod.uv_args(uv_args_mod.pip_config(LISTING))
    assert args == [
        "--index-url", "https://install.example/simple",
        "--extra-index-url", "file:///opt/pypi/simple",
        "--extra-index-url", "file:///opt/pypi-more/simple",
        "--find-links", "/opt/wheels",
        "--find-links", "/more/wheels",
        "--constraints", "/etc/xdg/pip/constraints.txt",
        "--index-strategy", "unsafe-best-match",  # pip: the best version from all indexes
        "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
    ]  # fmt: skip


def test_no_configuration_gives_no_arguments():
    assert uv_args_mod.uv_args(uv_args_mod.pip_config("")) == []
    assert uv_args_mod.uv_args({"no-index": "true"}) == ["--no-index"]

"""Issue 31 item 9: an escaped ``\\${…}`` in a config string is resolved once, as OmegaConf
documents: the built stage holds the literal ``${…}`` the logged config.yaml shows, never a
second resolution (a traceback, or a prompt that differs from the log)."""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rag_experiments.core.build import build
from rag_experiments.run.assemble import instantiate
from tests.sweep_helpers import REPO


def _cfg(*overrides: str):
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "rag_experiments" / "conf")):
        return compose("config", overrides=list(overrides))


def test_escaped_interpolation_in_a_prompt_stays_literal() -> None:
    cfg = _cfg(r"prompt.system=Use \${HOME} and \${oc.env:USER} literally")
    prompt = instantiate(cfg.prompt)  # hydra.utils.instantiate raised InterpolationKeyError here
    assert prompt.system == "Use ${HOME} and ${oc.env:USER} literally"
    # what the run logs as config.yaml, resolved: the same text
    assert OmegaConf.to_container(cfg, resolve=True)["prompt"]["system"] == prompt.system


def test_plain_interpolations_still_resolve() -> None:
    cfg = _cfg("corpus=sample")
    corpus = instantiate(cfg.corpus)
    assert "${" not in str(corpus.path)


def test_build_nested_targets_and_kwargs() -> None:
    node = {
        "_target_": "collections.OrderedDict",
        "inner": {"_target_": "fractions.Fraction", "numerator": 1, "denominator": 4},
        "text": "${not.resolved}",
        "items": [{"_target_": "fractions.Fraction", "numerator": 2}],
    }
    out = build(node, extra=3)
    assert str(out["inner"]) == "1/4" and out["text"] == "${not.resolved}"
    assert str(out["items"][0]) == "2" and out["extra"] == 3

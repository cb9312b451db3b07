"""The default config's values, for the default baseline (``analysis.baseline``): Hydra composes
``conf/config.yaml`` here, in ``run/``, and the readers pass plain values down."""

from __future__ import annotations

from collections.abc import Sequence


def default_levels(factors: Sequence[str]) -> dict[str, str]:
    """The value of each factor in the default config: ``conf/config.yaml`` composed by Hydra with
    no overrides. A group (``prompt``) gives its default option (``concise``), a key
    (``retriever.k``) its value (``5``) as a string; a factor the default config lacks, or whose
    value is a list or mapping, is left out (no config is at its default)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import DictConfig, ListConfig, OmegaConf

    from rag_experiments.core.conf_groups import conf_dir

    if GlobalHydra.instance().is_initialized():  # inside a Hydra app: compose with its search path
        cfg = compose(config_name="config", return_hydra_config=True)
    else:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            cfg = compose(config_name="config", return_hydra_config=True)
    choices = cfg.hydra.runtime.choices
    out = {}
    for f in factors:
        if f in choices:
            out[f] = str(choices[f])
            continue
        # interpolations (${sample_dir:}) need resolvers this process may not have: unresolved = absent
        v = OmegaConf.select(cfg, f, default=None, throw_on_missing=False, throw_on_resolution_failure=False)
        if v is not None and not isinstance(v, DictConfig | ListConfig):
            out[f] = str(v)
    return out

"""The Metric definitions and Reproducibility sections: where every number came from."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rag_experiments.core import slots
from rag_experiments.core.run_record import parse_json
from rag_experiments.core.sanitize import shell_line
from rag_experiments.report.load import Config
from rag_experiments.report.model import (
    Analysis,
    Bullets,
    CodeBlock,
    Paragraph,
    Section,
    Subsection,
    Table,
    code,
    metric_definitions,
    table,
    text,
)


def definitions(an: Analysis) -> Section:
    """The docstring of every function that computed a reported number, verbatim."""
    s = Section("definitions", "Metric definitions")
    s.blocks.append(
        Paragraph(text("The docstrings of the functions that computed every number above, verbatim."))
    )
    judge_choice = an.configs[0].params.get("judge") if an.gen else None
    logged = {key for c in an.configs for key in c.metrics}
    for name, doc in metric_definitions(logged, judge_choice):
        s.subsections.append(Subsection(name, [CodeBlock(doc)]))
    return s


def reproduce_command(c: Config) -> str:
    """The sweep command that reruns this config alone (its logged Hydra overrides)."""
    ov = parse_json(c.tags.get("overrides"), [])
    return "python -m rag_experiments.sweep " + shell_line(o for o in ov if isinstance(o, str))


def constant_or_per_config(configs: Sequence[Config], get: Callable[[Config], str | None]) -> str:
    """The one value every config has, ``–`` if none has it, else ``label: value; …``."""
    vals = [get(c) for c in configs]
    uniq = sorted({v for v in vals if v})
    if len(uniq) <= 1:
        return uniq[0] if uniq else "–"
    return "; ".join(f"{c.label}: {v or '–'}" for c, v in zip(configs, vals, strict=True))


def _tag(key: str) -> Callable[[Config], str | None]:
    return lambda c: c.tags.get(key)


def _identity(an: Analysis) -> Bullets:
    configs, t = an.configs, an.inp.target
    ptags = t.parent.tags if t.parent is not None else configs[0].tags
    commit = constant_or_per_config(configs, _tag("git_commit"))
    dirty = constant_or_per_config(configs, _tag("git_dirty"))
    run_kind = "sweep parent run" if an.inp.is_sweep else "run"
    items = [
        text(
            "git commit: ",
            code(ptags.get("git_commit", commit)),
            f" (dirty: {ptags.get('git_dirty', dirty)})",
        ),
        text("corpus digest: ", code(constant_or_per_config(configs, _tag("corpus_digest")))),
        text("eval-set digest: ", code(constant_or_per_config(configs, _tag("evalset_digest")))),
        text(
            "MLflow experiment: ",
            code(an.inp.experiment_name),
            f" ({configs[0].run.experiment_id}); {run_kind} ",
            code(t.log_run_id),
        ),
    ]
    if commit != ptags.get("git_commit", commit):
        items.append(text(f"children's git commit(s): {commit}"))
    return Bullets(items)


def _models(an: Analysis) -> Table:
    """The stages of each config, as logged: embedding, retriever, the query transform and the
    reranker when any config has one, generator and judge (columns from ``core.slots``)."""
    shown = [s for s in slots.SLOTS if s.group not in ("chunking", "prompt") and (  # chunking and prompt: own tables
        not s.optional or s.name in ("generator", "judge")
        or any(c.params.get(s.group, "none") != "none" for c in an.configs))]  # fmt: skip
    rows = []
    for c in an.configs:
        p, t = c.params, c.tags
        cells = {
            "embedding": ", ".join(
                f"{k}={v}"
                for k, v in sorted(p.items())
                if k == "embedding" or (k.startswith("embedding.") and k != "embedding._target_")
            ) or "–",
            "retriever": f"{p.get('retriever', '–')} (k={p.get('retriever.k', '–')})",
        }
        if an.gen:
            jm = t.get("judge_model")
            jm = jm if jm and jm != "None" else p.get("judge", "–")
            jparams = ", ".join(
                f"{k[len('judge.') :]}={v}"
                for k, v in sorted(p.items())
                if k.startswith("judge.") and k != "judge._target_"
            )
            judge = f"{jm} ({jparams})" if jparams else jm
            if t.get("judge_is_generator") == "true":
                judge += " (same as generator!)"
            cells.update(judge=judge, generator=t.get("generator_model") or p.get("generator", "–"))
        else:
            cells.update(judge="– (retrieval only)", generator=p.get("generator", "none"))
        rows.append([c.label, *(cells.get(s.group, p.get(s.group, "none")) for s in shown)])
    return table(["config", *(s.group for s in shown)], rows)


def _versions(configs: Sequence[Config]) -> Table:
    pkgs = sorted({k[len("version.") :] for c in configs for k in c.tags if k.startswith("version.")})
    rows = [[pkg, constant_or_per_config(configs, _tag(f"version.{pkg}"))] for pkg in pkgs]
    return table(["package", "version"], rows or [["–", "not logged"]])


def _commands(an: Analysis) -> list:
    t = an.inp.target
    ptags = t.parent.tags if t.parent is not None else an.configs[0].tags
    out: list = []
    if an.inp.is_sweep:
        out.append(Paragraph(text("The sweep, exactly as launched (parent run tag ", code("command"), "):")))
        out.append(CodeBlock(ptags.get("command") or "(not logged)"))
    out.append(
        Paragraph(
            text(
                "Each config on its own (its Hydra overrides; add ",
                code("force=true"),
                " to recompute a config that already FINISHED in this tracking store):",
            )
        )
    )
    out.append(CodeBlock("\n".join(f"# {c.label}\n{reproduce_command(c)}" for c in an.configs)))
    return out


def reproducibility(an: Analysis) -> Section:
    """Commit, data digests, models, package versions, commands, cache keys: enough to rerun it."""
    configs = an.configs
    s = Section("reproducibility", "Reproducibility", [_identity(an)])
    s.subsections.append(Subsection("Models", [_models(an)]))
    s.subsections.append(Subsection("Package versions", [_versions(configs)]))
    s.subsections.append(Subsection("Commands", _commands(an)))
    ck_names = sorted({k for c in configs for k in c.tags if k.startswith("cache_key.")})
    rows = [
        [c.label, c.tags.get("config_hash", "–"), *(c.tags.get(k, "–") for k in ck_names)] for c in configs
    ]
    s.subsections.append(
        Subsection("Cache keys and config hashes", [table(["config", "config_hash", *ck_names], rows)])
    )
    return s

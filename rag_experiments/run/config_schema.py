"""One validator per config group, run before any MLflow run (or Hydra output) is created.

Every problem becomes one line ``conf/<group>: <key>: what is wrong (got X)``; the sweep prints
them all and exits 2. The checks are about values a stage cannot work with (sizes <= 0, overlap
>= size, k <= 0, thresholds outside [0, 1], paths that do not exist, malformed URLs, keys the
stage's constructor does not take), so a typo costs a message, not a FAILED run.
:func:`unknown_group_options` checks ``group=option`` on the command line before Hydra composes.

Every group with a ``_target_`` is checked against its constructor (its keys and their types,
``config_types.constructor_hints``); :data:`GROUP_CHECKS` holds only the range and cross-field
rules a group adds. The endpoint settings' rules, the same for every group that holds them, are
``run.endpoint_checks``'.

Why this module is long: it is one validator per config group and the cross-field rules, read top
to bottom like the config tree; split, a group's rules would live in two places.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rag_experiments.core.conf_groups import conf_dir
from rag_experiments.core.identity import UNUSED_WHEN_NONE
from rag_experiments.core.slots import SLOTS
from rag_experiments.evaluation.defaults import RANK_DEPTH, TOKEN_BUDGETS, metrics_problems
from rag_experiments.run.config_keys import constructor_key_problems
from rag_experiments.run.config_types import conforms, constructor_hints, describe
from rag_experiments.run.config_types import is_int as _is_int
from rag_experiments.run.config_types import is_num as _is_num
from rag_experiments.run.endpoint_checks import (
    budget_problems,
    embedding_endpoint_problems,
    endpoint_problems,
)
from rag_experiments.stages.prompts import CONTEXT_FORMATS

Problems = list[str]
BM25_METHODS = ("robertson", "lucene", "bm25l", "bm25+", "atire")
FUSIONS = ("rrf", "weighted")  # retriever=hybrid (stages.retrieval.HybridRetriever)
CONSTRAINED = ("response_format", "json_schema", "none")
MIN_RESAMPLES = 100


class ConfigError(ValueError):
    """Every problem found in a config, one ``conf/<group>: <key>: …`` per line."""

    def __init__(self, problems: Problems):
        self.problems = problems
        super().__init__("\n".join(problems))


class _Group:
    """Collects problems for one group: ``g.positive_int("size")`` etc."""

    def __init__(self, name: str, node: dict):
        self.name, self.node, self.problems = name, node or {}, []
        self.checked: set[str] = set()  # keys a hand-written check owns (typed_keys leaves them)

    def bad(self, key: str, what: str, got: Any = None, show: bool = True) -> None:
        self.checked.add(key)
        tail = f" (got {got!r})" if show else ""
        self.problems.append(f"conf/{self.name}: {key}: {what}{tail}")

    def has(self, key: str) -> bool:
        return key in self.node and self.node[key] is not None

    def int_at_least(self, key: str, low: int) -> None:
        self.checked.add(key)
        if self.has(key):
            v = self.node[key]
            if not _is_int(v) or v < low:
                self.bad(key, f"must be an integer >= {low}", v)

    def num_in(self, key: str, low: float, high: float, low_open: bool = False) -> None:
        self.checked.add(key)
        if self.has(key):
            v = self.node[key]
            ok = _is_num(v) and (v > low if low_open else v >= low) and v <= high
            if not ok:
                self.bad(key, f"must be a number in {'(' if low_open else '['}{low}, {high}]", v)

    def num_at_least(self, key: str, low: float, strict: bool = False) -> None:
        self.checked.add(key)
        if self.has(key):
            v = self.node[key]
            if not _is_num(v) or v < low or (strict and v == low):
                self.bad(key, f"must be a number {'>' if strict else '>='} {low}", v)

    def one_of(self, key: str, options: tuple) -> None:
        self.checked.add(key)
        if self.has(key) and self.node[key] not in options:
            self.bad(key, f"must be one of {', '.join(map(str, options))}", self.node[key])

    def overlap_below(self, size_key: str) -> None:
        self.checked.add("overlap")
        size, overlap = self.node.get(size_key), self.node.get("overlap")
        if _is_int(size) and size > 0 and self.has("overlap"):
            if not _is_int(overlap) or not 0 <= overlap < size:
                self.bad("overlap", f"must be an integer in [0, {size_key}={size})", overlap)

    def path_exists(self, key: str, kind: str) -> None:
        self.checked.add(key)
        if not self.has(key):
            return
        p = Path(os.path.expanduser(str(self.node[key])))
        ok = p.is_dir() if kind == "dir" else p.is_file() if kind == "file" else p.exists()
        if not ok:
            self.bad(key, f"{kind if kind != 'any' else 'path'} not found", str(self.node[key]))

    def known_keys(self, extra: set[str] = frozenset()) -> None:
        """Keys the ``_target_``'s constructor does not take (typos, ``+chunking.sizee=5``):
        ``config_keys.constructor_key_problems``, with a "did you mean"."""
        for key, what in constructor_key_problems(self.name, self.node, extra):
            self.bad(key, what, show=False)

    def typed_keys(self) -> None:
        """Every key's value against the type its ``_target_``'s constructor declares for it
        (``config_types.constructor_hints``: int, float, bool, str, Literal, unions with None,
        lists, tuples, mappings; the endpoint settings' fields), so an implementation's annotated
        signature is its typed config. Keys a hand-written check owns (ranges, paths, URLs,
        ``api_key_env``'s null) are left to it: one rule per key, one line per problem."""
        target = self.node.get("_target_")
        if not target:
            return
        from hydra.utils import get_class

        try:
            hints = constructor_hints(get_class(target)) or {}
        except Exception:  # noqa: BLE001 - an unimportable target is reported by known_keys
            return
        for key, value in self.node.items():
            if key in hints and key not in self.checked and not conforms(value, hints[key]):
                self.bad(key, f"must be {describe(hints[key])}", value)


def _corpus(g: _Group) -> None:
    if not g.has("path") or not str(g.node["path"]).strip():
        g.bad("path", "missing (set corpus.path=...)", g.node.get("path"))
    else:
        g.path_exists("path", "any")


def _evalset(g: _Group) -> None:
    if not g.has("path") or not str(g.node["path"]).strip():
        g.bad("path", "missing (set evalset.path=...)", g.node.get("path"))
    else:
        g.path_exists("path", "file")
    g.int_at_least("limit", 1)


def _chunking(g: _Group) -> None:
    for key in ("size", "max_size", "window"):
        g.int_at_least(key, 1)
    g.overlap_below("max_size" if "max_size" in g.node else "size")
    g.one_of("unit", ("chars", "tokens"))
    window = g.node.get("window")
    if g.has("stride") and _is_int(window) and window > 0:
        s = g.node["stride"]
        if not _is_int(s) or not 1 <= s <= window:
            g.bad("stride", f"must be an integer in [1, window={window}]", s)


def _embedding(g: _Group) -> None:
    if embedding_endpoint_problems(g):  # embedding=openai: its keys, then one probe request
        return
    g.path_exists("path", "dir")
    g.path_exists("teacher_path", "dir")
    g.int_at_least("batch_size", 1)
    g.int_at_least("pca_dims", 1)
    g.int_at_least("max_seq_length", 1)
    if "ray" in g.node and str(g.node["ray"]).lower() not in ("auto", "true", "false"):
        g.bad("ray", "must be one of auto, true, false", g.node["ray"])
    g.int_at_least("ray_min_chunks", 1)
    g.int_at_least("ray_concurrency", 1)


def _retriever(g: _Group) -> None:
    if not g.has("k"):
        g.bad("k", "missing (chunks handed to the generator)", g.node.get("k"))
    g.int_at_least("k", 1)
    g.num_at_least("k1", 0, strict=True)
    g.num_in("b", 0, 1)
    g.one_of("method", BM25_METHODS)
    g.num_at_least("dense_weight", 0)
    g.num_at_least("bm25_weight", 0)
    g.num_at_least("rrf_c", 0, strict=True)
    g.one_of("fusion", FUSIONS)
    g.num_in("alpha", 0, 1)
    g.int_at_least("candidates", 1)
    g.int_at_least("batch_size", 1)


def _rerank(g: _Group) -> None:
    """conf/rerank: ``candidates`` (>= retriever.k: checked in :func:`validate`), a cross-encoder
    directory, an endpoint URL, the bi-encoder node of rerank=dense (``embedding.*``)."""
    if not g.node.get("_target_"):
        for key in g.node:
            if key != "name":
                g.bad(key, "unknown option for rerank=none", g.node[key])
        return
    g.int_at_least("candidates", 1)
    g.int_at_least("batch_size", 1)
    g.int_at_least("max_length", 1)
    if str(g.node["_target_"]).endswith(".CrossEncoderReranker") and g.has("path"):
        g.path_exists("path", "dir")
        from rag_experiments.stages.rerank import is_cross_encoder

        path = os.path.expanduser(str(g.node["path"]))
        if os.path.isdir(path) and not is_cross_encoder(path):
            g.bad("path", "not a cross-encoder (its config.json names no *ForSequenceClassification "
                  "architecture; a bi-encoder belongs in rerank=dense)", str(g.node["path"]))
    if "prompt" in g.node and not all(f in str(g.node["prompt"]) for f in ("{query}", "{passage}")):
        g.bad("prompt", "must contain {query} and {passage}", str(g.node["prompt"])[:60])
    emb = g.node.get("embedding")
    if emb is not None:
        if not isinstance(emb, dict) or not emb.get("_target_"):
            g.bad("embedding", "must be an embedding option's node with a _target_", emb)
            return
        e = _Group("embedding", emb)
        _check(e, _embedding)
        g.problems += [p.replace("conf/embedding: ", "conf/rerank: embedding.") for p in e.problems]


def _query(g: _Group) -> None:
    """conf/query: ``n`` >= 1, ``query_weight`` in [0, 1], ``rrf_c`` > 0, a ``prompt`` with its
    placeholders, and an ``llm`` node checked like the generator group (``query.llm.*``). Without
    an ``llm`` the run's generator is called: generator=none is refused in :func:`_query_llm`."""
    if not g.node.get("_target_"):
        for key in g.node:
            if key not in ("name", "llm"):  # llm: unused (a sweep -m query=none,hyde shares it)
                g.bad(key, f"unknown option for {g.name}={g.node.get('name', 'none')}", g.node[key])
        return
    g.int_at_least("n", 1)
    g.num_in("query_weight", 0, 1)
    g.num_at_least("rrf_c", 0, strict=True)
    if g.has("prompt"):
        kind = str(g.node["_target_"]).rsplit(".", 1)[-1]
        need = ("{question}", "{n}") if kind == "MultiQuery" else ("{question}",)
        if not isinstance(g.node["prompt"], str) or not all(f in g.node["prompt"] for f in need):
            g.bad("prompt", f"must be a string containing {' and '.join(need)}", str(g.node["prompt"])[:60])
    _llm_node(g)


def _llm_node(g: _Group) -> None:
    """An ``llm`` node (query, history) is checked like the generator group (``<group>.llm.*``)."""
    llm = g.node.get("llm")
    if llm is not None:
        if not isinstance(llm, dict) or not llm.get("_target_"):
            g.bad("llm", f"must be a generator option's node with a _target_ (+generator@{g.name}.llm=local)", llm)
            return
        e = _Group("generator", llm)
        _check(e, _generator)
        g.problems += [p.replace("conf/generator: ", f"conf/{g.name}: llm.") for p in e.problems]


def _history(g: _Group) -> None:
    """conf/history (docs/conversations.md): ``turns`` >= 1, a rewrite ``prompt`` with
    ``{question}`` (the conversation), an ``llm`` node like the query transform's."""
    _query(g)
    g.int_at_least("turns", 1)


def _query_llm(cfg: dict) -> Problems:
    """A query transform or a history rewrite calls the run's generator unless it has an ``llm``
    of its own."""
    if (cfg.get("generator") or {}).get("_target_"):
        return []
    problems = []
    for group in ("query", "history"):
        node = cfg.get(group) or {}
        if isinstance(node, dict) and node.get("_target_") and node.get("llm") is None and (
            group == "query" or str(node["_target_"]).endswith(".HistoryRewrite")
        ):
            problems.append(
                f"conf/{group}: llm: missing: with generator=none the "
                f"{'transform' if group == 'query' else 'history rewrite'} needs a chat model of its own "
                f"(e.g. +generator@{group}.llm=local, or +generator@{group}.llm=openai {group}.llm.model=...)"
            )
    return problems


def _local_model(g: _Group) -> None:
    """A chat model's keys besides the endpoint settings (``run.endpoint_checks``): the llama.cpp
    server's, the answer cap, the judge's questions."""
    g.path_exists("model_path", "file")
    for key in ("ctx_size", "n_threads", "n_parallel", "n_questions"):
        g.int_at_least(key, 1)


def _generator(g: _Group) -> None:
    if not g.node.get("_target_"):
        for key in g.node:
            if key != "name":
                g.bad(key, "unknown option for generator=none", g.node[key])
        return
    _local_model(g)


def _judge(g: _Group) -> None:
    for key in ("sim_threshold", "coverage_threshold", "entity_threshold"):
        g.num_in(key, 0, 1)
    g.int_at_least("repeats", 1)
    g.one_of("constrained", CONSTRAINED)
    if g.node.get("fold") is True and g.node.get("decompose") is False:  # judge.llm.LLMJudge
        g.bad("fold", "needs judge.decompose=true: the folded call lists the answer's claims", True)
    if "band" in g.node:  # judge=cascade
        band = g.node["band"]
        ok = isinstance(band, list) and len(band) == 2 and all(isinstance(x, int | float) for x in band)
        if not ok or not 0 <= band[0] <= band[1] <= 1:
            g.bad("band", "must be [lo, hi] with 0 <= lo <= hi <= 1 (P(supported) escalated to the LLM)", band)
    nested = isinstance(g.node.get("verifier"), dict)  # judge=cascade holds its verifier's keys
    verifier = g.node["verifier"] if nested else g.node
    if verifier.get("precision") is not None:  # judge=verifier (or the cascade's verifier)
        from rag_experiments.judge.token_pass import PRECISIONS

        if verifier["precision"] not in PRECISIONS:
            key = "verifier.precision" if nested else "precision"
            g.bad(key, f"must be one of {', '.join(PRECISIONS)} (the verifier's MiniLM pass)", verifier["precision"])
    if str(g.node.get("_target_") or "").endswith(".MLflowJudge"):
        _mlflow_judge(g)
    _local_model(g)


def _mlflow_judge(g: _Group) -> None:
    """judge=mlflow: ``model`` is required with ``base_url`` (unused without: the GGUF names it);
    a model *name*, since the judge builds MLflow's ``openai:/<model>`` URI itself."""
    model = g.node.get("model")
    if g.has("base_url"):
        if not str(model or "").strip():
            g.bad(
                "model",
                "missing: the model name the endpoint at base_url serves (set judge.model=...)",
                model,
            )
        elif ":/" in str(model):
            g.bad("model", "must be a model name; the judge builds the MLflow URI openai:/<model>", model)
    g.checked.add("model")


def _prompt(g: _Group) -> None:
    if str(g.node.get("_target_", "")).endswith(".RegisteredPrompt"):  # prompt=registry
        _registered_prompt(g)
        return
    tpl = g.node.get("template")
    if not isinstance(tpl, str) or "{context}" not in tpl or "{question}" not in tpl:
        g.bad("template", "must be a string containing {context} and {question}", str(tpl)[:60])
    fmt = g.node.get("context_format", "plain")
    if fmt not in CONTEXT_FORMATS:  # stages/prompts.py: how passages are rendered into {context}
        g.bad("context_format", f"must be one of {', '.join(CONTEXT_FORMATS)}", fmt)
    for key in ("system", "template"):  # {{ }} is MLflow's variable syntax (the Prompt Registry)
        if any(b in str(g.node.get(key) or "") for b in ("{{", "}}")):
            g.bad(key, "must not contain {{ or }} (MLflow's prompt variable syntax)", str(g.node[key])[:60])


def _registered_prompt(g: _Group) -> None:
    if not str(g.node.get("name") or "").strip():
        g.bad("name", "missing: a prompt in MLflow's Prompt Registry (prompt.name=rag-experiments.concise)", None)
    version, alias = g.node.get("version"), g.node.get("alias")
    if version is not None and (not _is_int(version) or version < 1):
        g.bad("version", "must be a version number >= 1", version)
    if alias is not None and not str(alias).strip():
        g.bad("alias", "must be a non-empty alias", alias)
    if (version is None) == (alias is None):
        g.bad("version", "set exactly one of prompt.version=N or prompt.alias=NAME (alias latest: the newest)", version)


def _attribution(g: _Group) -> None:
    for key in ("correct", "faithful"):
        g.num_in(key, 0, 1)


def _metrics(g: _Group) -> None:
    ks = g.node.get("ks")
    if not isinstance(ks, list) or not ks or not all(_is_int(k) and k >= 1 for k in ks):
        g.bad("ks", "must be a non-empty list of integers >= 1", ks)
    g.num_in("min_coverage", 0, 1, low_open=True)
    depth, budgets = g.node.get("rank_depth", RANK_DEPTH), g.node.get("token_budgets", TOKEN_BUDGETS)
    g.problems += [f"conf/config: {p}" for p in metrics_problems(rank_depth=depth, token_budgets=budgets)]
    v = g.node.get("bootstrap_resamples")
    if not _is_int(v) or v < MIN_RESAMPLES:
        g.bad("bootstrap_resamples", f"must be an integer >= {MIN_RESAMPLES} (CIs need resamples)", v)


def _shared_rules(g: _Group) -> None:
    """The keys every group shares the meaning of, in range wherever they appear unless the group's
    own rule checked them: the endpoint settings (``run.endpoint_checks``, docs/endpoints.md) and
    the answer cap. So a group no rule lists (``app``, a slot added by the recipe) needs no line
    here."""
    if "max_answer_chars" not in g.checked and g.node.get("max_answer_chars") is not None:  # null: the default cap
        g.int_at_least("max_answer_chars", 1)
    endpoint_problems(g)


def _run_keys(group: str) -> set[str]:
    """Keys the run reads from a group itself, besides its constructor's: a priced slot's
    ``pricing`` (cost_usd, the budget), a judging slot's ``repeats`` (judge/repeats.py), a slot's
    model unused when it is off (``core.identity.UNUSED_WHEN_NONE``)."""
    keys = set(UNUSED_WHEN_NONE.get(group, ()))
    for s in SLOTS:
        if s.group == group:
            keys |= {"pricing"} if s.priced else set()
            keys |= {"repeats"} if s.phase == "judging" else set()
    return keys


def _check(g: _Group, rule: Callable[[_Group], None]) -> None:
    """A group's node: its range rule, the shared rules, its constructor's keys and their types."""
    rule(g)
    _shared_rules(g)
    g.known_keys(extra=_run_keys(g.name))
    g.typed_keys()


#: Range and cross-field rules per group. Every group with a ``_target_`` (these and any other, such
#: as a group added by the slot recipe) is also checked against its constructor in :func:`validate`:
#: unknown keys and value types, with no line here.
GROUP_CHECKS: dict[str, Callable[[_Group], None]] = {
    "corpus": _corpus,
    "evalset": _evalset,
    "chunking": _chunking,
    "embedding": _embedding,
    "retriever": _retriever,
    "query": _query,
    "history": _history,
    "rerank": _rerank,
    "generator": _generator,
    "prompt": _prompt,
    "judge": _judge,
    "attribution": _attribution,
}


def _top_level(cfg: dict) -> Problems:
    problems: Problems = []
    if not str(cfg.get("experiment_name") or "").strip():
        problems.append(
            f"conf/config: experiment_name: must be a non-empty name (got {cfg.get('experiment_name')!r})"
        )
    if not _is_int(cfg.get("seed")):
        problems.append(f"conf/config: seed: must be an integer (got {cfg.get('seed')!r})")
    subset = cfg.get("generation_subset")
    if subset is not None and (not _is_int(subset) or subset < 1):
        problems.append(
            f"conf/config: generation_subset: must be a positive number of items or null (got {subset!r})"
        )
    problems += _judge_card(cfg.get("judge_card"))
    timeout = (cfg.get("tracking") or {}).get("timeout_s")
    if timeout is not None and (not _is_num(timeout) or not timeout > 0):
        problems.append(f"conf/tracking: timeout_s: must be a number of seconds > 0 (got {timeout!r})")
    for key in ("force", "dry_run"):
        if not isinstance(cfg.get(key, False), bool):
            problems.append(f"conf/config: {key}: must be true or false (got {cfg.get(key)!r})")
    reps = cfg.get("replicates", 1)
    if not _is_int(reps) or reps < 1:
        problems.append(
            f"conf/config: replicates: must be an integer >= 1 (generations per item; got {reps!r})"
        )
    from rag_experiments.run.racing import problems as racing_problems

    problems += racing_problems(cfg)
    if (cfg.get("racing") or {}).get("enabled") and _is_int(cfg.get("replicates", 1)) and cfg.get("replicates", 1) > 1:
        problems.append(
            "conf/config: replicates: racing runs one replicate per item (got replicates="
            f"{cfg.get('replicates')!r} with racing=true); race first, then replicate the survivors"
        )
    m = _Group("metrics", cfg.get("metrics") or {})
    _metrics(m)
    problems += [p.replace("conf/metrics: ", "conf/config: metrics.") for p in m.problems]
    return problems


def _judge_card(node: Any) -> Problems:
    """``judge_card``: the validity card every generating run logs (docs/judges.md)."""
    if node is None:
        return []
    import dataclasses

    from rag_experiments.judge.validity import CardSettings

    g = _Group("judge_card", node if isinstance(node, dict) else {})
    unknown = set(g.node) - {f.name for f in dataclasses.fields(CardSettings)}
    for key in sorted(unknown):
        g.bad(key, "unknown key", g.node[key])
    g.path_exists("pairs", "file")
    for key in ("max_pairs", "max_pairs_model", "batch_pairs"):
        g.int_at_least(key, 1)
    g.num_in("target_width", 0, 2)  # κ's CI lies in [-1, 1]; 0 or null: judge every pair up to the cap
    g.int_at_least("bootstrap_resamples", MIN_RESAMPLES)
    return [p.replace("conf/judge_card: ", "conf/config: judge_card.") for p in g.problems]


def validate(cfg: dict) -> Problems:
    """Every problem in a resolved config (a plain dict), in group order; [] when it is valid."""
    problems = _top_level(cfg) + budget_problems(cfg)
    with_generation = bool((cfg.get("generator") or {}).get("_target_"))
    with_generation |= bool((cfg.get("app") or {}).get("_target_"))  # the app answers: it is judged
    targeted = [k for k, v in cfg.items() if k not in GROUP_CHECKS and isinstance(v, dict) and v.get("_target_")]
    for name in [*GROUP_CHECKS, *targeted]:
        if name not in cfg or (name in ("prompt", "judge") and not with_generation):
            continue
        node = cfg[name]
        if not isinstance(node, dict):
            problems.append(f"conf/{name}: expected a config group, got {node!r}")
            continue
        g = _Group(name, node)
        _check(g, GROUP_CHECKS.get(name, _no_rule))
        problems += g.problems
    return problems + _rerank_depth(cfg) + _query_llm(cfg)


def _no_rule(g: _Group) -> None:
    """A group with no range rule: its constructor's keys and types are all there is to check."""


def _rerank_depth(cfg: dict) -> Problems:
    """A reranker keeps retriever.k of its candidates: ``rerank.candidates >= retriever.k``."""
    node, k = cfg.get("rerank") or {}, (cfg.get("retriever") or {}).get("k")
    cand = node.get("candidates") if isinstance(node, dict) and node.get("_target_") else None
    if _is_int(cand) and _is_int(k) and cand < k:
        return [f"conf/rerank: candidates: must be >= retriever.k={k}, the chunks the reranker keeps (got {cand!r})"]
    return []


def check(cfg) -> None:
    """``validate`` for a DictConfig or dict; raises ConfigError listing every problem."""
    from omegaconf import OmegaConf
    from omegaconf.errors import MissingMandatoryValue

    if OmegaConf.is_config(cfg):
        try:
            cfg = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        except MissingMandatoryValue as e:  # a ``???`` the user must set
            raise ConfigError(
                [f"{_where(_omegaconf_key(e))}: missing (set {_omegaconf_key(e)}=...)"]
            ) from None
        except Exception as e:  # noqa: BLE001 - a bad interpolation
            raise ConfigError([f"{_where(_omegaconf_key(e))}: {_short(e)}"]) from None
    cfg = {k: v for k, v in cfg.items() if k != "hydra"}
    problems = validate(cfg)
    if problems:
        raise ConfigError(problems)


def _where(full_key: str) -> str:
    """``evalset.path`` → ``conf/evalset: path``; a top-level key → ``conf/config: key``."""
    group, _, key = full_key.partition(".")
    return f"conf/{group}: {key}" if key and (conf_dir() / group).is_dir() else f"conf/config: {full_key}"


def _omegaconf_key(e: Exception) -> str:
    return str(getattr(e, "full_key", "") or "?")


def _short(e: Exception) -> str:
    return str(e).splitlines()[0][:300]


def unknown_group_options(argv: list[str]) -> list[str]:
    """``chunking=foo`` on the command line when ``conf/chunking/foo.yaml`` does not exist.

    Checked before Hydra composes (whose own error exits 1 with a traceback hint); skipped when
    the user adds a config dir (``-cd``/``--config-dir``), where their own options live.
    """
    if any(a in ("-cd", "--config-dir") or a.startswith("--config-dir=") for a in argv):
        return []
    problems = []
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if arg.startswith("-") or not sep or "/" in key or not (conf_dir() / key).is_dir():
            continue
        if any(c in value for c in "()[]{}$"):  # sweep functions and interpolations: Hydra's job
            continue
        options = sorted(p.stem for p in (conf_dir() / key).glob("*.yaml"))
        for v in (x.strip() for x in value.split(",")):
            if v and v != "null" and v not in options:
                problems.append(f"conf/{key}: unknown option {v!r} (options: {', '.join(options)})")
    return problems

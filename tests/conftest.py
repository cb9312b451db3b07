import os
import signal
from pathlib import Path

import pytest

from tests.faults.summary import fault_table

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# MLFLOW_TRACKING_URI wins over --tracking-uri (tracking/uri.py): a developer's exported server
# URI must not redirect the tests' temporary stores.
os.environ.pop("MLFLOW_TRACKING_URI", None)


@pytest.fixture(autouse=True)
def _no_leaked_tracking_uri():
    """``mlflow.set_tracking_uri`` also exports MLFLOW_TRACKING_URI; one test's store must not
    become the next test's (the variable wins over ``--tracking-uri``)."""
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    yield
    os.environ.pop("MLFLOW_TRACKING_URI", None)


_HTTP_BUDGET_VARS = ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR")
_HTTP_BUDGET_AT_START = {k: os.environ.get(k) for k in _HTTP_BUDGET_VARS}


_SIGNALS_AT_START = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}


@pytest.fixture(autouse=True)
def _no_leaked_signal_handlers():
    """An in-process sweep callback installs SIGINT/SIGTERM handlers for its sweep; a later test
    that sends itself Ctrl-C must meet Python's default handler, not the dead sweep's."""
    yield
    for sig, handler in _SIGNALS_AT_START.items():
        if signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)


@pytest.fixture(autouse=True)
def _no_leaked_http_budget():
    """An in-process CLI (``cli_main``) exports MLflow's HTTP budget; a later test's subprocess
    would inherit it and read it as the user's own setting, overriding ``tracking.timeout_s``."""
    yield
    for k, v in _HTTP_BUDGET_AT_START.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


SHARED = Path(__file__).resolve().parent.parent.parent / "shared"
DATASETS = SHARED / "datasets"


@pytest.fixture
def shared_datasets() -> Path:
    if not DATASETS.is_dir():
        pytest.skip(f"shared datasets not present at {DATASETS}")
    return DATASETS


# ---------------------------------------------------------------------------------- test tiers
# ``scripts/test.sh --fast`` (= ``pytest -m "not slow"``) is the unit tier for the inner loop
# (≤ 3 min on 2 cores: 2 min 49-55 s at load 1.2-2.6, 2026-12-05); ``scripts/test.sh`` runs everything,
# as CI does (23 min 38 s on a quiet 2-core machine, load 3-3.6 from the suite itself, 2026-12-05).
# The rule, "a test that starts a process, a server, a model or a sweep is slow", is applied by
# construction (:func:`starts_something`, below): the collection hook reads a test's source, its
# fixtures' and the test helpers they call, and marks it slow when one of them calls what STARTS
# names. The lists here hold only what the hook cannot see: whole modules (end-to-end sweeps,
# servers, Ray, Chromium), tests that open a real MLflow store or a model through a library call
# the rule does not name, and long pure computations.
SLOW_MODULES = {
    "test_ann",
    "test_compare_gate",
    "test_healing",
    "test_interrupts",
    "test_judge_change",
    "test_headlines_sweep",  # a generating prompt × k sweep and a single run through the CLI (~1.5 min)
    "test_kill_resume",
    "test_mlflow_ui",
    "test_mlflow_ui_versions",  # a sweep, a re-run, a real mlflow server and Chromium (~1-2 min)
    "test_noise_runs",
    "test_parent_dedup",
    "test_prompt_sweep",  # two generating sweeps, a real mlflow server and Chromium
    "test_racing_sweep",  # racing sweeps through the CLI (basic and joblib launchers)
    "test_ray",
    "test_report",
    "test_readable",  # a 5-chunker retrieval-only sweep through the CLI
    "test_review_ui",  # a real mlflow server and Chromium labelling in the Review tab (~40 s)
    "test_server",
    "test_sweep",
    "test_traces",
    "test_wheel",
}
SLOW_TESTS = {
    "test_a_history_sweep_on_the_sample_logs_turn_breakdowns_and_sessions",  # a 3-config sweep subprocess (~1 min)
    "test_a_slot_declared_once_is_traced_in_a_real_store",  # a sqlite MLflow store (~5-9 s)
    "test_gate_cli_fails_on_a_critical_check_and_the_summary_names_it",  # a sqlite MLflow store (~10 s)
    "test_bad_cli_argument_exits_2",
    "test_malformed_label_file_exits_2_naming_file_and_line",
    "test_the_integer_schema_hint_is_not_printed",  # a real sqlite MLflow store (~7 s)
    "test_other_warnings_still_show",
    "test_rejected_replies_are_written_with_their_reason",  # MiniLM for the near duplicates (~11 s)
    "test_bad_input_exits_2_naming_file_and_line",
    "test_tokens_mode_windows_at_most_size_tokens",
    "test_tokens_mode_offsets_are_characters_on_non_ascii",
    "test_retrieval_only_run_costs_nothing",
    "test_end_to_end_with_the_packaged_local_model",
    "test_agrees_with_ranx_on_random_rankings",
    "test_composed_judge_mlflow_config_is_checked_before_any_run",
    "test_smollm2_verdicts_through_mlflow",
    "test_simulation_variant_any_rival_and_larger_bets_keeps_alpha",  # 500 races, every rival: ~100 s loaded
    "test_score_prints_and_logs_ppi_beside_judge_only",
    "test_report_shows_judge_only_and_ppi_only_for_spot_checked_configs",
    "test_retrieval_only_run_logs_only_registered_keys",
    "test_config_builds_typed_stages_once",
    "test_evaluate_with_our_scorers_on_a_traced_app",
    "test_sample_is_seeded_stratified_and_has_the_columns",
    "test_score_round_trip_kappa_confusion_and_logging",
    "test_malformed_label_files_exit_2_with_file_line",
    "test_retrieval_only_run_is_bad_input",
    "test_summary_names_the_population_its_figures_describe",
    "test_pipeline_mrr_independent_of_ks_and_tokens_cached",
    "test_pipeline_budget_uses_real_token_counts",
    "test_weighted_leniency_and_kappa_estimate_the_run_not_the_boosted_sample",  # 45 s under load
    "test_card_cli_json_keys_and_ci_shapes",
    "test_stochastic_judge_repeats_flip_rate_cached_per_repeat",
    "test_heuristic_judge_rejects_contradicting_evidence_far_more_than_similarity",
    # measured in the fast tier at load 7-10 (2 cores): processes started, a sweep run
    "test_parallel_jobs_linking_one_version_keep_every_run",  # 4 spawned processes (34 s)
    "test_concurrent_jobs_linking_versions_to_one_app_version_keep_every_link",  # 4 processes (39 s)
    # fault tests that run whole sweeps (subprocesses, fake endpoints): fast tier of tests/faults
    # measured at load 7-8, 17.9 min for 166 tests; these 14 were 13.3 min of it (the partial-errors
    # and dead-judge ones, the dead endpoint under a generation subset and the huge answers since
    # moved in-process onto the in-memory run store, tests/test_run_store.py: fast tier)
    # second pass (fast tier of tests/faults 4.1 min at load 2-3.5): real mlflow servers, sweeps
    # third pass (2026-12-05: fast tier 4.1 min at load 1-2.7, target ≤ 3 min): sweeps, real models
    "test_rewrite_searches_the_rewritten_query_and_a_rerun_makes_no_call",  # MiniLM, two runs (8-12 s)
    "test_dead_endpoint_with_a_generation_subset_fails_and_is_retried",  # two runs on a store (12-22 s)
    "test_killed_between_writing_and_attaching_does_not_duplicate",  # a killed subprocess (7 s)
    "test_a_stale_corpus_only_fit_is_refitted_by_auto_fit_a_labelled_one_is_not",  # two fits (7 s)
}


# ------------------------------------------------------------------ parallel order (pytest-xdist)
# scripts/test.sh runs the suite with ``-n 3 --dist loadfile --no-loadscope-reorder``: each worker
# takes whole files, in collection order, as it becomes free. The longest files go first so that
# none of them starts last while the other workers sit idle (longest-first scheduling); the rest
# keep pytest's order. Seconds per file (setup + call + teardown) from the full suite at -n 3 on
# 2 cores, nothing else running (2026-12-05: 23.6 min, load 3-3.6 from the suite itself); re-measure
# with ``--durations=0`` when a file grows or shrinks a lot.
HEAVY_FILES = {
    "tests/faults/test_fault_matrix.py": 235,
    "tests/test_traces.py": 231,
    "tests/test_dry_run.py": 159,
    "tests/test_noise_runs.py": 150,
    "tests/test_from_traces.py": 150,
    "tests/test_racing_sweep.py": 143,
    "tests/test_kill_resume.py": 140,
    "tests/test_pipeline.py": 133,
    "tests/test_api_embedding.py": 131,
    "tests/test_mlflow_judge.py": 111,
    "tests/test_ray.py": 108,
    "tests/test_sweep.py": 106,
    "tests/test_ci_gate.py": 95,
    "tests/test_headlines_sweep.py": 94,
    "tests/faults/test_interrupts.py": 90,
    "tests/test_prompt_sweep.py": 89,
    "tests/test_judge_card.py": 85,
    "tests/test_select.py": 81,
    "tests/faults/test_tracking_outage.py": 79,
    "tests/faults/test_secrets.py": 70,
    "tests/test_budget.py": 69,
    "tests/test_identity.py": 65,
    "tests/faults/test_healing.py": 63,
    "tests/faults/test_sweep_status.py": 54,
    "tests/test_cli_help.py": 53,
    "tests/faults/test_signal_in_flight.py": 50,
    "tests/test_comparability.py": 50,
    "tests/faults/test_bad_config.py": 49,
    "tests/test_query.py": 49,
    "tests/test_report.py": 48,
    "tests/faults/test_generation_window.py": 47,
    "tests/test_mlflow_ui.py": 46,
    "tests/test_calibration.py": 45,
    "tests/test_server.py": 44,
    "tests/faults/test_sweep_reuse.py": 41,
    "tests/faults/test_readonly_and_locks.py": 40,
    "tests/test_verifier.py": 38,
    "tests/test_mlflow_ui_versions.py": 38,
    "tests/test_wheel.py": 37,
    "tests/test_prompt_registry.py": 34,
    "tests/test_generation_digest.py": 34,
    "tests/test_parent_dedup.py": 32,
    "tests/test_query_table.py": 31,
}


# ---------------------------------------------------------------------- the tier rule, by construction
#: Calls that start a process, a server or a model. A test whose function, fixtures, or the test
#: helpers they call (followed through ``tests.*`` functions) make one of these calls is slow by
#: construction (:func:`starts_something`); SLOW_TESTS lists only what this cannot see.
STARTS = {
    "run_sweep",  # a sweep subprocess (tests/sweep_helpers.py)
    "Popen",
    "check_output",
    "check_call",
    "mlflow_server",  # a real MLflow server
    "llama_embedding_server",  # a llama.cpp server
    "SentenceTransformerEmbedder",  # MiniLM
    "LocalLlamaGenerator",  # SmolLM2 through llama.cpp
}
#: ``subprocess.run(...)``, and judges whose building loads a model (MiniLM: build_judge("heuristic")).
STARTS_ATTR = {("subprocess", "run"), ("ray", "init")}
MODEL_JUDGES = {"heuristic", "cascade", "verifier"}


def _calls(fn) -> tuple[set[str], set[tuple[str, str]], bool, set[str]]:
    """(called names, (module, attr) calls, builds a model judge, names read) of ``fn``'s source."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return set(), set(), False, set()
    names, attrs, judge, read = set(), set(), False, set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            read.add(n.id)
        if not isinstance(n, ast.Call):
            continue
        f = n.func
        if isinstance(f, ast.Name):
            names.add(f.id)
        elif isinstance(f, ast.Attribute):
            names.add(f.attr)
            if isinstance(f.value, ast.Name):
                attrs.add((f.value.id, f.attr))
        if getattr(f, "id", getattr(f, "attr", "")) == "build_judge" and n.args:
            judge |= isinstance(n.args[0], ast.Constant) and n.args[0].value in MODEL_JUDGES
    return names, attrs, judge, read


_STARTS_CACHE: dict = {}


def starts_something(fn, seen: set | None = None) -> bool:
    """Whether ``fn`` (a test, a fixture or a test helper) starts a process, a server or a model,
    itself or through the ``tests.*`` functions it calls or reads."""
    if fn in _STARTS_CACHE:
        return _STARTS_CACHE[fn]
    seen = set() if seen is None else seen
    if id(fn) in seen:
        return False
    seen.add(id(fn))
    names, attrs, judge, read = _calls(fn)
    hit = judge or bool(names & STARTS) or bool(attrs & STARTS_ATTR)
    if not hit:
        for name in sorted(read | names):
            g = getattr(fn, "__globals__", {}).get(name)
            if callable(g) and getattr(g, "__module__", "").startswith("tests") and starts_something(
                getattr(g, "__wrapped__", g), seen
            ):
                hit = True
                break
    _STARTS_CACHE[fn] = hit
    return hit


def _fixture_funcs(item) -> list:
    info = getattr(item, "_fixtureinfo", None)
    defs = getattr(info, "name2fixturedefs", {}) if info is not None else {}
    return [d.func for ds in defs.values() for d in ds if getattr(d, "func", None) is not None]


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.path.stem
        fn = getattr(item, "function", None)
        by_rule = fn is not None and any(starts_something(f) for f in (fn, *_fixture_funcs(item)))
        if module in SLOW_MODULES or item.originalname in SLOW_TESTS or by_rule:
            item.add_marker(pytest.mark.slow)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker sorts alike: xdist checks they agree
        # a stable sort: a file's tests stay together and in their order
        items.sort(key=lambda item: -HEAVY_FILES.get(item.nodeid.split("::")[0], 0))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    fault_table(terminalreporter)

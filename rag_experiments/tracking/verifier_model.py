"""A fitted claim verifier in MLflow: a run with its recipe and validation card, and a LoggedModel
holding the verifier directory (``model.json`` + ``manifest.json``), tagged with its ``fit_id``.

Logged once per ``fit_id`` and experiment: a cached re-fit finds the existing model and logs
nothing new.
"""

from __future__ import annotations

import math

from mlflow.entities import Metric, Param, RunTag

from rag_experiments.tracking.writer import get_experiment_id, open_store


def _card_metrics(card: dict) -> dict[str, float]:
    out: dict[str, float] = {}
    for part, f in card.items():
        for key in ("kappa", "balanced_accuracy", "accuracy", "precision_supported", "recall_supported"):
            v = f.get(key)
            if isinstance(v, int | float) and not math.isnan(v):
                out[f"card/{part}/{key}"] = float(v)
                lo_hi = f.get("ci", {}).get(key)
                if lo_hi:
                    out[f"card/{part}/{key}_ci_low"], out[f"card/{part}/{key}_ci_high"] = map(float, lo_hi)
        for t, v in (f.get("accept_by_type") or {}).items():
            out[f"card/{part}/accept/{t}"] = float(v)
        if "n" in f:
            out[f"card/{part}/n"] = float(f["n"])
    return out


def log_verifier(manifest: dict, path: str, uri: str, experiment: str, artifact_root: str | None) -> tuple[str, bool]:
    """(model_id, logged_now): the verifier as an MLflow LoggedModel with a source run."""
    import time

    client = open_store(uri)
    exp = get_experiment_id(client, experiment, artifact_root)
    fit_id = manifest["fit_id"]
    found = client.search_logged_models([exp], filter_string=f"tags.fit_id = '{fit_id}'", max_results=1)
    if len(found):
        return found[0].model_id, False
    tags = {
        "fit_id": fit_id,
        "weights_sha256": manifest["weights_sha256"],
        "pairs_digest": manifest["data"]["pairs_digest"],
        "corpus_digest": manifest["data"]["corpus_digest"],
        "code_version": manifest["code_version"],
        "rag_experiments.kind": "claim_verifier",
    }
    run = client.create_run(exp, run_name=f"verifier-{fit_id[:12]}", tags=tags)
    rid = run.info.run_id
    now = int(time.time() * 1000)
    params = {f"recipe.{k}": str(v) for k, v in manifest["recipe"].items()}
    params |= {"n_pairs": str(manifest["data"]["n_pairs"]), "n_labelled": str(manifest["data"]["n_labelled"])}
    client.log_batch(
        rid,
        metrics=[Metric(k, v, now, 0) for k, v in _card_metrics(manifest.get("card", {})).items()],
        params=[Param(k, v) for k, v in params.items()],
        tags=[RunTag("mlflow.note.content", "claim verifier fit (rag_experiments.judge fit)")],
    )
    client.log_dict(rid, manifest.get("card", {}), "validation_card.json")
    model = client.create_logged_model(
        exp, name="claim-verifier", source_run_id=rid, tags=tags, params=params, model_type="claim_verifier"
    )
    client.log_model_artifacts(model.model_id, path)
    client.finalize_logged_model(model.model_id, "READY")
    client.set_terminated(rid, "FINISHED")
    return model.model_id, True

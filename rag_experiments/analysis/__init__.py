"""Statistics over per-query tables: paired tests, attribution, gate decisions. No MLflow inside."""

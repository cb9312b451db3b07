"""Per-query metrics, failure labels and aggregation with confidence intervals."""

"""Per-query metrics, the metric registry, failure labels and aggregation with confidence intervals."""

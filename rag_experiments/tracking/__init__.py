"""Everything that writes to or reads from MLflow."""

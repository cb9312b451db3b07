"""Loading corpora and eval sets (and importers from other formats) into plain typed data."""

"""The research report: a model built once from runs, rendered to Markdown and HTML."""

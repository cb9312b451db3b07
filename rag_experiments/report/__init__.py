"""The research report of a sweep or a run: ``python -m rag_experiments.report RUN_OR_SWEEP``.

One pass, one module per step:

- ``load``: read the runs, their per-query tables and the experiment from MLflow;
- ``model``: the :class:`~rag_experiments.report.model.Report` tree, the statistics it shows
  (computed once) and the metric lists the report names;
- ``sections``, ``figures``, ``provenance``, ``queries``: build each section from the statistics;
- ``plots``: draw the figures (matplotlib); ``render`` + ``templates/``: Markdown and HTML (Jinja2);
- ``tables``: number formats and table rows shared with ``compare``; ``cli``: the command line.
"""

"""Command-line entry points: each module exposes ``main(argv) -> int`` (0 ok, 1 gate failed, 2 bad input).

``python -m rag_experiments.<name>`` modules are thin shims that call these.
"""

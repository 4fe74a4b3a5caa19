"""Escalations: the terminal states a human must decide, raised once with the fenced settle
(`worker/pipeline/settle.py`), listed and resolved with `aip-hermes-worker escalations`."""

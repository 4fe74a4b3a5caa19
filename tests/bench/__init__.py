"""Benchmarks: the worker next to arq, FastStream and a raw nats-py loop, on this machine.

Run them with ``.venv/bin/python -m tests.bench`` (prints the tables) or
``.venv/bin/python -m pytest tests/bench -m bench -s``. Every figure is printed beside the raw
baseline measured in the same run, as a ratio; nothing here asserts a timing, because a
2-core machine shared by servers and clients makes absolute numbers a property of the box.
"""

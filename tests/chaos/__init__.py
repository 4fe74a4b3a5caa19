"""A Jepsen-style randomized fault campaign over a real loopback deployment (issue #29).

`nemesis` draws a fault schedule from a seed and plays it; `workload` is what clients do
meanwhile; `checker` decides from the evidence whether every guarantee held; `campaign`
ties them together; `python -m tests.chaos` (`./dev chaos`) runs long campaigns.
See docs/reliability.md.
"""

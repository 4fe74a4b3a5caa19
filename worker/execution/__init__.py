"""One execution of one Action: its context, its lease, its cancel signal and its chunk stream.

`context.py` is what an operation runs with; `leases.py` keeps the lease and stops a stale
worker; `cancel_signal.py` and `cancel_notices.py` carry a cancel to the task that runs the
Action; `chunk_stream.py` assigns each chunk its seq and hash chain (docs/architecture.md §4).
"""

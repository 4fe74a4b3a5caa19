"""`aip-hermes-worker console`: a read-only web view of runs, escalations, the DLQ and workers.

It keeps no database of its own: every page is read, when it is asked for, from what is
durable on the bus (the results, chunks, audit, DLQ and escalation streams, with message gets
only: worker/bus/stream_reads.py), in Redis (lease records, bindings, resolutions) and in
what workers say of themselves (`$SRV.STATS`, worker/control.py). It never holds an
approver's key and never decides: a page that waits on a person shows the exact command that
person runs (docs/console.md).
"""

"""The NATS side of a worker: connecting, pulling, publishing, dead-lettering and auditing.

Everything that speaks to NATS JetStream lives here, as everything that speaks to Redis lives
in `worker/store/` (docs/architecture.md §2).
"""

"""aip-hermes-worker: drive Hermes Agent instances safely from NATS JetStream."""

__version__ = "0.1.0"

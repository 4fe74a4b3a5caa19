"""The channel roles: results and escalations sent into persisted Hermes sessions (egress)."""

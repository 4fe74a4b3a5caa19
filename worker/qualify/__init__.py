"""Qualification against live Hermes: the connector overview's ten items, with evidence.

`aip-hermes-worker qualify --endpoint-id hermes-1 --endpoint-id hermes-2 --record DIR`
drives a running deployment. `python -m worker.testing.qualify_local --record DIR` (a
launcher in the `testing` extra: it starts servers and real Hermes from the test harness)
starts a whole two-instance deployment and drives that. One job per module:

- `settings`: what the driver needs beyond a worker's settings (credentials as files);
- `deployment`: the bus, Redis, each Hermes and the gateway, as the driver uses them;
- `control`: what the driver may do to processes it owns;
- `broken`: the deliberately broken endpoint the driver serves;
- `items`: pass / fail / skip and evidence;
- `tour`, `operator_items`, `delegation_items`, `negative_items`: the ten items;
- `probe`: preflight and the record's facts;
- `record`: the JSON and Markdown record;
- `objectives`: what the driver asks each Hermes to do;
- `driver`: the run; `command`: the CLI.

See docs/qualification.md.
"""

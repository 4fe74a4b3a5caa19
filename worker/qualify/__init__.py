"""Qualification against live Hermes: the connector overview's ten items, with evidence.

`aip-hermes-worker qualify --endpoint-id hermes-1 --endpoint-id hermes-2 --record DIR`
drives a running deployment; `python -m worker.qualify.local --record DIR` starts a whole
two-instance deployment (two real Hermes 0.19.0) and drives that. One job per module:

- `settings`: what the driver needs beyond a worker's settings (credentials as files);
- `deployment`: the bus, Redis, each Hermes and the gateway, as the driver uses them;
- `control`: what the driver may do to processes it owns;
- `broken`: the deliberately broken endpoint the driver serves;
- `items`: pass / fail / skip and evidence;
- `tour`, `operator_items`, `delegation_items`, `negative_items`: the ten items;
- `probe`: preflight and the record's facts;
- `record`: the JSON and Markdown record;
- `driver`: the run; `command`: the CLI; `local`: the launcher.

See docs/qualification.md.
"""

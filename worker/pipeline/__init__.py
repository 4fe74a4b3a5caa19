"""The delivery pipeline: one envelope from the bus to its answer (docs/architecture.md §4).

- `pipeline`: `Pipeline`, the order of the steps and the guard around them;
- `delivery`: the frozen `Delivery` the steps pass along, and `is_dependency_failure`;
  `Rejected`/`Refusal` (worker/errors.py) are the two ways a step ends a delivery early;
- `steps`: an Action's intake (decode, signature, `Nats-Msg-Id`, route, admission,
  deadline) and the checks every intake shares;
- `acquire`: the lease acquire;
- `execute`: the operation under its lease (`Leased`);
- `settle`: the fenced settle, publication and ack;
- `answers`: every answer without an execution (DLQ, refusal, the stored result again, ack);
- `runtime`: what every delivery shares.

Delegations (`worker.delegation.handler`) and channel deliveries (`worker.channel.egress`)
are intakes of the same pipeline. Nothing here imports an operation's own code: what the
pipeline must know of one is asked through `worker.operations.base.Operation`.
"""

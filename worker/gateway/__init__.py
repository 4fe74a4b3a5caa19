"""The AIP gateway: the runtime's side of this bus, started as `aip-hermes-worker gateway`.

It is the authenticated Streamable HTTP MCP server Hermes calls (`aip_capabilities`,
`aip_call`, `aip_action_status`, `aip_action_result`, `aip_action_events`,
`aip_action_cancel`) and the only writer of the runtime's queue and lifecycle stores the
delegation resolver reads. One job per module:

- `settings`: the `AIPD_*` configuration;
- `principals`: the bearer principals file and token authentication;
- `routes`: the capability route table;
- `records`: signed writes and verified reads of the queue and lifecycle stores;
- `children`: dispatch a child, wait for its result, settle its records in order;
- `service`: the six tools, transport-free;
- `discovery`: the workers' manifests for `aip_capabilities`;
- `recovery`: finish what a dead gateway left, from durable state;
- `observe`: metrics and audit receipts;
- `mcp_app`: the MCP server, the 401 gate and `/health`, `/ready`, `/metrics`;
- `app`: the process.

See docs/gateway.md.
"""

from typing import TYPE_CHECKING

from worker.lazy import lazy_exports

if TYPE_CHECKING:
    from worker.gateway.app import READY_MARK, Gateway
    from worker.gateway.settings import GatewaySettings

__all__ = ["READY_MARK", "Gateway", "GatewaySettings"]

__getattr__ = lazy_exports(
    __name__,
    {
        "READY_MARK": "worker.gateway.app",
        "Gateway": "worker.gateway.app",
        "GatewaySettings": "worker.gateway.settings",
    },
)

"""The Hermes API client: one shared httpx client per endpoint, bounded and redirect-free."""

from typing import Final

#: The Hermes API server release this project is built and qualified against: its
#: `gateway/platforms/api_server.py` is the contract (shared/reference/hermes-0.19.md).
PINNED_VERSION: Final = "0.19.0"

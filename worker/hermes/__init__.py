"""The Hermes API client: one shared httpx client per endpoint, bounded and redirect-free."""

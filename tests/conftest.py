"""Settings for the whole suite.

Property tests check what a function returns, not how fast: on a loaded machine (CI runs
the suite on four xdist processes over two cores) Hypothesis' own timing checks, the
per-example deadline and the `too_slow` health check, fail tests for the machine's load.
The suite's profile turns those two off; a test's own `@settings` still applies on top.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")

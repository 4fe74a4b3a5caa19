"""`python -m worker` is the `aip-hermes-worker` command."""

import sys

from worker.commands.cli import main

sys.exit(main())

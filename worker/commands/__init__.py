"""The `aip-hermes-worker` command line: `cli.py` is its entry, the rest its subcommands.

Each `*_admin.py` module holds one package's operator commands (trust, operator,
escalation); they import what they administer, never the other way round.
"""

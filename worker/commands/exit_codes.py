"""The exit status of every `aip-hermes-worker` command, defined once.

A script chains commands on these (`submit --wait && next-step`), so each outcome has its
own code and no command exits 0 for anything but what it was asked to do: an Action that
failed, a wait that timed out, an envelope the workers dead-lettered, or a result that does
not verify are never 0. argparse's own usage errors exit 2, which is why 2 means "fix the
command line or the configuration". The table in README.md ("Exit codes") is this enum.
"""

from __future__ import annotations

from enum import IntEnum

from schemas.result import ResultStatus


class Exit(IntEnum):
    """What a command's exit status means (README.md "Exit codes")."""

    #: Done: the Action completed, the record was written, the thing asked for was shown.
    OK = 0
    #: The command ran and the answer is "no": the Action failed or was cancelled, the
    #: record asked for does not exist, a cancel was not accepted, provisioning conflicts.
    FAILED = 1
    #: Bad usage, setting, file or key: nothing was sent; the line names what to fix.
    CONFIGURATION = 2
    #: NATS, Redis or another service did not answer (or has no JetStream, no worker
    #: answering, no stream for the subject); the line names its URL or subject and setting.
    UNREACHABLE = 3
    #: A result, chunk chain, receipt or escalation does not verify against the trusted
    #: worker keys (`connector_host.response_signing`): read the durable state instead.
    UNVERIFIED = 4
    #: `--wait`/`--timeout` elapsed without a result (the line says whether the Action was
    #: dead-lettered: then the code is REFUSED).
    TIMEOUT = 5
    #: Refused: the workers dead-lettered the Action, the CLI refused to publish or sign an
    #: envelope the workers would refuse (unsigned, stale, malformed), or an approval, a
    #: resolution or a `--reveal` was refused.
    REFUSED = 6
    #: The Action ended `requires_human`: a person must answer an escalation first.
    REQUIRES_HUMAN = 7
    #: Interrupted (Ctrl-C), as shells report SIGINT.
    INTERRUPTED = 130


def for_status(status: ResultStatus) -> Exit:
    """The exit status of a command that waited for an Action's result."""
    match status:
        case ResultStatus.COMPLETED:
            return Exit.OK
        case ResultStatus.REQUIRES_HUMAN:
            return Exit.REQUIRES_HUMAN
        case ResultStatus.FAILED | ResultStatus.CANCELLED:
            return Exit.FAILED

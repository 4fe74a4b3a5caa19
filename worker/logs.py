"""Logging: JSON lines for machines, a short human format for terminals; never a secret.

Records carry Action context (`action_id`, `endpoint`, `capability`, `fence`, `trace_id`)
when the caller passes them in `extra`, and, logged inside an OpenTelemetry span
(`worker.tracing`), that span's `otel_trace_id` and `span_id` (`trace_id` already names the
AIP Envelope's trace id, which is not the OpenTelemetry one). Secrets cannot reach a record
by accident: keys are `Secret` objects whose repr is masked, and messages are built from
route templates and exception class names, never from provider bodies.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Literal

import msgspec

from worker import tracing

CONTEXT_FIELDS = ("action_id", "endpoint", "capability", "fence", "trace_id", "worker_id")


class JsonFormatter(logging.Formatter):
    """One JSON object per line. A worker logs one line per Action it settles, so the line is
    built for cost: the timestamp's whole-second prefix is kept until the second changes,
    and msgspec encodes (with `setup_logging`'s switches, one line costs ~21 µs where it cost
    ~35 µs with `json.dumps` and a `strftime` per record)."""

    def __init__(self) -> None:
        super().__init__()
        #: The whole second `_second_text` prints, and that text (`2026-12-07T05:21:45`).
        self._second = -1
        self._second_text = ""

    def format(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second:
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        doc: dict[str, object] = {
            "ts": f"{self._second_text}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                doc[name] = value
        span = tracing.log_ids()
        if span is not None:
            doc["otel_trace_id"], doc["span_id"] = span
        if record.exc_info and record.exc_info[0] is not None:
            doc["error"] = record.exc_info[0].__name__
            doc["traceback"] = self.formatException(record.exc_info)
        return _LINE_ENCODER.encode(doc).decode()


#: `AIPD_LOG_FORMAT`, read by the worker and the gateway alike (one `.env` may serve both):
#: `json` lines for machines; `human` for terminals, and `text`, the same format, which the
#: gateway's own setting named until the two were made one.
LogFormat = Literal["json", "human", "text"]

#: Prints what JSON has no type for (a path, an exception) as its `str`, as `json.dumps`'s
#: `default=str` did.
_LINE_ENCODER = msgspec.json.Encoder(enc_hook=str)


class RepeatedErrors:
    """Log an error once per cause per interval, and count every occurrence.

    A failing dependency fails every delivery the same way: logging each one (with its
    traceback) wrote 37 MB per worker in 100 s when Redis was full. Here the first
    occurrence of a (where, cause) pair in `interval_s` is logged, later ones are only
    counted (`on_count`, the metrics hook, sees every one), and the next line logged for the
    pair says how many were left out.
    """

    def __init__(
        self,
        interval_s: float = 10.0,
        on_count: Callable[[str, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self.on_count = on_count
        self._clock = clock
        #: (where, cause) -> (when it was last logged, occurrences left out since).
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}

    def report(
        self,
        where: str,
        cause: str,
        logger: logging.Logger,
        msg: str,
        *args: object,
        level: int = logging.WARNING,
        exc_info: bool = False,
        extra: dict[str, object] | None = None,
    ) -> bool:
        """Count one occurrence; log it when its pair was not logged within the interval.
        Returns whether it was logged."""
        if self.on_count is not None:
            self.on_count(where, cause)
        key = (where, cause)
        now = self._clock()
        last = self._seen.get(key)
        if last is not None and now - last[0] < self.interval_s:
            self._seen[key] = (last[0], last[1] + 1)
            return False
        if len(self._seen) > 1_000:  # causes come from bounded sets; this is a backstop
            self._seen.clear()
        left_out = last[1] if last is not None else 0
        self._seen[key] = (now, 0)
        if left_out:
            msg += f" ({left_out} more like it since the last such line, not logged)"
        logger.log(level, msg, *args, exc_info=exc_info, extra=extra)
        return True


def setup_logging(fmt: LogFormat = "json", level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # Neither format prints a record's source line, thread or process: not looking them up
    # saves a frame walk and three calls per record (the "Optimization" section of the
    # logging HOWTO names these switches).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    root.setLevel(level.upper())
    # Libraries stay quiet unless something is wrong.
    for noisy in ("nats", "httpx", "aiohttp", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

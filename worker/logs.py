"""Logging: JSON lines for machines, a short human format for terminals; never a secret.

Records carry Action context (`action_id`, `endpoint`, `capability`, `fence`, `trace_id`)
when the caller passes them in `extra`. Secrets cannot reach a record by accident: keys are
`Secret` objects whose repr is masked, and messages are built from route templates and
exception class names, never from provider bodies.
"""

from __future__ import annotations

import json
import logging
import sys
import time

CONTEXT_FIELDS = ("action_id", "endpoint", "capability", "fence", "trace_id", "worker_id")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                doc[name] = value
        if record.exc_info and record.exc_info[0] is not None:
            doc["error"] = record.exc_info[0].__name__
            doc["traceback"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def setup_logging(fmt: str = "json", level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Libraries stay quiet unless something is wrong.
    for noisy in ("nats", "httpx", "aiohttp", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

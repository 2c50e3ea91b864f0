"""shardwise's logging: Python ``logging`` under the ``shardwise`` logger, rank-prefixed.

Every module logs through ``get_logger("shardwise.<part>")``; the C++ core's lines (what a
search tried and chose, csrc/support/log.h) arrive under ``shardwise.core``. Under torchrun
(or any initialised process group) each line starts with ``[rank N]``, so the interleaved
output of many ranks stays readable. shardwise adds no handler: configure logging as usual,

    logging.basicConfig(level=logging.INFO)          # or: python -m shardwise -v ...
    logging.getLogger("shardwise").setLevel(logging.DEBUG)
"""
from __future__ import annotations

import atexit
import logging
import os

from . import _C


def _rank() -> int | None:
    """This process' rank in a job of several processes; None in a job of one."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank() if dist.get_world_size() > 1 else None
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ:
        return int(os.environ["RANK"])
    return None


class _RankPrefixed(logging.LoggerAdapter):
    def process(self, msg, kwargs):
        rank = _rank()
        return (f"[rank {rank}] {msg}" if rank is not None else msg), kwargs


def get_logger(name: str) -> logging.LoggerAdapter:
    """The logger for `name` (under "shardwise"), prefixing each line with the rank."""
    return _RankPrefixed(logging.getLogger(name), {})


_core = get_logger("shardwise.core")


def _core_line(level: int, line: str) -> None:
    _core.log(level, line)


def install_core_sink() -> None:
    """Route the core's log lines to ``shardwise.core``; removed at exit, before the
    interpreter goes (the core holds a Python function until then)."""
    _C.set_log_sink(_core_line, logging.DEBUG)
    atexit.register(_C.set_log_sink, None)

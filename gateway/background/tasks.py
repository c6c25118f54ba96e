"""Starting and stopping the background loops: every loop is `async def run(app)` in its own
module, started under a name and cancelled on shutdown; a loop that dies is logged loudly."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)


def report_death(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.critical("background task %s died", task.get_name(), exc_info=exc)
    else:
        log.error("background task %s returned; it should run until stopped", task.get_name())


# A background loop: runs until cancelled, logging and going on after each failure.
Loop = Callable[[web.Application], Coroutine[Any, Any, None]]


class BackgroundTasks:
    """The app's background loops; stopped together on shutdown."""

    def __init__(self, app: web.Application) -> None:
        self._app = app
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, name: str, loop: Loop) -> None:
        task = asyncio.create_task(loop(self._app), name=name)
        task.add_done_callback(report_death)
        self._tasks.append(task)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

"""`serve --workers N`: N gateway processes on one port, under one parent.

Each worker is a whole gateway (its own event loop, pool, call log and background loops) that
binds the port with SO_REUSEPORT, so the kernel spreads connections over them; nothing is
shared in memory, and what must be shared already goes through PostgreSQL (background work is
claimed there, caches are invalidated with LISTEN/NOTIFY, Redis when configured). The parent
serves nothing: it starts the workers, says where they listen once every one does (each
tells it through a pipe they share), starts a crashed one again (backing off while it keeps
crashing at once), and on SIGTERM or SIGINT passes SIGTERM to every worker and waits while each
drains its requests and its call log. A worker that cannot start the first time (the port is
taken) stops them all: the reason is the parent's one line, not a restart every 30 s forever.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType

from gateway.config import Settings

log = logging.getLogger("gateway")

# Longer than a worker's own drain (aiohttp's shutdown_timeout plus the call log's), then kill.
STOP_SECONDS = 60.0
# A worker that dies sooner than this after its start is restarted after a growing pause.
QUICK_DEATH_SECONDS = 10.0
MAX_RESTART_PAUSE_SECONDS = 30.0

# How a worker tells the parent ("listening", its URL) once it accepts connections, or
# ("failed", why) when it cannot start.
Report = Callable[[str, str], None]
WorkerMain = Callable[[Settings, Report], None]


class StartFailed(Exception):
    """A worker could not start the first time; the message says why, in one line."""


def _worker(main: WorkerMain, settings: Settings, reports: Connection) -> None:
    """A worker's first steps: out of the terminal's process group (Ctrl+C reaches the parent
    only, which stops the workers one SIGTERM each), and gone with the parent: if the parent
    dies without stopping it, the worker stops itself as on SIGTERM."""
    os.setpgrp()
    parent = os.getppid()

    def watch_parent() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch_parent, name="parent-watch", daemon=True).start()

    def report(kind: str, text: str) -> None:
        # One small write to a pipe, atomic among the workers writing to it.
        reports.send((settings.worker_id, kind, text))

    main(settings, report)


@dataclass
class _Slot:
    worker_id: int
    process: BaseProcess | None = None
    started_at: float = 0.0
    pause: float = 0.0
    restart_at: float = 0.0


@dataclass
class Supervisor:
    settings: Settings
    count: int
    main: WorkerMain
    # Called once, with the URL, when every worker has said it listens.
    announce: Callable[[str], None]
    _slots: list[_Slot] = field(default_factory=list)
    _stopping: bool = False
    _listening: set[int] = field(default_factory=set)
    _announced: bool = False
    _failure: str | None = None
    # The pipe every worker reports through: the parent reads one end, the workers write the other.
    _reports: Connection = field(init=False)
    _report_to: Connection = field(init=False)

    def run(self) -> None:
        """Until SIGTERM or SIGINT; then every worker is stopped before this returns. Raises
        StartFailed (once they are stopped) when a worker cannot start the first time."""
        context = multiprocessing.get_context("spawn")  # nothing inherited but the settings
        self._reports, self._report_to = context.Pipe(duplex=False)
        self._slots = [_Slot(worker_id) for worker_id in range(1, self.count + 1)]
        # Each worker leaves its metrics here for the others (whichever takes a scrape).
        metrics_dir = Path(tempfile.mkdtemp(prefix="mcp-gateway-metrics-"))
        self.settings = self.settings.replace(metrics_dir=metrics_dir)
        previous = {sig: signal.signal(sig, self._stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            for slot in self._slots:
                self._start(context, slot)
            while not self._stopping:
                self._watch(context)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._stop_all()
            shutil.rmtree(metrics_dir, ignore_errors=True)
            self._reports.close()
            self._report_to.close()
        if self._failure is not None:
            raise StartFailed(self._failure)

    def pids(self) -> list[int]:
        return [s.process.pid for s in self._slots if s.process is not None and s.process.pid]

    def _stop(self, signum: int, _frame: FrameType | None) -> None:
        log.info("received %s: stopping %d workers", signal.Signals(signum).name, self.count)
        self._stopping = True

    def _start(self, context: multiprocessing.context.SpawnContext, slot: _Slot) -> None:
        settings = self.settings.replace(worker_id=slot.worker_id)
        process = context.Process(
            target=_worker,
            args=(self.main, settings, self._report_to),
            name=f"gateway-worker-{slot.worker_id}",
        )
        process.start()
        slot.process, slot.started_at = process, time.monotonic()
        log.info("worker %d started (pid %d)", slot.worker_id, process.pid)

    def _watch(self, context: multiprocessing.context.SpawnContext) -> None:
        now = time.monotonic()
        for slot in self._slots:
            if slot.process is None and now >= slot.restart_at:
                self._start(context, slot)
        running = [s.process.sentinel for s in self._slots if s.process is not None]
        wait([self._reports, *running], timeout=0.5)  # returns early on a report or an exit
        # Reports first: a worker that failed to start said so before it exited.
        while self._reports.poll():
            self._heard(*self._reports.recv())
        now = time.monotonic()
        for slot in self._slots:
            process = slot.process
            if process is None or process.is_alive() or self._stopping:
                continue
            process.join()
            lived = now - slot.started_at
            # Crashing at start (a bad setting, a port taken): wait longer each time.
            slot.pause = (
                min(max(1.0, slot.pause * 2), MAX_RESTART_PAUSE_SECONDS)
                if lived < QUICK_DEATH_SECONDS
                else 0.0
            )
            slot.process, slot.restart_at = None, now + slot.pause
            log.error(
                "worker %d (pid %d) exited with %s after %.0f s; restarting in %.0f s",
                slot.worker_id,
                process.pid,
                process.exitcode,
                lived,
                slot.pause,
            )

    def _heard(self, worker_id: int, kind: str, text: str) -> None:
        if kind == "listening":
            self._listening.add(worker_id)
            if not self._announced and len(self._listening) == self.count:
                self._announced = True
                self.announce(text)
        elif not self._announced:
            self._failure, self._stopping = text, True
        else:
            log.error("worker %d could not start: %s", worker_id, text)

    def _stop_all(self) -> None:
        running = [s.process for s in self._slots if s.process is not None]
        for process in running:
            if process.is_alive() and process.pid:
                os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_SECONDS
        for process in running:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                log.error("worker pid %d did not stop in %.0f s: killed", process.pid, STOP_SECONDS)
                process.kill()
                process.join()

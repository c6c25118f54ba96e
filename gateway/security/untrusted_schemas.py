"""Checks arguments against upstream-supplied JSON Schemas within a time bound, never on the
event loop.

An upstream's `inputSchema` is untrusted input: a catastrophic regex (`"^(a+)+$"`), an `anyOf`
chain whose branches multiply, `uniqueItems` over thousands of objects or a `$ref` loop can
each take seconds to hours of CPU, or all the memory there is. So checks run in a small pool of
worker processes (gateway.security.schema_worker, jsonschema-rs with its linear-time regex
engine), started when first needed. A check that overruns its bound has its worker killed (by
PID) and replaced; a worker that crashes is replaced too. A schema too large or too deeply
nested is not sent at all. One workspace has at most one check running at a time, so its slow
schemas hold at most one worker; a check that cannot start within the bound is given up.

Whatever cannot be checked in time is not enforced: the verdict says so and why, and the caller
goes on unchecked (the upstream judges its own arguments, as it must anyway).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
import sys
from collections.abc import AsyncIterator, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson
from aiohttp import web

log = logging.getLogger(__name__)

# What is sent to a worker at most: the schema's JSON, and how deeply it may nest.
MAX_SCHEMA_BYTES: Final = 1024 * 1024
MAX_SCHEMA_DEPTH: Final = 64
DEFAULT_WORKERS: Final = 2
_WORKER_MODULE: Final = "gateway.security.schema_worker"
# Starting a worker (a Python process importing jsonschema-rs) is not part of a check's bound:
# a check is sent once the worker says it is ready.
_START_SECONDS: Final = 30.0
_MAX_REPLY_BYTES: Final = 1024 * 1024
_HEADER: Final = struct.Struct(">I")
# The only variables a worker gets: enough to find Python and its packages, no secrets.
_INHERITED_ENV: Final = ("PATH", "HOME", "LANG", "LC_ALL", "VIRTUAL_ENV", "PYTHONPATH")
# The directory holding the `gateway` package, installed or not: the worker is one of its modules.
_PACKAGE_ROOT: Final = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True, slots=True)
class Problem:
    """One way the arguments break the schema: where (keys and indexes) and what."""

    path: tuple[str | int, ...]
    message: str


@dataclass(frozen=True, slots=True)
class Verdict:
    """`checked`: the schema was applied, and `problems` are its complaints (most relevant
    first, at most `max_errors`); else `reason` says why the arguments go unchecked."""

    checked: bool
    problems: tuple[Problem, ...] = ()
    reason: str | None = None

    @classmethod
    def unchecked(cls, reason: str) -> Verdict:
        return cls(False, (), reason)


class _Worker:
    """One worker process and its pipes; asked one question at a time."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        assert proc.stdin is not None and proc.stdout is not None
        self._stdin = proc.stdin
        self._stdout = proc.stdout

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    async def ask(self, frame: bytes) -> Any:
        self._stdin.write(frame)
        await self._stdin.drain()
        return await self.answer()

    async def answer(self) -> Any:
        (size,) = _HEADER.unpack(await self._stdout.readexactly(_HEADER.size))
        if size > _MAX_REPLY_BYTES:
            raise ConnectionError(f"reply of {size} bytes from the schema checker")
        return orjson.loads(await self._stdout.readexactly(size))

    async def stop(self) -> None:
        """Killed by its PID (it may be spinning in native code, deaf to anything gentler)."""
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        with contextlib.suppress(OSError, RuntimeError):
            self._stdin.close()
        await self.proc.wait()


class SchemaChecker:
    """The pool; `check()` from request handlers, `close()` on shutdown."""

    def __init__(
        self,
        *,
        seconds: float,
        workers: int = DEFAULT_WORKERS,
        max_errors: int = 10,
        max_schema_bytes: int = MAX_SCHEMA_BYTES,
        max_schema_depth: int = MAX_SCHEMA_DEPTH,
    ) -> None:
        self._seconds = seconds
        self._max_errors = max_errors
        self._max_schema_bytes = max_schema_bytes
        self._max_schema_depth = max_schema_depth
        # A slot holds a started worker or None (not started, or killed: started on next use).
        self._slots: asyncio.Queue[_Worker | None] = asyncio.Queue()
        for _ in range(workers):
            self._slots.put_nowait(None)
        self._running: set[_Worker] = set()
        # The workspaces with a check under way or waiting, and how many of each.
        self._turns: dict[Hashable, tuple[asyncio.Lock, int]] = {}
        self._closed = False

    async def check(self, owner: Hashable, schema: Any, instance: Any) -> Verdict:
        """Check `instance` against `schema` for workspace `owner`: at most one check of the
        same owner at a time, each within the bound."""
        if self._closed:
            return Verdict.unchecked("the gateway is shutting down")
        frame = self._frame(schema, instance)
        if isinstance(frame, Verdict):
            return frame
        # Waiting for the owner's turn and for a free worker share one bound.
        start_by = asyncio.get_running_loop().time() + self._seconds
        async with self._turn(owner, start_by) as started:
            if not started:
                return Verdict.unchecked(self._busy)
            return await self._run(owner, frame, start_by)

    async def close(self) -> None:
        """Stop every worker; checks from now on are not made."""
        self._closed = True
        running, self._running = list(self._running), set()
        await asyncio.gather(*(worker.stop() for worker in running), return_exceptions=True)

    @property
    def pids(self) -> list[int]:
        """The worker processes running now (for operators and tests)."""
        return [worker.pid for worker in self._running if worker.alive]

    @property
    def _busy(self) -> str:
        return f"the schema checker was busy for {self._seconds:g} s with other checks"

    @contextlib.asynccontextmanager
    async def _turn(self, owner: Hashable, start_by: float) -> AsyncIterator[bool]:
        """This owner's turn, if it comes by `start_by`: yields whether it came."""
        lock, waiting = self._turns.get(owner, (asyncio.Lock(), 0))
        self._turns[owner] = (lock, waiting + 1)
        try:
            came = True
            try:
                async with asyncio.timeout_at(start_by):
                    await lock.acquire()
            except TimeoutError:
                came = False
            try:
                yield came
            finally:
                if came:
                    lock.release()
        finally:
            lock, waiting = self._turns[owner]
            if waiting == 1:
                del self._turns[owner]
            else:
                self._turns[owner] = (lock, waiting - 1)

    async def _run(self, owner: Hashable, frame: bytes, start_by: float) -> Verdict:
        try:
            async with asyncio.timeout_at(start_by):
                slot = await self._slots.get()
        except TimeoutError:
            return Verdict.unchecked(self._busy)
        worker = slot
        try:
            if worker is None or not worker.alive:
                worker = await self._start()
                if worker is None:
                    return Verdict.unchecked("the schema checker could not be started")
            try:
                async with asyncio.timeout(self._seconds):
                    reply = await worker.ask(frame)
            except TimeoutError:
                log.warning(
                    "a schema check took over %g s: its worker (pid %d) is killed",
                    self._seconds,
                    worker.pid,
                    extra={"workspace_id": str(owner)},
                )
                await self._discard(worker)
                worker = None
                return Verdict.unchecked(f"checking took longer than {self._seconds:g} s")
            except (OSError, EOFError, ValueError) as exc:  # IncompleteReadError is an EOFError
                log.warning(
                    "the schema checker (pid %d) failed on a schema: %s",
                    worker.pid,
                    type(exc).__name__,
                    extra={"workspace_id": str(owner)},
                )
                await self._discard(worker)
                worker = None
                return Verdict.unchecked("the schema checker failed on this schema")
            except BaseException:
                # Cancelled mid-question: the worker's answer would be read by the next check.
                await asyncio.shield(self._discard(worker))
                worker = None
                raise
        finally:
            self._slots.put_nowait(worker)
        return self._verdict(reply)

    async def _start(self) -> _Worker | None:
        env = {name: os.environ[name] for name in _INHERITED_ENV if name in os.environ}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (_PACKAGE_ROOT, env.get("PYTHONPATH"))))
        worker = None
        try:
            async with asyncio.timeout(_START_SECONDS):
                proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    _WORKER_MODULE,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.DEVNULL,
                    env=env,
                )
                worker = _Worker(proc)
                self._running.add(worker)
                ready = await worker.answer()
            if ready != {"ready": True}:
                raise ValueError(f"unexpected greeting {ready!r}")
        except (OSError, EOFError, ValueError) as exc:  # TimeoutError is an OSError
            log.error("cannot start a schema checker worker: %s", exc or type(exc).__name__)
            if worker is not None:
                await self._discard(worker)
            return None
        except BaseException:
            if worker is not None:
                await asyncio.shield(self._discard(worker))
            raise
        if self._closed:  # shut down while it was starting
            await self._discard(worker)
            return None
        log.debug("schema checker worker started (pid %d)", worker.pid)
        return worker

    async def _discard(self, worker: _Worker) -> None:
        self._running.discard(worker)
        await worker.stop()

    def _frame(self, schema: Any, instance: Any) -> bytes | Verdict:
        # Only the size is judged here (encoding is fast and stops at 254 levels); the depth
        # is judged by the worker, off the event loop.
        try:
            encoded_schema = orjson.dumps(schema)
        except orjson.JSONEncodeError:
            return Verdict.unchecked(self._too_deep)
        if len(encoded_schema) > self._max_schema_bytes:
            return Verdict.unchecked(
                f"the inputSchema is larger than {self._max_schema_bytes // 1024} KiB"
            )
        try:
            payload = orjson.dumps(
                {
                    "schema": orjson.Fragment(encoded_schema),
                    "instance": instance,
                    "max_errors": self._max_errors,
                    "max_depth": self._max_schema_depth,
                }
            )
        except orjson.JSONEncodeError:
            return Verdict.unchecked("the arguments are nested too deeply to be checked")
        return _HEADER.pack(len(payload)) + payload

    @property
    def _too_deep(self) -> str:
        return f"the inputSchema is nested deeper than {self._max_schema_depth} levels"

    def _verdict(self, reply: Any) -> Verdict:
        if not isinstance(reply, dict):
            return Verdict.unchecked("the schema checker answered nonsense")
        if reply.get("checked") is not True:
            reason = reply.get("reason")
            return Verdict.unchecked(reason if isinstance(reason, str) else "not checked")
        problems = tuple(
            Problem(tuple(_path(error[0])), str(error[1]))
            for error in reply.get("errors", [])
            if isinstance(error, list) and len(error) == 2
        )
        return Verdict(True, problems[: self._max_errors])


def _path(raw: Any) -> Sequence[str | int]:
    if not isinstance(raw, list):
        return ()
    return [part if isinstance(part, str | int) else str(part) for part in raw]


# The worker processes that check playground arguments against upstream JSON Schemas.
SCHEMA_CHECKER: web.AppKey[SchemaChecker] = web.AppKey("schema_checker")

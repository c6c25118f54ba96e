"""Node.js clients through npx: skip fast, saying how to enable them, when they cannot run."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.helpers.upstreams import free_port


async def npx_for(package: str) -> str:
    """npx, once the npm registry has answered for `package`; else the test skips. Without the
    registry npx retries for minutes before failing, even with the package in its cache."""
    npx, npm = shutil.which("npx"), shutil.which("npm")
    if npx is None or npm is None:
        pytest.skip(f"needs Node.js: install npm and npx ({package} runs through npx)")
    args = ["view", package, "version", "--fetch-retries=0", "--fetch-timeout=5000"]
    process = await asyncio.create_subprocess_exec(
        npm, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout=10)
    except TimeoutError:
        process.kill()
        await process.wait()
        why = "no answer in 10 s"
    else:
        if process.returncode == 0:
            return npx
        errors = [line for line in out.decode(errors="replace").splitlines() if "error" in line]
        why = errors[0] if errors else f"exit status {process.returncode}"
    pytest.skip(f"needs the npm registry for {package} (npm view {package}: {why})")


# Preloaded into Node peers so that every server they start listens on 127.0.0.1 only.
LOOPBACK_PRELOAD = Path(__file__).with_name("loopback.cjs")
EVERYTHING = "@modelcontextprotocol/server-everything"


@contextlib.asynccontextmanager
async def everything_server() -> AsyncIterator[str]:
    """The TypeScript reference server (server-everything, streamable HTTP) on a free loopback
    port; yields its MCP URL and stops it by PID. Skips as npx_for() does."""
    npx = await npx_for(EVERYTHING)
    port = free_port()
    env = {
        **os.environ,
        "PORT": str(port),
        "NODE_OPTIONS": f"--require {LOOPBACK_PRELOAD}",
    }
    process = await asyncio.create_subprocess_exec(
        npx,
        "-y",
        EVERYTHING,
        "streamableHttp",
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        # Its own process group: npx runs node as a child, which must stop with it.
        start_new_session=True,
    )
    try:
        # The first run downloads it from the npm registry.
        deadline = time.monotonic() + 300
        while True:
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            assert process.returncode is None, f"{EVERYTHING} exited with {process.returncode}"
            assert time.monotonic() < deadline, f"{EVERYTHING} did not listen within 300 s"
            await asyncio.sleep(0.2)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), timeout=10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()


INSPECTOR = "@modelcontextprotocol/inspector@2"  # 0.x has another CLI syntax


async def inspector(npx: str, url: str, key: str, *args: str) -> Any:
    """The MCP Inspector's CLI against an MCP URL with an API key; its JSON answer."""
    process = await asyncio.create_subprocess_exec(
        npx,
        "-y",
        INSPECTOR,
        "--cli",
        url,
        "--transport",
        "http",
        "--header",
        f"X-API-Key: {key}",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        # The first run downloads the inspector from the npm registry.
        out, err = await asyncio.wait_for(process.communicate(), timeout=300)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode == 0, err.decode(errors="replace")[-3000:]
    return orjson.loads(out)

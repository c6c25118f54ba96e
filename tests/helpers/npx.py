"""Node.js clients through npx: skip fast, saying how to enable them, when they cannot run."""

from __future__ import annotations

import asyncio
import shutil

import pytest


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

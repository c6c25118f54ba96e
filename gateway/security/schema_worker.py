"""A worker process of the schema checker: checks arguments against untrusted JSON Schemas.

Started by gateway.security.untrusted_schemas as `python -m gateway.security.schema_worker`
and spoken to over stdin and stdout in frames: a 4-byte big-endian length, then that many bytes
of JSON. A request is `{"schema": ..., "instance": ..., "max_errors": n, "max_depth": n}`; the
reply is `{"checked": true, "errors": [[path, message], ...], "total": n}` (most relevant first) or
`{"checked": false, "reason": "..."}`. One request at a time, in order; the first frame, sent
unasked, is `{"ready": true}`, once everything is imported.

It imports nothing of the gateway and is given none of its settings or secrets: a hostile
schema can at worst make it slow (the parent kills it past its time bound), make it run out of
its own memory limit, or crash it (the parent starts another).
"""

from __future__ import annotations

import contextlib
import os
import resource
import struct
import sys
from typing import Any, BinaryIO, Final

import jsonschema_rs
import orjson

# Bounds of the conversation; the parent keeps well inside them.
MAX_FRAME_BYTES: Final = 64 * 1024 * 1024
# Address space of this process: a schema that makes the validator allocate without end
# ends this process (and its check), not the machine's memory.
_MEMORY_LIMIT: Final = 1024 * 1024 * 1024
# Lower priority than the gateway itself: a check spinning until it is killed leaves the CPU
# to the requests of everyone else first.
_NICENESS: Final = 10
# Errors looked at before the most relevant are picked: a large instance may fail a schema
# millions of times over.
_ERRORS_SCANNED: Final = 1000
_MESSAGE_CHARS: Final = 300
# Keywords whose failure says little on its own: the errors of their branches say more.
_WEAK: Final = frozenset({"anyOf", "oneOf", "not"})
_HEADER: Final = struct.Struct(">I")
_KNOWN_META_SCHEMAS: Final = (
    "http://json-schema.org/draft-04/schema",
    "http://json-schema.org/draft-06/schema",
    "http://json-schema.org/draft-07/schema",
    "https://json-schema.org/draft/2019-09/schema",
    "https://json-schema.org/draft/2020-12/schema",
)


def main() -> None:
    _confine()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    _write_frame(stdout, {"ready": True})
    while True:
        request = _read_frame(stdin)
        if request is None:
            return  # the parent closed the pipe: it is done with this worker
        _write_frame(stdout, _answer(request))


def _write_frame(stream: BinaryIO, value: Any) -> None:
    payload = orjson.dumps(value)
    stream.write(_HEADER.pack(len(payload)) + payload)
    stream.flush()


def check(schema: Any, instance: Any, max_errors: int, max_depth: int) -> dict[str, Any]:
    """The reply to one request (see the module docstring)."""
    if _deeper_than(schema, max_depth):
        return {
            "checked": False,
            "reason": f"the inputSchema is nested deeper than {max_depth} levels",
        }
    validator = _compile(schema)
    if isinstance(validator, str):
        return {"checked": False, "reason": validator}
    found: list[tuple[bool, int, int, list[str | int], str]] = []
    for index, error in enumerate(validator.iter_errors(instance)):
        kind = error.kind.name
        if "backtrack" in kind.lower():
            return {"checked": False, "reason": "a pattern of the schema takes too long to match"}
        path = list(error.instance_path)
        found.append((kind in _WEAK, len(path), index, path, _shorten(error.message)))
        if len(found) >= _ERRORS_SCANNED:
            break
    found.sort(key=lambda item: item[:3])
    errors = [[path, message] for _, _, _, path, message in found[:max_errors]]
    return {"checked": True, "errors": errors, "total": len(found)}


def _compile(schema: Any) -> jsonschema_rs.Validator | str:
    """The validator, or why the schema cannot be checked.

    Patterns go to the linear-time regex engine; only a pattern it cannot take (lookaround,
    backreferences) falls back to the backtracking one, whose steps are bounded. No `$ref` is
    ever fetched.
    """
    if not isinstance(schema, dict | bool):
        return "the inputSchema is not a JSON Schema (neither an object nor a boolean)"
    attempts: list[dict[str, Any]] = [
        {"pattern_options": jsonschema_rs.RegexOptions()},
        {"pattern_options": jsonschema_rs.FancyRegexOptions(backtrack_limit=100_000)},
    ]
    first: jsonschema_rs.ValidationError | None = None
    for options in attempts:
        try:
            return jsonschema_rs.validator_for(
                _with_known_meta_schema(schema), validate_formats=False, offline=True, **options
            )
        except jsonschema_rs.ValidationError as exc:
            first = first or exc
    assert first is not None
    if first.kind.name == "$ref" or "retriev" in first.message.lower():
        return "the inputSchema refers to another document ($ref), which the gateway does not fetch"
    return f"the inputSchema is not a valid JSON Schema: {_shorten(first.message)}"


def _with_known_meta_schema(schema: Any) -> Any:
    """An unknown `$schema` is read as the latest draft, as the server's own validator would."""
    if not isinstance(schema, dict):
        return schema
    meta = schema.get("$schema")
    if meta is None or (isinstance(meta, str) and meta.rstrip("#") in _KNOWN_META_SCHEMAS):
        return schema
    return {key: value for key, value in schema.items() if key != "$schema"}


def _answer(request: Any) -> dict[str, Any]:
    if not isinstance(request, dict):
        return {"checked": False, "reason": "malformed request to the schema checker"}
    max_errors, max_depth = request.get("max_errors"), request.get("max_depth")
    return check(
        request.get("schema"),
        request.get("instance"),
        max_errors if isinstance(max_errors, int) else 10,
        max_depth if isinstance(max_depth, int) else 64,
    )


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether objects and arrays nest more than `limit` levels (without recursing)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = (
            node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        )
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def _shorten(text: str) -> str:
    return text if len(text) <= _MESSAGE_CHARS else text[: _MESSAGE_CHARS - 1] + "…"


def _read_frame(stream: BinaryIO) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME_BYTES:
        return None
    body = stream.read(size)
    if len(body) < size:
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}


def _confine() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (_MEMORY_LIMIT, _MEMORY_LIMIT))
    # A crash leaves no core file (it would hold the hostile schema and whatever it drew in).
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    with contextlib.suppress(OSError):
        os.nice(_NICENESS)


if __name__ == "__main__":
    main()

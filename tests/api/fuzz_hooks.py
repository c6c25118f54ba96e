"""schemathesis hooks: refusals a JSON Schema cannot state, which are therefore not failures of
the document (each rule is stated in its operation's description or in docs/behaviour.md)."""

from __future__ import annotations

from typing import Any

import schemathesis

# 422s for a reason that depends on more than one field, or on the deployment.
_NOT_IN_A_SCHEMA = (
    # GET /tool-calls: a window whose end is before its start.
    "end must not be before start",
    # test_fuzz runs the gateway with every address refused, so that the URLs the fuzzer
    # registers reach nothing on this machine: URLs with an IP address for a host are refused.
    "the address is refused by the outbound policy",
    # POST /tool-calls: a created_at outside the tool call retention, which moves with the
    # clock and GATEWAY_TOOL_CALL_RETENTION_DAYS (stated in created_at's description).
    "is older than the tool call retention",
    "is more than 1 hour in the future",
    # A workspace's (or a user's) bounds on what it may hold: the count is not in the request.
    "the most this gateway allows",
    # An API key's allowed_servers: ids must be servers of the workspace, which a schema
    # cannot know.
    "not servers of this workspace",
    # A toolset's members: servers of the workspace (likewise), each listed once (a schema
    # cannot say that objects differ in one field).
    "not a server of this workspace",
    "a server is a member once",
    # POST /servers/{id}/tools/approve: the names must be tools the server lists now.
    "not among the tools the server lists now",
)


@schemathesis.hook
def filter_failure(
    context: schemathesis.HookContext, failure: Any, case: Any, response: Any
) -> bool:
    return not (
        response.status_code == 422 and any(why in response.text for why in _NOT_IN_A_SCHEMA)
    )

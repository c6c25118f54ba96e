"""Toolsets: one MCP endpoint over several servers of a workspace, at
/api/v1/toolsets/{id}/mcp. The endpoint (endpoint) answers MCP itself and forwards each call to
the member that owns its tool; the tools go under names of their own (names); a client's
session state travels inside its Mcp-Session-Id (sessions), so any process of any replica
serves any request of a session; members are reached through sessions of their own (members);
toolsets and their name index are cached in-process (registry)."""

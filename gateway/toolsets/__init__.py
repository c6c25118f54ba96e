"""Toolsets: one MCP endpoint over several servers of a workspace, at
/api/v1/toolsets/{id}/mcp. Its tools are the members' tools under names of their own (names),
and a client's session state travels inside its Mcp-Session-Id (sessions), so any process of
any replica serves any request of a session."""

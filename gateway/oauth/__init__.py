"""OAuth 2.1 for MCP clients: the gateway as the authorization server for its own accounts,
and every proxy and toolset MCP URL as a protected resource (MCP authorization spec)."""

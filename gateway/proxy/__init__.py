"""The hot path: the transparent MCP proxy from agents to their upstream servers, and how it
reads what passes (the calls in a request, their outcomes in the reply) for the call log."""

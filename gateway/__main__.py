"""`python -m gateway` is the mcp-gateway command."""

from gateway.cli import main

main()

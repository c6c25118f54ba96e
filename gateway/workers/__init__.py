"""Background loops that run in the server's event loop."""

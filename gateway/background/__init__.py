"""Background loops in the server's event loop: probes, alert evaluation and notification,
retention, API key and OAuth grant usage; one way to start them, and a loop that dies is logged
loudly."""

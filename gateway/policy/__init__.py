"""What a caller may do through the gateway: one decision per request, from rules held in memory.

- rules: what the rules are made of: a key's permissions, servers and tool patterns, a
  server's disabled tools, and rate limits ("100/minute"), each parsed and checked once.
- budgets: rate limits that hold across every process and machine of a deployment. A window's
  *budget* of calls is shared in PostgreSQL (or Redis); each process takes a *lease* of it in
  batches and refunds what it does not use, so no proxied call waits for a round trip.
"""

"""Caching: the in-process caches of per-request lookups, the LISTEN loop that drops their
stale entries, and the response cache shared by every process (memory or Redis)."""

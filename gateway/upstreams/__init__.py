"""Registered servers as the gateway reaches them at run time: their in-process cache, and
their tool lists (cached, fetched once at a time, held within a memory budget)."""

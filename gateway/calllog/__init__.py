"""The tool call log: the rows every producer (proxy, playground, ingestion) writes, and the
bounded in-memory queue that writes them to PostgreSQL in batches."""

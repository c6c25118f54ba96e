"""PostgreSQL access: the pool, the embedded server, the schema, and one SQL module per resource."""

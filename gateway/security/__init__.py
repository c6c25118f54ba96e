"""Security: the secrets the gateway keeps and the lines it does not cross.

Passwords (passwords), access and refresh tokens (tokens), API key values (api_keys), stored
upstream credentials sealed with rotatable keys (secretbox, rotation) and the headers they
become (credentials), the outbound address policy every request to a user-given URL obeys
(outbound), and JSON Schemas from upstreams checked in worker processes so none can stall the
event loop (untrusted_schemas, schema_worker)."""

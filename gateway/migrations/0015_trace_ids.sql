-- Version 15: tracing. A tool call keeps the id of its OpenTelemetry trace (gateway/ops/tracing),
-- so the dashboard links a call to its trace. A nullable column without a default: adding it
-- rewrites nothing.
ALTER TABLE tool_calls
    ADD COLUMN trace_id text CHECK (trace_id ~ '^[0-9a-f]{32}$');

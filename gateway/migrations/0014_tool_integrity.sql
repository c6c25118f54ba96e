-- Version 14: tool integrity. Every tool list the gateway sees is fingerprinted per tool
-- (server_tools), its changes kept (tool_changes); a server may pin its tools (pin_tools), and
-- alert rules may watch the number of changes (metric tool_changes). New tables and columns
-- with defaults: nothing existing is rewritten.
ALTER TABLE servers
    ADD COLUMN pin_tools boolean NOT NULL DEFAULT false,
    ADD COLUMN tool_definitions_hash text;

DROP TRIGGER servers_invalidate ON servers;
CREATE TRIGGER servers_invalidate
    AFTER UPDATE OF name, url, auth_type, credentials, disabled_tools, rate_limit, pin_tools
    OR DELETE
    ON servers
    FOR EACH ROW EXECUTE FUNCTION notify_invalidate('id');

CREATE TABLE server_tools (
    server_id    uuid NOT NULL REFERENCES servers (id) ON DELETE CASCADE,
    name         text NOT NULL,
    fingerprint  text,
    definition   jsonb,
    approved     text,
    seen_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (server_id, name)
);

CREATE TABLE tool_changes (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    server_id     uuid NOT NULL REFERENCES servers (id) ON DELETE CASCADE,
    workspace_id  uuid NOT NULL,
    tool_name     text NOT NULL,
    change        text NOT NULL CHECK (change IN ('added', 'removed', 'changed')),
    before        jsonb,
    after         jsonb,
    detected_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX tool_changes_server_idx ON tool_changes (server_id, detected_at DESC, id DESC);
CREATE INDEX tool_changes_detected_idx ON tool_changes (detected_at);

ALTER TABLE alert_rules DROP CONSTRAINT alert_rules_metric_check;
ALTER TABLE alert_rules ADD CONSTRAINT alert_rules_metric_check CHECK (metric IN ('error_rate',
    'avg_latency_ms', 'p95_latency_ms', 'call_count', 'server_down', 'tool_changes'));

-- Version 8: governed access. What each API key may do (permissions, servers, tool patterns,
-- a rate limit), what nobody may do with a server (disabled tools, a rate limit), and the
-- budgets that make rate limits hold across every gateway process.
ALTER TABLE api_keys
    ADD COLUMN permissions text[] NOT NULL DEFAULT '{proxy,ingest,read}',
    ADD COLUMN allowed_servers uuid[],
    ADD COLUMN allowed_tools text[],
    ADD COLUMN rate_limit text;

ALTER TABLE servers
    ADD COLUMN disabled_tools text[] NOT NULL DEFAULT '{}',
    ADD COLUMN rate_limit text;

DROP TRIGGER servers_invalidate ON servers;
CREATE TRIGGER servers_invalidate
    AFTER UPDATE OF url, auth_type, credentials, disabled_tools, rate_limit OR DELETE ON servers
    FOR EACH ROW EXECUTE FUNCTION notify_invalidate('id');

CREATE UNLOGGED TABLE call_budgets (
    subject       text NOT NULL,
    window_start  timestamptz NOT NULL,
    used          integer NOT NULL,
    granted       integer NOT NULL,
    expires_at    timestamptz NOT NULL,
    PRIMARY KEY (subject, window_start)
);
CREATE INDEX call_budgets_expiry_idx ON call_budgets (expires_at);

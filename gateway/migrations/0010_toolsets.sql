-- Version 10: toolsets (one MCP endpoint over several servers, gateway/toolsets), and the
-- toolset a tool call came through. Adding a nullable column without a default rewrites
-- nothing, on every partition of tool_calls. A server's name now drops it from every
-- process's cache too: a toolset's tool names start with it.

-- One MCP endpoint over several servers of a workspace (gateway/toolsets). Members are kept in
-- order: when two expose the same tool name, the first one's tool wins.
CREATE TABLE toolsets (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    workspace_id  uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    name          text NOT NULL,
    description   text NOT NULL DEFAULT '',
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT toolsets_workspace_id_name_key UNIQUE (workspace_id, name)
);
CREATE TRIGGER toolsets_invalidate AFTER INSERT OR UPDATE OR DELETE ON toolsets
    FOR EACH ROW EXECUTE FUNCTION notify_invalidate('id');

-- A deleted server leaves its toolsets (the cascade), which its trigger tells every process.
CREATE TABLE toolset_servers (
    toolset_id  uuid NOT NULL REFERENCES toolsets (id) ON DELETE CASCADE,
    server_id   uuid NOT NULL REFERENCES servers (id) ON DELETE CASCADE,
    position    integer NOT NULL,
    tools       text[],  -- tool name globs (* and ?); null: every tool
    prefix      text,    -- null: the server's name in [a-z0-9_] and '__'; '': none
    PRIMARY KEY (toolset_id, server_id)
);
CREATE INDEX toolset_servers_server_idx ON toolset_servers (server_id);
CREATE TRIGGER toolset_servers_invalidate AFTER INSERT OR UPDATE OR DELETE ON toolset_servers
    FOR EACH ROW EXECUTE FUNCTION notify_invalidate('toolset_id');

ALTER TABLE tool_calls ADD COLUMN toolset_id uuid;

DROP TRIGGER servers_invalidate ON servers;
CREATE TRIGGER servers_invalidate
    AFTER UPDATE OF name, url, auth_type, credentials, disabled_tools, rate_limit OR DELETE
    ON servers
    FOR EACH ROW EXECUTE FUNCTION notify_invalidate('id');

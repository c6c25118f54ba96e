-- Version 13: OAuth 2.1 for MCP clients (gateway/oauth): clients, grants, codes and refresh
-- tokens. New tables only, and a trigger ending a leaving member's grants.

-- == OAuth 2.1 for MCP clients ==

-- The gateway is the authorization server for its own accounts (gateway/oauth). A client is
-- either registered here (RFC 7591, public clients: client_id is ours) or known by its client
-- ID metadata document (client_id is the document's https URL; the row caches the document).
CREATE TABLE oauth_clients (
    client_id      text PRIMARY KEY,
    client_name    text NOT NULL,
    redirect_uris  text[] NOT NULL,
    metadata       jsonb NOT NULL,   -- as registered, or the document as fetched
    registered     boolean NOT NULL, -- false: a metadata document, fetched again when stale
    created_at     timestamptz NOT NULL DEFAULT now(),
    fetched_at     timestamptz
);

-- What a member consented to: one client's access to one MCP URL (a server's proxy URL or a
-- toolset's) of one workspace, acting as that member. Made when its authorization code is
-- exchanged; deleting it (revocation in the dashboard or at /oauth/revoke, a refresh token
-- presented twice, the member leaving) ends its tokens at once in every process (NOTIFY).
CREATE TABLE oauth_grants (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    workspace_id  uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    user_id       uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    client_id     text NOT NULL REFERENCES oauth_clients (client_id) ON DELETE CASCADE,
    client_name   text NOT NULL,  -- as consented to; the call log's caller_agent
    resource      text NOT NULL,  -- the MCP URL (RFC 8707): its tokens are good there only
    server_id     uuid REFERENCES servers (id) ON DELETE CASCADE,
    toolset_id    uuid REFERENCES toolsets (id) ON DELETE CASCADE,
    scope         text NOT NULL DEFAULT '',
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_used_at  timestamptz,    -- written in batches, not per call
    CHECK ((server_id IS NULL) <> (toolset_id IS NULL))
);
CREATE INDEX oauth_grants_member_idx ON oauth_grants (workspace_id, user_id);
CREATE INDEX oauth_grants_client_idx ON oauth_grants (client_id);
CREATE INDEX oauth_grants_server_idx ON oauth_grants (server_id);
CREATE INDEX oauth_grants_toolset_idx ON oauth_grants (toolset_id);
-- Not on UPDATE: last_used_at changes all the time and means nothing to a cache.
CREATE TRIGGER oauth_grants_invalidate AFTER DELETE ON oauth_grants
    FOR EACH ROW EXECUTE FUNCTION notify_invalidate('id');

-- A member who leaves a workspace (or is removed) takes their grants there with them.
CREATE FUNCTION memberships_end_grants() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM oauth_grants WHERE workspace_id = OLD.workspace_id AND user_id = OLD.user_id;
    RETURN NULL;
END $$;
CREATE TRIGGER memberships_end_grants AFTER DELETE ON memberships
    FOR EACH ROW EXECUTE FUNCTION memberships_end_grants();

-- Authorization codes: single use and short-lived; only their hash is kept. A code presented
-- a second time ends the grant it was exchanged for (RFC 9700 4.5: a stolen code).
CREATE TABLE oauth_codes (
    code_hash       text PRIMARY KEY,
    client_id       text NOT NULL REFERENCES oauth_clients (client_id) ON DELETE CASCADE,
    workspace_id    uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    user_id         uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    resource        text NOT NULL,
    server_id       uuid REFERENCES servers (id) ON DELETE CASCADE,
    toolset_id      uuid REFERENCES toolsets (id) ON DELETE CASCADE,
    redirect_uri    text NOT NULL,
    scope           text NOT NULL DEFAULT '',
    code_challenge  text NOT NULL,  -- PKCE, S256 only
    expires_at      timestamptz NOT NULL,
    used_at         timestamptz,
    grant_id        uuid REFERENCES oauth_grants (id) ON DELETE SET NULL  -- once exchanged
);
CREATE INDEX oauth_codes_expiry_idx ON oauth_codes (expires_at);

-- Refresh tokens, rotated on every use; only their hash is kept. One presented after it was
-- rotated (a copy, used by someone) ends its grant (RFC 9700 4.14.2).
CREATE TABLE oauth_refresh_tokens (
    token_hash  text PRIMARY KEY,
    grant_id    uuid NOT NULL REFERENCES oauth_grants (id) ON DELETE CASCADE,
    expires_at  timestamptz NOT NULL,
    rotated_at  timestamptz
);
CREATE INDEX oauth_refresh_tokens_grant_idx ON oauth_refresh_tokens (grant_id);
CREATE INDEX oauth_refresh_tokens_expiry_idx ON oauth_refresh_tokens (expires_at);

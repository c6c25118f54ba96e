-- mcp-gateway: the canonical schema. A fresh database gets this file; an existing one gets the
-- numbered files in gateway/migrations/ above its recorded version (a test checks both agree).

CREATE TABLE schema_version (
    version     integer PRIMARY KEY,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- Cache invalidation: every row change that an in-process cache may hold is announced on the
-- channel 'gateway_invalidate' as '<table>:<key>', where the key is the values of the columns
-- named in the trigger's arguments, joined with ':'. Every gateway process then drops it.
CREATE FUNCTION notify_invalidate() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    doc jsonb;
    col text;
    parts text[] := '{}';
BEGIN
    IF TG_OP = 'DELETE' THEN doc := to_jsonb(OLD); ELSE doc := to_jsonb(NEW); END IF;
    FOREACH col IN ARRAY TG_ARGV LOOP
        parts := parts || (doc ->> col);
    END LOOP;
    PERFORM pg_notify('gateway_invalidate', TG_TABLE_NAME || ':' || array_to_string(parts, ':'));
    RETURN NULL;
END $$;

-- == accounts and workspaces ==

CREATE TABLE users (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    email          text NOT NULL,
    name           text NOT NULL,
    password_hash  text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT users_email_key UNIQUE (email)
);

CREATE TABLE workspaces (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name         text NOT NULL,
    slug         text NOT NULL,
    is_personal  boolean NOT NULL DEFAULT false,
    created_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT workspaces_slug_key UNIQUE (slug)
);

CREATE TABLE memberships (
    workspace_id  uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    user_id       uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    role          text NOT NULL CHECK (role IN ('owner', 'admin', 'member')),
    joined_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, user_id)
);
CREATE INDEX memberships_user_idx ON memberships (user_id);
CREATE TRIGGER memberships_invalidate AFTER INSERT OR UPDATE OR DELETE ON memberships
    FOR EACH ROW EXECUTE FUNCTION notify_invalidate('workspace_id', 'user_id');

CREATE TABLE invites (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    workspace_id  uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    email         text NOT NULL,
    role          text NOT NULL CHECK (role IN ('admin', 'member')),
    -- Kept in the clear: the invitee sees it in /auth/me, and accepting also needs the
    -- invitee's own login with the same email, so the token alone grants nothing.
    token         text NOT NULL UNIQUE,
    status        text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'accepted', 'revoked')),
    invited_by    uuid REFERENCES users (id) ON DELETE SET NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    accepted_at   timestamptz
);
CREATE INDEX invites_workspace_idx ON invites (workspace_id, created_at DESC);
CREATE INDEX invites_pending_email_idx ON invites (email) WHERE status = 'pending';

-- Refresh tokens rotate on every use; all tokens descending from one login share a family,
-- so presenting an already-rotated token revokes the whole family.
CREATE TABLE refresh_tokens (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    family_id     uuid NOT NULL,
    user_id       uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    workspace_id  uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    token_hash    text NOT NULL UNIQUE,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    used_at       timestamptz,
    revoked_at    timestamptz
);
CREATE INDEX refresh_tokens_family_idx ON refresh_tokens (family_id);

CREATE TABLE api_keys (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    workspace_id  uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    name          text NOT NULL,
    prefix        text NOT NULL,
    key_hash      text NOT NULL UNIQUE,
    created_by    uuid REFERENCES users (id) ON DELETE SET NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_used_at  timestamptz,
    revoked_at    timestamptz
);
CREATE INDEX api_keys_workspace_idx ON api_keys (workspace_id, created_at DESC);
CREATE TRIGGER api_keys_invalidate AFTER INSERT OR UPDATE OR DELETE ON api_keys
    FOR EACH ROW EXECUTE FUNCTION notify_invalidate('key_hash');

-- == servers and health ==

CREATE TABLE servers (
    id                uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    workspace_id      uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    name              text NOT NULL,
    url               text NOT NULL,
    description       text NOT NULL DEFAULT '',
    tags              text[] NOT NULL DEFAULT '{}',
    auth_type         text CHECK (auth_type IN ('bearer', 'api_key', 'basic')),
    -- Fernet token (MultiFernet over GATEWAY_SECRET_KEYS) of the credentials JSON object.
    credentials       bytea,
    status            text NOT NULL DEFAULT 'unknown'
                      CHECK (status IN ('unknown', 'healthy', 'degraded', 'down')),
    last_checked_at   timestamptz,
    last_latency_ms   double precision,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT servers_workspace_id_name_key UNIQUE (workspace_id, name),
    CONSTRAINT servers_credentials_match CHECK ((auth_type IS NULL) = (credentials IS NULL))
);
CREATE TRIGGER servers_invalidate AFTER UPDATE OF url, auth_type, credentials OR DELETE ON servers
    FOR EACH ROW EXECUTE FUNCTION notify_invalidate('id');

-- == tool calls ==

-- == alerts ==

INSERT INTO schema_version (version) VALUES (1);

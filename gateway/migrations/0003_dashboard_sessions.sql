-- Version 3: sign-ins of the dashboard (a cookie session; the API stays bearer / API key).

CREATE TABLE dashboard_sessions (
    id_hash       text PRIMARY KEY,
    user_id       uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    -- The workspace the pages show; null once it is deleted (the next page lands at home).
    workspace_id  uuid REFERENCES workspaces (id) ON DELETE SET NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL
);
CREATE INDEX dashboard_sessions_user_idx ON dashboard_sessions (user_id);
CREATE INDEX dashboard_sessions_expiry_idx ON dashboard_sessions (expires_at);

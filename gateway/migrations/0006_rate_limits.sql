-- Version 6: login and signup rate limits shared by every gateway process (without Redis).
CREATE UNLOGGED TABLE rate_limit_hits (
    key         text NOT NULL,
    at          timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX rate_limit_hits_key_idx ON rate_limit_hits (key, at);
CREATE INDEX rate_limit_hits_expiry_idx ON rate_limit_hits (expires_at);

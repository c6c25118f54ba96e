-- Version 7: tenants cannot hurt each other. Verified email addresses (invitations are
-- accepted only by someone who controls the invited address), the workspace of each queued
-- alert notification, so the notifier shares its sending slots fairly between them, and the
-- index a password change uses to end every session of its user.
ALTER TABLE users ADD COLUMN email_verified_at timestamptz;
CREATE INDEX refresh_tokens_user_idx ON refresh_tokens (user_id) WHERE revoked_at IS NULL;

ALTER TABLE alert_deliveries ADD COLUMN workspace_id uuid;
UPDATE alert_deliveries d SET workspace_id = r.workspace_id
FROM alert_rules r WHERE r.id = d.rule_id;
ALTER TABLE alert_deliveries ALTER COLUMN workspace_id SET NOT NULL;
ALTER TABLE alert_deliveries
    ADD CONSTRAINT alert_deliveries_workspace_id_fkey
    FOREIGN KEY (workspace_id) REFERENCES workspaces (id) ON DELETE CASCADE;
CREATE INDEX alert_deliveries_workspace_due_idx
    ON alert_deliveries (workspace_id, next_attempt_at) WHERE status = 'pending';

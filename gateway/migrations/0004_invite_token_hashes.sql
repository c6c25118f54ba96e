-- Version 4: invitation tokens are stored as hashes (SHA-256, hex), as API keys are. Links
-- already sent keep working: their tokens are hashed in place.

ALTER TABLE invites ADD COLUMN token_hash text;
UPDATE invites SET token_hash = encode(sha256(convert_to(token, 'UTF8')), 'hex');
ALTER TABLE invites ALTER COLUMN token_hash SET NOT NULL;
ALTER TABLE invites ADD CONSTRAINT invites_token_hash_key UNIQUE (token_hash);
ALTER TABLE invites DROP COLUMN token;

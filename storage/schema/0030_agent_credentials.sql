-- A confirmation token is bound to the credential that previewed its action (`key:<id>` or
-- `session:<id>`, engine/runtime.py Principal.credential): another key or session of the same
-- user cannot confirm it, so it dies with the key or session that asked for it. Tokens issued
-- before this column have none and are confirmed by nobody (they lived 10 minutes at most).
ALTER TABLE agent_confirmations ADD COLUMN credential TEXT;

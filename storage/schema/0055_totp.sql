-- Two-factor sign-in (engine/accounts/totp.py). A user's TOTP secret is sealed (storage/sealing.py)
-- and counts only once confirmed; `last_step` is the last time step whose code was accepted, so
-- a code is never accepted twice. Recovery codes are kept only as their hashes, each used once.
CREATE TABLE user_totp (
    user_id TEXT PRIMARY KEY REFERENCES users (id) ON DELETE CASCADE,
    secret TEXT NOT NULL,
    created_at TEXT NOT NULL,
    confirmed_at TEXT,
    last_step BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE totp_recovery_codes (
    user_id TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    code_hash TEXT NOT NULL,
    used_at TEXT,
    PRIMARY KEY (user_id, code_hash)
);
-- A workspace listed here requires two-factor sign-in of every member who uses it.
CREATE TABLE workspace_totp_required (
    workspace_id TEXT PRIMARY KEY REFERENCES workspaces (id) ON DELETE CASCADE,
    required_by TEXT NOT NULL,
    required_at TEXT NOT NULL
);

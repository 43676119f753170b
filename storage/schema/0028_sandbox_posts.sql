-- Issue 28: in a sandboxed workspace nothing leaves the machine, HTTP included. The POSTs it
-- would have made (webhook deliveries, forwards to URLs) are captured here as the receiver
-- would have got them: URL, header fields (the signature among them; a basic-auth password
-- never) and body. The service's own mail about its transfers joins the captured mail.
CREATE TABLE sandbox_posts (
    id TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    kind TEXT NOT NULL,
    source_id TEXT NOT NULL,
    url TEXT NOT NULL,
    headers TEXT NOT NULL,
    body BYTEA NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX sandbox_posts_workspace ON sandbox_posts (workspace_id, created_at);

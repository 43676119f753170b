-- A sandbox mark (domains.sandbox_verified: verified without DNS) is valid only inside the
-- sandboxed workspace that made it (engine/domains/registry.py). Marks that escaped before
-- this rule, carried by a transfer into a workspace outside the sandbox, go back to pending:
-- only DNS verifies those names now.
UPDATE domains SET status = 'pending', record_status = '{}', verified_at = NULL,
    sandbox_verified = FALSE
    WHERE sandbox_verified AND workspace_id NOT IN (SELECT id FROM workspaces WHERE sandbox)

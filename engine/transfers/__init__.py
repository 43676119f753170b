"""Domain transfers between workspaces: rules, actions, notices and the timer."""

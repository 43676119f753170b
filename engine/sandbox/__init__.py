"""The sandbox: workspaces whose mail is captured instead of delivered, with scripted outcomes."""

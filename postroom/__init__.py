"""Postroom's composition root: settings, the command line and service start-up."""

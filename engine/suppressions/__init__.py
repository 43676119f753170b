"""The suppression list and its one-time 24-hour override."""

"""Users, sessions, API keys, SMTP credentials and passwords: who may act."""

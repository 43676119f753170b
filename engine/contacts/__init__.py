"""Contact lists, CSV import and bulk sends to a list."""

"""Database access for Postroom: SQLite and PostgreSQL behind one interface.

Repository functions are plain synchronous functions over a `Tx`; `Database` runs each unit
of work in one thread hop. Storage imports nothing else of Postroom.
"""

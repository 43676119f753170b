"""One module per resource; each exposes a `blueprint`."""

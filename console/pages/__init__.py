"""The console's pages, one module per area, each a blueprint nested in `console.web`."""

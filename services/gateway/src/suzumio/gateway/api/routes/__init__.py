"""One module per resource; `ROUTERS` lists them all for the app."""

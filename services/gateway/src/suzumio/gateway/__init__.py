"""The gateway: the public REST API, live streams and the web page (DESIGN.md §2)."""

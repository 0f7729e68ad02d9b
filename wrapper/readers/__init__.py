"""The readers: every command that reads the catalog (agents, top, watch, metrics, web, scan, ...)."""

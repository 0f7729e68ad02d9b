"""`hctx web`: the fleet at a glance in a browser, live, read-only (see wrapper.readers.web.command)."""

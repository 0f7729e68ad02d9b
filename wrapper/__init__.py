"""The launcher, the relaunch supervisor, harness settings rendering and the `hctx` command line."""

"""Launch and supervision: `hctx wrap`'s launcher, its resident and the sidecars it keeps."""

"""Names in models.toml -> GGUF files on disk -> a checked, loaded target and draft."""

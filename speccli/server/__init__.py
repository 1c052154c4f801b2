"""speccli serve: an OpenAI-compatible HTTP server over the speculative Generator (app, worker, metrics)."""

"""Files shipped with speccli: the models.toml registry and the built-in bench prompts."""

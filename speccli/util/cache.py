"""Where speccli keeps what it builds and downloads, and where the user's configuration lives."""
from __future__ import annotations

import os
from pathlib import Path


def user_config_path() -> Path:
    config_home = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(config_home).expanduser() / "speccli" / "models.toml"


def speccli_cache_dir() -> Path:
    """${SPECCLI_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/speccli}."""
    explicit = os.environ.get("SPECCLI_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    cache_home = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache_home).expanduser() / "speccli"


def model_cache_dir() -> Path:
    """Where package, chunked-package and derived models are built: <speccli cache>/models."""
    return speccli_cache_dir() / "models"

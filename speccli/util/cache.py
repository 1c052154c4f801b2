"""Where speccli keeps what it builds and downloads, and where the user's configuration lives."""
from __future__ import annotations

import os
from pathlib import Path

from speccli.errors import SpeccliError, UnreadableFileError


def expand_home(path: str | Path, named_by: str) -> Path:
    """`path` with a leading ~ or ~user expanded; one that names no user here (`~nobody-here/x`) is
    refused, naming where it was written (Python raises RuntimeError)."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        raise SpeccliError(f"{named_by} {path}: {str(path).split('/')[0]} is no home folder on this machine") from None


def home_folder() -> Path:
    """Path.home(), or one line where HOME starts with a ~ that names no user here."""
    try:
        return Path.home()
    except RuntimeError:
        return expand_home(os.environ.get("HOME") or "~", "HOME")  # raises, naming HOME


def user_config_path() -> Path:
    config_home = os.environ.get("XDG_CONFIG_HOME")
    base = expand_home(config_home, "XDG_CONFIG_HOME") if config_home else home_folder() / ".config"
    return base / "speccli" / "models.toml"


def speccli_cache_dir() -> Path:
    """${SPECCLI_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/speccli}; refused, naming where it was set, if
    something other than a folder is there (the first write into it would name an internal file)."""
    explicit = os.environ.get("SPECCLI_CACHE_DIR")
    if explicit:
        folder, named_by = expand_home(explicit, "SPECCLI_CACHE_DIR"), "SPECCLI_CACHE_DIR"
    else:
        refuse_empty_home("SPECCLI_CACHE_DIR")
        cache_home = os.environ.get("XDG_CACHE_HOME")
        base = expand_home(cache_home, "XDG_CACHE_HOME") if cache_home else home_folder() / ".cache"
        folder, named_by = base / "speccli", "the cache folder"
    if folder.exists() and not folder.is_dir():
        raise UnreadableFileError(f"{named_by} {folder}: not a folder")
    return folder


def refuse_empty_home(*own_variables: str) -> None:
    """An empty HOME makes Python's home folder /, and a cache under it /.cache: gigabytes written at the
    root (this tool's builds, and huggingface_hub's downloads alike). Refused where no other variable
    (the cache's `own_variables`, or XDG_CACHE_HOME) says where the cache goes."""
    if os.environ.get("HOME") == "" and not any(os.environ.get(name) for name in ("XDG_CACHE_HOME", *own_variables)):
        raise SpeccliError(f"HOME is set but empty, so there is no cache folder: set HOME, XDG_CACHE_HOME or {own_variables[0]}")


def model_cache_dir() -> Path:
    """Where package, chunked-package and derived models are built: <speccli cache>/models."""
    return speccli_cache_dir() / "models"

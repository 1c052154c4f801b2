"""quant-check's sequential-mode store of the reference's rows, one model loaded at a time: the
reference runs first and its log-probabilities are stored on disk, memory-mapped, as llama.cpp stores
its `--kl-divergence-base` file: uint16 codes over the top STORED_RANGE nats of each row (step 0.00037
nats), tokens below that range dropped (probability < e^-24 of the top one). That is the only
approximation, and it is small.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np

from speccli.errors import SpeccliError
from speccli.util.format import format_size

STORED_RANGE = 24.0  # nats below each row's top kept
_CODE_STEPS = 65534  # uint16 codes 1..65535 span the stored range; 0 means below it


class ReferenceStore:
    """The reference's log-probabilities for every position, uint16-coded in a memory-mapped temp file."""

    def __init__(self, directory: Path, n_positions: int, n_vocab: int) -> None:
        path = directory / "reference-log-p.u16"
        _reserve_disk(path, n_positions * n_vocab * np.dtype(np.uint16).itemsize)
        self.codes = np.memmap(path, dtype=np.uint16, mode="r+", shape=(n_positions, n_vocab))
        self.floor = np.empty(n_positions, dtype=np.float32)  # each row's top minus STORED_RANGE

    def write(self, start: int, log_p: np.ndarray) -> None:
        floor = log_p.max(axis=1) - np.float32(STORED_RANGE)
        scaled = (log_p - floor[:, None]) * np.float32(_CODE_STEPS / STORED_RANGE)
        codes = np.where(scaled >= 0, np.rint(np.maximum(scaled, 0)) + 1, 0)
        self.codes[start : start + len(log_p)] = codes.astype(np.uint16)
        self.floor[start : start + len(log_p)] = floor

    def read(self, start: int, count: int) -> np.ndarray:
        codes = np.asarray(self.codes[start : start + count], dtype=np.float32)
        log_p = (codes - 1) * np.float32(STORED_RANGE / _CODE_STEPS) + self.floor[start : start + count, None]
        log_p[codes == 0] = -np.inf
        return log_p


def _reserve_disk(path: Path, size: int) -> None:
    """Create `path` with `size` bytes of disk allocated now. Writes to a memory-mapped file that find
    no free block end the process with SIGBUS, which Python cannot catch (a full temporary folder:
    "Bus error", the folder left behind); allocated up front, a full disk is one line here instead."""
    with path.open("wb") as file:
        try:
            if not hasattr(os, "posix_fallocate"):  # macOS
                raise OSError(errno.EOPNOTSUPP, "no fallocate")
            os.posix_fallocate(file.fileno(), 0, size)
        except OSError as error:
            if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                raise SpeccliError(
                    f"{path.parent.parent}: no room for the {format_size(size)} of reference rows quant-check's "
                    f"sequential mode keeps there ({error.strerror}); point TMPDIR at a folder with more space"
                ) from None
            file.truncate(size)  # a file system that cannot reserve blocks: a sparse file, as before

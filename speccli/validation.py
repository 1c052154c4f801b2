"""The one check of each user setting, shared by the command line, chat's slash commands and models.toml:
the parsers (`parse_k`), the checks (`check_*`), their bounds and the commands' defaults. (The settings
themselves live with what they set: `BenchSettings`, `ServeSettings`, `SamplingParams`, ...)

Every check takes the value and the name the user knows it by (`--temp`, `/temp`, `pairs.x.k`),
raises `SpeccliError` with one line naming it and saying what is wrong, and returns the value it
accepts, so callers can use it inline. All of them run before any model is loaded, and none reads a
file: the bound of --ctx that depends on the model is checked as it loads (`speccli.llama.model`).
Light on imports, so the command line can check its options without numpy or llama.cpp.
"""
from __future__ import annotations

import math
import os
import re
import secrets
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

from speccli.errors import SpeccliError, WrongTypeError

MAX_K = 64  # draft tokens per step: past this, acceptance of the last positions is ~0 for any real pair
AUTO_K: Final = "auto"  # K chosen per step from measured costs (speccli.drafting.policy.AutoK)
# Draft tokens per step, as every layer holds it once parsed (`parse_k`): a whole number from 1 to MAX_K,
# or AUTO_K. `K | None` is a K that may not have been given (None: "not given", never auto), resolved to
# the pair's or the command's default where it was read.
K: TypeAlias = int | Literal["auto"]
MIN_CTX = 16  # llama.cpp takes 0 to mean the model's whole training context; tiny ones leave no room to speak
# --ctx when not given, each lowered to the models' training context where that is less: a chat keeps
# turns; bench's and quant-check's texts are short, and a smaller KV cache loads sooner.
CHAT_CTX = 4096
DEFAULT_PARALLEL = 1  # serve's slots (RESULTS.md, *Slots*)
MAX_SEQUENCES = 256  # LLAMA_MAX_SEQ: sequences one llama.cpp context holds
BENCH_CTX = 2048
MAX_THREADS = 512  # GGML_MAX_N_THREADS
RANDOM_SEED = -1  # llama.cpp's spelling of "pick a seed at random"
API_KEY_VARIABLE = "SPECCLI_API_KEY"  # serve's key where `ps` does not show it
RPC_PORT = 50052  # llama.cpp's rpc-server default
MAX_DEVICES = 16  # llama_max_devices(): the length of llama.cpp's tensor_split


def check_k(k: int, name: str = "--k") -> int:
    """A fixed K, a whole number from 1 to MAX_K. (`parse_k` turns text into a K.)"""
    if not 1 <= k <= MAX_K:
        raise SpeccliError(f"{name} (draft tokens per step) must be between 1 and {MAX_K}, got {k}")
    return k


def parse_k(text: str | int, name: str = "--k") -> K:
    """K as typed (`--k 4`, `/k auto`): a whole number from 1 to MAX_K, or AUTO_K (chosen per step).
    `str(k)` writes it back as typed."""
    if isinstance(text, str) and text.strip() == AUTO_K:
        return AUTO_K
    try:
        k = int(text)
    except ValueError:
        given = f"got {text!r}" if text else "and none was given"
        raise WrongTypeError(f"{name} needs 'auto' or a whole number from 1 to {MAX_K}, {given}") from None
    return check_k(k, name)


def parse_k_sweep(text: str, name: str = "--k") -> list[K]:
    """'4' -> [4]; '1,2,4,8' -> [1, 2, 4, 8]; '1-8' -> [1..8]; 'auto,1,4' -> ['auto', 1, 4] (auto
    first); items may mix: '1-3,8'. Sorted, unique."""
    usage = "give auto, a number (4), a list (auto,1,2,4) or a range (1-8)"
    if not text.strip():  # malformed, as ',2' is: a usage error, not a value out of range
        raise WrongTypeError(f"{name} is empty; {usage}")
    values: set[int] = set()
    auto = False
    for item in text.split(","):
        item = item.strip()
        if item == AUTO_K:
            auto = True
            continue
        # Numbers may be negative ('-1' is K = -1, refused by check_k below, not a broken range).
        match = re.fullmatch(r"(-?\d+)(?:\s*-\s*(-?\d+))?", item)
        if not match:
            raise WrongTypeError(f"{name} {text!r}: {item!r} is not auto, a number or a range; {usage}")
        low = int(match[1])
        high = low if match[2] is None else int(match[2])
        for value in (low, high):
            check_k(value, f"{name} {text!r}: K")
        if low > high:
            raise SpeccliError(f"{name} {text!r}: the range {item} runs backwards; write {high}-{low}")
        values.update(range(low, high + 1))
    return [AUTO_K] * auto + sorted(values)


def _finite(value: float, name: str) -> float:
    if not math.isfinite(value):
        raise SpeccliError(f"{name} must be a finite number, got {value}")
    return value


# OpenAI's limit, which serve's clients are held to: one range for chat, bench and serve alike. Past
# it every token is nearly as likely as any other.
MAX_TEMPERATURE = 2.0


def check_temperature(value: float, name: str = "--temp") -> float:
    if not 0 <= _finite(value, name) <= MAX_TEMPERATURE:
        raise SpeccliError(f"{name} must be from 0 (greedy) to {MAX_TEMPERATURE:g}, got {value}")
    return value or 0.0  # -0 is 0


def check_top_k(value: int, name: str = "--top-k") -> int:
    if value < 0:
        raise SpeccliError(f"{name} must be >= 0 (0 keeps every token), got {value}")
    return value


def check_top_p(value: float, name: str = "--top-p") -> float:
    if not 0 < _finite(value, name) <= 1:
        raise SpeccliError(f"{name} must be in (0, 1], got {value}")
    return value


def check_min_p(value: float, name: str = "--min-p") -> float:
    if not 0 <= _finite(value, name) < 1:
        raise SpeccliError(f"{name} must be in [0, 1), got {value}")
    return value


def check_max_tokens(value: int, name: str = "--max-tokens") -> int:
    if value < 1:
        raise SpeccliError(f"{name} must be >= 1, got {value}")
    return value


def check_ctx(value: int, name: str = "--ctx") -> int:
    """The lower bound; the upper one is each model's training context (checked as it loads)."""
    if value < MIN_CTX:
        raise SpeccliError(f"{name} must be at least {MIN_CTX} tokens, got {value}")
    return value


def check_listen(host: str, port: int) -> None:
    """serve's and rpc-server's --host and --port. An empty host binds every interface (the socket
    module's "" is INADDR_ANY): never by accident, as from an unset variable."""
    if not host.strip():
        raise SpeccliError("--host is empty; give an address (0.0.0.0 listens on every interface)")
    if not 0 <= port <= 65535:
        raise SpeccliError(f"--port must be between 0 and 65535, got {port}")


def check_threads(value: int | None, name: str = "--threads") -> int | None:
    if value is not None and value < 1:
        raise SpeccliError(f"{name} must be >= 1, got {value}")
    # ggml's own limit (GGML_MAX_N_THREADS): past it llama.cpp aborts the process (100000 threads) or
    # spends minutes creating threads a 2-core machine cannot run (2000).
    if value is not None and value > MAX_THREADS:
        raise SpeccliError(f"{name} must be at most {MAX_THREADS} (ggml's limit), got {value}")
    return value


def check_gpu_layers(value: int | None, name: str = "--ngl") -> int | None:
    """Layers to offload: a count, or -1 for all of them (llama.cpp's convention)."""
    if value is not None and value < -1:
        raise SpeccliError(f"{name} must be a number of layers, or -1 for all, got {value}")
    return value


def check_seed(value: int | None, name: str = "--seed") -> int | None:
    """A seed >= 0; -1 (llama.cpp's "random") draws one, so a report can still name the seed used."""
    if value == RANDOM_SEED:
        return secrets.randbelow(2**32)
    if value is not None and value < 0:
        raise SpeccliError(f"{name} must be >= 0, or -1 for a random seed, got {value}")
    return value


def check_api_key(value: str, name: str = "--api-key") -> str:
    """The key a server's clients must send (`Authorization: Bearer KEY`). Empty is refused (not "no
    key": a script whose variable came out empty must not serve in the open), and so is a key no HTTP
    header could carry whole (spaces, control or non-ASCII characters). The key is never echoed."""
    if not value:
        without = "unset it" if name == API_KEY_VARIABLE else "leave it out"
        raise SpeccliError(f"{name} is empty; give a key, or {without} to serve without one")
    if not re.fullmatch(r"[\x21-\x7e]+", value):
        raise SpeccliError(f"{name} must be printable ASCII without spaces, as an HTTP header carries it")
    return value


def api_key_for(given: str | None) -> str | None:
    """serve's key: --api-key as given (checked as it was parsed), else SPECCLI_API_KEY where it is
    set, else None (no key asked for)."""
    if given is not None:
        return given
    from_environment = os.environ.get(API_KEY_VARIABLE)
    return None if from_environment is None else check_api_key(from_environment, API_KEY_VARIABLE)


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoints(text: str, option: str = "--rpc") -> tuple[Endpoint, ...]:
    """`HOST:PORT[,HOST:PORT...]`, each once: text of another shape is a usage error (exit 2), an
    endpoint of this shape that cannot be used is refused (exit 1), as docs/cli.md's rule has it."""
    endpoints: list[Endpoint] = []
    for item in (part.strip() for part in text.split(",")):
        host, colon, port = item.rpartition(":")
        if item.startswith("[") or ":" in host:
            raise SpeccliError(f"{option} {text!r}: {item!r} is an IPv6 address, which llama.cpp's RPC does not "
                               "support; give an IPv4 address or a host name")
        if not item or not colon or not host or any(character.isspace() for character in host):
            raise WrongTypeError(f"{option} {text!r}: {item!r} is not HOST:PORT (an IPv4 address or a host name, "
                                 f"then a port, such as 192.168.1.20:{RPC_PORT})")
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            error = SpeccliError if port.isdigit() else WrongTypeError
            raise error(f"{option} {text!r}: the port of {item!r} is not a number from 1 to 65535")
        endpoint = Endpoint(host, int(port))
        if endpoint in endpoints:
            raise SpeccliError(f"{option} {text!r}: {endpoint} is named twice")
        endpoints.append(endpoint)
    return tuple(endpoints)


def parse_tensor_split(text: str, name: str = "--tensor-split") -> tuple[float, ...]:
    """Each device's share of the layers, as llama.cpp's --tensor-split: '3,1' puts three quarters on the first."""
    try:
        shares = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise WrongTypeError(f"{name} {text!r}: expected numbers separated by commas, such as 3,1") from None
    if not all(math.isfinite(share) and share >= 0 for share in shares) or not any(shares):
        raise SpeccliError(f"{name} {text!r}: each share must be a number of at least 0, and one above 0")
    if len(shares) > MAX_DEVICES:
        raise SpeccliError(f"{name} {text!r}: at most {MAX_DEVICES} shares, one per device")
    return shares

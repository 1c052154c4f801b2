"""speccli: speculative decoding for local GGUF models, with the target model's exact output distribution."""

from speccli.llama.load_order import load_llama_library_first

__version__ = "0.1.0"

load_llama_library_first()  # before anything imports numpy: see speccli/llama/load_order.py

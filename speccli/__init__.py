"""speccli: speculative decoding for local GGUF models, with the target model's exact output distribution."""

__version__ = "0.1.0"

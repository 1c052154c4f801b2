"""The only package that imports llama_cpp: load a GGUF, decode token batches, drop a KV suffix."""

"""Checks of a model file against a reference: quantization fidelity measured as speculative acceptance."""

"""check-vocab: can a draft draft for a target, decided from metadata alone."""

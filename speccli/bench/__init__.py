"""speccli bench: target-only vs speculative, measured side by side, predicted, reported."""

"""Small helpers several packages share: atomic files, hashing, cache locations, size formatting."""

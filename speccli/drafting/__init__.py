"""Draft sources (a draft model, n-gram lookup, a chain of both) and the policy that picks K per step."""

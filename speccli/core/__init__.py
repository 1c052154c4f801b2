"""The algorithm, in numpy and Python only: sampling, the verify rule, the generation loop, its statistics."""

"""Time spent inside llama.cpp, apart from llama_cpp itself: the engine reads it without importing llama.cpp."""


class ComputeClock:
    """Seconds this process has spent inside llama.cpp's decode, every model's (`Model.decode` adds
    each call's): the rest of a step's time is the host's own work (sampling, verifying, bookkeeping)."""

    def __init__(self) -> None:
        self.seconds = 0.0


COMPUTE_CLOCK = ComputeClock()

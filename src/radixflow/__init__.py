"""radixflow: hybrid prefix caching with state-ready round scheduling."""

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str):
    # Lazy: the simulator and the scheduler core must import without torch.
    if name == "LLM":
        from radixflow.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from radixflow.engine.sampling import SamplingParams

        return SamplingParams
    raise AttributeError(name)

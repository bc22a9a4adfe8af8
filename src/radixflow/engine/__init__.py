"""The real PyTorch engine: model code, weight loading, tokenizer and sampling.

Kept import-light on purpose: importing `radixflow.engine` must not pull in torch, so the
scheduler and the simulator can live in the same process without paying for it. Import the
submodules (`radixflow.engine.loader`, `radixflow.engine.models`, ...) where they are needed.
"""

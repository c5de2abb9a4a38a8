"""`make bench`: how fast the from-scratch model is, measured against the same model built from PyTorch's built-ins,
and how fast notebook 13's tokenizer is, against Hugging Face's `tokenizers`.

`python -m transformer_from_scratch.benchmark` (see `__main__.py`) prints a table and writes it to
build/benchmark.md (`--only tokenizer`: the tokenizer's part alone, to build/benchmark_tokenizer.md).
`reference.ReferenceLM` is the model's yardstick: the same weights, run through `F.linear`, `F.rms_norm`, `F.silu`,
`F.embedding` and `F.scaled_dot_product_attention`.
"""

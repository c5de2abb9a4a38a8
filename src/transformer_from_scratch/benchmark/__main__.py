"""`make bench`: the from-scratch TransformerLM against the same model built from PyTorch's built-ins.

    python -m transformer_from_scratch.benchmark [--out build/benchmark.md] [--no-compile] [--no-notebooks]
                                                 [--only model|tokenizer|pretrained|decode|finetune] [--threads N]

Prints a Markdown table and writes it to --out. Every measurement runs in a fresh Python process (a clean
allocator, a clean peak-memory reading, no compiled code left over from another row):

* training: forward + backward (cross-entropy loss) tokens/s and peak memory, for the reference
  (`ReferenceLM`: F.linear, F.rms_norm, F.silu, F.embedding, F.scaled_dot_product_attention(is_causal=True), on
  a copy of the same weights), for our model with its shape checks on and off, with `fused=True`, and
  compiled with `torch.compile`. "× ref" is our tokens/s over the reference's: 1.0 means as fast.
  MFU is the model's matrix FLOPs (count_resources, ×3 for forward + backward) per second over this machine's
  own measured float32 matmul throughput (not a datasheet peak).
* make train's loop: tokens/s of `make train`'s step (get_batch, training_step, optimizer.step) at its default
  config's shapes, with the course's AdamW, cross_entropy, gradient_clipping and TransformerLM (checks off), against
  the same loop with torch.optim.AdamW, F.cross_entropy, clip_grad_norm_ and ReferenceLM.
* decode: tokens/s of `generate` at batch 1, greedy, ours against the reference through the same loop.
* decode with a KV cache: tokens/s of `generate` (notebook 12: the cache) against the reference's own cached decode
  (`reference.greedy_decode_with_cache`: preallocated keys and values, F.scaled_dot_product_attention) and against
  our `generate(..., use_cache=False)`, batch 1, greedy, a 32-token prompt and 128 new tokens.
* small forward: microseconds of one no-grad forward of the model on batch 1, 16 tokens, ours against the reference.
* per call: microseconds of Linear, softmax and attention on a tiny input, checks on and off, against PyTorch's.
* notebooks: each notebook's time under nbval, against the floor: the same command on a notebook whose only
  cell imports torch.
* tokenizer (`--only tokenizer` for this part alone): notebook 13's byte-level BPE (`tokenizer.py`) against
  Hugging Face's `tokenizers` (Rust): `train_bpe` to 500 tokens on the first 130 KB of the training plays in one
  process (the handout's bound: under 1.5 s); to 10,000 tokens on the whole 4.5 MB of them, ours in one process and
  in one per core against `BpeTrainer` with GPT-2's byte-level pre-tokenizer, and how many of the first merges agree;
  encoding the held-out plays with that 10,000-token vocabulary, ours (a fresh Tokenizer, then again with its cache
  warm) against `tokenizers` loaded from our vocab.json and merges.txt (one `encode` of the whole text, then
  `encode_batch` of its lines against our `encode` of each line), in MB/s, and whether the ids are identical.
* pretrained (`--only pretrained` for this part alone; needs `make weights`): SmolLM2-135M-Instruct from the GGUF
  file, loaded by notebook 14's `load_gguf` into our TransformerLM, against Hugging Face transformers'
  `AutoModelForCausalLM.from_pretrained(..., gguf_file=...)` on the same weights, dtype and threads, on the CPU:
  greedy decoding with the KV cache of a ChatML prompt (44 tokens) by 64 new tokens, ours through `generate`
  (shape checks off, and on as shipped) and through `pretrained.chat` (as shipped), theirs through
  `model.generate(ids, max_new_tokens=64, do_sample=False, min_new_tokens=64)`; tokens/s, × HF, and the weight
  bandwidth each reaches (the parameters' bytes, all read once per token, × tokens/s) beside the machine's copy
  bandwidth (bytes read and written by a 256 MB tensor copy); in float32 and bfloat16; the prefill (one forward of
  a 256-token prompt) in tokens/s, the load time and the process's peak resident memory.
* decode (`--only decode` for this part alone; needs `make weights`): how fast SmolLM2-135M-Instruct decodes, one
  table measured in one run, each row in a fresh process, the same threads for all: greedy, a ChatML prompt (44
  tokens) and 64 new ones, in float32: Hugging Face's `model.generate` (its EOS switched off, so that it runs the 64
  tokens with the greedy ids unchanged), ours through `generate` on the model as `load_gguf` gives it (plain), after
  `fast_decode.prepare_for_decode` (fuse: what `make chat` ships), after `prepare_for_decode(compile=True)` (what `make
  chat --compile` ships: a static-shape step under `torch.compile`; unless --no-compile; its compile time below), after `prepare_for_decode(int8=True)`,
  plain and fused in bfloat16 too, and llama.cpp (llama-cpp-python, the optional `bench-llama` extra, built from
  source: see the Makefile's bench target) on the GGUF file itself, its Q4_1/Q8_0 blocks as they are, when `llama_cpp`
  is importable; tokens/s (the prompt's forward included), × HF, the seconds to the first token, the bytes a step
  reads (ours: `fast_decode.decode_bytes` at the mean cache length; HF: its parameters' bytes; llama.cpp: the file's
  tensor bytes), the weight bandwidth that reaches over the steps after the first token, its share of the copy
  bandwidth measured in the same run, and where the greedy tokens first differ from ours plain's. Below the table,
  the eager steps' floor: the prepared float32 and int8 models' matrix products alone, in a step's order on one
  vector each (nothing else of the step), and PyTorch's int8 kernel alone on bfloat16, float32 and float16 rows.
* finetune (`--only finetune` for this part alone; needs `make weights`): one training step of `make finetune`
  (forward, backward, clipping, AdamW; its first batch: 16 questions of notebook 15's task) on SmolLM2-135M-Instruct
  in float32, ours (`apply_lora`, the course's AdamW) against transformers + peft (`get_peft_model`,
  torch.optim.AdamW) from the same GGUF file, LoRA at rank 8 on q_proj and v_proj, and full fine-tuning (every weight)
  for both: tokens/s, and the resident memory the steps add to the loaded model at their peak.

A shared machine's speed drifts by tens of percent from minute to minute, so each row runs --rounds times
(default 3), the rows interleaved, and keeps its fastest round; each notebook and the floor measured just before
it keep the faster of two runs.

Targets, on the CPU: checks off >= 0.9× the reference for training, fused >= 1.0×, make train's loop >= 0.9×
PyTorch's, decode with checks off >= 0.9×, decode with the KV cache >= 1.0× the reference's cached decode and >= 5×
ours without the cache, the small forward with checks off >= 1.0× the reference, and the notebooks under nbval
<= 2× their floors; the tokenizer's 500-token training under 1.5 s, and its encoding within 5× of `tokenizers`
(≥ 0.2× its MB/s) on one encode call; SmolLM2's greedy decode, as shipped, ≥ 1.0× Hugging Face's; its decode after prepare_for_decode ≥ 1.5× Hugging
Face's, at ≥ 50 % of the copy bandwidth, within 2× of llama.cpp (≥ 0.5× its tokens/s), int8 ≥ 2× Hugging Face's;
its LoRA step ≥ 1.0× transformers + peft's. The table says which are met. --threads N: torch's threads in every
measuring process (llama.cpp's n_threads too); by default torch's own (the cores), printed in each header.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .._project import repo_root

REPO = repo_root()
THREADS_VARIABLE = "TFS_BENCH_THREADS"  # --threads N, passed to the measuring processes

# The training shape of the targets on a CPU, and a larger one (GPT-2 small's width and depth) on a GPU.
SHAPES = {
    "cpu": dict(batch=8, seq=256, vocab_size=4096, d_model=256, num_layers=4, num_heads=8, d_ff=704),
    "cuda": dict(batch=8, seq=1024, vocab_size=32768, d_model=768, num_layers=12, num_heads=12, d_ff=2048),
}
TRAIN_ROWS = ["reference", "ours, checks on", "ours, checks off", "ours fused, checks off",
              "reference, compiled", "ours, compiled", "ours fused, compiled"]
LOOP_ROWS = ["PyTorch's parts, ReferenceLM", "make train's: the course's parts, TransformerLM"]
DECODE_ROWS = ["reference", "ours, checks on", "ours, checks off", "ours fused, checks off"]
DECODE = dict(prompt=32, new_tokens=96)
KV_DECODE_ROWS = ["reference, its KV cache", "ours, KV cache, checks on", "ours, KV cache, checks off",
                  "ours fused, KV cache, checks off", "ours, no cache, checks off"]
KV_DECODE = dict(prompt=32, new_tokens=128)
SMALL_ROWS = ["reference", "ours, checks off", "ours fused, checks off"]
SMALL = dict(batch=1, seq=16)
CORPUS = REPO / "notebooks" / "data" / "shakespeare"
BPE_SMALL = dict(vocab_size=500, text_bytes=130_000)  # the handout's check: under 1.5 s, one process
BPE_LARGE = dict(vocab_size=10_000, special_tokens=["<|endoftext|>"])  # on the whole of train.txt


# ---------------------------------------------------------------- one measurement, in its own process

def _build(row: str, device: str, shape: dict):
    import torch

    import transformer_from_scratch as tfs
    from transformer_from_scratch.reference import ReferenceLM

    torch.manual_seed(0)
    sizes = {k: shape[k] for k in ("vocab_size", "d_model", "num_layers", "num_heads", "d_ff")}
    ours = tfs.TransformerLM(context_length=shape["seq"], rope_theta=10000.0, device=device, fused="fused" in row,
                             **sizes)
    tfs.set_shape_checks("checks on" in row)
    model = ReferenceLM(ours) if row.startswith("reference") else ours
    if "compiled" in row:
        model = torch.compile(model, fullgraph=True)
    return model


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _rss_bytes() -> int:
    """This process's resident memory now (Linux)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure_training(row: str, device: str, steps: int) -> dict:
    import torch
    import torch.nn.functional as F

    shape = SHAPES[device]
    model = _build(row, device, shape)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, shape["vocab_size"], (shape["batch"], shape["seq"] + 1), generator=generator).to(device)
    inputs, targets = ids[:, :-1], ids[:, 1:]

    def step() -> None:
        logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        for p in model.parameters():
            p.grad = None

    baseline = _rss_bytes()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
    start = time.perf_counter()
    step()  # the first step compiles, when compiling
    _sync(device)
    first = time.perf_counter() - start
    step()
    times = []
    for _ in range(steps):
        _sync(device)
        start = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - start)
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() - baseline
    else:  # ru_maxrss is the high-water mark of the whole process, in KiB on Linux
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - baseline
    seconds = statistics.median(times)
    return dict(seconds=seconds, tokens_per_s=shape["batch"] * shape["seq"] / seconds, peak_bytes=peak,
                first_step_s=first)


def measure_train_loop(row: str, device: str, steps: int) -> dict:
    """make train's step, as train.py runs it, with the course's parts or with PyTorch's (LOOP_ROWS)."""
    import contextlib

    import numpy as np
    import torch
    import torch.nn.functional as F

    import transformer_from_scratch as tfs
    from transformer_from_scratch import train
    from transformer_from_scratch.reference import ReferenceLM

    config = train.TrainConfig()
    seq = config.seq_len or config.context_length
    torch.manual_seed(0)
    model = train.build_model(config, device)
    tfs.set_shape_checks(False)
    hyper = dict(lr=config.max_lr, betas=tuple(config.betas), eps=config.eps, weight_decay=config.weight_decay)
    if row == LOOP_ROWS[0]:
        model = ReferenceLM(model)
        optimizer = torch.optim.AdamW(model.parameters(), **hyper)
        parts = dict(loss_fn=lambda logits, y: F.cross_entropy(logits.flatten(0, 1), y.flatten()),
                     clip_fn=torch.nn.utils.clip_grad_norm_)
    else:
        optimizer = tfs.AdamW(model.parameters(), **hyper)
        parts = dict(loss_fn=tfs.cross_entropy, clip_fn=tfs.gradient_clipping)
    amp = device == "cuda" and config.amp
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if amp else contextlib.nullcontext
    tokens = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8)
    batches = torch.Generator().manual_seed(0)

    def step() -> None:
        x, y = tfs.get_batch(tokens, config.batch_size, seq, device, generator=batches)
        loss, norm = train.training_step(model, optimizer, x, y, config.max_lr, config.grad_clip, autocast=autocast,
                                         **parts)
        torch.stack([loss.float(), norm.float()]).tolist()  # make train's one read-back per step
        optimizer.step()

    step()
    step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    return dict(seconds=seconds, tokens_per_s=config.batch_size * seq / seconds)


def measure_decode(row: str, device: str, repeats: int) -> dict:
    import torch

    import transformer_from_scratch as tfs

    shape = dict(SHAPES[device], seq=DECODE["prompt"] + DECODE["new_tokens"])
    model = _build(row, device, shape)
    prompt = torch.randint(0, shape["vocab_size"], (DECODE["prompt"],),
                           generator=torch.Generator().manual_seed(2)).to(device)
    tfs.generate(model, prompt, 8, temperature=0, use_cache=False)  # warm up
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        new = tfs.generate(model, prompt, DECODE["new_tokens"], temperature=0, use_cache=False)
        _sync(device)
        times.append(time.perf_counter() - start)
    return dict(tokens_per_s=len(new) / statistics.median(times))


def measure_kv_decode(row: str, device: str, repeats: int) -> dict:
    """Greedy decoding with a KV cache (KV_DECODE_ROWS): the reference's own, ours, and ours without the cache."""
    import torch

    import transformer_from_scratch as tfs
    from transformer_from_scratch.reference import greedy_decode_with_cache

    shape = dict(SHAPES[device], seq=KV_DECODE["prompt"] + KV_DECODE["new_tokens"])
    model = _build(row, device, shape)
    prompt = torch.randint(0, shape["vocab_size"], (KV_DECODE["prompt"],),
                           generator=torch.Generator().manual_seed(2)).to(device)
    if row.startswith("reference"):
        decode = lambda n: greedy_decode_with_cache(model, prompt, n)  # noqa: E731
    else:
        decode = lambda n: tfs.generate(model, prompt, n, temperature=0, use_cache="no cache" not in row)  # noqa: E731
    decode(8)  # warm up
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        new = decode(KV_DECODE["new_tokens"])
        _sync(device)
        times.append(time.perf_counter() - start)
    return dict(tokens_per_s=len(new) / statistics.median(times))


def measure_small_forward(row: str, device: str) -> dict:
    """One forward pass without gradients on a small input (SMALL: batch 1, 16 tokens), the fastest of several
    repeats: where the time goes to how many operations run, not to the arithmetic."""
    import timeit

    import torch

    shape = SHAPES[device]
    model = _build(row, device, dict(shape, seq=SMALL["seq"]))
    ids = torch.randint(0, shape["vocab_size"], (SMALL["batch"], SMALL["seq"]),
                        generator=torch.Generator().manual_seed(3)).to(device)

    def forward() -> None:
        model(ids)
        _sync(device)

    with torch.no_grad():
        forward()
        seconds = min(timeit.repeat(forward, number=50, repeat=5)) / 50
    return dict(tokens_per_s=SMALL["batch"] * SMALL["seq"] / seconds, microseconds=seconds * 1e6)


def measure_calls(device: str) -> dict:
    """Microseconds per call on a tiny input (1, 1, 64), where the cost is everything but the arithmetic: ours with
    the shape checks on, off, and PyTorch's own function. The fastest of several repeats."""
    import timeit

    import torch
    import torch.nn.functional as F

    import transformer_from_scratch as tfs

    torch.manual_seed(0)
    x = torch.randn(1, 1, 64, device=device)
    q = torch.randn(1, 4, 1, 64, device=device)
    mask = torch.ones(1, 1, dtype=torch.bool, device=device)
    linear = tfs.Linear(64, 64, device=device)
    calls = {
        "Linear": (lambda: linear(x), lambda: F.linear(x, linear.weight)),
        "softmax": (lambda: tfs.softmax(x, -1), lambda: torch.softmax(x, -1)),
        "scaled_dot_product_attention": (lambda: tfs.scaled_dot_product_attention(q, q, q, mask),
                                         lambda: F.scaled_dot_product_attention(q, q, q, attn_mask=mask)),
    }

    def per_call(fn) -> float:
        fn()
        _sync(device)
        return min(timeit.repeat(fn, number=200, repeat=5)) / 200 * 1e6

    result = {}
    with torch.no_grad():
        for name, (ours, builtin) in calls.items():
            with tfs.shape_checks(True):
                on = per_call(ours)
            with tfs.shape_checks(False):
                off = per_call(ours)
            result[name] = dict(on=on, off=off, builtin=per_call(builtin))
    return result


def measure_matmul(device: str) -> dict:
    """This machine's float32 matrix-multiply throughput (FLOP/s): the best of several n×n products."""
    import torch

    n = 2048 if device == "cpu" else 8192
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    best = float("inf")
    for _ in range(6):
        _sync(device)
        start = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return dict(flops_per_s=2 * n**3 / best)


def _small_corpus(folder: Path) -> Path:
    """The first BPE_SMALL["text_bytes"] of the training plays, cut after the last line break before it."""
    head = (CORPUS / "train.txt").read_bytes()[:BPE_SMALL["text_bytes"]]
    path = folder / "train_130k.txt"
    path.write_bytes(head[:head.rindex(b"\n") + 1])
    return path


def _merge_lines(merges_path: Path) -> list[str]:
    """The merges of a GPT-2 merges.txt, one "left right" string each (the version line left out)."""
    return [line for line in merges_path.read_text("utf-8").splitlines() if line and not line.startswith("#version")]


def measure_bpe_train(row: str, folder: str) -> dict:
    """Seconds of training the BPE of `row`: "ours, 500, 1 process" on the small corpus, "ours, 10k, 1 process" and
    "ours, 10k, 1 per core" on train.txt, or "tokenizers, 10k" (BpeTrainer, GPT-2's byte-level pre-tokenizer).
    Writes vocab.json and merges.txt to `folder` and returns the merges, in merges.txt's spelling."""
    from transformer_from_scratch.tokenizer import Tokenizer, train_bpe

    folder_path = Path(folder)
    if row.startswith("ours"):
        small = "500" in row
        path = _small_corpus(folder_path) if small else CORPUS / "train.txt"
        sizes = dict(vocab_size=BPE_SMALL["vocab_size"]) if small else BPE_LARGE
        start = time.perf_counter()
        vocab, merges = train_bpe(path, processes=1 if "1 process" in row else None, **sizes)
        seconds = time.perf_counter() - start
        Tokenizer(vocab, merges).save(folder_path / "vocab.json", folder_path / "merges.txt")
    else:
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import models, pre_tokenizers, trainers

        hf = HFTokenizer(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        trainer = trainers.BpeTrainer(vocab_size=BPE_LARGE["vocab_size"], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      special_tokens=BPE_LARGE["special_tokens"])
        start = time.perf_counter()
        hf.train([str(CORPUS / "train.txt")], trainer)
        seconds = time.perf_counter() - start
        hf.model.save(folder)
    return dict(seconds=seconds, merges=_merge_lines(folder_path / "merges.txt"))


def measure_bpe_encode(row: str, folder: str) -> dict:
    """MB/s of encoding the held-out plays with the vocabulary of folder/vocab.json and merges.txt: `row` "ours"
    (a fresh Tokenizer: cold, then warm; each line) or "tokenizers" (one encode; encode_batch of the lines). Returns
    the ids too (one list for the whole text, one per line), for the check that both agree."""
    text = (CORPUS / "heldout.txt").read_text("utf-8")
    lines = text.splitlines(keepends=True)
    megabytes = len(text.encode("utf-8")) / 1e6
    vocab, merges = str(Path(folder) / "vocab.json"), str(Path(folder) / "merges.txt")
    best = lambda times: megabytes / min(times)  # noqa: E731
    if row == "ours":
        from transformer_from_scratch.tokenizer import Tokenizer

        cold, warm, per_line = [], [], []
        for _ in range(3):
            tokenizer = Tokenizer.from_files(vocab, merges)
            start = time.perf_counter()
            ids = tokenizer.encode(text)
            cold.append(time.perf_counter() - start)
            start = time.perf_counter()
            tokenizer.encode(text)
            warm.append(time.perf_counter() - start)
            tokenizer = Tokenizer.from_files(vocab, merges)
            start = time.perf_counter()
            line_ids = [tokenizer.encode(line) for line in lines]
            per_line.append(time.perf_counter() - start)
        return dict(one=best(cold), warm=best(warm), lines=best(per_line), ids=ids, line_ids=line_ids)
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    one, batch = [], []
    for _ in range(3):
        hf = HFTokenizer(models.BPE.from_file(vocab, merges))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        start = time.perf_counter()
        ids = hf.encode(text).ids
        one.append(time.perf_counter() - start)
        start = time.perf_counter()
        line_ids = [encoding.ids for encoding in hf.encode_batch(lines)]
        batch.append(time.perf_counter() - start)
    return dict(one=best(one), lines=best(batch), ids=ids, line_ids=line_ids)


def _first_difference(ours: list[str], theirs: list[str]) -> int:
    """How many of the first merges the two lists share."""
    return next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))


def _pair_counts(merges: list[str], pairs: list[str]) -> list[int]:
    """How often each of `pairs` occurs in the training plays' pre-tokens after `merges` (merges.txt's spelling):
    the counts that chose the next merge, for seeing why ours and tokenizers' differ there."""
    from transformer_from_scratch.tokenizer import _merge_word, _pretoken_counts, bytes_to_unicode

    byte_of = {char: b for b, char in bytes_to_unicode().items()}
    split = lambda line: tuple(bytes(byte_of[c] for c in part) for part in line.split(" "))  # noqa: E731
    words = {tuple(bytes([b]) for b in word.encode("utf-8")): count
             for word, count in _pretoken_counts(CORPUS / "train.txt", BPE_LARGE["special_tokens"]).items()}
    for merge in map(split, merges):
        words = {tuple(_merge_word(list(word), merge)): count for word, count in words.items()}
    wanted = [split(pair) for pair in pairs]
    return [sum(count * sum(1 for p in zip(word, word[1:]) if p == pair) for word, count in words.items())
            for pair in wanted]


def tokenizer_report(rounds: int) -> str:
    """The tokenizer's section of the table: training and encoding, ours against Hugging Face's tokenizers."""
    import tokenizers

    train: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as folder:
        rows = ["ours, 500, 1 process", "ours, 10k, 1 process", "ours, 10k, 1 per core", "tokenizers, 10k"]
        for round_ in range(rounds):
            for row in rows:
                print(f"  tokenizer: train {row} (round {round_ + 1} of {rounds}) …", file=sys.stderr, flush=True)
                place = Path(folder) / row.replace(",", "").replace(" ", "_")
                place.mkdir(exist_ok=True)
                result = _run_child("bpe_train", row, str(place))
                if row not in train or result["seconds"] < train[row]["seconds"]:
                    train[row] = result
        print("  tokenizer: encode …", file=sys.stderr, flush=True)
        vocab_folder = str(Path(folder) / "ours_10k_1_per_core")
        ours, theirs = (_run_child("bpe_encode", row, vocab_folder) for row in ("ours", "tokenizers"))
    small = train["ours, 500, 1 process"]["seconds"]
    hf_seconds = train["tokenizers, 10k"]["seconds"]
    ours_merges, hf_merges = train["ours, 10k, 1 per core"]["merges"], train["tokenizers, 10k"]["merges"]
    same = _first_difference(ours_merges, hf_merges)
    differ = "all identical"
    if same < len(ours_merges):
        counts = _pair_counts(ours_merges[:same], [ours_merges[same], hf_merges[same]])
        differ = (f"the first {same:,} of {len(ours_merges):,} are identical; #{same + 1} is ours "
                  f"`{ours_merges[same]}` ({counts[0]:,} times in the pre-tokens then), theirs `{hf_merges[same]}` "
                  f"({counts[1]:,} times)" + (": a tie, which ours breaks for the lexicographically greater pair, "
                                              "tokenizers for the pair of lower ids" if counts[0] == counts[1] else ""))
    in_merges = len(set(ours_merges) & set(hf_merges))
    size = (CORPUS / "heldout.txt").stat().st_size
    lines = [f"Tokenizer benchmark of {datetime.date.today().isoformat()}: {_cpu_name()}, {os.cpu_count()} cores; "
             f"Python {platform.python_version()}.", "",
             f"**Tokenizer**: notebook 13's byte-level BPE (`tokenizer.py`, Python) against Hugging Face's "
             f"`tokenizers` {tokenizers.__version__} (Rust), on the plays. Training: the best of {rounds} runs, each "
             f"in a fresh process. `tokenizers` trains and encodes a batch on every core "
             f"({os.cpu_count()} here); ours in one process unless said.", "",
             "| training | seconds | × tokenizers' time |", "|---|---:|---:|",
             f"| ours, 500 tokens on the first 130 KB, 1 process | {small:.2f} | |"]
    lines += [f"| {row.replace('10k', '10,000 tokens on train.txt (4.5 MB)')} | {train[row]['seconds']:.2f} | "
              f"{train[row]['seconds'] / hf_seconds:.1f} |" for row in rows[1:]]
    lines += ["", f"Merges, ours against `tokenizers`' (vocabulary 10,000 with `<|endoftext|>`): {differ}; "
              f"{in_merges:,} of ours are among theirs.", "",
              f"**Encoding** the held-out plays ({size / 1e6:.2f} MB) with the 10,000-token vocabulary, `tokenizers` "
              "loaded from our vocab.json and merges.txt (`BPE.from_file`, the same byte-level pre-tokenizer); the "
              "best of 3.", "", "| encode | ours MB/s | tokenizers MB/s | ours / theirs |", "|---|---:|---:|---:|",
              f"| the whole text, one call (ours: a fresh Tokenizer, cold cache) | {ours['one']:.2f} | "
              f"{theirs['one']:.2f} | {ours['one'] / theirs['one']:.2f} |",
              f"| the whole text again (ours: warm cache) | {ours['warm']:.2f} | | "
              f"{ours['warm'] / theirs['one']:.2f} |",
              f"| each line (theirs: `encode_batch`, in parallel) | {ours['lines']:.2f} | {theirs['lines']:.2f} | "
              f"{ours['lines'] / theirs['lines']:.2f} |", "",
              f"Identical ids: whole text {'yes' if ours['ids'] == theirs['ids'] else 'NO'} ({len(ours['ids']):,} "
              f"tokens, {size / len(ours['ids']):.2f} bytes per token), lines "
              f"{'yes' if ours['line_ids'] == theirs['line_ids'] else 'NO'}.", "",
              "**Targets** (tokenizer):",
              f"- training 500 tokens on 130 KB in one process under 1.5 s: {'met' if small < 1.5 else 'missed'} "
              f"({small:.2f} s)",
              f"- encoding within 5× of `tokenizers` (one call, cold): {_verdict(ours['one'] / theirs['one'], 0.2)}"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- SmolLM2-135M-Instruct, ours against Hugging Face's

PRETRAINED = dict(new_tokens=64, prefill=256, decodes=2, copy_bytes=256 * 2**20)
PRETRAINED_ROWS = [("hf", "float32"), ("ours", "float32"), ("hf", "bfloat16"), ("ours", "bfloat16")]
PRETRAINED_QUESTION = "What is the capital of France, and what is it famous for?"
CHAT_ROW = "pretrained.chat, checks on (as shipped)"


def _pretrained_prompts(path) -> tuple[list[int], list[int]]:
    """The decode prompt (ChatML with the template's system prompt, about 30 tokens) and the 256-token prefill prompt
    (the held-out plays), as ids of the file's own tokenizer (read from the metadata alone: no weights loaded)."""
    import gguf

    from transformer_from_scratch.pretrained import chat_prompt, default_system, read_metadata, tokenizer_from_gguf

    tokenizer = tokenizer_from_gguf(read_metadata(gguf.GGUFReader(path)))
    messages = [{"role": "user", "content": PRETRAINED_QUESTION}]
    decode = tokenizer.encode(chat_prompt(messages, default_system(tokenizer.chat_template)))
    prefill = tokenizer.encode((CORPUS / "heldout.txt").read_text("utf-8")[:4000])[:PRETRAINED["prefill"]]
    return decode, prefill


def measure_copy(device: str) -> dict:
    """This machine's memory bandwidth for a large tensor copy: bytes read + written per second, the best of 6."""
    import torch

    n = PRETRAINED["copy_bytes"] // 4
    a, b = torch.ones(n, device=device), torch.empty(n, device=device)
    best = float("inf")
    for _ in range(6):
        _sync(device)
        start = time.perf_counter()
        b.copy_(a)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return dict(bytes_per_s=2 * n * 4 / best)


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure_pretrained(row: str, dtype_name: str) -> dict:
    """One process: SmolLM2 loaded by `row` ("ours": load_gguf; "hf": transformers from the same GGUF file) in
    `dtype_name`, then the load time, the prefill's tokens/s, the greedy decode's tokens/s (ours: generate with
    the checks off and on, and pretrained.chat as shipped, interleaved; theirs: model.generate), the parameters'
    bytes and the peak resident memory."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import torch

    import transformer_from_scratch as tfs
    from transformer_from_scratch.weights import gguf_path

    path, dtype = gguf_path(), getattr(torch, dtype_name)
    decode_ids, prefill_ids = _pretrained_prompts(path)
    new = PRETRAINED["new_tokens"]
    start = time.perf_counter()
    if row == "ours":
        from transformer_from_scratch.pretrained import chat, load_gguf

        model, tokenizer = load_gguf(path, dtype=dtype)
    else:
        model = _hf_model(path, dtype)
    load_s = time.perf_counter() - start
    import gc

    gc.collect()
    loaded_rss = _rss_bytes()  # what stays resident once loaded (the peak below includes the load's float32 copies)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # a tied matrix counted once

    prompt, prefill = torch.tensor(decode_ids), torch.tensor([prefill_ids])
    if row == "ours":
        def ours(checks: bool):
            def run(n: int = new) -> list[int]:
                tfs.set_shape_checks(checks)
                return tfs.generate(model, prompt, n, temperature=0.0).tolist()
            return run

        forwards = []
        model.register_forward_hook(lambda *_: forwards.append(1))

        def shipped_chat(n: int = new) -> int:
            tfs.set_shape_checks(True)
            forwards.clear()
            chat(model, tokenizer, [{"role": "user", "content": PRETRAINED_QUESTION}], max_new_tokens=n)
            return len(forwards)  # one forward per new token (the last one may be <|im_end|>)

        decoders = {"generate, checks off": ours(False), "generate, checks on (as shipped)": ours(True),
                    CHAT_ROW: shipped_chat}
    else:
        def theirs(n: int = new) -> list[int]:
            out = model.generate(prompt.unsqueeze(0), attention_mask=torch.ones(1, len(decode_ids), dtype=torch.long),
                                 max_new_tokens=n, do_sample=False, min_new_tokens=n)
            return out[0, len(decode_ids):].tolist()

        decoders = {"model.generate": theirs}

    with torch.no_grad():
        tfs.set_shape_checks(False)
        forward = lambda: model(prefill)  # noqa: E731
        forward()  # warm up
        prefill_s = min(_seconds(forward) for _ in range(2))
        results, ids = {}, {}
        for decode in decoders.values():  # warm up: the first call of each pays for its set-up
            decode(4)
        for _ in range(PRETRAINED["decodes"]):
            for name, decode in decoders.items():
                start = time.perf_counter()
                out = decode()
                seconds = time.perf_counter() - start
                count = out if isinstance(out, int) else len(out)
                if not isinstance(out, int):
                    ids[name] = out
                results[name] = max(results.get(name, 0.0), count / seconds)
    tfs.set_shape_checks(True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return dict(tokens_per_s=max(results.values()), decode=results, ids=ids, load_s=load_s,
                prefill_tokens_per_s=len(prefill_ids) / prefill_s, param_bytes=param_bytes, peak_bytes=peak,
                loaded_bytes=loaded_rss,
                prompt_tokens=len(decode_ids), threads=torch.get_num_threads())


def pretrained_report(rounds: int) -> str:
    """SmolLM2-135M-Instruct's section of the table: ours against Hugging Face transformers on the same weights."""
    try:
        from transformer_from_scratch.weights import gguf_path

        gguf_path()
        import transformers
    except (FileNotFoundError, ImportError) as error:
        return f"**SmolLM2-135M-Instruct**: not measured ({error}).\n"
    copy = max(_run_child("copy", "-", "cpu")["bytes_per_s"] for _ in range(rounds))
    best: dict[tuple, dict] = {}
    for round_ in range(rounds):
        for row, dtype in PRETRAINED_ROWS:
            print(f"  pretrained: {row}, {dtype} (round {round_ + 1} of {rounds}) …", file=sys.stderr, flush=True)
            result = _run_child("pretrained", row, dtype)
            old = best.get((row, dtype))
            if old is None:
                best[(row, dtype)] = result
                continue
            for name, rate in result["decode"].items():  # each measure's best round
                old["decode"][name] = max(old["decode"][name], rate)
            for key, better in (("load_s", min), ("prefill_tokens_per_s", max), ("peak_bytes", min),
                                ("loaded_bytes", min)):
                old[key] = better(old[key], result[key])
    some = best[("ours", "float32")]
    lines = [f"SmolLM2-135M-Instruct benchmark of {datetime.date.today().isoformat()}: {_cpu_name()}, "
             f"{os.cpu_count()} cores, {some['threads']} torch thread(s); torch {_version('torch')}, transformers "
             f"{transformers.__version__}, Python {platform.python_version()}.", "",
             f"**SmolLM2-135M-Instruct** (the GGUF file of `make weights`, dequantized): our TransformerLM loaded by "
             f"`load_gguf` against Hugging Face's `AutoModelForCausalLM` from the same file, the same dtype and "
             f"threads. Greedy decode with the KV cache: a ChatML prompt of {some['prompt_tokens']} tokens, "
             f"{PRETRAINED['new_tokens']} new ones (ours: `generate`, and `pretrained.chat`, which stops at "
             f"`<|im_end|>`; theirs: `model.generate(..., do_sample=False, min_new_tokens="
             f"{PRETRAINED['new_tokens']})`); each model in a fresh process, the best of {rounds} rounds × "
             f"{PRETRAINED['decodes']} runs. Weight bandwidth: the parameters' bytes (each read once per token) × "
             f"tokens/s; this machine's copy bandwidth (a 256 MB tensor copy, read + write): {copy / 1e9:.1f} GB/s.",
             "", "| dtype | decode | tokens/s | × HF | weight GB/s | of copy bw |", "|---|---|---:|---:|---:|---:|"]
    verdicts = []
    for dtype in ("float32", "bfloat16"):
        hf, ours = best[("hf", dtype)], best[("ours", dtype)]
        hf_rate = hf["decode"]["model.generate"]
        rows = [("HF transformers, `model.generate`", hf_rate, hf["param_bytes"])]
        rows += [(f"ours, `{name.split(',')[0]}`,{name.split(',', 1)[1]}", rate, ours["param_bytes"])
                 for name, rate in ours["decode"].items()]
        for name, rate, nbytes in rows:
            lines.append(f"| {dtype} | {name} | {rate:.1f} | {rate / hf_rate:.2f} | {nbytes * rate / 1e9:.1f} | "
                         f"{nbytes * rate / copy:.0%} |")
        shipped = ours["decode"]["generate, checks on (as shipped)"]
        same = _first_difference(ours["ids"]["generate, checks off"], hf["ids"]["model.generate"])
        verdicts.append(f"- {dtype}: `generate` as shipped ≥ 1.0× HF: {_verdict(shipped / hf_rate, 1.0)} "
                        f"({shipped / hf_rate:.2f}×; `pretrained.chat` {ours['decode'][CHAT_ROW] / hf_rate:.2f}×); "
                        f"the first {same} of the {PRETRAINED['new_tokens']} greedy tokens are HF's")
    lines += ["", f"Prefill (one forward of {PRETRAINED['prefill']} tokens, no cache), loading, and the process's "
              "resident memory (torch and, for HF, transformers imported) once loaded and at its peak (the load and "
              "the decodes included):", "",
              "| dtype | model | prefill tokens/s | × HF | load s | RSS loaded | peak RSS |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for dtype in ("float32", "bfloat16"):
        hf = best[("hf", dtype)]
        for label, r in (("HF transformers", hf), ("ours", best[("ours", dtype)])):
            lines.append(f"| {dtype} | {label} | {r['prefill_tokens_per_s']:,.0f} | "
                         f"{r['prefill_tokens_per_s'] / hf['prefill_tokens_per_s']:.2f} | {r['load_s']:.1f} | "
                         f"{_mib(r['loaded_bytes'])} | {_mib(r['peak_bytes'])} |")
    lines += ["", "**Targets** (SmolLM2, CPU):", *verdicts]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- SmolLM2's decode: prepare_for_decode, HF, llama.cpp

FAST_DECODE = dict(new_tokens=64, decodes=2)
FAST_DECODE_ROWS = [("hf", "float32"), ("plain", "float32"), ("fused", "float32"), ("compiled", "float32"),
                    ("int8", "float32"), ("int8-compiled", "float32"), ("plain", "bfloat16"), ("fused", "bfloat16"),
                    ("llama.cpp", "gguf")]
FAST_DECODE_LABELS = {"hf": "HF transformers `model.generate`", "plain": "ours, `generate` (plain)",
                      "fused": "ours, `prepare_for_decode` (fuse: what `make chat` ships)",
                      "compiled": "ours, prepared, compiled (`compile=True`)",
                      "int8": "ours, `prepare_for_decode(int8=True)`",
                      "int8-compiled": "ours, int8, compiled (`int8=True, compile=True`)",
                      "llama.cpp": "llama.cpp (llama-cpp-python, the GGUF's own Q4_1/Q8_0 blocks)"}
LLAMA_CMAKE_ARGS = "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
LLAMA_INSTALL = (f'CMAKE_ARGS="{LLAMA_CMAKE_ARGS}" .venv/bin/pip install --no-binary llama-cpp-python -e '
                 f'".[bench-llama]"')


def _hf_model(path, dtype):
    """Hugging Face's AutoModelForCausalLM from the GGUF file (dequantized), in eval mode."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype).eval()


def _llama_decoder(path, prompt_ids: list[int], threads: int):
    """llama.cpp's greedy decode of prompt_ids, through llama-cpp-python's low-level loop (its create_completion
    stops at the end-of-turn token): the prompt evaluated once, then each argmax of the last logits evaluated in turn.
    Returns decode(n) -> (ids, the time each id was known) and the file's tensor bytes."""
    import gguf
    import llama_cpp
    import numpy as np

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, n_threads=threads, n_threads_batch=threads, n_batch=64,
                          verbose=False, seed=0)
    vocab = llm.n_vocab()

    def decode(n: int) -> tuple[list[int], list[float]]:
        llm.reset()
        llm.eval(prompt_ids)
        ids, times = [], []
        for i in range(n):
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(vocab,))
            ids.append(int(np.argmax(logits)))
            times.append(time.perf_counter())
            if i < n - 1:
                llm.eval([ids[-1]])
        return ids, times

    return decode, sum(int(tensor.n_bytes) for tensor in gguf.GGUFReader(path).tensors)


def _step_matrices(model) -> list:
    """A prepared model's matrix modules in the order a decode step calls them: each block's q/k/v, output, w1/w3
    and w2, then lm_head."""
    blocks = [(block.attn.qkv, block.attn.out, block.ffn.w13, block.ffn.down) for block in model.layers]
    return [module for four in blocks for module in four] + [model.lm_head]


def _step_products_seconds(model, repeats: int = 5) -> float:
    """The seconds a decode step of a prepared model spends in its matrix products alone: every product the step
    makes (_step_matrices), called in the step's order on one random vector as the step calls it, the best of
    `repeats` runs after one. Each matrix comes from memory, as in a step (the whole set is larger than a cache
    holds), and nothing else of the step runs: the eager step's floor."""
    import torch

    calls = [(module, torch.randn(1, 1, module.weight.shape[1])) for module in _step_matrices(model)]

    def products() -> None:
        for module, x in calls:
            module(x)

    with torch.no_grad():
        return min(_seconds(products) for _ in range(repeats + 1))


def _int8_kernel_seconds(model, repeats: int = 5) -> dict[str, float]:
    """PyTorch's int8 kernel alone (torch._weight_int8pack_mm) on an int8 model's matrices, in a step's order, one
    vector each, for each dtype of its rows (the scales in it too): the best seconds of `repeats` runs after one, by
    dtype name. What the kernel makes of bfloat16, float32 and float16 rows when every matrix comes from memory."""
    import torch

    seconds = {}
    for dtype in (torch.bfloat16, torch.float32, torch.float16):
        calls = [(torch.randn(1, m.weight.shape[1], dtype=dtype), m.weight, m.scale.to(dtype))
                 for m in _step_matrices(model)]

        def products() -> None:
            for x, weight, scale in calls:
                torch._weight_int8pack_mm(x, weight, scale)

        seconds[str(dtype).removeprefix("torch.")] = min(_seconds(products) for _ in range(repeats + 1))
    return seconds


def measure_fast_decode(row: str, dtype_name: str) -> dict:
    """One process: SmolLM2's greedy decode of FAST_DECODE["new_tokens"] ids after the ChatML prompt, by `row`
    ("hf": transformers' model.generate, its EOS switched off; "plain", "fused", "int8": our generate on the model
    of load_gguf, as loaded, after prepare_for_decode, after prepare_for_decode(int8=True), shape checks off as make
    chat runs; "compiled": our generate after prepare_for_decode(compile=True), as make chat --compile (on the
    inductor cache of TORCHINDUCTOR_CACHE_DIR, which the report sets); "int8-compiled": after
    prepare_for_decode(int8=True, compile=True), as make chat --int8 --compile (which caches no graph); "llama.cpp":
    llama-cpp-python on the GGUF file, `dtype_name` "gguf"), one decode to warm up (its seconds: compile_s), then the
    best of FAST_DECODE["decodes"]: tokens/s of the whole call (the prompt's forward included), the seconds to the
    first new token, the steps/s after it, the ids, and the bytes one step reads."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import torch

    import transformer_from_scratch as tfs
    from transformer_from_scratch.weights import gguf_path

    path, threads, new = gguf_path(), torch.get_num_threads(), FAST_DECODE["new_tokens"]
    prompt_ids, _ = _pretrained_prompts(path)
    prompt = torch.tensor(prompt_ids)
    if row == "llama.cpp":
        import llama_cpp

        decode, nbytes = _llama_decoder(path, prompt_ids, threads)
        version = llama_cpp.__version__
    elif row == "hf":
        import transformers

        model = _hf_model(path, getattr(torch, dtype_name))
        model.generation_config.eos_token_id = None  # 64 tokens, <|im_end|> or not, as ours (min_new_tokens would
        nbytes = sum(p.numel() * p.element_size() for p in model.parameters())  # mask it: other greedy ids)
        version = transformers.__version__

        class Stamps:  # a streamer: put() gets the prompt, then each new id
            def __init__(self):
                self.times = []

            def put(self, value) -> None:
                self.times.append(time.perf_counter())

            def end(self) -> None:
                pass

        def decode(n: int) -> tuple[list[int], list[float]]:
            stamps = Stamps()
            out = model.generate(prompt[None], attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                                 max_new_tokens=n, do_sample=False, streamer=stamps)
            return out[0, len(prompt_ids):].tolist(), stamps.times[1:]
    else:
        from transformer_from_scratch.fast_decode import decode_bytes, prepare_for_decode
        from transformer_from_scratch.pretrained import load_gguf

        model, _ = load_gguf(path, dtype=getattr(torch, dtype_name))
        if row != "plain":
            prepare_for_decode(model, int8=row.startswith("int8"), compile=row.endswith("compiled"))
        tfs.set_shape_checks(False)  # as make chat decodes
        nbytes = decode_bytes(model, len(prompt_ids) + new // 2)  # at the mean cache length of the steps
        version = torch.__version__

        def decode(n: int) -> tuple[list[int], list[float]]:
            times = []
            ids = tfs.generate(model, prompt, n, temperature=0.0, on_token=lambda _: times.append(time.perf_counter()))
            return ids.tolist(), times

    products_s = _step_products_seconds(model) if row in ("fused", "int8") and dtype_name == "float32" else None
    kernel_s = _int8_kernel_seconds(model) if row == "int8" else None

    best = dict(tokens_per_s=0.0, steps_per_s=0.0, first_token_s=float("inf"))
    with torch.no_grad():
        start = time.perf_counter()
        decode(4)  # warm up: the first call pays for its set-up (the compiled row: compiling)
        best["compile_s"] = time.perf_counter() - start
        for _ in range(FAST_DECODE["decodes"]):
            start = time.perf_counter()
            ids, times = decode(new)
            seconds = time.perf_counter() - start
            best["tokens_per_s"] = max(best["tokens_per_s"], len(ids) / seconds)
            best["steps_per_s"] = max(best["steps_per_s"], (len(ids) - 1) / (times[-1] - times[0]))
            best["first_token_s"] = min(best["first_token_s"], times[0] - start)
    return dict(best, ids=ids, bytes=nbytes, threads=threads, prompt_tokens=len(prompt_ids), version=version,
                products_s=products_s, kernel_s=kernel_s)


def fast_decode_report(rounds: int, compile_rows: bool = True) -> str:
    """The decode section: SmolLM2's greedy decode, ours (plain, prepared, compiled unless compile_rows is False,
    int8, int8 compiled unless compile_rows is False) against transformers and llama.cpp, with the bandwidth each
    reaches."""
    import importlib.util

    try:
        from transformer_from_scratch.weights import gguf_path

        gguf_path()
        import transformers
    except (FileNotFoundError, ImportError) as error:
        return f"**Decode** (SmolLM2-135M-Instruct): not measured ({error}).\n"
    llama = importlib.util.find_spec("llama_cpp") is not None
    rows = [(row, dtype) for row, dtype in FAST_DECODE_ROWS
            if (llama or row != "llama.cpp") and (compile_rows or not row.endswith("compiled"))]
    copies, best = [], {}
    compiles = []  # the compiled row's compile seconds, process by process, all on one inductor cache
    with tempfile.TemporaryDirectory(prefix="inductor-") as inductor_cache:
        for round_ in range(rounds):
            copies.append(_run_child("copy", "-", "cpu")["bytes_per_s"])
            for row, dtype in rows:
                print(f"  decode: {row}, {dtype} (round {round_ + 1} of {rounds}) …", file=sys.stderr, flush=True)
                # the compiled row: an empty cache first (a first run's compile), then the one it left (a later run's)
                for _ in range(2 if row == "compiled" and round_ == 0 else 1):
                    result = _run_child("fast_decode", row, dtype,
                                        {"TORCHINDUCTOR_CACHE_DIR": inductor_cache} if "compiled" in row else {})
                    compiles += [result["compile_s"]] if row == "compiled" else []
                    old = best.setdefault((row, dtype), result)
                    for key, better in (("tokens_per_s", max), ("steps_per_s", max), ("first_token_s", min)):
                        old[key] = better(old[key], result[key])
    copy = max(copies)
    hf, plain = best[("hf", "float32")], best[("plain", "float32")]
    threads = plain["threads"]
    versions = f"torch {_version('torch')}, transformers {transformers.__version__}"
    if llama:
        versions += f", llama-cpp-python {best[('llama.cpp', 'gguf')]['version']}"
    new = FAST_DECODE["new_tokens"]
    lines = [f"Decode benchmark of {datetime.date.today().isoformat()}: {_cpu_name()}, {os.cpu_count()} cores, "
             f"{threads} thread(s) for every row (torch's; llama.cpp's n_threads); {versions}, Python "
             f"{platform.python_version()}.", "",
             f"**Decode**, SmolLM2-135M-Instruct from the GGUF file of `make weights`: greedy, a ChatML prompt of "
             f"{plain['prompt_tokens']} tokens, {new} new ones; ours through `generate` (shape checks off, as `make "
             f"chat` runs) on the model as `load_gguf` gives it (plain), after `fast_decode.prepare_for_decode` "
             f"(q/k/v and w1/w3 fused, each matrix in the layout `faster_layout` measured), "
             + ("after `prepare_for_decode(compile=True)` (`make chat --compile`: each step through `static_step`, "
                "a static-shape step under `torch.compile`; its compile time below the table), " if compile_rows
                else "") +
             "and after `prepare_for_decode(int8=True)` (PyTorch's int8 kernel on inputs rounded to bfloat16)"
             + (", eager and compiled (`make chat --int8 --compile`: inductor's own C++ int8 kernel)" if compile_rows
                else "") + "; "
             f"Hugging Face's `model.generate(..., do_sample=False)` with its EOS switched off (so the {new} greedy "
             f"ids are its argmaxes)" + ("; llama.cpp on the GGUF file itself (its Q4_1 matrices and Q8_0 "
                                         "embedding, never dequantized), the same ids in, argmax of its logits out"
                                         if llama else "") +
             f". Each row in a fresh process, the best of {rounds} rounds × {FAST_DECODE['decodes']} runs. tokens/s: "
             f"{new} over the whole call, the prompt's forward included. Bytes a step reads: ours "
             f"`fast_decode.decode_bytes` (every weight once, the embedding's one row unless lm_head reads it too, "
             f"the KV cache at the steps' mean length, {plain['prompt_tokens'] + new // 2}); HF its parameters' "
             f"bytes; llama.cpp the file's tensor bytes. Weight GB/s: those bytes × the steps per second after the "
             f"first token; copy bandwidth (a 256 MB tensor copy, read + write, in the same run): "
             f"{copy / 1e9:.1f} GB/s.", "",
             "| decode | dtype | tokens/s | × HF | first token s | MB a step reads | weight GB/s | of copy bw | "
             "greedy ids = ours plain's (float32's) |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for row, dtype in rows:
        r = best[(row, dtype)]
        against = ("plain", "bfloat16") if (row, dtype) == ("fused", "bfloat16") else ("plain", "float32")
        same = _first_difference(r["ids"], best[against]["ids"])
        agree = f"all {new}" if same == new else f"the first {same} of {new}"
        if (row, dtype) == against:
            agree = "(the reference)"
        elif against[1] != "float32":
            agree += f" ({against[1]}'s)"
        rate = r["steps_per_s"] * r["bytes"]
        lines.append(f"| {FAST_DECODE_LABELS[row]} | {dtype} | {r['tokens_per_s']:.1f} | "
                     f"{r['tokens_per_s'] / hf['tokens_per_s']:.2f} | {r['first_token_s']:.2f} | "
                     f"{r['bytes'] / 1e6:,.0f} | {rate / 1e9:.1f} | {rate / copy:.0%} | {agree} |")
    fused, int8 = best[("fused", "float32")], best[("int8", "float32")]
    share = fused["steps_per_s"] * fused["bytes"] / copy
    if compile_rows:
        compiled = best[("compiled", "float32")]
        cold, warm = compiles[0], min(compiles[1:])
        saved = 1 / fused["steps_per_s"] - 1 / compiled["steps_per_s"]  # seconds a token
        pays = [(seconds - fused["compile_s"]) / saved if saved > 0 else -1.0 for seconds in (cold, warm)]
        lines += ["", f"torch.compile: the static-shape step compiled in {cold:.0f} s in its first process (an empty "
                  f"inductor cache), {warm:.0f} s in a later one (the cache on disk it left), not counted in its row "
                  f"(its first decode); its steps run at {compiled['steps_per_s'] / fused['steps_per_s']:.2f}× the "
                  f"prepared model's ({compiled['steps_per_s']:.1f} against {fused['steps_per_s']:.1f} steps/s)" +
                  (f", so compiling pays for itself after about {pays[0]:,.0f} tokens, {pays[1]:,.0f} with the "
                   "cache." if saved > 0 else ": it does not pay.")]
        int8_compiled = best[("int8-compiled", "float32")]
        lines += ["", f"The int8 step compiled in {int8_compiled['compile_s']:.0f} s (inductor's C++ int8 kernel, "
                  f"chosen by timing, the weights frozen in; no graph cached, so every run pays it); its steps run at "
                  f"{int8_compiled['steps_per_s'] / int8['steps_per_s']:.2f}× the eager int8 model's."]
    floors = []
    for r, name in ((fused, "the prepared float32 model"), (int8, "the int8 one")):
        ceiling = 1 / r["products_s"]
        floors.append(f"{name}'s {r['products_s'] * 1e3:.1f} ms a token, a ceiling of {ceiling:.1f} tokens/s "
                      f"({ceiling / hf['tokens_per_s']:.2f}× HF) that its step reaches at "
                      f"{r['steps_per_s'] / ceiling:.0%}")
    lines += ["", "The products alone (each matrix's module called on one vector, in a step's order, nothing else of "
              "the step run; the eager step's floor): " + "; ".join(floors) + "."]
    kernel = int8["kernel_s"]
    lines += ["", f"PyTorch's int8 kernel alone (`torch._weight_int8pack_mm`, the same calls on the int8 model's "
              f"matrices, without `Int8Linear`'s conversions) took {kernel['bfloat16'] * 1e3:.1f} ms a token on "
              f"bfloat16 rows, {kernel['float32'] * 1e3:.1f} ms on float32 ones "
              f"({kernel['float32'] / kernel['bfloat16']:.1f}× as long) and {kernel['float16'] * 1e3:.1f} ms on "
              f"float16 ones ({kernel['float16'] / kernel['bfloat16']:.1f}×)."]
    if llama:
        llama_rate = best[("llama.cpp", "gguf")]["tokens_per_s"]
        ratio = fused["tokens_per_s"] / llama_rate
        versus_llama = f"{_verdict(ratio, 0.5)} ({ratio:.2f}× llama.cpp's tokens/s)"
    else:
        versus_llama = "not measured"
        lines += ["", f"llama.cpp: not measured, llama-cpp-python is not installed. It is the optional `bench-llama` "
                  f"extra, never part of `dev`, built from source for this CPU (about 17 minutes on 2 cores): "
                  f"`{LLAMA_INSTALL}`."]
    lines += ["", "**Targets** (decode, float32, CPU):",
              f"- `prepare_for_decode` ≥ 1.5× HF: {_verdict(fused['tokens_per_s'] / hf['tokens_per_s'], 1.5)} "
              f"({fused['tokens_per_s'] / hf['tokens_per_s']:.2f}×; plain "
              f"{plain['tokens_per_s'] / hf['tokens_per_s']:.2f}×)",
              f"- `prepare_for_decode` at ≥ 50 % of the copy bandwidth: {_verdict(share, 0.5)} ({share:.0%})",
              f"- `prepare_for_decode(int8=True)` ≥ 2× HF: {_verdict(int8['tokens_per_s'] / hf['tokens_per_s'], 2.0)} "
              f"({int8['tokens_per_s'] / hf['tokens_per_s']:.2f}×)",
              f"- `prepare_for_decode` within 2× of llama.cpp (≥ 0.5× its tokens/s): {versus_llama}"]
    if compile_rows:  # make chat --compile: shipped behind a flag, so held to the same targets beside the default
        ratio = compiled["tokens_per_s"] / hf["tokens_per_s"]
        compiled_share = compiled["steps_per_s"] * compiled["bytes"] / copy
        lines += [f"- `prepare_for_decode(compile=True)` (`make chat --compile`) ≥ 1.5× HF: {_verdict(ratio, 1.5)} "
                  f"({ratio:.2f}×); at ≥ 50 % of the copy bandwidth: {_verdict(compiled_share, 0.5)} "
                  f"({compiled_share:.0%})"]
        ratio = int8_compiled["tokens_per_s"] / hf["tokens_per_s"]
        lines += [f"- `prepare_for_decode(int8=True, compile=True)` (`make chat --int8 --compile`) ≥ 2× HF: "
                  f"{_verdict(ratio, 2.0)} ({ratio:.2f}×)" + (
                      f"; within 2× of llama.cpp: {_verdict(int8_compiled['tokens_per_s'] / llama_rate, 0.5)} "
                      f"({int8_compiled['tokens_per_s'] / llama_rate:.2f}×)" if llama else "")]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- fine-tuning SmolLM2 (make finetune's step)

FINETUNE = dict(batch=16, steps=3, rank=8, alpha=16.0, targets=("q_proj", "v_proj"), seed=0)
FINETUNE_ROWS = [("hf", "lora"), ("ours", "lora"), ("hf", "full"), ("ours", "full")]


def _finetune_batch() -> tuple[list[list[int]], list[list[int]]]:
    """make finetune's first training batch (its default --seed and --batch-size): ids and targets, padded."""
    import random

    import gguf

    from transformer_from_scratch import finetune
    from transformer_from_scratch.pretrained import default_system, read_metadata, tokenizer_from_gguf
    from transformer_from_scratch.weights import gguf_path

    tokenizer = tokenizer_from_gguf(read_metadata(gguf.GGUFReader(gguf_path())))
    system = default_system(tokenizer.chat_template)
    rng = random.Random(FINETUNE["seed"])
    examples = [finetune.encode_example(tokenizer, *finetune.reverse_task(rng), system)
                for _ in range(FINETUNE["batch"])]
    ids, targets = finetune.pad_batch(examples, tokenizer.special_ids["<|endoftext|>"])  # make finetune's padding
    return ids.tolist(), targets.tolist()


class _PeakRss:
    """The process's resident memory, sampled every 2 ms on a thread while the block runs: its peak."""

    def __enter__(self):
        import threading

        self.peak, self._done = _rss_bytes(), threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.002):
            self.peak = max(self.peak, _rss_bytes())

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())


def measure_finetune(row: str, mode: str) -> dict:
    """One process: SmolLM2 in float32, ours (load_gguf; LoRA by finetune.apply_lora; the course's AdamW,
    masked_cross_entropy and gradient_clipping; shape checks off, as make finetune runs) or Hugging Face's
    (transformers from the same GGUF; LoRA by peft's get_peft_model; torch.optim.AdamW, F.cross_entropy,
    clip_grad_norm_), adapting q_proj and v_proj (mode "lora") or training every weight ("full"), on the same batch:
    the step's tokens/s (forward, backward, clipping, AdamW; one step to warm up, the best of the timed ones) and the
    resident memory the steps add to the loaded model, at their peak (AdamW's state made in the first step)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import gc

    import torch
    import torch.nn.functional as F

    import transformer_from_scratch as tfs
    from transformer_from_scratch.weights import gguf_path

    ids, targets = (torch.tensor(rows) for rows in _finetune_batch())
    path = gguf_path()
    torch.manual_seed(FINETUNE["seed"])
    if row == "ours":
        from transformer_from_scratch import finetune
        from transformer_from_scratch.pretrained import load_gguf
        from transformer_from_scratch.training import AdamW, gradient_clipping

        model, _ = load_gguf(path, dtype=torch.float32)
        tfs.set_shape_checks(False)
        if mode == "lora":
            finetune.apply_lora(model, FINETUNE["targets"], FINETUNE["rank"], FINETUNE["alpha"])
        from transformer_from_scratch.tune import reply_logits

        counted = targets != finetune.IGNORE  # make finetune's step: the LM head on the replies' positions only
        loss_of = lambda: finetune.masked_cross_entropy(reply_logits(model, ids, counted)[None],  # noqa: E731
                                                        targets[counted][None])
        clip, make_adamw = gradient_clipping, AdamW
    else:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        if mode == "lora":
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=FINETUNE["rank"], lora_alpha=FINETUNE["alpha"],
                                                     lora_dropout=0.0, target_modules=list(FINETUNE["targets"])))
        model.train()
        loss_of = lambda: F.cross_entropy(model(input_ids=ids).logits.flatten(0, 1), targets.flatten(),  # noqa: E731
                                          ignore_index=-100)
        clip, make_adamw = torch.nn.utils.clip_grad_norm_, torch.optim.AdamW
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_adamw(trained, lr=1e-4, weight_decay=0.0)
    gc.collect()
    loaded = _rss_bytes()

    def step() -> float:
        loss = loss_of()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clip(trained, 1.0)
        optimizer.step()
        return loss.item()

    seconds = []
    with _PeakRss() as peak:
        first_loss = step()  # warm-up: AdamW's state is made here
        for _ in range(FINETUNE["steps"]):
            seconds.append(_seconds(step))
    counted = int((targets != -100).sum())
    return dict(tokens_per_s=ids.numel() / min(seconds), tokens=ids.numel(), counted=counted,
                trained=sum(p.numel() for p in trained), first_loss=first_loss,
                added_bytes=peak.peak - loaded, loaded_bytes=loaded, threads=torch.get_num_threads())


def finetune_report(rounds: int) -> str:
    """make finetune's step against transformers + peft on the same weights, batch, rank, targets and threads."""
    try:
        from transformer_from_scratch.weights import gguf_path

        gguf_path()
        import peft
        import transformers
    except (FileNotFoundError, ImportError) as error:
        return f"**Fine-tuning SmolLM2**: not measured ({error}).\n"
    best: dict[tuple, dict] = {}
    for round_ in range(rounds):
        for row, mode in FINETUNE_ROWS:
            print(f"  finetune: {row}, {mode} (round {round_ + 1} of {rounds}) …", file=sys.stderr, flush=True)
            result = _run_child("finetune", row, mode)
            old = best.setdefault((row, mode), result)
            old["tokens_per_s"] = max(old["tokens_per_s"], result["tokens_per_s"])
            old["added_bytes"] = min(old["added_bytes"], result["added_bytes"])
    some = best[("ours", "lora")]
    lines = [f"Fine-tuning benchmark of {datetime.date.today().isoformat()}: {_cpu_name()}, {os.cpu_count()} cores, "
             f"{some['threads']} torch thread(s); torch {_version('torch')}, transformers {transformers.__version__}, "
             f"peft {peft.__version__}.", "",
             f"**Fine-tuning SmolLM2-135M-Instruct** (float32): one training step (forward, backward, clipping at "
             f"1.0, AdamW) on make finetune's first batch ({FINETUNE['batch']} lists of the reversal task, "
             f"{some['tokens']} positions padded, {some['counted']} counted), ours (`load_gguf`, `apply_lora`, the "
             f"course's AdamW, shape checks off, as `make finetune` runs) against transformers + peft "
             f"(`get_peft_model`, torch.optim.AdamW) on the same GGUF file. LoRA: rank {FINETUNE['rank']}, alpha "
             f"{FINETUNE['alpha']:g}, on {' and '.join(FINETUNE['targets'])}; full: every weight trained. Each row in "
             f"a fresh process, the best of {rounds} rounds × {FINETUNE['steps']} steps after one to warm up. "
             f"Memory: the resident memory the steps add to the loaded model at their peak (activations, "
             f"gradients, AdamW's state).", "",
             "| training | stack | trained parameters | tokens/s | × HF | memory added |",
             "|---|---|---:|---:|---:|---:|"]
    for mode in ("lora", "full"):
        hf = best[("hf", mode)]
        for label, r in (("transformers + peft" if mode == "lora" else "transformers", hf),
                         ("ours", best[("ours", mode)])):
            lines.append(f"| {'LoRA' if mode == 'lora' else 'full'} | {label} | {r['trained']:,} | "
                         f"{r['tokens_per_s']:,.0f} | {r['tokens_per_s'] / hf['tokens_per_s']:.2f} | "
                         f"{_mib(r['added_bytes'])} |")
    ours, full = best[("ours", "lora")], best[("ours", "full")]
    ratio = ours["tokens_per_s"] / best[("hf", "lora")]["tokens_per_s"]
    lines += ["", "**Targets** (fine-tuning, CPU):",
              f"- LoRA step ≥ 1.0× transformers + peft: {_verdict(ratio, 1.0)} ({ratio:.2f}×)",
              f"- memory added by a LoRA step against full fine-tuning (ours): {_mib(ours['added_bytes'])} against "
              f"{_mib(full['added_bytes'])} ({ours['added_bytes'] / full['added_bytes']:.0%})"]
    return "\n".join(lines) + "\n"


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def _run_child(kind: str, row: str, device: str, env: dict | None = None) -> dict:
    """Run one measurement in a fresh interpreter (env: variables added to this one's) and return its JSON result."""
    command = [sys.executable, "-m", "transformer_from_scratch.benchmark", "--child", kind, row, device]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise RuntimeError(f"benchmark row {kind}/{row} on {device} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- notebooks under nbval

def _nbval_seconds(notebook: Path) -> float:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval", "--nbval-current-env",
               "--nbval-sanitize-with", str(REPO / "tests" / "nbval_sanitize.cfg"), str(notebook)]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"nbval failed on {notebook.name}:\n{done.stdout[-3000:]}")
    return seconds


def measure_notebooks(passes: int = 2) -> dict:
    """Each notebook's seconds under nbval, and the floor's, measured right before it (a slow spell of the machine
    then slows both): the fastest of `passes` runs of each."""
    import nbformat

    paths = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    with tempfile.TemporaryDirectory() as folder:
        floor_notebook = Path(folder) / "floor.ipynb"
        notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import torch")])
        notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(notebook, floor_notebook)
        floors = {path.name: float("inf") for path in paths}
        times = dict(floors)
        for _ in range(passes):
            for path in paths:
                floors[path.name] = min(floors[path.name], _nbval_seconds(floor_notebook))
                times[path.name] = min(times[path.name], _nbval_seconds(path))
    return dict(floors=floors, notebooks=times)


# ---------------------------------------------------------------- the table

def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _verdict(value: float, target: float) -> str:
    return f"met (≥ {target:g}×)" if value >= target else f"missed: {value / target:.0%} of the target {target:g}×"


def _best_of(rounds: int, kind: str, rows: list[str], device: str) -> dict:
    """Each row measured `rounds` times, the rows interleaved (a slow spell of a shared machine hits all of them),
    keeping each row's fastest round: the ratios between rows are what this benchmark is for."""
    best: dict[str, dict] = {}
    for round_ in range(rounds):
        for row in rows:
            print(f"  {kind}: {row} (round {round_ + 1} of {rounds}) …", file=sys.stderr, flush=True)
            result = _run_child(kind, row, device)
            if row not in best or result["tokens_per_s"] > best[row]["tokens_per_s"]:
                best[row] = result
    return best


def report(device: str, compile_rows: bool, notebooks: bool, rounds: int) -> str:
    import torch

    import transformer_from_scratch as tfs

    shape = SHAPES[device]
    machine = (f"{_cpu_name()}, {os.cpu_count()} cores" if device == "cpu" else torch.cuda.get_device_name())
    threads = f", {torch.get_num_threads()} torch thread(s)" if device == "cpu" else ""
    lines = [f"Benchmark of {datetime.date.today().isoformat()}: {machine}{threads}; torch {torch.__version__}, "
             f"Python {platform.python_version()}.", ""]
    flops = 3 * shape["batch"] * tfs.count_resources(shape["vocab_size"], shape["seq"], shape["d_model"],
                                                     shape["num_layers"], shape["num_heads"],
                                                     shape["d_ff"])["flops"]["total"]
    matmul = max(_run_child("matmul", "-", device)["flops_per_s"] for _ in range(rounds))  # the machine at its best
    lines += [f"**Training**, forward + backward on {device}: batch {shape['batch']}, seq {shape['seq']}, d_model "
              f"{shape['d_model']}, {shape['num_layers']} layers, {shape['num_heads']} heads, d_ff {shape['d_ff']}, "
              f"vocab {shape['vocab_size']}. Matmul throughput measured here: {matmul / 1e9:,.0f} GFLOP/s (float32).",
              "", "| model | tokens/s | × ref | peak memory | MFU | first step |", "|---|---:|---:|---:|---:|---:|"]
    rows = [row for row in TRAIN_ROWS if compile_rows or "compiled" not in row]
    results = _best_of(rounds, "train", rows, device)
    for row in rows:
        r = results[row]
        ratio = r["tokens_per_s"] / results["reference"]["tokens_per_s"]
        lines.append(f"| {row} | {r['tokens_per_s']:,.0f} | {ratio:.2f} | {_mib(r['peak_bytes'])} | "
                     f"{flops / r['seconds'] / matmul:.0%} | {r['first_step_s']:.1f} s |")
    from transformer_from_scratch.train import TrainConfig

    config = TrainConfig()
    loop = _best_of(rounds, "loop", LOOP_ROWS, device)
    loop_ratio = loop[LOOP_ROWS[1]]["tokens_per_s"] / loop[LOOP_ROWS[0]]["tokens_per_s"]
    lines += ["", f"**make train's loop** on {device}: get_batch, forward, loss, backward, clipping, optimizer step at "
              f"the default config's shapes (batch {config.batch_size}, seq {config.seq_len or config.context_length}, "
              f"d_model {config.d_model}, {config.num_layers} layers, {config.num_heads} heads, vocab 256).", "",
              "| loop | tokens/s | × PyTorch's |", "|---|---:|---:|"]
    lines += [f"| {row} | {loop[row]['tokens_per_s']:,.0f} | "
              f"{loop[row]['tokens_per_s'] / loop[LOOP_ROWS[0]]['tokens_per_s']:.2f} |" for row in LOOP_ROWS]
    lines += ["", "**Decode**: `generate` at batch 1, greedy, a prompt of "
              f"{DECODE['prompt']} tokens and {DECODE['new_tokens']} new ones (no KV cache: each step runs the model "
              "on the whole window).", "", "| model | tokens/s | × ref |", "|---|---:|---:|"]
    decode = _best_of(rounds, "decode", DECODE_ROWS, device)
    for row in DECODE_ROWS:
        d = decode[row]
        lines.append(f"| {row} | {d['tokens_per_s']:,.1f} | {d['tokens_per_s'] / decode['reference']['tokens_per_s']:.2f} |")
    lines += ["", "**Decode with a KV cache** (notebook 12): `generate` at batch 1, greedy, a prompt of "
              f"{KV_DECODE['prompt']} tokens and {KV_DECODE['new_tokens']} new ones, against the reference's own cached "
              "decode (`reference.greedy_decode_with_cache`) and our decode without the cache.", "",
              "| model | tokens/s | × ref's cached | × ours without |", "|---|---:|---:|---:|"]
    kv = _best_of(rounds, "kv_decode", KV_DECODE_ROWS, device)
    kv_ref, kv_none = kv[KV_DECODE_ROWS[0]]["tokens_per_s"], kv["ours, no cache, checks off"]["tokens_per_s"]
    lines += [f"| {row} | {kv[row]['tokens_per_s']:,.1f} | {kv[row]['tokens_per_s'] / kv_ref:.2f} | "
              f"{kv[row]['tokens_per_s'] / kv_none:.2f} |" for row in KV_DECODE_ROWS]
    kv_ours, kv_fused = (kv[row]["tokens_per_s"] for row in ("ours, KV cache, checks off", "ours fused, KV cache, checks off"))
    small = _best_of(rounds, "small", SMALL_ROWS, device)
    small_ref = small["reference"]["tokens_per_s"]
    lines += ["", f"**Small forward**: the model on batch {SMALL['batch']}, {SMALL['seq']} tokens, no gradient (the "
              "training shape's model).", "", "| model | µs per forward | × ref |", "|---|---:|---:|"]
    lines += [f"| {row} | {small[row]['microseconds']:,.0f} | {small[row]['tokens_per_s'] / small_ref:.2f} |"
              for row in SMALL_ROWS]
    calls = _run_child("calls", "-", device)
    lines += ["", "**Per call** on a tiny input (1, 1, 64): microseconds, no gradient.", "",
              "| function | ours, checks on | ours, checks off | PyTorch's |", "|---|---:|---:|---:|"]
    lines += [f"| {name} | {c['on']:.1f} | {c['off']:.1f} | {c['builtin']:.1f} |" for name, c in calls.items()]
    ref = results["reference"]["tokens_per_s"]
    lines += ["", "**Targets** (CPU):",
              f"- training, checks off ≥ 0.9× the reference: "
              f"{_verdict(results['ours, checks off']['tokens_per_s'] / ref, 0.9)}",
              f"- training, fused ≥ 1.0×: {_verdict(results['ours fused, checks off']['tokens_per_s'] / ref, 1.0)}",
              f"- make train's loop ≥ 0.9× the same loop with PyTorch's parts: {_verdict(loop_ratio, 0.9)}",
              f"- decode, checks off ≥ 0.9×: "
              f"{_verdict(decode['ours, checks off']['tokens_per_s'] / decode['reference']['tokens_per_s'], 0.9)}",
              f"- decode with the KV cache, checks off ≥ 1.0× the reference's cached decode: {_verdict(kv_ours / kv_ref, 1.0)}"
              f" (fused: {_verdict(kv_fused / kv_ref, 1.0)})",
              f"- decode with the KV cache ≥ 5× ours without it: {_verdict(kv_ours / kv_none, 5.0)}"
              f" (fused: {_verdict(kv_fused / kv_none, 5.0)})",
              f"- small forward, checks off ≥ 1.0× the reference: "
              f"{_verdict(small['ours, checks off']['tokens_per_s'] / small_ref, 1.0)} (fused: "
              f"{_verdict(small['ours fused, checks off']['tokens_per_s'] / small_ref, 1.0)})"]
    if notebooks:
        print("  notebooks under nbval …", file=sys.stderr, flush=True)
        nb = measure_notebooks()
        total, floors = sum(nb["notebooks"].values()), sum(nb["floors"].values())
        lines.append(f"- the {len(nb['notebooks'])} notebooks under nbval ≤ 2× the floor: {'met' if total <= 2 * floors else 'missed'}: "
                     f"{total:.0f} s against {floors:.0f} s, {total / floors:.2f}×")
        lines += ["", "**Notebooks** under nbval, each against the floor measured just before it (a notebook whose only "
                  "cell imports torch).", "", "| notebook | seconds | floor | × floor |", "|---|---:|---:|---:|"]
        lines += [f"| {name} | {seconds:.1f} | {nb['floors'][name]:.1f} | {seconds / nb['floors'][name]:.2f} |"
                  for name, seconds in nb["notebooks"].items()]
        lines.append(f"| all {len(nb['notebooks'])} | {total:.1f} | {floors:.1f} | {total / floors:.2f} |")
    return "\n".join(lines) + "\n"


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="where the table goes (default: build/benchmark.md; with --only, build/benchmark_ONLY.md)")
    parser.add_argument("--only", choices=["model", "tokenizer", "pretrained", "decode", "finetune"], default=None,
                        help="measure one part: the model's rows (and the notebooks), the tokenizer's, "
                             "SmolLM2-135M-Instruct's decode against Hugging Face's, its decode after "
                             "prepare_for_decode against Hugging Face's and llama.cpp's, or its fine-tuning step "
                             "against transformers + peft")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch's CPU threads in every measuring process, and llama.cpp's (default: torch's "
                             "own, the cores); each part's header says how many")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows (slow to compile)")
    parser.add_argument("--no-notebooks", action="store_true", help="skip timing the notebooks under nbval")
    parser.add_argument("--rounds", type=int, default=3, help="measure each eager row this many times, keep the best")
    parser.add_argument("--child", nargs=3, metavar=("KIND", "ROW", "DEVICE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be >= 1, got {args.threads}")
        os.environ[THREADS_VARIABLE] = str(args.threads)  # the measuring processes inherit it
    if args.child:
        kind, row, device = args.child
        if os.environ.get(THREADS_VARIABLE):
            import torch

            torch.set_num_threads(int(os.environ[THREADS_VARIABLE]))
        measure = {"train": lambda: measure_training(row, device, steps=5 if device == "cpu" else 20),
                   "loop": lambda: measure_train_loop(row, device, steps=5 if device == "cpu" else 20),
                   "decode": lambda: measure_decode(row, device, repeats=3),
                   "kv_decode": lambda: measure_kv_decode(row, device, repeats=3),
                   "small": lambda: measure_small_forward(row, device),
                   "matmul": lambda: measure_matmul(device),
                   "calls": lambda: measure_calls(device),
                   "bpe_train": lambda: measure_bpe_train(row, device),  # DEVICE: the folder of its files
                   "bpe_encode": lambda: measure_bpe_encode(row, device),
                   "copy": lambda: measure_copy(device),
                   "pretrained": lambda: measure_pretrained(row, device),  # DEVICE: the dtype
                   "fast_decode": lambda: measure_fast_decode(row, device),  # DEVICE: the dtype ("gguf": llama.cpp)
                   "finetune": lambda: measure_finetune(row, device)}[kind]  # DEVICE: lora or full
        print(json.dumps(measure()))
        return
    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)  # the model part's header reads this process's
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    parts = []
    if args.only in (None, "model"):
        parts += [report(device, not args.no_compile, not args.no_notebooks and device == "cpu", args.rounds)
                  for device in devices]
    if args.only in (None, "tokenizer"):
        parts.append(tokenizer_report(args.rounds))
    if args.only in (None, "pretrained"):
        parts.append(pretrained_report(min(args.rounds, 2)))  # ~1 min a round on 2 cores
    if args.only in (None, "decode"):
        parts.append(fast_decode_report(min(args.rounds, 2), not args.no_compile))  # 15 min a round on 2 busy cores
    if args.only in (None, "finetune"):
        parts.append(finetune_report(min(args.rounds, 2)))  # ~2 min a round on 2 cores
    text = "\n".join(parts)
    print(text)
    if args.out is None:
        args.out = REPO / "build" / (f"benchmark_{args.only}.md" if args.only else "benchmark.md")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"written to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()

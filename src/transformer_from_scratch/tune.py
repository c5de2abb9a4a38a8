"""`make finetune`: LoRA adapters for SmolLM2-135M-Instruct, trained in the course's own code on notebook 15's task
(reverse a list of words), saved in the layout Hugging Face's peft reads.

    python -m transformer_from_scratch.tune [--steps 60] [--rank 8 --alpha 16 --targets q_proj,v_proj] [--resume]
    torchrun --nproc_per_node=2 -m transformer_from_scratch.tune [...]     # the same adapter, from two processes
    python -m transformer_from_scratch.chat --adapter build/finetune       # chat with it (merged into the weights)

The program, in the order it runs: main() reads the flags (a `TuneConfig`); tune() checks them, finds the GGUF file
(`make weights`'), the device and the torchrun processes; set_up() loads the model in float32 (NAME.pretrained's
load_gguf, `--package NAME` as make chat's), puts LoRA adapters on the --targets (finetune.apply_lora: every other
weight frozen) and builds notebook 11's AdamW over the adapters alone, or, with --resume, restores all of it from the
checkpoint; it grades the held-out lists once (teacher-forced exact match: finetune.exact_match); tune_loop() repeats
take_step() (--batch-size questions of finetune.reverse_task's training split, in ChatML with the model's default
system prompt, the loss on the reply only: finetune.masked_cross_entropy; lr_cosine_schedule, gradient_clipping,
AdamW) and save(); at the end the adapter is written (save_adapter) and the held-out lists graded again, with 95 %
Wilson intervals.

Written to --out-dir (build/finetune): checkpoint.pt (the adapters, AdamW's state, the step, the question generator
and torch's RNG states, the settings: every --checkpoint-every steps, at the end, and on Ctrl-C or SIGTERM, when the
step in flight finishes, is saved and the run exits, printing the command that resumes it), metrics.jsonl (a row per
step: loss, the batch's exact match, lr, gradient norm, seconds), and at the end adapter_config.json and
adapter_model.safetensors (peft's names and layout: `PeftModel.from_pretrained(model, out_dir)` loads them into
transformers' LlamaForCausalLM of the same file) and results.json (the accuracies). --resume goes on from
checkpoint.pt: on the CPU, a run stopped at any step (Ctrl-C, SIGTERM, or kill -9 and the last checkpoint) and
resumed writes exactly the adapter of a run that never stopped (at the same --threads). Without --resume an out-dir
that holds a fine-tune is refused; --overwrite starts again.

Under torchrun every process draws the same global batch of questions and trains on its own slice of it; the loss of a
slice is its share of the global batch's mean, so the gradients summed over the processes are one process's (float32
rounding apart). Only the adapters' gradients travel (one all-reduce a step): DistributedDataParallel would also send
the 135 M frozen weights that every process has already read from the same file.

The GGUF file stores q_proj's and k_proj's rows permuted for llama.cpp's RoPE, which the course's model uses as they
are, while transformers' GGUF loader puts them back in Hugging Face's order: save_adapter permutes the rows of those
lora_B the same way, load_adapter back (tests/test_peft_parity.py checks the logits against transformers + peft).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import math
import os
import random
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from transformer_from_scratch import finetune
from transformer_from_scratch._project import repo_root
from transformer_from_scratch.config import load_checkpoint_file, setting_flag
from transformer_from_scratch.pretrained import default_system
from transformer_from_scratch.shapes import shape_checks
from transformer_from_scratch.train import (_make, _Processes, _process_group, _read_lines, _stop_requests,
                                           resumed_settings, start_processes)
from transformer_from_scratch.training import AdamW, gradient_clipping, lr_cosine_schedule

FORMAT = "transformer_from_scratch.tune/1"  # marks a checkpoint of this program
CHECKPOINT, METRICS, RESULTS = "checkpoint.pt", "metrics.jsonl", "results.json"
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"  # peft's file names
BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"  # adapter_config.json's base_model_name_or_path
PLAYS = repo_root() / "notebooks" / "data" / "shakespeare" / "heldout.txt"  # what it forgot: plays_loss_per_byte
EVAL_SEED = 15  # the held-out questions: the same for every run, whatever its --seed
# Fixed parts of the recipe: a warm-up over the first tenth of the steps, the cosine down to a tenth of --lr, AdamW
# without weight decay (the adapters start at B = 0: decay would only pull them back), gradients clipped at norm 1.
WARMUP_FRACTION, MIN_LR_FRACTION, BETAS, WEIGHT_DECAY, GRAD_CLIP = 0.1, 0.1, (0.9, 0.999), 0.0, 1.0
RECENT = 10  # the progress bar's running accuracy: the training batches of the last RECENT steps

# The course's Linear -> transformers' LlamaForCausalLM module (under model.layers.{i}.).
HF_NAMES = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
            "output_proj": "self_attn.o_proj", "w1": "mlp.gate_proj", "w2": "mlp.down_proj", "w3": "mlp.up_proj"}
PARENT = {"q_proj": "attn", "k_proj": "attn", "v_proj": "attn", "output_proj": "attn", "w1": "ffn", "w2": "ffn",
          "w3": "ffn"}
PERMUTED = ("q_proj", "k_proj")  # rows in llama.cpp's RoPE order in the GGUF file (and in the course's model)
ALIASES = {hf.rsplit(".", 1)[1]: ours for ours, hf in HF_NAMES.items()}  # o_proj -> output_proj, gate_proj -> w1, ...


# ---------------------------------------------------------------- the adapter in peft's layout

def hf_path(path: str) -> str:
    """A LoRA module's path in the course's model as transformers' Llama names it: layers.3.attn.q_proj ->
    model.layers.3.self_attn.q_proj, layers.3.ffn.w1 -> model.layers.3.mlp.gate_proj. ValueError for another."""
    match = re.fullmatch(r"layers\.(\d+)\.(attn|ffn)\.(\w+)", path)
    if not match or PARENT.get(match[3]) != match[2]:
        raise ValueError(f"no transformers name for the module {path!r}: an adapter in peft's layout goes on "
                         f"{', '.join(HF_NAMES)} of layers.N.attn / layers.N.ffn")
    return f"model.layers.{match[1]}.{HF_NAMES[match[3]]}"


def rows_to_hf(b: Tensor, heads: int) -> Tensor:
    """Rows (output features) in the GGUF file's order -> transformers' order, as transformers' GGUF loader permutes
    q_proj and k_proj (its reverse_permute_weights): per head, the rows (d_k/2, 2) -> (2, d_k/2)."""
    return b.reshape(heads, b.shape[0] // heads // 2, 2, *b.shape[1:]).transpose(1, 2).reshape(b.shape)


def rows_from_hf(b: Tensor, heads: int) -> Tensor:
    """The inverse of rows_to_hf: transformers' order -> the GGUF file's (llama.cpp's permute)."""
    return b.reshape(heads, 2, b.shape[0] // heads // 2, *b.shape[1:]).transpose(1, 2).reshape(b.shape)


def _heads(model: nn.Module, path: str, d_out: int) -> int:
    """How many heads the rows of the q_proj or k_proj at `path` hold: its output features / the head size."""
    attention = model.get_submodule(path.rsplit(".", 1)[0])
    d_k = getattr(attention, "d_k", None) or attention.d_model // attention.num_heads
    return d_out // d_k


def adapters_of(model: nn.Module) -> dict[str, nn.Module]:
    """{path: module} of every LoRA module in `model` (one with lora_A and lora_B), in the model's order."""
    return {path: module for path, module in model.named_modules()
            if isinstance(getattr(module, "lora_A", None), Tensor) and isinstance(getattr(module, "lora_B", None),
                                                                                  Tensor)}


def _peft_key(path: str, factor: str) -> str:
    return f"base_model.model.{hf_path(path)}.{factor}.weight"


def adapter_tensors(model: nn.Module) -> dict[str, Tensor]:
    """The adapters of `model` under peft's keys (base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight),
    float32, on the CPU, lora_B of q_proj and k_proj in transformers' row order."""
    tensors = {}
    for path, module in adapters_of(model).items():
        a, b = (module.lora_A.detach().float().cpu(), module.lora_B.detach().float().cpu())
        if path.rsplit(".", 1)[1] in PERMUTED:
            b = rows_to_hf(b, _heads(model, path, b.shape[0]))
        tensors[_peft_key(path, "lora_A")], tensors[_peft_key(path, "lora_B")] = a.contiguous(), b.contiguous()
    return tensors


def adapter_config(rank: int, alpha: float, targets: list[str], base_model: str = BASE_MODEL) -> dict[str, Any]:
    """adapter_config.json: peft's LoraConfig fields for plain LoRA (no dropout, no bias, no DoRA, one rank)."""
    return dict(peft_type="LORA", task_type="CAUSAL_LM", base_model_name_or_path=base_model, revision=None,
                inference_mode=True, r=rank, lora_alpha=alpha, lora_dropout=0.0,
                target_modules=sorted(HF_NAMES[t].rsplit(".", 1)[1] for t in targets), exclude_modules=None,
                fan_in_fan_out=False, bias="none", use_rslora=False, modules_to_save=None, init_lora_weights=True,
                layers_to_transform=None, layers_pattern=None, rank_pattern={}, alpha_pattern={}, use_dora=False,
                lora_bias=False)


def _write_atomically(path: Path, write) -> None:
    """write(temporary path), then rename it to `path`: a process killed meanwhile leaves the old file whole."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    write(partial)
    os.replace(partial, path)


def save_adapter(model: nn.Module, directory: str | os.PathLike, *, base_model: str = BASE_MODEL) -> Path:
    """Write the LoRA adapters of `model` to `directory` as peft writes them: adapter_config.json and
    adapter_model.safetensors (float32), each written to a temporary file and renamed. Returns the directory.
    ValueError for a model without adapters, or with adapters of several ranks or alphas."""
    from safetensors.torch import save

    loras = adapters_of(model)
    if not loras:
        raise ValueError("save_adapter: the model has no LoRA adapters (apply_lora or load_adapter first)")
    kinds = {(int(m.rank), float(m.alpha)) for m in loras.values()}
    if len(kinds) > 1:
        raise ValueError(f"save_adapter: the adapters have several (rank, alpha): {sorted(kinds)}; one is written")
    (rank, alpha), = kinds
    targets = sorted({path.rsplit(".", 1)[1] for path in loras}, key=list(HF_NAMES).index)
    tensors = adapter_tensors(model)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = adapter_config(rank, alpha, targets, base_model)
    _write_atomically(directory / ADAPTER_WEIGHTS, lambda p: p.write_bytes(save(tensors, metadata={"format": "pt"})))
    _write_atomically(directory / ADAPTER_CONFIG, lambda p: p.write_text(json.dumps(config, indent=2) + "\n"))
    return directory


def read_adapter_config(directory: str | os.PathLike) -> tuple[int, float, list[str]]:
    """(rank, alpha, the course's target names) of the adapter in `directory`, or a one-line ValueError for a
    directory without one, a file that is not JSON (a truncated file), or an adapter load_adapter cannot read."""
    path = Path(directory) / ADAPTER_CONFIG
    if not path.is_file():
        raise ValueError(f"no LoRA adapter in {directory}: it has no {ADAPTER_CONFIG} (make finetune writes one, as "
                         f"does peft's save_pretrained)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON (truncated?): {error}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} holds a JSON {type(config).__name__}, not peft's adapter config (an object)")
    if config.get("peft_type") != "LORA":
        raise ValueError(f"{path} is a {config.get('peft_type')!r} adapter, not peft's 'LORA'")
    unsupported = [f"{key} {config[key]!r}" for key, plain in [
        ("use_dora", False), ("use_rslora", False), ("bias", "none"), ("lora_bias", False),
        ("fan_in_fan_out", False), ("modules_to_save", None), ("layers_to_transform", None), ("rank_pattern", {}),
        ("alpha_pattern", {}), ("target_parameters", None), ("trainable_token_indices", None),
        ("layer_replication", None)] if config.get(key, plain) not in (plain, [], {}, None)]
    if unsupported:
        raise ValueError(f"{path}: load_adapter reads plain LoRA (one rank and alpha, no bias, no DoRA), this "
                         f"adapter has {', '.join(unsupported)}")
    rank, alpha, modules = config.get("r"), config.get("lora_alpha"), config.get("target_modules")
    if isinstance(modules, str):
        modules = [modules]
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1 or not isinstance(alpha, (int, float)) \
            or isinstance(alpha, bool) or not alpha > 0 or not isinstance(modules, list) or not modules:
        raise ValueError(f"{path}: needs r (an int >= 1), lora_alpha (> 0) and target_modules (a list), got r "
                         f"{rank!r}, lora_alpha {alpha!r}, target_modules {modules!r}")
    unknown = sorted(m for m in modules if m not in ALIASES)
    if unknown:
        raise ValueError(f"{path}: target_modules {unknown} are not among transformers' Llama names "
                         f"{sorted(ALIASES)}")
    return rank, float(alpha), sorted({ALIASES[m] for m in modules}, key=list(HF_NAMES).index)


def _linears(model: nn.Module, targets: list[str]) -> dict[str, tuple[int, int]]:
    """{path: (d_out, d_in)} of the model's matrices named one of `targets` (what apply_lora would adapt)."""
    found = {}
    for path, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if path.rsplit(".", 1)[-1] in targets and isinstance(weight, Tensor) and weight.dim() == 2:
            found[path] = tuple(weight.shape)
    return found


def load_adapter(model: nn.Module, directory: str | os.PathLike, *, apply_lora=finetune.apply_lora
                 ) -> dict[str, nn.Module]:
    """Put the LoRA adapter saved in `directory` (save_adapter's, or peft's save_pretrained for SmolLM2) on `model`:
    apply_lora with the config's rank, alpha and targets, then the weights, lora_B of q_proj and k_proj put back in
    the GGUF file's row order. Returns apply_lora's {path: LoRALinear}. Everything is checked before the model is
    touched: a one-line ValueError for a missing, truncated or foreign file, keys that are not this model's
    adapters, or shapes that do not fit (the model is then left as it was)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if adapters_of(model):
        raise ValueError("load_adapter: the model already has LoRA adapters (merge them or load a fresh model)")
    rank, alpha, targets = read_adapter_config(directory)
    path = Path(directory) / ADAPTER_WEIGHTS
    if not path.is_file():
        raise ValueError(f"{directory} has {ADAPTER_CONFIG} but no {ADAPTER_WEIGHTS}")
    try:
        tensors = load_file(path)
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ValueError(f"{path} is not a readable safetensors file (truncated?): {first}") from None
    linears = _linears(model, targets)
    try:
        expected = {_peft_key(p, f): shape for p, (d_out, d_in) in linears.items()
                    for f, shape in (("lora_A", (rank, d_in)), ("lora_B", (d_out, rank)))}
    except ValueError as error:
        raise ValueError(f"load_adapter: this model's {error}") from None
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if not linears or missing or unexpected:
        raise ValueError(f"{path} does not fit this model: " + "; ".join(
            f"{len(keys)} {what} (the first: {keys[0]})" for what, keys in
            [("keys missing", missing), ("keys this model has no place for", unexpected)] if keys))
    wrong = [f"{key} {tuple(tensors[key].shape)} (this model's: {shape})" for key, shape in expected.items()
             if tuple(tensors[key].shape) != shape or not tensors[key].is_floating_point()]
    if wrong:
        raise ValueError(f"{path} does not fit this model: {len(wrong)} tensors of other shapes or not floats, "
                         f"the first {wrong[0]}")
    loras = apply_lora(model, tuple(targets), rank, alpha)
    with torch.no_grad():
        for p, module in loras.items():
            b = tensors[_peft_key(p, "lora_B")]
            if p.rsplit(".", 1)[1] in PERMUTED:
                b = rows_from_hf(b, _heads(model, p, b.shape[0]))
            module.lora_A.copy_(tensors[_peft_key(p, "lora_A")])
            module.lora_B.copy_(b)
    return loras


# ---------------------------------------------------------------- the settings

@dataclasses.dataclass
class TuneConfig:
    """Everything that defines a fine-tune; the defaults are `make finetune`'s run (the README gives its time)."""

    rank: int = 8                          # LoRA's r
    alpha: float = 16.0                    # the update is scaled by alpha / rank
    targets: str = "q_proj,v_proj"         # comma list: q_proj k_proj v_proj output_proj w1 w2 w3 (or o_proj, ...)
    lr: float = 2e-3                       # the peak; a warm-up over a tenth of the steps, cosine down to lr / 10
    steps: int = 60
    batch_size: int = 16                   # questions per step, over all processes together
    seed: int = 0                          # the adapters' initialisation and the training questions
    out_dir: str = "build/finetune"
    weights: str | None = None             # the GGUF file; None: make weights' .cache/weights/
    package: str = "transformer_from_scratch"  # NAME.pretrained loads the model, NAME.finetune adapts it if it has one
    eval_examples: int = 200               # held-out lists graded before and after
    eval_batch_size: int = 32
    checkpoint_every: int = 10
    threads: int | None = None             # torch's CPU threads; None: the free cores (make chat's rule)
    device: str = "cpu"                    # cpu, cuda, cuda:N, mps or auto


# The settings that do not change the adapter: a resumed run may take other values of them.
OPERATIONAL = {"out_dir", "weights", "package", "eval_examples", "eval_batch_size", "checkpoint_every", "threads",
               "device"}
FIELDS = {f.name: f for f in dataclasses.fields(TuneConfig)}


def parse_targets(text: str) -> tuple[str, ...]:
    """--targets q_proj,v_proj -> ("q_proj", "v_proj") in the model's order; transformers' names are taken too."""
    names = [ALIASES.get(t.strip(), t.strip()) for t in str(text).split(",") if t.strip()]
    unknown = [t for t in names if t not in HF_NAMES]
    if unknown or not names:
        raise SystemExit(f"--targets must be a comma list of {', '.join(HF_NAMES)} (or transformers' "
                         f"{', '.join(ALIASES)}), got {text!r}")
    return tuple(sorted(set(names), key=list(HF_NAMES).index))


def check_config(config: TuneConfig) -> TuneConfig:
    """Every setting in range, or SystemExit with one line naming the flag; returns it with --targets normalised."""
    at_least = dict(rank=1, steps=1, batch_size=1, eval_examples=0, eval_batch_size=1, checkpoint_every=1, threads=1)
    for name, low in at_least.items():
        value = getattr(config, name)
        if value is not None and value < low:
            raise SystemExit(f"{setting_flag(name)} must be >= {low}, got {value}")
    if not config.alpha > 0:
        raise SystemExit(f"--alpha must be > 0, got {config.alpha}")
    if not (config.lr > 0 and math.isfinite(config.lr)):
        raise SystemExit(f"--lr must be a number > 0, got {config.lr}")
    return dataclasses.replace(config, targets=",".join(parse_targets(config.targets)))


def _resumed_config(checkpoint: dict, requested: dict[str, Any], path: Path) -> TuneConfig:
    """The checkpoint's settings, with the operational ones asked for now; SystemExit if a training one differs."""
    if "targets" in requested:
        requested = dict(requested, targets=",".join(parse_targets(requested["targets"])))
    return TuneConfig(**resumed_settings(checkpoint["config"], requested, FIELDS, OPERATIONAL, "the fine-tune", path))


# ---------------------------------------------------------------- the program

def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    requested = {name: value for name, value in vars(args).items() if name in FIELDS}
    return tune(requested, resume=args.resume, overwrite=args.overwrite, stop_at=args.stop_at,
                progress=args.progress)


def tune(requested: dict[str, Any], *, resume: bool = False, overwrite: bool = False, stop_at: int | None = None,
         progress: bool = True) -> dict[str, Any]:
    """Run (or, with resume, go on with) the fine-tune the `requested` settings describe (TuneConfig's defaults for
    the others); return a summary. SystemExit with a one-line message for bad settings, a missing file, an unusable
    checkpoint, an out-dir that holds a fine-tune already (without resume or overwrite), a loss that is not finite."""
    if resume and overwrite:
        raise SystemExit("--resume goes on with the fine-tune in --out-dir, --overwrite starts it again: not both")
    out_dir = Path(requested.get("out_dir", FIELDS["out_dir"].default))
    checkpoint = None
    if resume:
        checkpoint = read_tune_checkpoint(out_dir / CHECKPOINT)
        config = _resumed_config(checkpoint, requested, out_dir / CHECKPOINT)
    else:
        held = [name for name in (CHECKPOINT, ADAPTER_WEIGHTS, ADAPTER_CONFIG) if (out_dir / name).exists()]
        if held and not overwrite:
            raise SystemExit(f"{out_dir} holds a fine-tune ({', '.join(held)}): --resume to go on with it, "
                             f"--overwrite to start again, or another --out-dir")
        config = TuneConfig(**requested)
    config = check_config(config)
    procs, device = start_processes(config.batch_size, stop_at, config.device)
    weights = _weights_file(config.weights)
    digest = _sha256(weights)
    if checkpoint is not None and checkpoint["weights_sha256"] != digest:
        raise SystemExit(f"--resume: {out_dir / CHECKPOINT} was trained on another GGUF file than {weights} "
                         f"(sha256 {checkpoint['weights_sha256'][:12]}..., this one {digest[:12]}...)")
    pretrained, ft = _modules(config.package)
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads or max(1, _free_cores() // procs.world))
    undo = _set_shape_checks(config.package)
    try:
        with _process_group(procs, device), shape_checks(False):
            run = set_up(config, checkpoint, procs, device, weights, digest, pretrained, ft, overwrite)
            return tune_loop(run, stop_at, progress)
    finally:
        for setter, was in reversed(undo):
            setter(was)
        torch.set_num_threads(threads)


def _weights_file(name: str | None) -> Path:
    from transformer_from_scratch.weights import gguf_path

    if name is None:
        try:
            return gguf_path()
        except FileNotFoundError as error:
            raise SystemExit(str(error)) from None
    if not Path(name).is_file():
        raise SystemExit(f"--weights: no GGUF file at {name} (make weights fetches SmolLM2-135M-Instruct)")
    return Path(name)


def _sha256(path: Path) -> str:
    from transformer_from_scratch.weights import sha256_of

    return sha256_of(path)


def _free_cores() -> int:
    from transformer_from_scratch.chat import free_cores

    return free_cores()


def _set_shape_checks(package: str) -> list:
    from transformer_from_scratch.chat import _set_shape_checks

    return _set_shape_checks(package, False)


def _modules(package: str):
    """NAME.pretrained (load_gguf) and the finetune module: NAME.finetune where NAME has one (the learner's, from
    notebook 15), else the course's. SystemExit for a package that cannot be imported."""
    from transformer_from_scratch.chat import _import_pretrained, _Usage

    try:
        pretrained = _import_pretrained(package)
    except _Usage as error:
        raise SystemExit(f"--package: {error}") from None
    if package == "transformer_from_scratch":
        return pretrained, finetune
    try:
        return pretrained, importlib.import_module(f"{package}.finetune")
    except ModuleNotFoundError as error:
        if error.name != f"{package}.finetune":
            raise
        print(f"--package {package}: it has no finetune module yet (notebook 15): the course's LoRALinear is used",
              file=sys.stderr)
        return pretrained, finetune


# ---------------------------------------------------------------- the run: set up

@dataclasses.dataclass
class Run:
    """A fine-tune in progress: what set_up() builds, and what the loop's functions read and advance."""

    config: TuneConfig
    procs: _Processes
    device: torch.device
    model: nn.Module
    tokenizer: Any
    ft: Any                            # the finetune module: the course's, or the learner's
    loras: dict[str, nn.Module]        # apply_lora's {path: LoRALinear}
    optimizer: torch.optim.Optimizer   # notebook 11's AdamW over the adapters alone
    questions: random.Random           # draws the training questions; saved, so a resumed run draws the same ones
    system: str | None                 # the system prompt of every example: the one make chat uses
    held_out: list[tuple[list[int], list[int]]]  # the encoded held-out questions, graded before and after
    weights: Path
    weights_sha256: str
    step: int = 0
    elapsed_s: float = 0.0             # seconds of training so far, those before a resume included
    recent: list[float] = dataclasses.field(default_factory=list)  # the last RECENT batches' exact match
    before: dict | None = None         # {"correct", "n"} of the model without adapters
    last_saved: int | None = None

    @property
    def lead(self) -> bool:
        return self.procs.rank == 0

    @property
    def out_dir(self) -> Path:
        return Path(self.config.out_dir)

    @property
    def parameters(self) -> list[nn.Parameter]:
        return [p for module in self.loras.values() for p in (module.lora_A, module.lora_B)]

    @property
    def pad_id(self) -> int:
        specials = getattr(self.tokenizer, "special_ids", {})
        return specials.get("<|endoftext|>", specials.get("<|im_end|>", 0))


def set_up(config: TuneConfig, checkpoint: dict | None, procs: _Processes, device: torch.device, weights: Path,
           digest: str, pretrained, ft, overwrite: bool) -> Run:
    """The model with its adapters, AdamW and the question generator, seeded from config.seed, or restored from the
    checkpoint (already read) to go on exactly where it stopped; the held-out questions encoded."""
    torch.manual_seed(config.seed)
    model, tokenizer = pretrained.load_gguf(weights, device=device, dtype=torch.float32)
    try:
        loras = ft.apply_lora(model, parse_targets(config.targets), config.rank, config.alpha)
    except ValueError as error:
        raise SystemExit(f"--targets/--rank: {error}") from None
    optimizer = AdamW([p for m in loras.values() for p in (m.lora_A, m.lora_B)], lr=config.lr, betas=BETAS,
                      weight_decay=WEIGHT_DECAY)
    system = default_system(getattr(tokenizer, "chat_template", None))
    held = random.Random(EVAL_SEED)
    held_out = [ft.encode_example(tokenizer, *ft.reverse_task(held, split="test"), system)
                for _ in range(config.eval_examples)]
    run = Run(config, procs, device, model, tokenizer, ft, loras, optimizer, random.Random(config.seed), system,
              held_out, weights, digest)
    if checkpoint is not None:
        _restore(run, checkpoint)
    if run.lead:
        run.out_dir.mkdir(parents=True, exist_ok=True)
        if overwrite:
            for name in (ADAPTER_WEIGHTS, ADAPTER_CONFIG, CHECKPOINT, RESULTS):
                (run.out_dir / name).unlink(missing_ok=True)
        kept = [line for line in _read_lines(run.out_dir / METRICS) if json.loads(line)["step"] <= run.step]
        (run.out_dir / METRICS).write_text("".join(kept) if run.step else "")
    return run


def read_tune_checkpoint(path: Path) -> dict:
    """A checkpoint of this program, read onto the CPU, or SystemExit naming what is wrong with it."""
    checkpoint = load_checkpoint_file(path, "fine-tune")
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != FORMAT:
        raise SystemExit(f"{path} is not a checkpoint of transformer_from_scratch.tune: it has no format "
                         f"{FORMAT!r} (make train's, or another program's?)")
    missing = [key for key in ("adapter", "optimizer", "step", "config", "questions", "torch_rng", "elapsed_s",
                               "recent", "before", "weights_sha256") if key not in checkpoint]
    if missing:
        raise SystemExit(f"{path} is not a whole checkpoint of transformer_from_scratch.tune: it lacks {missing}")
    return checkpoint


def _restore(run: Run, checkpoint: dict) -> None:
    """Everything a resumed run needs to write the adapter of the run that never stopped: the adapters, AdamW's
    moments, the step, the question generator, torch's generator, the clock, the recent accuracies, the first grade."""
    adapter, ours = checkpoint["adapter"], {f"{path}.{f}": getattr(m, f) for path, m in run.loras.items()
                                            for f in ("lora_A", "lora_B")}
    wrong = sorted(set(adapter) ^ set(ours)) or [k for k in ours if tuple(adapter[k].shape) != tuple(ours[k].shape)]
    if wrong:
        raise SystemExit(f"--resume: the checkpoint's adapters do not fit the model ({wrong[0]} and {len(wrong) - 1} "
                         f"more)")
    with torch.no_grad():
        for key, parameter in ours.items():
            parameter.copy_(adapter[key])
    try:
        run.optimizer.load_state_dict(checkpoint["optimizer"])
    except (ValueError, KeyError) as error:
        raise SystemExit(f"--resume: the checkpoint's optimizer state does not fit the adapters: {error}") from None
    version, state, gauss = checkpoint["questions"]
    run.questions.setstate((version, tuple(state), gauss))
    torch.set_rng_state(checkpoint["torch_rng"])
    run.step = run.last_saved = int(checkpoint["step"])
    run.elapsed_s, run.recent, run.before = checkpoint["elapsed_s"], list(checkpoint["recent"]), checkpoint["before"]


# ---------------------------------------------------------------- the run: the loop, one step, grading, saving

def tune_loop(run: Run, stop_at: int | None, progress: bool) -> dict[str, Any]:
    """Grade the held-out questions (a new run), then from run.step to config.steps take a step, saving every
    checkpoint_every steps, at the last and when stopped (Ctrl-C, SIGTERM, stop_at); then _finish (again, for a run
    stopped after its last step but before its adapter and its grades were written)."""
    config = run.config
    if run.step >= config.steps and all((run.out_dir / name).is_file() for name in (ADAPTER_WEIGHTS, RESULTS)):
        if run.lead:
            print(f"the fine-tune in {run.out_dir} already finished at step {run.step}: its adapter is "
                  f"{run.out_dir / ADAPTER_WEIGHTS}; chat with it: `{chat_command(config)}`")
        return dict(step=run.step, stopped=False)
    if run.lead:
        _announce(run)
    if run.before is None and run.step == 0:  # the adapters start at B = 0: the model as it was loaded
        run.before = dict(correct=grade(run, "before", progress), n=len(run.held_out))
        if run.lead and run.held_out:
            print(f"held-out exact match before: {_accuracy(run.before)}", file=sys.stderr, flush=True)
    bar = _ProgressBar(run, show=run.lead and progress)
    clock_zero = time.perf_counter() - run.elapsed_s
    with _stop_requests() as requests, bar:
        while run.step < config.steps:
            began = time.perf_counter()
            result = take_step(run, requests)
            run.elapsed_s = time.perf_counter() - clock_zero
            bar.show(result, time.perf_counter() - began)
            if run.lead:
                row = {k: v for k, v in result.items() if k != "stop"}
                with (run.out_dir / METRICS).open("a", encoding="utf-8") as file:
                    file.write(json.dumps(dict(row, elapsed_s=round(run.elapsed_s, 2))) + "\n")
            stop = result["stop"] or run.step == stop_at
            if stop or run.step % config.checkpoint_every == 0 or run.step == config.steps:
                save(run)
            if stop:
                break
    return _finish(run, progress)


def draw_batch(run: Run) -> tuple[Tensor, Tensor, float]:
    """The step's global batch of training questions from run.questions (the same on every process), encoded; this
    process's rows of it, padded, on its device, and their share of the global batch's counted tokens."""
    ft, size = run.ft, run.config.batch_size
    examples = [ft.encode_example(run.tokenizer, *ft.reverse_task(run.questions, split="train"), run.system)
                for _ in range(size)]
    rows = size // run.procs.world
    mine = examples[run.procs.rank * rows:(run.procs.rank + 1) * rows]
    counted = lambda batch: sum(t != ft.IGNORE for _, targets in batch for t in targets)  # noqa: E731
    ids, targets = ft.pad_batch(mine, run.pad_id)
    share = 1.0 if run.procs.world == 1 else counted(mine) / counted(examples)
    return ids.to(run.device), targets.to(run.device), share


def reply_logits(model: nn.Module, ids: Tensor, counted: Tensor) -> Tensor:
    """The model's logits at the counted positions only (``counted``: True where a target is not IGNORE), as
    (counted, vocab) in (example, position) order. The loss and the step's grade read nothing else, and the LM head
    (576 x 49,152 for SmolLM2, the largest matrix product of a position) over the prompts' positions, nine in ten of
    make finetune's, would be work thrown away. Equal to model(ids)[counted] within float32 rounding."""
    x = model.token_embeddings(ids)
    for layer in model.layers:
        x = layer(x)
    return model.lm_head(model.ln_final(x[counted]))


def take_step(run: Run, requests: dict[str, bool]) -> dict[str, Any]:
    """Step run.step + 1: the scheduled lr, a batch, the loss on the replies, the gradients (summed over the
    processes), clipped, then AdamW's update if the loss and the norm are finite (else SystemExit before it)."""
    config, ft = run.config, run.ft
    warmup = int(WARMUP_FRACTION * config.steps)
    lr = lr_cosine_schedule(run.step + 1, config.lr, MIN_LR_FRACTION * config.lr, warmup, config.steps)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    ids, targets, share = draw_batch(run)
    counted = targets != ft.IGNORE
    logits = reply_logits(run.model, ids, counted)  # (counted, vocab): the replies' positions, one row each
    loss = ft.masked_cross_entropy(logits[None], targets[counted][None])
    run.optimizer.zero_grad(set_to_none=True)
    (loss * share).backward()  # this slice's part of the global batch's mean (share 1.0 with one process)
    if run.procs.distributed:
        grads = [p.grad for p in run.parameters]
        flat = run.procs.sum(torch.cat([g.flatten() for g in grads]))
        for g, summed in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(summed.view_as(g))
    norm = gradient_clipping(run.parameters, GRAD_CLIP)
    predicted = targets.clone()  # an example is exactly right when the argmax is its target at every counted position
    predicted[counted] = logits.detach().argmax(dim=-1)
    correct = (predicted == targets).all(dim=-1).sum()
    votes = torch.stack([loss.detach().float() * share, correct.float(), norm.detach().float().to(loss.device),
                         torch.tensor(float(requests["stop"]), device=loss.device)])
    votes = run.procs.sum(votes)
    loss_value, correct_value, norm_value, stops = votes.tolist()
    norm_value /= run.procs.world  # every process clipped the same summed gradients: the same norm
    run.step += 1
    if not (math.isfinite(loss_value) and math.isfinite(norm_value)):
        kept = (f"the last checkpoint, of step {run.last_saved}, is kept" if run.last_saved is not None else
                "no checkpoint was saved yet")
        raise SystemExit(f"the loss is {loss_value} and the gradient norm {norm_value} at step {run.step}: stopped "
                         f"before the update; {kept}. Try a lower --lr.")
    run.optimizer.step()
    accuracy = correct_value / config.batch_size
    run.recent = (run.recent + [accuracy])[-RECENT:]
    return dict(step=run.step, loss=loss_value, exact_match=accuracy, lr=lr, grad_norm=norm_value, stop=stops > 0)


@contextlib.contextmanager
def adapters_off(loras: dict[str, nn.Module]) -> Iterator[None]:
    """The model without its adapters' update: each scaling 0 (y = base(x) + 0), then put back."""
    scalings = {path: module.scaling for path, module in loras.items()}
    for module in loras.values():
        module.scaling = 0.0
    try:
        yield
    finally:
        for path, module in loras.items():
            module.scaling = scalings[path]


@torch.no_grad()
def grade(run: Run, when: str, progress: bool) -> int:
    """How many held-out questions the model answers exactly (teacher-forced: finetune.exact_match, True when greedy
    decoding writes the reply and its <|im_end|>), in batches of eval_batch_size, each process its share of every
    batch; the count summed over the processes."""
    from tqdm.auto import tqdm

    size, ft = run.config.eval_batch_size, run.ft
    correct = torch.zeros((), device=run.device)
    batches = [run.held_out[i:i + size] for i in range(0, len(run.held_out), size)]
    for batch in tqdm(batches, desc=f"grading {len(run.held_out)} held-out lists ({when})", unit="batch",
                      disable=not (run.lead and progress), leave=False, dynamic_ncols=True):
        mine = batch[run.procs.rank::run.procs.world]
        if mine:
            ids, targets = ft.pad_batch(mine, run.pad_id)
            targets = targets.to(run.device)
            correct += ft.exact_match(run.model(ids.to(run.device)), targets).sum()
    return int(run.procs.sum(correct).item())


@torch.no_grad()
def plays_loss_per_byte(run: Run) -> float | None:
    """What the fine-tune may have cost elsewhere: the model's loss, in nats per byte of text, on a fixed slice of
    Shakespeare's held-out plays (notebook 11's: 4 rows of 256 tokens, as notebook 15 measures it), a kind of text no
    fine-tune trains on. None where the plays are not at hand (the package without the repository)."""
    if not PLAYS.is_file():
        return None
    ids = torch.tensor(run.tokenizer.encode(PLAYS.read_text(encoding="utf-8")[:6_000])[:4 * 256]).view(4, 256)
    logits = run.model(ids[:, :-1].to(run.device)).float()
    nats = nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten().to(run.device), reduction="sum")
    return nats.item() / sum(len(run.tokenizer.vocab[i]) for i in ids[:, 1:].flatten().tolist())


def _checkpoint(run: Run) -> dict[str, Any]:
    return dict(format=FORMAT, config=dataclasses.asdict(run.config), step=run.step,
                adapter={f"{path}.{f}": getattr(m, f).detach().cpu() for path, m in run.loras.items()
                         for f in ("lora_A", "lora_B")},
                optimizer=run.optimizer.state_dict(), questions=run.questions.getstate(),
                torch_rng=torch.get_rng_state(), elapsed_s=run.elapsed_s, recent=list(run.recent), before=run.before,
                weights_sha256=run.weights_sha256)


def save(run: Run) -> None:
    """Rank 0 writes checkpoint.pt (to a temporary file, renamed: a kill while saving leaves the previous whole)."""
    if run.lead:
        checkpoint = _checkpoint(run)
        _write_atomically(run.out_dir / CHECKPOINT, lambda p: torch.save(checkpoint, p))
    run.last_saved = run.step


# ---------------------------------------------------------------- what it says and leaves behind

def _accuracy(grade: dict) -> str:
    if not grade["n"]:
        return "none graded (--eval-examples 0)"
    low, high = finetune.wilson_interval(grade["correct"], grade["n"])
    return f"{grade['correct'] / grade['n']:.3f} [{low:.3f}, {high:.3f}] ({grade['correct']}/{grade['n']})"


def _announce(run: Run) -> None:
    trained = sum(p.numel() for p in run.parameters)
    frozen = sum(p.numel() for p in run.model.parameters() if not p.requires_grad)
    config = run.config
    print(f"LoRA rank {config.rank}, alpha {config.alpha:g} on {config.targets.replace(',', ', ')} "
          f"({len(run.loras)} matrices): {trained:,} trained parameters, {frozen:,} frozen | "
          f"{run.procs.world} process(es) on {run.device}, {torch.get_num_threads()} thread(s) each | "
          f"{config.batch_size} questions a step, steps {run.step} -> {config.steps} | writing to {run.out_dir}",
          file=sys.stderr, flush=True)


class _ProgressBar:
    """Rank 0's tqdm bar: the step, the loss, the running exact match of the training batches, the lr, s/step."""

    def __init__(self, run: Run, show: bool):
        from tqdm.auto import tqdm

        self.run = run
        self.bar = tqdm(total=run.config.steps, initial=run.step, unit="step", disable=not show, smoothing=0.1,
                        dynamic_ncols=True, mininterval=0.5)

    def show(self, row: dict, seconds: float) -> None:
        recent = self.run.recent
        self.bar.set_postfix_str(f"loss {row['loss']:.3f}, acc {sum(recent) / len(recent):.2f} (last "
                                 f"{len(recent)} batches), lr {row['lr']:.1e}, {seconds:.1f} s/step", refresh=False)
        self.bar.update(1)

    def __enter__(self) -> "_ProgressBar":
        return self

    def __exit__(self, *error) -> None:
        self.bar.close()


def _finish(run: Run, progress: bool) -> dict[str, Any]:
    """Stopped early: say how to go on. Done: write the adapter, grade the held-out lists again, report."""
    config = run.config
    if run.step < config.steps:
        if run.lead:
            print(f"stopped after step {run.step} of {config.steps}: checkpoint saved to {run.out_dir / CHECKPOINT}; "
                  f"go on with `{resume_command(config)}`" + (" (the same flags after your torchrun command)"
                                                              if run.procs.distributed else ""), file=sys.stderr)
        return dict(step=run.step, stopped=True)
    if run.lead:
        save_adapter(run.model, run.out_dir)
    began = time.perf_counter()
    after = dict(correct=grade(run, "after", progress), n=len(run.held_out))
    if run.before is None or run.before["n"] != after["n"]:  # resumed with another --eval-examples
        with adapters_off(run.loras):
            run.before = dict(correct=grade(run, "before", progress), n=len(run.held_out))
    grading_s = time.perf_counter() - began
    with adapters_off(run.loras):
        plays_before = plays_loss_per_byte(run)
    plays = dict(before=plays_before, after=plays_loss_per_byte(run))
    results = dict(step=run.step, before=run.before, after=after, plays_loss_per_byte=plays,
                   train_s=round(run.elapsed_s, 1),
                   s_per_step=round(run.elapsed_s / run.step, 2), grading_s=round(grading_s, 1),
                   config=dataclasses.asdict(config), processes=run.procs.world, threads=torch.get_num_threads())
    if run.lead:
        (run.out_dir / RESULTS).write_text(json.dumps(results, indent=2) + "\n")
        print(f"held-out exact match ({after['n']} lists never trained on, teacher-forced, 95 % Wilson interval):\n"
              f"  before {_accuracy(run.before)}\n  after  {_accuracy(after)}\n" + _forgetting(plays) +
              f"{run.step} steps in {run.elapsed_s / 60:.1f} min ({run.elapsed_s / run.step:.1f} s a step; grading "
              f"{grading_s:.0f} s) | {run.out_dir / ADAPTER_CONFIG}, {ADAPTER_WEIGHTS} (peft's layout), {RESULTS} | "
              f"chat with it: `{chat_command(config)}`")
    return dict(results, stopped=False)


def _forgetting(plays: dict) -> str:
    if plays["before"] is None:
        return ""
    return (f"what it forgot: the loss on Shakespeare's held-out plays, {plays['before']:.3f} nats per byte before, "
            f"{plays['after']:.3f} after\n")


def resume_command(config: TuneConfig) -> str:
    """The command that goes on with this fine-tune: --resume and its --out-dir (the checkpoint holds the rest)."""
    flags = ["--resume"]
    if Path(config.out_dir) != Path(FIELDS["out_dir"].default):
        flags += ["--out-dir", config.out_dir]
    if config.weights is not None:
        flags += ["--weights", config.weights]
    return _make("finetune", "FINETUNE_ARGS", flags)


def chat_command(config: TuneConfig) -> str:
    flags = ["--adapter", config.out_dir] + (["--weights", config.weights] if config.weights is not None else [])
    return _make("chat", "CHAT_ARGS", flags)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m transformer_from_scratch.tune",
                                     description=__doc__.split("\n\n")[0].replace("`", ""),
                                     epilog="torchrun --nproc_per_node=N -m transformer_from_scratch.tune [...]: the "
                                            "same adapter from N processes.")
    parser.add_argument("--resume", action="store_true", help="go on from OUT_DIR/checkpoint.pt")
    parser.add_argument("--overwrite", action="store_true", help="start again over an out-dir that holds a fine-tune")
    parser.add_argument("--stop-at", type=int, default=None, help="stop after this step as Ctrl-C would (save, exit)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    settings = parser.add_argument_group("settings (--resume takes them from the checkpoint)")
    helps = dict(rank="LoRA's rank r (%s)", alpha="the update is scaled by alpha / rank (%s)",
                 targets="the matrices to adapt, a comma list of q_proj, k_proj, v_proj, output_proj, w1, w2, w3 "
                         "(transformers' o_proj, gate_proj, down_proj, up_proj too) (%s)",
                 lr="the peak learning rate: warm-up over a tenth of the steps, cosine down to a tenth (%s)",
                 steps="the steps (%s)", batch_size="questions a step, over all processes (%s)",
                 seed="the adapters' initialisation and the training questions (%s)",
                 out_dir="where the checkpoint, the metrics and the adapter go (%s)",
                 weights="the GGUF file (default: make weights' .cache/weights/)",
                 package="the package whose pretrained.load_gguf loads the model, and whose finetune module, if it "
                         "has one, adapts it (%s; my_transformer: your own)",
                 eval_examples="held-out lists graded before and after (%s)",
                 eval_batch_size="lists a grading batch (%s)", checkpoint_every="save checkpoint.pt every N steps (%s)",
                 threads="torch's CPU threads (default: the free cores, the cores less the load average)",
                 device="cpu, cuda, cuda:N, mps, or auto (%s)")
    for name, field in FIELDS.items():
        kind = {"int": int, "float": float, "str": str, "str | None": str, "int | None": int}[field.type]
        text = helps[name] % field.default if "%s" in helps[name] else helps[name]
        settings.add_argument(setting_flag(name), dest=name, type=kind, default=argparse.SUPPRESS, help=text)
    return parser


if __name__ == "__main__":
    main()

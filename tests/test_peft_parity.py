"""finetune.LoRALinear and make finetune's adapter files against Hugging Face's peft (a test-only dependency).

(a) LoRALinear against peft's own LoRA layer, peft.tuners.lora.Linear, around the same torch.nn.Linear: outputs,
gradients and merged weights, in float32 and float64 (no weights needed). (b) The whole model: the course's
TransformerLM with an adapter, written by tune.save_adapter, against transformers' LlamaForCausalLM of the same GGUF
file with peft.PeftModel.from_pretrained of that directory, and the other way round (peft's save_pretrained read by
tune.load_adapter): logits within 1e-4 in float32. (b) is skipped without the weights (`make weights`); the two models
are loaded once for the module.
"""

import copy

import pytest
import torch
from torch import nn

from transformer_from_scratch import tune
from transformer_from_scratch.finetune import LoRALinear, apply_lora
from transformer_from_scratch.pretrained import chat_prompt, default_system, load_gguf
from transformer_from_scratch.weights import GGUF, weights_dir

peft = pytest.importorskip("peft")
pytestmark = [pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
              pytest.mark.filterwarnings("ignore:Could not find a config file:UserWarning")]  # peft on a GGUF folder

ALL = ("q_proj", "k_proj", "v_proj", "output_proj", "w1", "w2", "w3")
WEIGHTS = weights_dir() / GGUF
needs_weights = pytest.mark.skipif(not WEIGHTS.is_file(), reason=f"no {WEIGHTS}: `make weights` fetches it")


# ---------------------------------------------------------------- (a) one layer

def _pair(dtype: torch.dtype, d_in: int = 24, d_out: int = 40, rank: int = 4, alpha: float = 12.0):
    """A LoRALinear and peft's LoRA Linear around copies of one nn.Linear, with the same nonzero lora_A and lora_B."""
    torch.manual_seed(0)
    base = nn.Linear(d_in, d_out, bias=False, dtype=dtype)
    ours = LoRALinear(copy.deepcopy(base), rank, alpha)
    with torch.no_grad():
        ours.lora_B.normal_()
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=["base"])
    theirs = peft.tuners.lora.Linear(copy.deepcopy(base), "default", config=config, r=rank, lora_alpha=alpha,
                                     lora_dropout=0.0)
    theirs.to(dtype)
    theirs.base_layer.weight.requires_grad_(False)  # what peft's get_peft_model does around the layer
    with torch.no_grad():
        theirs.lora_A["default"].weight.copy_(ours.lora_A)
        theirs.lora_B["default"].weight.copy_(ours.lora_B)
    return ours, theirs


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_lora_linear_equals_peft_in_outputs_and_gradients(dtype):
    ours, theirs = _pair(dtype)
    assert theirs.scaling["default"] == ours.scaling == 3.0
    x = torch.randn(2, 3, 24, dtype=dtype)
    upstream = torch.randn(2, 3, 40, dtype=dtype)
    results = []
    for layer, a, b in [(ours, ours.lora_A, ours.lora_B),
                        (theirs, theirs.lora_A["default"].weight, theirs.lora_B["default"].weight)]:
        xi = x.clone().requires_grad_(True)
        y = layer(xi)
        (y * upstream).sum().backward()
        results.append((y, xi.grad, a.grad, b.grad))
    for name, mine, peft_s in zip(["output", "x.grad", "lora_A.grad", "lora_B.grad"], *results):
        assert mine.dtype == dtype
        torch.testing.assert_close(mine, peft_s, msg=name)
    assert (results[0][0] - ours.base(x)).abs().max() > 0.1  # the update is there, not zero
    assert ours.base.weight.grad is None and theirs.base_layer.weight.grad is None  # frozen


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_lora_linear_merges_as_peft_does(dtype):
    ours, theirs = _pair(dtype)
    x = torch.randn(5, 24, dtype=dtype)
    before = ours(x)
    ours.merge()
    theirs.merge()
    torch.testing.assert_close(ours.base.weight, theirs.base_layer.weight)
    torch.testing.assert_close(ours(x), theirs(x))
    torch.testing.assert_close(ours(x), before)
    ours.unmerge()
    theirs.unmerge()
    torch.testing.assert_close(ours.base.weight, theirs.base_layer.weight)


# ---------------------------------------------------------------- (b) the whole model

@pytest.fixture(scope="module")
def ours():
    return load_gguf(WEIGHTS, dtype=torch.float32)


@pytest.fixture(scope="module")
def hf_model():
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers.AutoModelForCausalLM.from_pretrained(WEIGHTS.parent, gguf_file=WEIGHTS.name,
                                                             dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompt(ours):
    _, tokenizer = ours
    text = chat_prompt([{"role": "user", "content": "Reverse the order of this list: apple, stone, water."}],
                       default_system(tokenizer.chat_template))
    return torch.tensor([tokenizer.encode(text)])


def _random_adapter(model: nn.Module) -> None:
    """LoRA of rank 4 on all seven matrices of every block, lora_B random (not zero): an update that shows."""
    torch.manual_seed(1)
    for lora in apply_lora(model, ALL, rank=4, alpha=8.0).values():
        with torch.no_grad():
            lora.lora_B.normal_(std=0.02)


@needs_weights
def test_our_adapter_in_peft_gives_our_logits(ours, hf_model, prompt, tmp_path, monkeypatch):
    """save_adapter's files, read by peft.PeftModel.from_pretrained into transformers' Llama of the same GGUF file:
    the same logits. And the row permutation of q_proj's and k_proj's lora_B is needed: without it they differ."""
    model = copy.deepcopy(ours[0])
    with torch.no_grad():
        base = model(prompt)
    _random_adapter(model)
    with torch.no_grad():
        adapted = model(prompt)
    assert (adapted - base).abs().max() > 0.5  # the adapter changes the logits clearly
    tune.save_adapter(model, tmp_path / "ours")
    theirs = peft.PeftModel.from_pretrained(copy.deepcopy(hf_model), tmp_path / "ours").eval()
    with torch.no_grad():
        torch.testing.assert_close(theirs(prompt).logits, adapted, rtol=0, atol=1e-4)
    monkeypatch.setattr(tune, "rows_to_hf", lambda b, heads: b)  # the GGUF file's row order, as it is
    tune.save_adapter(model, tmp_path / "unpermuted")
    theirs.load_adapter(tmp_path / "unpermuted", adapter_name="unpermuted")
    theirs.set_adapter("unpermuted")
    with torch.no_grad():
        assert (theirs(prompt).logits - adapted).abs().max() > 1e-2


@needs_weights
def test_peft_adapter_in_our_model_gives_peft_logits(ours, hf_model, prompt, tmp_path):
    """peft's own adapter (get_peft_model with random weights, save_pretrained) read by tune.load_adapter: the
    logits of transformers + peft, and after LoRALinear.merge (what make chat --adapter runs) too."""
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, init_lora_weights=False, task_type="CAUSAL_LM",
                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                             "down_proj"])
    torch.manual_seed(2)
    theirs = peft.get_peft_model(copy.deepcopy(hf_model), config).eval()
    with torch.no_grad():
        for name, parameter in theirs.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.02)
        expected = theirs(prompt).logits
    theirs.save_pretrained(tmp_path / "peft")
    model = copy.deepcopy(ours[0])
    loras = tune.load_adapter(model, tmp_path / "peft")
    assert len(loras) == 7 * 30 and {m.rank for m in loras.values()} == {4}
    with torch.no_grad():
        assert (model(prompt) - ours[0](prompt)).abs().max() > 0.5
        torch.testing.assert_close(model(prompt), expected, rtol=0, atol=1e-4)
        for lora in loras.values():
            lora.merge()
        torch.testing.assert_close(model(prompt), expected, rtol=0, atol=1e-4)

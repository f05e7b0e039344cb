"""Write the tiny cross-framework fixtures under tests/fixtures/xframe/ (issue 19).

Needs torch, torchvision and transformers, and must run in its own process: torch and TensorFlow
imported into one process segfault with the default wheels. The test suite itself needs neither:
it reads the committed files with ckptmerge and keras-hub only.

    python -m venv /work/venvs/torch
    /work/venvs/torch/bin/pip install torch==2.14.1 torchvision==0.29.1 transformers safetensors numpy
    /work/venvs/torch/bin/python scripts/make_xframe_fixtures.py [OUT_DIR]

For each model it writes ``OUT_DIR/NAME/``:

- the Hugging Face models (``bert``, ``gpt2``, ``llama``, ``phi3``, ``vit``): ``save_pretrained(dir,
  safe_serialization=True)``, i.e. ``config.json`` plus ``model.safetensors``;
- ``resnet18``: ``model.safetensors`` holding torchvision's ResNet-18 ``state_dict`` (ResNet with
  ``BasicBlock`` and ``[2, 2, 2, 2]`` blocks, as ``torchvision.models.resnet18``, at 1/16 of its
  width so that the file stays small: the names, kinds and nesting of every tensor are resnet18's);
- ``reference.npz``: the fixed inputs and PyTorch's outputs on them (eval mode, float32).

Every model is built from a small config with a fixed seed; every floating tensor is then drawn
at random (norm scales around 1, biases, BatchNorm statistics with positive variances, position
tables), so that a swapped or transposed tensor changes the outputs visibly.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Dict

import numpy as np
import torch
from safetensors.torch import save_file

SEED = 19
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, os.pardir, "tests", "fixtures", "xframe")


def randomise(model: torch.nn.Module, seed: int) -> None:
    """Draw every floating parameter and buffer afresh: matrices ~ N(0, 1/fan_in), norm scales
    ~ 1 + N(0, 0.2), other vectors ~ N(0, 0.2), BatchNorm variances ~ U(0.5, 1.5)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.state_dict(keep_vars=True).items():
            if not t.is_floating_point():
                continue
            if name.endswith("running_var"):
                new = 0.5 + torch.rand(t.shape, generator=g)
            elif t.ndim == 1 and (name.endswith("weight") or name.endswith(".gamma")):
                new = 1.0 + 0.2 * torch.randn(t.shape, generator=g)
            elif t.ndim == 1:
                new = 0.2 * torch.randn(t.shape, generator=g)
            else:
                fan_in = int(np.prod(t.shape[1:])) if t.ndim > 1 else t.shape[0]
                new = torch.randn(t.shape, generator=g) / np.sqrt(max(fan_in, 1))
            t.copy_(new)


def save_hf(model: torch.nn.Module, out: str, inputs: Dict[str, np.ndarray],
            outputs: Dict[str, np.ndarray]) -> None:
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    np.savez(os.path.join(out, "reference.npz"), **inputs, **outputs)


def make_bert(out: str) -> None:
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=40, max_position_embeddings=24, type_vocab_size=2,
                     hidden_act="gelu_new", attn_implementation="eager")
    torch.manual_seed(SEED)
    model = BertModel(cfg).eval()
    randomise(model, SEED)
    rng = np.random.default_rng(SEED)
    ids = rng.integers(0, 50, (2, 8)).astype(np.int64)
    types = np.zeros_like(ids)
    types[:, 5:] = 1
    mask = np.ones_like(ids)
    with torch.no_grad():
        o = model(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(types),
                  attention_mask=torch.tensor(mask))
    save_hf(model, out, {"token_ids": ids, "segment_ids": types, "padding_mask": mask},
            {"sequence_output": o.last_hidden_state.numpy(), "pooled_output": o.pooler_output.numpy()})


def make_gpt2(out: str) -> None:
    from transformers import GPT2Config, GPT2Model

    cfg = GPT2Config(vocab_size=50, n_positions=24, n_embd=16, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0,
                     attn_implementation="eager")
    torch.manual_seed(SEED)
    model = GPT2Model(cfg).eval()
    randomise(model, SEED + 1)
    ids = np.random.default_rng(SEED + 1).integers(0, 50, (2, 8)).astype(np.int64)
    mask = np.ones_like(ids)
    with torch.no_grad():
        o = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    save_hf(model, out, {"token_ids": ids, "padding_mask": mask},
            {"sequence_output": o.last_hidden_state.numpy()})


def save_decoder(model: torch.nn.Module, out: str, seed: int) -> None:
    """Save a causal LM's folder with its decoder's outputs (``model.model``: the backbone KerasHub
    builds) on token ids drawn with ``seed``."""
    ids = np.random.default_rng(seed).integers(0, 50, (2, 8)).astype(np.int64)
    mask = np.ones_like(ids)
    with torch.no_grad():
        o = model.model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    save_hf(model, out, {"token_ids": ids, "padding_mask": mask},
            {"sequence_output": o.last_hidden_state.numpy()})


def make_llama(out: str) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=40, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                      rms_norm_eps=1e-6, tie_word_embeddings=False, attn_implementation="eager")
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(cfg).eval()  # with its untied lm_head, as Llama checkpoints are published
    randomise(model, SEED + 2)
    save_decoder(model, out, SEED + 2)


def make_phi3(out: str) -> None:
    from transformers import Phi3Config, Phi3ForCausalLM

    # Fused tensors of their own: qkv_proj holds query (4 heads), key and value (2 heads each)
    # one after the other, so the three parts have unequal sizes (16, 8, 8 rows); gate_up_proj
    # holds the gate (rows 0..39) then the up projection (rows 40..79): Phi3MLP.forward's
    # ``gate, up = gate_up_proj(x).chunk(2, dim=-1)``.
    cfg = Phi3Config(vocab_size=50, hidden_size=16, intermediate_size=40, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                     original_max_position_embeddings=32, rms_norm_eps=1e-6, rope_theta=10000.0,
                     pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
                     attn_implementation="eager")
    torch.manual_seed(SEED)
    model = Phi3ForCausalLM(cfg).eval()  # with its untied lm_head (KerasHub's reverse_embeddings)
    randomise(model, SEED + 5)
    save_decoder(model, out, SEED + 5)


def make_vit(out: str) -> None:
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(image_size=12, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=2,
                    num_attention_heads=4, intermediate_size=40, hidden_act="gelu",
                    layer_norm_eps=1e-6, num_labels=3, attn_implementation="eager")
    torch.manual_seed(SEED)
    model = ViTForImageClassification(cfg).eval()  # ViT under "vit.", plus its classifier head
    randomise(model, SEED + 3)
    pixels = np.random.default_rng(SEED + 3).standard_normal((2, 3, 12, 12)).astype(np.float32)
    with torch.no_grad():
        o = model.vit(pixel_values=torch.tensor(pixels))
    save_hf(model, out, {"images": pixels.transpose(0, 2, 3, 1).copy()},
            {"sequence_output": o.last_hidden_state.numpy()})


def narrow_resnet18(divisor: int = 16, num_classes: int = 10) -> torch.nn.Module:
    """torchvision's ResNet-18 (``BasicBlock``, ``[2, 2, 2, 2]``) with every width divided by
    ``divisor``: the same modules under the same names, a small fraction of the bytes."""
    from torchvision.models.resnet import BasicBlock, ResNet

    class NarrowResNet(ResNet):
        def _make_layer(self, block, planes, blocks, stride=1, dilate=False):  # type: ignore[override]
            if planes == 64:  # the first stage: its input is conv1's (narrowed) output
                self.inplanes = 64 // divisor
            return super()._make_layer(block, planes // divisor, blocks, stride, dilate)

    model = NarrowResNet(BasicBlock, [2, 2, 2, 2], num_classes=num_classes)
    width = 64 // divisor
    model.conv1 = torch.nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
    model.bn1 = torch.nn.BatchNorm2d(width)
    model.fc = torch.nn.Linear(8 * width, num_classes)
    return model


def make_resnet18(out: str) -> None:
    torch.manual_seed(SEED)
    model = narrow_resnet18().eval()
    randomise(model, SEED + 4)
    images = np.random.default_rng(SEED + 4).standard_normal((2, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        logits = model(torch.tensor(images))
    os.makedirs(out, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"architecture": "torchvision.models.resnet18", "width_divisor": 16, "num_classes": 10,
                   "input": "NCHW float32 (2, 3, 32, 32); reference.npz 'images' is NHWC"}, f, indent=1)
        f.write("\n")
    np.savez(os.path.join(out, "reference.npz"), images=images.transpose(0, 2, 3, 1).copy(),
             logits=logits.numpy())


MAKERS = {"bert": make_bert, "gpt2": make_gpt2, "llama": make_llama, "phi3": make_phi3, "vit": make_vit,
          "resnet18": make_resnet18}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = os.path.abspath(argv[0] if argv else DEFAULT_OUT)
    torch.use_deterministic_algorithms(True)
    for name, make in MAKERS.items():
        make(os.path.join(out, name))
        size = sum(os.path.getsize(os.path.join(out, name, f)) for f in os.listdir(os.path.join(out, name)))
        print(f"{name}: {size / 1024:.1f} KiB")
    import transformers
    import torchvision
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, transformers {transformers.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

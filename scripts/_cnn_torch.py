"""The torch half of scripts/cnn_transfers.py: runs in the torch venv (torch never shares a process with TF).

For each model: build it with seeded random weights (no downloads), randomise every BatchNorm's
weight, bias and running statistics (and ConvNeXt's layer scale), set BatchNorm epsilon to the Keras target's, save the state
dict to ``model.safetensors`` (timm models with timm's ``config.json``), the fixed input and the
output to ``reference.npz``, and each key's module class to ``modules.json``.

Usage: python scripts/_cnn_torch.py OUT_DIR
"""

import json
import os
import sys

import numpy as np
import torch
import timm
import torchvision.models as tvm
from safetensors.torch import save_file

#: name -> (builder, BatchNorm epsilon of the Keras target, image size)
MODELS = {
    "tv_densenet121": (lambda: tvm.densenet121(weights=None), 1.001e-5, 64),
    "tv_mobilenet_v2": (lambda: tvm.mobilenet_v2(weights=None), 1e-3, 65),
    "tv_mobilenet_v3_small": (lambda: tvm.mobilenet_v3_small(weights=None), 1e-3, 65),
    "tv_efficientnet_b0": (lambda: tvm.efficientnet_b0(weights=None), 1e-3, 65),
    "tv_convnext_tiny": (lambda: tvm.convnext_tiny(weights=None), None, 64),
    "timm_resnet18": (lambda: timm.create_model("resnet18", pretrained=False), 1e-5, 64),
    "timm_densenet121": (lambda: timm.create_model("densenet121", pretrained=False), 1e-5, 64),
    "timm_efficientnet_b0": (lambda: timm.create_model("efficientnet_b0", pretrained=False), 1e-5, 64),
    "timm_mobilenetv3_small_050": (lambda: timm.create_model("mobilenetv3_small_050", pretrained=False), 1e-3, 64),
}


def build(name, seed=0):
    make, eps, image = MODELS[name]
    torch.manual_seed(seed)
    model = make().eval()
    g = torch.Generator().manual_seed(seed + 1)
    modules = {}
    for mod_name, m in model.named_modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            n = m.num_features
            with torch.no_grad():
                m.weight.copy_(torch.rand(n, generator=g) + 0.5)
                m.bias.copy_(torch.randn(n, generator=g) * 0.2)
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.2)
                m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
            if eps is not None:
                m.eps = eps
        if hasattr(m, "layer_scale"):  # ConvNeXt: torchvision starts it at 1e-6, which would hide the blocks
            with torch.no_grad():
                m.layer_scale.copy_(torch.rand(m.layer_scale.shape, generator=g) + 0.5)
        for p, _ in list(m.named_parameters(recurse=False)) + list(m.named_buffers(recurse=False)):
            modules[f"{mod_name}.{p}" if mod_name else p] = type(m).__name__
    return model, image, modules


def main(out):
    for name in MODELS:
        model, image, modules = build(name)
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        sd = {k: v.contiguous() for k, v in model.state_dict().items()}
        save_file(sd, os.path.join(d, "model.safetensors"))
        x = torch.rand(2, 3, image, image, generator=torch.Generator().manual_seed(7))
        with torch.no_grad():
            y = model(x).numpy()
            feats = model.forward_features(x).numpy() if name.startswith("timm") else y
        np.savez(os.path.join(d, "reference.npz"), images=x.numpy(), logits=y, features=feats)
        with open(os.path.join(d, "modules.json"), "w") as f:
            json.dump({"order": list(sd), "modules": modules}, f)
        if name.startswith("timm"):
            arch = name[len("timm_"):]
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump({"architecture": arch, "num_classes": model.num_classes,
                           "num_features": model.num_features,
                           "pretrained_cfg": dict(model.pretrained_cfg)}, f, default=str)


if __name__ == "__main__":
    main(sys.argv[1])

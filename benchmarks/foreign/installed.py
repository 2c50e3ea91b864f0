"""Models and losses of other projects, imported from their installed packages (not copied):
torchtitan's Llama 3 with torchtitan's own cross entropy, and timm's vision transformer. Each
builder raises ImportError naming the package to install when it is not there.

    pip install torchtitan==0.2.2 triton "torch==2.13.0"   # torchtitan's Llama 3 (0.3 drops SDPA for flex attention)
    pip install --no-deps timm                              # timm's ViT (see timm_vit: torchvision)

    model = titan_llama3(layers=2, dim=64, heads=4, kv_heads=2, vocab=128, seq=16)
    loss = titan_loss()(model(tokens), labels)          # a sum over the tokens, in float32
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import types

import torch


def titan_llama3(layers: int = 2, dim: int = 64, heads: int = 4, kv_heads: int = 2, vocab: int = 128,
                 seq: int = 16) -> torch.nn.Module:
    """torchtitan's Llama 3 ``Transformer`` (torchtitan/models/llama3/model/model.py) at a tiny
    size, initialised by its own ``init_weights``: SDPA attention with a causal mask, the
    rotary table a complex64 buffer (``freqs_cis``), RMSNorm, SwiGLU."""
    try:
        from torchtitan.models.llama3.model.args import TransformerModelArgs
        from torchtitan.models.llama3.model.model import Transformer
    except ImportError as e:
        raise ImportError(f"torchtitan's Llama 3 needs `pip install torchtitan==0.2.2 triton` ({e})") from e
    args = TransformerModelArgs(dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=kv_heads, vocab_size=vocab,
                                multiple_of=32, max_seq_len=max(seq, 16))
    model = Transformer(args)
    with torch.no_grad():
        model.init_weights()
    return model


def titan_loss():
    """torchtitan's ``cross_entropy_loss``: the logits in float32, a sum over the tokens (its
    trainer divides by the global token count; a sum is what the micro-batches must add)."""
    from torchtitan.components.loss import cross_entropy_loss

    return cross_entropy_loss


def _torchvision_stand_in() -> None:
    """timm imports torchvision at import time (its data pipeline's datasets and transforms,
    its ResNets' FrozenBatchNorm2d), none of which a vision transformer builds. PyPI's
    torchvision does not load beside this machine's torch 2.13.0 CPU wheel ("operator
    torchvision::nms does not exist"), so where it cannot be imported this installs a stand-in:
    every ``torchvision.*`` module exists and every name in it is a class that refuses to be
    built. The model timm builds is its own code, unchanged; anything that would really use
    torchvision fails loudly."""
    try:
        import torchvision  # noqa: F401
        return
    except Exception:  # noqa: BLE001 - missing, or present and unloadable
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]

    made: dict[str, type] = {}

    class _Placeholder(type):  # a class whose attributes are placeholders too (InterpolationMode.NEAREST)
        def __getattr__(cls, attr: str):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return placeholder(f"{cls.__qualname__}.{attr}")

    def placeholder(name: str) -> type:
        if name not in made:
            def refuse(*args, **kwargs):
                raise NotImplementedError(f"torchvision {name}: the zoo's torchvision stand-in (torchvision does "
                                          "not load beside this torch)")

            made[name] = _Placeholder(name.rsplit(".", 1)[-1], (), {"__init__": refuse, "__qualname__": name})
        return made[name]

    class _StandIn(types.ModuleType):
        def __getattr__(self, name: str):
            if name.startswith("__"):
                raise AttributeError(name)
            return placeholder(f"{self.__name__}.{name}")

    class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname, path, target=None):
            if fullname == "torchvision" or fullname.startswith("torchvision."):
                return importlib.util.spec_from_loader(fullname, self, is_package=True)
            return None

        def create_module(self, spec):
            module = _StandIn(spec.name)
            module.__path__ = []
            return module

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, _Finder())


def timm_vit(image: int = 32, patch: int = 8, depth: int = 2, dim: int = 64, heads: int = 4,
             classes: int = 10) -> torch.nn.Module:
    """timm's ``VisionTransformer`` (``vit_tiny_patch16_224`` resized), dropouts and drop path 0."""
    _torchvision_stand_in()
    try:
        import timm
    except ImportError as e:
        raise ImportError(f"timm's vision transformer needs `pip install --no-deps timm` ({e})") from e
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=image, patch_size=patch,
                             depth=depth, embed_dim=dim, num_heads=heads, num_classes=classes, drop_rate=0.0,
                             attn_drop_rate=0.0, drop_path_rate=0.0)

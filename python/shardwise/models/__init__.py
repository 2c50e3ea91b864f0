"""Built-in models: small PyTorch programs for the quick start, tests and examples, and
torch-free graph builders (gpt) for configurations too large to instantiate."""
from .gpt import gpt
from .tiny_gpt import TinyGPT, TinyGPTConfig
from .with_loss import CausalLMWithLoss

__all__ = ["CausalLMWithLoss", "TinyGPT", "TinyGPTConfig", "gpt"]

"""Built-in models: small PyTorch programs for the quick start, tests and examples."""
from .tiny_gpt import TinyGPT, TinyGPTConfig

__all__ = ["TinyGPT", "TinyGPTConfig"]

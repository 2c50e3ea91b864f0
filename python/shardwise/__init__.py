"""shardwise: automatic data, tensor and pipeline parallelism for PyTorch models."""
import torch  # noqa: F401  (must load before the extension: _C links against libtorch)

from . import _C, collectives, models
from ._C import ParseError, ShardwiseError, ValidationError
from ._fx_import import CaptureError
from .capture import capture
from .cluster import Cluster
from .engine import CollectiveError, Engine, parallelize
from .graph import Graph, RepeatedBlocks, UnknownOp
from .materialize import materialize
from .plan import Plan, plan
from .profile import Profile, profile
from .simulate import simulate

__version__ = "0.1.0"

__all__ = [
    "capture", "Cluster", "Engine", "Graph", "parallelize", "materialize", "Plan", "plan", "Profile", "profile", "RepeatedBlocks", "simulate",
    "UnknownOp",
    "ShardwiseError", "ParseError", "ValidationError", "CaptureError", "CollectiveError",
]

"""shardwise: automatic data, tensor and pipeline parallelism for PyTorch models."""
import torch  # noqa: F401  (must load before the extension: _C links against libtorch)

from . import _C, collectives, models
from ._logging import install_core_sink as _install_core_sink
from ._C import ParseError, ShardwiseError, ValidationError
from ._fx_import import CaptureError
from .capture import capture
from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .cluster import Cluster
from .devices import backend_for, local_device
from .engine import CollectiveError, Engine, parallelize
from .graph import Graph, RepeatedBlocks, UnknownOp
from .materialize import materialize
from .plan import NetworkCondition, Plan, plan
from .profile import Profile, profile
from .simulate import simulate

_install_core_sink()

__version__ = "0.1.0"

__all__ = [
    "capture", "save_checkpoint", "load_checkpoint", "Cluster", "Engine", "Graph", "parallelize", "materialize",
    "NetworkCondition", "Plan", "plan", "Profile", "profile", "RepeatedBlocks", "simulate",
    "UnknownOp", "local_device", "backend_for",
    "ShardwiseError", "ParseError", "ValidationError", "CaptureError", "CollectiveError", "CheckpointError",
]

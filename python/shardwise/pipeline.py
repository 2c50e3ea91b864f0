"""The pipeline engine, by the names scripts import it under; it lives in the runtime
(python/shardwise/runtime/pipeline_engine.py), and shardwise.parallelize builds it."""
from .runtime.pipeline_engine import PipelineEngine, StageProgram, stage_program

__all__ = ["PipelineEngine", "StageProgram", "stage_program"]

"""torch.distributed.checkpoint's side of shardwise's checkpoints: the planners that write and read
each rank's boxes (shardwise/checkpoint.py). Imported when a checkpoint is saved or loaded, not
with the package: importing DCP costs about a second, most of `import shardwise`."""
from __future__ import annotations

import io
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, MetadataIndex, TensorProperties,
                                                   TensorStorageMetadata)
from torch.distributed.checkpoint.planner import LoadPlan, SavePlan, TensorWriteData, WriteItem, WriteItemType
from torch.distributed.checkpoint.planner_helpers import _create_read_item_for_byteio, create_read_items_for_chunk_list

from .runtime.state import _Box, _Held

__all__ = ["BoxLoadPlanner", "BoxSavePlanner", "CheckpointException", "TensorStorageMetadata", "dcp"]


def box_view(tensor: torch.Tensor, box: _Box) -> torch.Tensor:
    """The part of `tensor` (a rank's local tensor) that `box` covers."""
    out = tensor
    for dim, (at, size) in enumerate(zip(box.local, box.sizes)):
        out = out.narrow(dim, at, size)
    return out


# ---- DCP planners over boxes -----------------------------------------------------------------
class BoxSavePlanner(DefaultSavePlanner):
    def __init__(self, tensors: dict[str, _Held], objects: dict[str, Any]):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self._tensors = tensors
        self._objects = objects
        self._views: dict[tuple, torch.Tensor] = {}

    def create_local_plan(self) -> SavePlan:
        items = []
        for key, held in self._tensors.items():
            properties = TensorProperties.create_from_tensor(held.tensor)
            for box in held.boxes:
                index = MetadataIndex(key, torch.Size(box.offsets))
                self._views[(key, box.offsets)] = box_view(held.tensor, box)
                items.append(WriteItem(index=index, type=WriteItemType.SHARD, tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(offsets=torch.Size(box.offsets), sizes=torch.Size(box.sizes)),
                    properties=properties, size=torch.Size(held.shape))))
        for key in self._objects:
            items.append(WriteItem(index=MetadataIndex(key), type=WriteItemType.BYTE_IO))
        self.plan = SavePlan(items)
        return self.plan

    def resolve_data(self, write_item: WriteItem):
        key = write_item.index.fqn
        if write_item.type == WriteItemType.BYTE_IO:
            buffer = io.BytesIO()
            torch.save(self._objects[key], buffer)
            return buffer
        return self._views[(key, tuple(write_item.index.offset))].detach().contiguous()


class BoxLoadPlanner(DefaultLoadPlanner):
    def __init__(self, tensors: dict[str, _Held], objects: list[str]):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self._tensors = tensors
        self._object_keys = objects
        self.objects: dict[str, Any] = {}
        self._views: dict[tuple, torch.Tensor] = {}

    def create_local_plan(self) -> LoadPlan:
        requests = []
        for key, held in self._tensors.items():
            chunks = []
            for box in held.boxes:
                self._views[(key, box.offsets)] = box_view(held.tensor, box)
                chunks.append(ChunkStorageMetadata(offsets=torch.Size(box.offsets), sizes=torch.Size(box.sizes)))
            requests += create_read_items_for_chunk_list(key, self.metadata.state_dict_metadata[key], chunks)
        for key in self._object_keys:
            index = MetadataIndex(key)
            requests.append(_create_read_item_for_byteio(index, 0, index, 0, 0))
        return LoadPlan(requests)

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        self.objects[read_item.dest_index.fqn] = torch.load(value, weights_only=True)

    def resolve_tensor(self, read_item):
        index = read_item.dest_index
        view = self._views[(index.fqn, tuple(index.offset))]
        for dim, (at, size) in enumerate(zip(read_item.dest_offsets, read_item.lengths)):
            view = view.narrow(dim, at, size)
        return view

    def commit_tensor(self, read_item, tensor: torch.Tensor) -> None:
        pass  # resolve_tensor's view is written in place

"""TensorBoard event files as tests find and build them: the files a writer left in a folder,
and an event record with a tensor-based summary (as TensorBoard's own writers write scalars)."""

from __future__ import annotations

from pathlib import Path

from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2


def event_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if "tfevents" in p.name)


def tensor_event(tag: str, step: int, tensor: tensor_pb2.TensorProto, wall: float,
                 plugin: str | None = "scalars") -> event_pb2.Event:
    value = summary_pb2.Summary.Value(tag=tag, tensor=tensor)
    if plugin is not None:
        value.metadata.CopyFrom(summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=plugin)))
    return event_pb2.Event(wall_time=wall, step=step, summary=summary_pb2.Summary(value=[value]))

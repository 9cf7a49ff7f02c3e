"""Synchronized BatchNorm on CPU, under one name: the statistics (:mod:`normcore.sync`), the
module (:class:`normcore.nn.SyncBatchNorm`), the process launcher (:mod:`normcore.launch`)
and the chapter's comparison (:mod:`normcore.experiments.sync`).

The math and the rules (empty local batches, eval mode, a world of one, no process group)
are in :mod:`normcore.sync`'s docstring.
"""
from .experiments.sync import compare, compare_per_device_vs_sync, plain_batch_norm
from .launch import RemoteTraceback, free_port, run
from .nn import SyncBatchNorm
from .sync import (all_gather_moments, local_moments, merge, require_process_group,
                   sync_batch_norm)

__all__ = [
    "SyncBatchNorm", "sync_batch_norm", "local_moments", "all_gather_moments", "merge",
    "require_process_group", "run", "free_port", "RemoteTraceback", "compare",
    "compare_per_device_vs_sync", "plain_batch_norm",
]

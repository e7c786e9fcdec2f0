"""Context parallelism: ring attention over several GPUs (or emulated ranks on one).

* :func:`ring_attention_forward` / :func:`ring_attention_backward`: one rank's part, with its
  shards and a :class:`Communicator` (:class:`NcclRing`, one process per GPU).
* :func:`local_ring_attention_forward` / :func:`local_ring_attention_backward`: every rank of a
  :class:`LocalRing` in one process (one GPU, or the NumPy CPU model).
* :mod:`cupy_fmha.parallel.layout`: how tokens are sharded (:func:`shard`, :func:`unshard`,
  :func:`shard_positions`; zigzag by default).
* :mod:`cupy_fmha.parallel.run`: a multiprocessing launcher (``python -m
  cupy_fmha.parallel.run --nproc N``) and :func:`~cupy_fmha.parallel.run.launch`.

Importing this package needs neither CuPy nor a GPU.
"""

from .comm import Communicator, LocalRank, LocalRing, NcclRing, nccl_available, nccl_unique_id
from .layout import SCHEMES, rank_chunks, shard, shard_positions, unshard
from .merge import merge_into, merge_partials
from .plan import Call, RankPlan, Step, global_window, plan_rank, plan_ring
from .ring import (
    Timeline,
    local_ring_attention_backward,
    local_ring_attention_forward,
    ring_attention_backward,
    ring_attention_forward,
)

__all__ = [
    "Communicator", "LocalRank", "LocalRing", "NcclRing", "nccl_available", "nccl_unique_id",
    "SCHEMES", "rank_chunks", "shard", "shard_positions", "unshard",
    "merge_into", "merge_partials",
    "Call", "RankPlan", "Step", "global_window", "plan_rank", "plan_ring",
    "Timeline", "ring_attention_forward", "ring_attention_backward",
    "local_ring_attention_forward", "local_ring_attention_backward",
]

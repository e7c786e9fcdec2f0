"""Context parallelism: ring attention over several GPUs (or emulated ranks on one).

* :mod:`cupy_fmha.parallel.layout`: how tokens are sharded (:func:`shard`, :func:`unshard`,
  :func:`shard_positions`; zigzag by default).
* :mod:`cupy_fmha.parallel.plan`: the attention calls of each rank at each ring step.
* :mod:`cupy_fmha.parallel.merge`: merging partial results by their log-sum-exp.

Importing this package needs neither CuPy nor a GPU.
"""

from .layout import SCHEMES, rank_chunks, shard, shard_positions, unshard
from .merge import merge_into, merge_partials
from .plan import Call, RankPlan, Step, global_window, plan_rank, plan_ring

__all__ = [
    "SCHEMES", "rank_chunks", "shard", "shard_positions", "unshard",
    "merge_into", "merge_partials",
    "Call", "RankPlan", "Step", "global_window", "plan_rank", "plan_ring",
]

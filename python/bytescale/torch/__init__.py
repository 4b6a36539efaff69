"""bytescale.torch: Hybrid Data Parallelism executed in PyTorch (docs/torch.md).

The plans bytescale makes (one call into the C planner on rank 0) run on torch.distributed: packs of
short sequences with blockwise variable-length attention, long sequences as rings of ranks with
ring attention, as Ulysses (all-to-all) groups, or as rings of Ulysses groups (hybrid items), over
point-to-point messages of the default process group (or, beside the user's tensor parallelism
and pipeline stages, of a 3D Layout's hdp groups), token-level loss over the
whole global batch, gradients summed bucket by bucket. gloo on CPU, NCCL on CUDA; PyTorch 2
(docs/torch.md, "Supported PyTorch versions": 1.13 is not supported).

    import bytescale.torch as bt
    plan = bt.broadcast_plan(lambda: bt.plan_step(batch, source, ranks=world, capacity=C))  # rank 0 plans
    for mb in bt.microbatches(plan, rank, source):
        with bt.microbatch_context(mb):           # HDPAttention / hdp_attention attend as mb needs
            loss = model.loss_sum(mb.tokens, mb.targets, mb.pos) / plan.labelled
        loss.backward()

`import bytescale` never imports torch; this subpackage needs it.
"""

try:
    import torch as _torch  # noqa: F401  (absolute: the real torch, not this package)
    import torch.distributed as _dist  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise ImportError("bytescale.torch needs PyTorch 2: run with the project's environment, .venv/bin/python or "
                      ".venv/bin/torchrun (make venv), or pip install torch into yours") from e

from .attention import Rows, block_backward, block_forward, local_attention, merge, varlen_attention
from .ring import Ring, RingStats, ring_attention
from .ulysses import Ulysses, head_split, ulysses_attention
from .step import (Batch, FunctionSource, MicroBatch, MicroBatches, PlanError, StepPlan, TokenSource, broadcast_plan,
                   check_batch, labelled_tokens, member_pieces, microbatches, plan_chunk, plan_step)
from .check import PlanCheckError, Reading, check_plan, plan_fingerprint, plan_problem
from .guard import PeerError, StallError, set_timeout
from .model import HDPAttention, Llama, LlamaConfig, hdp_attention, microbatch_context
from .parallel import (ColumnParallelLinear, Layout, RowParallelLinear, column_parallel, column_parallel_group,
                       copy_to_tp, gather_whole, reduce_from_tp, row_parallel, split_layers, vocab_embedding,
                       vocab_parallel_cross_entropy)
from .sharded import clip_grad_norm_, load_tp, save_tp
from .pipeline import PipeStats, pipeline_slots, run_stage, stage_order
from .train import HDPTrainer, StepResult, all_reduce_gradients, lr_schedule
from .data import Dataset, DatasetError, Sampler
from .loader import DocumentError, HDPLoader, LoaderError, LoaderStep
from .checkpoint import Checkpoint, CheckpointError, load_params, read_checkpoint, write_checkpoint
from . import dcp, fsdp  # bt.fsdp.shard / step, bt.dcp.save / load (docs/torch-fsdp.md)

# one list, in the order of docs/torch.md's module table
__all__ = [
    # attention.py
    "Rows", "block_forward", "block_backward", "local_attention", "merge", "varlen_attention",
    # ring.py
    "Ring", "RingStats", "ring_attention",
    # ulysses.py
    "Ulysses", "head_split", "ulysses_attention",
    # step.py
    "Batch", "FunctionSource", "MicroBatch", "MicroBatches", "StepPlan", "TokenSource", "PlanError", "broadcast_plan",
    "check_batch", "labelled_tokens", "member_pieces", "microbatches", "plan_chunk", "plan_step",
    # check.py
    "PlanCheckError", "Reading", "check_plan", "plan_fingerprint", "plan_problem",
    # guard.py
    "PeerError", "StallError", "set_timeout",
    # model.py
    "HDPAttention", "Llama", "LlamaConfig", "hdp_attention", "microbatch_context",
    # parallel.py
    "ColumnParallelLinear", "Layout", "RowParallelLinear", "column_parallel", "column_parallel_group", "copy_to_tp",
    "gather_whole", "reduce_from_tp", "row_parallel", "split_layers", "vocab_embedding", "vocab_parallel_cross_entropy",
    # sharded.py
    "clip_grad_norm_", "load_tp", "save_tp",
    # pipeline.py
    "PipeStats", "pipeline_slots", "run_stage", "stage_order",
    # train.py
    "HDPTrainer", "StepResult", "all_reduce_gradients", "lr_schedule",
    # data.py
    "Dataset", "DatasetError", "Sampler",
    # loader.py
    "DocumentError", "HDPLoader", "LoaderError", "LoaderStep",
    # checkpoint.py
    "Checkpoint", "CheckpointError", "load_params", "read_checkpoint", "write_checkpoint",
    # fsdp.py, dcp.py (modules: bt.fsdp.shard, bt.dcp.save)
    "fsdp", "dcp",
]

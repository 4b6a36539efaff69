"""Ring attention over torch.distributed: a long sequence's K/V travel a ring of ranks.

The same algorithm as the C engine (src/runtime/ring_attn.c, docs/runtime.md "Ring attention"), on
the DEFAULT process group with point-to-point messages (no per-ring process groups: creating one
per ad-hoc ring is slow and, with NCCL, costs buffers per group), or, beside tensor parallelism and
pipeline stages, on the hdp group a 3D Layout made once (parallel.py; `Ring(group=)`). Every rank
runs its items in the plan's global order, so a rank only ever waits for the members of its current
ring and no two ranks can wait on each other in a cycle; no barrier is needed.

Member m of a ring of D holds chunks m and 2D-1-m of every segment of the item (plan_chunk). Per
layer:

- forward, D steps: at step t the member holds the K/V block of member j = (m - t) mod D; it posts
  the receive of the next block from its predecessor and the send of the block in hand to its
  successor, computes its queries against the block in hand, and merges the result into its output
  with the online softmax (log-sum-exp). The transfer overlaps the block's compute.
- backward, D steps of the same K/V ring plus a second ring that carries each block's partial dK/dV:
  at step t the member adds its queries' contribution to block j's dK/dV to the partial sum that
  arrived from the members before it and sends the sum on (one step later, while the next block
  computes); after D steps every block's sum is home at its owner.

Messages between one pair of ranks are posted in the same order on both sides (dK/dV before K/V
within a step), which is what NCCL's in-order point-to-point matching needs; gloo matches by tag.
A member with no rows still relays every block, and empty blocks are not sent at all (both sides
know every block's size from the plan).
"""

from __future__ import annotations

import contextlib
import time
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from . import guard
from .attention import Rows, _acc_dtype, autocast_inputs, block_backward, block_forward, merge, no_autocast
from .shapes import check_qkv

# gloo matches point-to-point messages by (peer, tag): one tag per stream of messages
TAG_FWD_KV, TAG_BWD_KV, TAG_BWD_DKV = 11, 12, 13


class RingStats:
    """Seconds spent computing ring blocks and waiting for ring messages, bytes sent, blocks run.
    On CUDA the seconds are CUDA event pairs until read: reading `compute` or `wait` waits for them
    (once per read, not per block)."""

    def __init__(self):
        self._compute = 0.0
        self._wait = 0.0
        self.bytes_sent = 0
        self.steps = 0
        self.pending = []  # [("compute" | "wait", start event, end event)] not yet added (CUDA)

    def flush(self):
        """Add the recorded CUDA event pairs' times to compute and wait (waits for the events)."""
        for what, t0, t1 in self.pending:
            t1.synchronize()
            sec = t0.elapsed_time(t1) / 1000.0
            if what == "compute":
                self._compute += sec
            else:
                self._wait += sec
        self.pending = []

    @property
    def compute(self) -> float:
        self.flush()
        return self._compute

    @compute.setter
    def compute(self, x: float):
        self.flush()
        self._compute = x

    @property
    def wait(self) -> float:
        self.flush()
        return self._wait

    @wait.setter
    def wait(self, x: float):
        self.flush()
        self._wait = x

    def reset(self):
        self.__init__()

    def __repr__(self):
        return (f"RingStats(compute={self.compute:.4f}s, wait={self.wait:.4f}s, bytes_sent={self.bytes_sent}, "
                f"steps={self.steps})")


class Ring:
    """One ring item as this rank sees it: the members' global ranks in ring order, this rank's
    member index, and every member's rows (positions and segment ids), so any member can mask a
    block it receives without more messages.

    ranks   global ranks of the default group, in ring order (D >= 2, distinct)
    me      this rank's index in `ranks`
    rows    D Rows objects (or (pos, seg) pairs): member j's rows, in the order member j holds them
    stats   where compute / wait / bytes are accumulated (a RingStats; one is made if omitted)
    group   the process group the messages go on (None: the default group); `ranks` are the default
            group's ranks either way (a 3D layout passes its hdp group, parallel.py)
    """

    def __init__(self, ranks: Sequence[int], me: int, rows: Sequence, stats: Optional[RingStats] = None,
                 group=None):
        self.ranks = [int(r) for r in ranks]
        self.D = len(self.ranks)
        if self.D < 2 or len(set(self.ranks)) != self.D:
            raise ValueError(f"a ring needs >= 2 distinct ranks, got {self.ranks}")
        if not 0 <= me < self.D:
            raise ValueError(f"member index {me} outside the ring of {self.D}")
        if len(rows) != self.D:
            raise ValueError(f"{len(rows)} members' rows for a ring of {self.D}")
        self.me = me
        self.rows = [r if isinstance(r, Rows) else Rows(*r) for r in rows]
        self.prev = self.ranks[(me - 1) % self.D]
        self.next = self.ranks[(me + 1) % self.D]
        self.stats = stats if stats is not None else RingStats()
        self.group = group

    def n(self, j: int) -> int:
        """Rows member j holds."""
        return self.rows[j].n

    def __repr__(self):
        return f"Ring(ranks={self.ranks}, me={self.me}, rows={[r.n for r in self.rows]})"


def _exchange(ops: List[dist.P2POp]):
    """Post a step's sends and receives together. On NCCL they go in one group
    (batch_isend_irecv), so a send and a receive between the same two ranks in opposite directions
    cannot block each other; gloo's isend/irecv are asynchronous on their own, and posting them one
    by one avoids the coalescing machinery newer torch versions put behind batch_isend_irecv."""
    if not ops:
        return []
    if dist.get_backend(ops[0].group) == "nccl":
        return dist.batch_isend_irecv(ops)
    return [op.op(op.tensor, op.peer, group=op.group, tag=op.tag) for op in ops]


def _wait(works, ring: Ring):
    t0 = time.perf_counter()
    # a member that failed leaves; its peers' waits then fail, and name it and its error (guard.py)
    with guard.waiting(f"ring attention (member {ring.me} of ring {ring.ranks})", [ring.prev]):
        for w in works:
            w.wait()
    ring.stats.wait += time.perf_counter() - t0


# Transport's stream path: None = where the tensors are on CUDA; True forces it (the tests run it on
# CPU tensors with stand-in streams, to check its ordering without a GPU)
STREAMS: Optional[bool] = None
_COMM_STREAMS = {}


def comm_stream(device: torch.device):
    """The side stream ring messages are posted from on a CUDA device (one per device, made once)."""
    key = torch.device(device).index if torch.device(device).index is not None else torch.cuda.current_device()
    if key not in _COMM_STREAMS:
        _COMM_STREAMS[key] = torch.cuda.Stream(device=key)
    return _COMM_STREAMS[key]


class Transport:
    """A ring's messages and the compute between them, for one forward or backward.

    CPU (gloo): post() hands the step's sends and receives to gloo, which moves them on its own
    threads while the block computes; wait() blocks the host until they are done (the blocks it
    received are then ready). This is the path the tests run.

    CUDA (NCCL): the same calls, plus streams. post() makes the side stream `comm` wait for the
    compute stream (the blocks it sends are written), posts the messages from `comm` (NCCL's
    batch_isend_irecv; its kernels run on NCCL's stream, ordered after `comm`), queues their
    completion on `comm` and records an event there; the host does not wait. wait() makes the
    compute stream wait for that event just before the received blocks are used, so the block in
    hand computes while the next one moves. Compute and wait seconds come from CUDA events read when
    the stats are (RingStats.flush), not from a device sync per block.
    """

    def __init__(self, ring: Ring, like: Tensor):
        self.ring = ring
        self.streams = like.is_cuda if STREAMS is None else STREAMS
        if self.streams:
            self.compute = torch.cuda.current_stream(like.device)
            self.comm = comm_stream(like.device)

    def post(self, ops: List[dist.P2POp]):
        """Start a step's messages; returns what wait() needs."""
        if not self.streams:
            return _exchange(ops)
        if not ops:
            return None
        self.comm.wait_stream(self.compute)
        with torch.cuda.stream(self.comm):
            for w in _exchange(ops):
                w.wait()  # NCCL: the current stream (comm) waits for the messages; the host does not
            done = torch.cuda.Event()
            done.record(self.comm)
        for op in ops:
            op.tensor.record_stream(self.comm)  # the allocator keeps them until comm is past them
        return done

    def wait(self, handle):
        """The messages posted by post() are done as far as the compute that follows can tell."""
        if not self.streams:
            return _wait(handle, self.ring)
        if handle is None:
            return
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record(self.compute)
        self.compute.wait_event(handle)
        t1.record(self.compute)
        self.ring.stats.pending.append(("wait", t0, t1))

    @contextlib.contextmanager
    def timed(self):
        """Time the block computed inside: host seconds on CPU, CUDA events on the compute stream."""
        if not self.streams:
            t0 = time.perf_counter()
            yield
            self.ring.stats.compute += time.perf_counter() - t0
            return
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record(self.compute)
        yield
        t1.record(self.compute)
        self.ring.stats.pending.append(("compute", t0, t1))


def _block_buf(ring: Ring, j: int, width: int, like: Tensor) -> Tensor:
    """A receive buffer for member j's K/V (or dK/dV) block: rows x (2 * G * hd), flat."""
    return torch.empty(ring.n(j) * width, dtype=like.dtype, device=like.device)


def ring_forward(q: Tensor, k: Tensor, v: Tensor, ring: Ring):
    """Forward of ring attention without autograd: (out (T, H, hd), lse (T, H)), both in the
    accumulation dtype (fp32 for bf16 / fp16 q): every block's partial output is merged unrounded,
    so a ring of D members rounds its output once, as one process does, not D times. The K/V blocks
    travel in their own dtype (exact copies)."""
    D, me = ring.D, ring.me
    G, hd = k.shape[1], k.shape[2]
    width = 2 * G * hd
    mine = ring.rows[me]
    check_qkv("ring attention", q, k, v, mine.n,
              f"the rows the plan gives this rank (member {me} of ring {ring.ranks})")
    cur = torch.cat([k.reshape(-1), v.reshape(-1)])  # the block in hand: K then V, flat
    out = lse = None
    tr = Transport(ring, q)
    for t in range(D):
        j = (me - t) % D
        ops, nxt = [], None
        if t < D - 1:
            jn = (me - t - 1) % D
            if ring.n(jn) > 0:
                nxt = _block_buf(ring, jn, width, k)
                ops.append(dist.P2POp(dist.irecv, nxt, ring.prev, ring.group, tag=TAG_FWD_KV))
            if ring.n(j) > 0:
                ops.append(dist.P2POp(dist.isend, cur, ring.next, ring.group, tag=TAG_FWD_KV))
                ring.stats.bytes_sent += cur.numel() * cur.element_size()
        works = tr.post(ops)
        with tr.timed():
            nj = ring.n(j)
            kb = cur[:nj * G * hd].view(nj, G, hd)
            vb = cur[nj * G * hd:].view(nj, G, hd)
            o, l = block_forward(q, kb, vb, mine, ring.rows[j], acc_out=True)
            if out is None:
                out, lse = o, l
            else:
                out, lse = merge(out, lse, o, l)
        tr.wait(works)  # the next block (and the send of this one) before the next step uses them
        ring.stats.steps += 1
        if t < D - 1:
            cur = nxt if nxt is not None else k.new_empty(0)
    return out, lse


def ring_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, ring: Ring,
                  acc_grads: bool = False):
    """Backward of ring attention: (dq, dk, dv) of this member's rows, dk/dv summed over every
    member's queries (they arrive home on the dK/dV ring). dq is summed over the blocks and the dK/dV
    partials travel and add up in the accumulation dtype; the result is rounded to q's dtype once,
    or not at all with acc_grads (a caller that sums them further: ulysses.py)."""
    D, me = ring.D, ring.me
    G, hd = k.shape[1], k.shape[2]
    width = 2 * G * hd
    mine = ring.rows[me]
    acc_t = _acc_dtype(q.dtype)
    delta = (dout.to(acc_t) * out.to(acc_t)).sum(-1)  # (T, H): rowsum(dout * out), as the C model computes
    dq = torch.zeros(q.shape, dtype=acc_t, device=q.device)
    cur = torch.cat([k.reshape(-1), v.reshape(-1)])
    tr = Transport(ring, q)
    partial = None  # the dK/dV sum computed last step, for the block (me - t + 1) mod D
    for t in range(D):
        j = (me - t) % D
        ops, nxt, inc = [], None, None
        if t > 0:
            jp = (me - t + 1) % D  # last step's block: its partial goes on to the next member
            if ring.n(jp) > 0:
                ops.append(dist.P2POp(dist.isend, partial, ring.next, ring.group, tag=TAG_BWD_DKV))
                ring.stats.bytes_sent += partial.numel() * partial.element_size()
            if ring.n(j) > 0:  # block j's partial from the members before this one
                inc = torch.empty(ring.n(j) * width, dtype=acc_t, device=q.device)
                ops.append(dist.P2POp(dist.irecv, inc, ring.prev, ring.group, tag=TAG_BWD_DKV))
        if t < D - 1:
            jn = (me - t - 1) % D
            if ring.n(jn) > 0:
                nxt = _block_buf(ring, jn, width, k)
                ops.append(dist.P2POp(dist.irecv, nxt, ring.prev, ring.group, tag=TAG_BWD_KV))
            if ring.n(j) > 0:
                ops.append(dist.P2POp(dist.isend, cur, ring.next, ring.group, tag=TAG_BWD_KV))
                ring.stats.bytes_sent += cur.numel() * cur.element_size()
        # sends first, then receives, in one order on every rank (NCCL matches in posting order)
        ops.sort(key=lambda op: (op.op is not dist.isend, op.tag != TAG_BWD_DKV))
        works = tr.post(ops)
        with tr.timed():
            nj = ring.n(j)
            kb = cur[:nj * G * hd].view(nj, G, hd)
            vb = cur[nj * G * hd:].view(nj, G, hd)
            dqj, dkj, dvj = block_backward(dout, q, kb, vb, lse, delta, mine, ring.rows[j])
            dq += dqj
            acc = torch.cat([dkj.reshape(-1), dvj.reshape(-1)])
        tr.wait(works)  # the incoming partial, last step's send, and the next K/V block
        if inc is not None:
            acc += inc
        partial = acc
        ring.stats.steps += 1
        if t < D - 1:
            cur = nxt if nxt is not None else k.new_empty(0)
    # the last partial is the next member's own block; this member's comes home from the previous one
    ops, home = [], None
    jp = (me + 1) % D
    if ring.n(jp) > 0:
        ops.append(dist.P2POp(dist.isend, partial, ring.next, ring.group, tag=TAG_BWD_DKV))
        ring.stats.bytes_sent += partial.numel() * partial.element_size()
    if mine.n > 0:
        home = torch.empty(mine.n * width, dtype=acc_t, device=q.device)
        ops.append(dist.P2POp(dist.irecv, home, ring.prev, ring.group, tag=TAG_BWD_DKV))
    tr.wait(tr.post(ops))
    n = mine.n * G * hd
    if home is None:
        home = torch.zeros(0, dtype=acc_t, device=q.device)
    dk = home[:n].view(mine.n, G, hd)
    dv = home[n:].view(mine.n, G, hd)
    if acc_grads:
        return dq, dk, dv
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    """The ring's forward and backward, autocast off inside (attention.no_autocast); the merged
    output is saved unrounded for the backward's rowsum(dout * out) and returned in q's dtype."""

    @staticmethod
    def forward(ctx, q, k, v, ring):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        with guard.failing(), no_autocast(q):  # an error here is recorded for the peers (guard.py)
            out, lse = ring_forward(q, k, v, ring)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring = ring
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        with guard.failing(), no_autocast(q):
            dq, dk, dv = ring_backward(dout.contiguous(), q, k, v, out, lse, ctx.ring)
        return dq, dk, dv, None


def ring_attention(q: Tensor, k: Tensor, v: Tensor, ring: Ring) -> Tensor:
    """Attention of this member's rows over the whole ring's rows, differentiable.

    q (T, H, hd), k and v (T, G, hd): this member's rows, after RoPE (T = ring.n(ring.me), possibly
    0). Every member of `ring` must call it at the same point of its schedule (the plan's global
    order guarantees it), for the forward and, through autograd, for the backward. Uses the default
    process group's point-to-point operations (gloo on CPU, NCCL on CUDA). Under torch.autocast q,
    k, v (and the output) are in the autocast dtype, the blocks merge in fp32
    (docs/torch-precision.md)."""
    q, k, v = autocast_inputs(q, k, v)
    check_qkv("ring attention", q, k, v, ring.n(ring.me),
              f"the rows the plan gives this rank (member {ring.me} of ring {ring.ranks})")
    return _RingAttention.apply(q, k, v, ring)

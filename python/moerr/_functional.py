"""torch's functional collectives (torch.distributed._functional_collectives)
recorded as collectives (docs/DISTRIBUTED.md, "Python").

While `moerr.record` records under torch.distributed, the eager functions
of `_functional_collectives` (`all_reduce`, `all_gather_tensor[_autograd]`,
`reduce_scatter_tensor[_autograd]`, `all_to_all_single[_autograd]`,
`broadcast`, `wait_tensor`) are replaced by the ones here (`functions()`).
Each runs torch.distributed's collective of the same kind through
`torch.distributed` (recorded from the dispatcher, or by `Collectives`
where it wraps the call, as c10d::<kind> with what was sent and what
arrived), waits for it, and returns the tensor it
received into: a plain tensor whose value exists when the function returns,
the very tensor the recorder hashed and captured. The gradients are those
torch 2.11 registers for the `_c10d_functional` ops (register_autograd in
_functional_collectives.py): the reverse collective, itself recorded.

Why the Python functions and not the dispatcher: the `_c10d_functional` ops
return an AsyncCollectiveTensor whose storage is filled by the process
group's worker after the op returns, so the op's output cannot be hashed
when the recorder sees it. It exists only at `wait_tensor`, whose output is
the same tensor the program already holds (and often read through the
wrapper's own __torch_dispatch__, under another op). Recording there needs
a dispatch mode over every op of the step, or kernels registered over
torch's. Running the collective synchronously instead gives the same bytes
(the same process group calls: allreduce, alltoall_base, ...) and leaves
the recorder's one path for collectives unchanged.

What is not replaced (the `*_coalesced` functions, the raw
`torch.ops._c10d_functional.*` ops) is recorded as ordinary ops: their
pending outputs get unknown fingerprints, and a replayable recording
refuses them by name (recorder/trace_worker.cpp).
"""
import weakref

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

# torch.distributed.ReduceOp of each reduceOp string the functional
# collectives take (torch/csrc/distributed/c10d/Functional.cpp, to_reduce_op).
_REDUCE_OPS = {"sum": "SUM", "avg": "AVG", "product": "PRODUCT", "min": "MIN", "max": "MAX", "band": "BAND",
               "bor": "BOR", "bxor": "BXOR"}

# The tensors the functions here returned (id -> tensor, weakly): their value
# exists, so `wait_tensor` hands them back as they are, as torch's does for a
# tensor with no pending work, without an op in the trace.
_received = weakref.WeakValueDictionary()


def _done(tensor):
    _received[id(tensor)] = tensor
    return tensor


def _reduce_op(name):
    op = _REDUCE_OPS.get(name.lower())
    if op is None:
        raise ValueError(f"Unrecognized reduce_op: {name}")
    return getattr(dist.ReduceOp, op)


def _process_group(group, tag):
    """The ProcessGroup a functional collective's `group` names (a group, a
    list of ranks, a DeviceMesh or (mesh, dim), a group name)."""
    name = funcol._resolve_group_name(group, tag)
    return dist.distributed_c10d._resolve_process_group(name)


def _check_sum(kind, op):
    if op != "sum":
        raise RuntimeError(f"{kind} backward only supports 'sum' reduction, got '{op}'")


class _AllReduce(torch.autograd.Function):
    """A copy of `x`, all-reduced (torch: clone, then all_reduce_ in place)."""

    @staticmethod
    def forward(ctx, x, op, group):
        ctx.op, ctx.group = op, group
        out = x.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, _reduce_op(op), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        _check_sum("all_reduce", ctx.op)
        return _AllReduce.apply(grad.contiguous(), "sum", ctx.group), None, None


class _AllGather(torch.autograd.Function):
    """Every group rank's `x`, concatenated along dim 0 by group rank."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = x.new_empty((dist.get_world_size(group) * x.shape[0], *x.shape[1:]))
        dist.all_gather_into_tensor(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return _ReduceScatter.apply(grad.contiguous(), "sum", ctx.group), None


class _ReduceScatter(torch.autograd.Function):
    """This group rank's slice of dim 0 of the group's reduced `x`."""

    @staticmethod
    def forward(ctx, x, op, group):
        ctx.op, ctx.group = op, group
        out = x.new_empty((x.shape[0] // dist.get_world_size(group), *x.shape[1:]))
        dist.reduce_scatter_tensor(out, x, _reduce_op(op), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        _check_sum("reduce_scatter_tensor", ctx.op)
        return _AllGather.apply(grad.contiguous(), ctx.group), None, None


class _AllToAll(torch.autograd.Function):
    """The rows that arrive: `send[j]` rows of `x` to group rank j,
    `recv[j]` from it; the gradient goes back with the splits swapped."""

    @staticmethod
    def forward(ctx, x, recv, send, group):
        ctx.recv, ctx.send, ctx.group = recv, send, group
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return _AllToAll.apply(grad.contiguous(), ctx.send, ctx.recv, ctx.group), None, None, None


def all_reduce(self, reduceOp, group, tag=""):
    return _done(_AllReduce.apply(self, reduceOp.lower(), _process_group(group, tag)))


def all_gather_tensor(self, gather_dim, group, tag=""):
    if not self.is_contiguous():
        raise AssertionError("Tensor must be contiguous for all_gather_tensor")
    pg = _process_group(group, tag)
    out = _AllGather.apply(self, pg)
    if gather_dim != 0:  # as torch: gathered along dim 0, then its chunks concatenated
        out = torch.cat(torch.chunk(out, dist.get_world_size(pg), dim=0), dim=gather_dim)
    return _done(out)


def all_gather_tensor_autograd(self, gather_dim, group, tag=""):
    return all_gather_tensor(self, gather_dim, group, tag)


def reduce_scatter_tensor(self, reduceOp, scatter_dim, group, tag=""):
    pg = _process_group(group, tag)
    size = dist.get_world_size(pg)
    if self.size(scatter_dim) % size != 0:
        raise AssertionError(f"input dimension 0 ({self.size(0)} must be a multiple of group_size {size})")
    if scatter_dim != 0:
        self = torch.cat(torch.chunk(self, size, dim=scatter_dim))
    return _done(_ReduceScatter.apply(self, reduceOp.lower(), pg))


def reduce_scatter_tensor_autograd(self, reduceOp, scatter_dim, group, tag=""):
    return reduce_scatter_tensor(self, reduceOp, scatter_dim, group, tag)


def all_to_all_single(self, output_split_sizes, input_split_sizes, group, tag=""):
    pg = _process_group(group, tag)
    if (output_split_sizes is None) != (input_split_sizes is None):
        raise AssertionError("output_split_sizes and input_split_sizes must either be "
                             "specified together or both set to None")
    if output_split_sizes is None:
        size = dist.get_world_size(pg)
        output_split_sizes = input_split_sizes = [self.shape[0] // size] * size
    recv, send = [int(n) for n in output_split_sizes], [int(n) for n in input_split_sizes]
    return _done(_AllToAll.apply(self, recv, send, pg))


def all_to_all_single_autograd(self, output_split_sizes, input_split_sizes, group, tag=""):
    return all_to_all_single(self, output_split_sizes, input_split_sizes, group, tag)


def broadcast(self, src, group, tag=""):
    """`src` is a group rank, as in torch's functional broadcast. torch 2.11
    registers no gradient for it: the result carries none."""
    pg = _process_group(group, tag)
    with torch.no_grad():
        out = self.clone(memory_format=torch.contiguous_format)
        dist.broadcast(out, dist.get_global_rank(pg, src), group=pg)
    return _done(out)


def wait_tensor(tensor):
    if _received.get(id(tensor)) is tensor:
        return tensor
    return _REAL_WAIT(tensor)


_REAL_WAIT = funcol.wait_tensor
NAMES = ("all_reduce", "all_gather_tensor", "all_gather_tensor_autograd", "reduce_scatter_tensor",
         "reduce_scatter_tensor_autograd", "all_to_all_single", "all_to_all_single_autograd", "broadcast",
         "wait_tensor")


def functions():
    """(name, torch's function, its replacement) for each name of NAMES
    the installed torch has."""
    here = globals()
    return [(n, getattr(funcol, n), here[n]) for n in NAMES if hasattr(funcol, n)]

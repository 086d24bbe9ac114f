"""moerr.record under torch.distributed: the run directory and the
collectives (docs/DISTRIBUTED.md, "Python").

With torch.distributed initialised, `moerr.record(RUN)` writes rank K's
bundle to RUN/rank<K>.moerr and rank 0 writes RUN/world.json. While it
records, torch.distributed's collectives are wrapped (`Collectives`), and
torch's functional collectives replaced by ones that call them
(`_functional.py`), in every loaded module that binds them by name, so each call is
recorded as the op c10d::<kind> with what this rank sent and what arrived;
they are restored when the recording closes.
"""
import os
import sys

import torch
import torch.distributed as dist

from ._moerr import CollectiveCall
from ._moerr import write_world_manifest

WORLD = "world"
MANIFEST = "world.json"
UNTRACED_SCOPE = "generate"  # the recorder records no op inside it (recorder/op_tracer.h)


def _is_world(group):
    return group is None or group is dist.GroupMember.WORLD


def group_ranks(group):
    """The world ranks of `group`, by group rank."""
    if _is_world(group):
        return list(range(dist.get_world_size()))
    by_world = dist.distributed_c10d._pg_group_ranks[group]  # world rank -> group rank
    return sorted(by_world, key=by_world.get)


def group_name(group):
    """The name the trace and the manifest give `group`: "world" for the
    default group, else "ranks:" and its world ranks by group rank."""
    return WORLD if _is_world(group) else "ranks:" + ",".join(map(str, group_ranks(group)))


def prepare_run(run_dir, overwrite, ep_size, experts):
    """Checks the run directory on every rank, then (rank 0) writes the
    manifest with every group any rank belongs to. Collective: every rank
    calls it, and every rank raises when any rank refused, so none is left
    waiting for the others. Returns this rank's bundle path."""
    run_dir = str(run_dir)
    rank, world = dist.get_rank(), dist.get_world_size()
    bundle = os.path.join(run_dir, f"rank{rank}.moerr")
    refusal = None
    if os.path.lexists(run_dir) and not os.path.isdir(run_dir):
        refusal = ("ValueError", f"{run_dir} is not a directory: with torch.distributed initialised, "
                                 "moerr.record's path is the run directory (rank K writes rank<K>.moerr in it)")
    elif not overwrite and os.path.lexists(bundle):
        refusal = ("FileExistsError", f"{bundle} exists; pass overwrite=True to replace it")
    elif rank == 0 and not overwrite and os.path.lexists(os.path.join(run_dir, MANIFEST)):
        refusal = ("FileExistsError", f"{os.path.join(run_dir, MANIFEST)} exists; pass overwrite=True to replace it")
    mine = {group_name(g): group_ranks(g) for g in dist.distributed_c10d._pg_group_ranks}
    everyone = [None] * world
    dist.all_gather_object(everyone, (refusal, mine))
    for r, (why, _) in enumerate(everyone):
        if why is not None:
            kind, message = why
            error = FileExistsError if kind == "FileExistsError" else ValueError
            raise error(message if r == rank else f"rank {r} refused to record: {message}")
    os.makedirs(run_dir, exist_ok=True)
    if rank == 0:
        groups = {}
        for _, theirs in everyone:
            groups.update(theirs)
        groups[WORLD] = list(range(world))
        write_world_manifest(run_dir, world, ep_size or 0, experts or 0, {n: [r] for n, r in groups.items()})
    return bundle


class _Done:
    """What an emulated collective called with async_op=True returns: it has
    completed."""

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True


def _group_rank(group, world_rank):
    """`world_rank`'s rank in `group`; -1 when this rank or it is not in the group."""
    if dist.distributed_c10d._rank_not_in_group(group):
        return -1
    ranks = group_ranks(group)
    return ranks.index(world_rank) if world_rank in ranks else -1


def _staged(tensor, in_place):
    """`tensor` itself, or for a view a tensor of its own: a copy of it for
    an in-place collective (it sends what it holds), else a new one."""
    if not tensor._is_view():
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format) if in_place else tensor.new_empty(tensor.shape)


def _rows(split_sizes, tensor, size):
    """Rows (dim 0) per group rank: the given splits, or equal ones."""
    if split_sizes is not None:
        return [int(n) for n in split_sizes]
    rows = tensor.shape[0] if tensor.dim() > 0 else 0
    return [rows // size] * size


def _gather_by_all_to_all(all_to_all_single, tensor, group, size):
    """Every group rank's `tensor`, stacked [size, bytes] by group rank,
    moved as bytes by an all_to_all: Gloo's all_gather copies on its worker
    threads, where a recorder would take the copies for ops of the step."""
    send = tensor.contiguous().reshape(1, -1).expand(size, -1).contiguous().view(torch.uint8)
    received = torch.empty_like(send)
    all_to_all_single(received, send, group=group)
    return received


def _rebind(names, old, new):
    """In every loaded module, each global `names[i]` bound to `old[i]` is
    bound to `new[i]`: what `from torch.distributed import all_reduce`
    made. A name bound under another name (`import ... as`, `real =
    dist.all_reduce`), or held elsewhere (a local, a closure, a dict),
    keeps what it holds."""
    for module in list(sys.modules.values()):
        globs = getattr(module, "__dict__", None)
        if not isinstance(globs, dict) or str(getattr(module, "__name__", "")).startswith("moerr."):
            continue
        for name, was, now in zip(names, old, new):
            if globs.get(name) is was:
                globs[name] = now


class Collectives:
    """torch.distributed's collectives wrapped for one recording, in every
    loaded module that binds them (torch.distributed, distributed_c10d,
    whose object collectives call them, and a module that imported a name
    itself), with torch's functional collectives, which call them
    (`_functional.py`): each call is handed to the recorder
    (`PyRecorder.collective`) with its group's name, its sequence number in
    that group (counted from the recording's start) and its splits. A rank
    outside the call's group runs it as is (torch does nothing there).
    async_op=True is waited on at once: the returned work has completed.
    The calls the recorder cannot see the results of (gather, scatter and
    their object forms, the list all_to_all, isend, irecv,
    batch_isend_irecv, recv from any source) raise RuntimeError while
    recording rather than leave a wrong record."""

    NAMES = ("all_reduce", "all_to_all_single", "all_gather", "all_gather_into_tensor", "reduce_scatter",
             "reduce_scatter_tensor", "broadcast", "reduce", "barrier", "send", "recv")
    REFUSED = ("gather", "scatter", "all_to_all", "isend", "irecv", "batch_isend_irecv", "gather_object",
               "scatter_object_list")
    # Python objects, pickled through all_gather and broadcast: no tensor of
    # the step, so not recorded (their ops run in the untraced scope).
    OBJECTS = ("all_gather_object", "broadcast_object_list")

    def __init__(self, recorder):
        self._rec = recorder
        self._seq = {}  # group name -> collectives issued in it
        self._real = {}
        self._names, self._torch, self._ours = [], [], []  # each name, torch's function and its wrapper
        self._inside = False  # in a transfer: a collective it calls is part of it

    def install(self):
        """Replaces torch.distributed's collectives and the functional
        collectives (`_functional.functions()`) wherever a loaded module
        binds them under their names: torch.distributed, distributed_c10d,
        and a module that imported one (`from torch.distributed import
        all_to_all_single`, as transformers' expert parallelism does)."""
        from . import _functional
        self._names, self._torch, self._ours = [], [], []
        for name in self.NAMES + self.REFUSED + self.OBJECTS:
            real = getattr(dist, name, None)
            if real is None:
                continue
            self._real[name] = real
            self._names.append(name)
            self._torch.append(real)
            self._ours.append(getattr(self, "_" + name) if name in self.NAMES else
                              self._refusal(name) if name in self.REFUSED else self._untraced(name))
        for name, real, wrapper in _functional.functions():
            self._names.append(name)
            self._torch.append(real)
            self._ours.append(wrapper)
        _rebind(self._names, self._torch, self._ours)

    def restore(self):
        """Puts torch's functions back wherever a wrapper is bound, in the
        modules that imported one while recording too."""
        _rebind(self._names, self._ours, self._torch)
        self._real.clear()

    def _untraced(self, name):
        def untraced(*args, **kwargs):
            if self._inside:
                return self._real[name](*args, **kwargs)
            self._inside = True
            scope = torch.ops.profiler._record_function_enter_new(UNTRACED_SCOPE, None)
            try:
                return self._real[name](*args, **kwargs)
            finally:
                torch.ops.profiler._record_function_exit(scope)
                self._inside = False
        return untraced

    def _refusal(self, name):
        def refuse(*args, **kwargs):
            if self._inside:
                return self._real[name](*args, **kwargs)
            raise RuntimeError(f"torch.distributed.{name} inside moerr.record: not recorded, and what it writes "
                               "would leave the record wrong; use all_reduce, all_to_all_single, all_gather, "
                               "broadcast, reduce, send or recv")
        return refuse

    def _run(self, kind, group, inputs, outputs, in_place, transfer, async_op, root=-1, send=(), recv=(), pair=None):
        """`transfer(inputs, outputs)` runs the collective on the tensors it
        is given. An output that is a view (a slot of a larger buffer)
        receives into a tensor of its own, copied into the view afterwards by
        a traced copy_: the trace then holds what arrived, and the buffer is
        written by an op that replay re-executes."""
        if self._inside or dist.distributed_c10d._rank_not_in_group(group):
            return transfer(inputs, outputs)
        if pair is None:
            name, group_rank, size = group_name(group), dist.get_rank(group), dist.get_world_size(group)
        else:  # point to point: the pair of world ranks is the group
            name, group_rank, size = "p2p:%d,%d" % tuple(sorted(pair)), int(pair[0] > pair[1]), 2
        seq = self._seq.get(name, 0)
        self._seq[name] = seq + 1
        call = CollectiveCall(kind, name, seq, group_rank, size, root, list(send), list(recv))
        staged = [_staged(t, in_place) for t in outputs]
        if in_place:
            inputs = staged

        def waited():
            self._inside = True
            try:
                work = transfer(inputs, staged)
                if async_op and work is not None:
                    work.wait()
                return work
            finally:
                self._inside = False

        work = self._rec.collective(call, list(inputs), staged, in_place, waited)
        with torch.no_grad():
            for out, got in zip(outputs, staged):
                if got is not out:
                    out.copy_(got)
        return work

    def _all_reduce(self, tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        real = self._real["all_reduce"]
        return self._run("all_reduce", group, [tensor], [tensor], True, lambda i, o: real(o[0], op, group, async_op),
                         async_op)

    def _broadcast(self, tensor, src, group=None, async_op=False):
        real = self._real["broadcast"]
        return self._run("broadcast", group, [tensor], [tensor], True, lambda i, o: real(o[0], src, group, async_op),
                         async_op, root=_group_rank(group, src))

    def _all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                           async_op=False):
        real = self._real["all_to_all_single"]

        def transfer(i, o):
            return real(o[0], i[0], output_split_sizes, input_split_sizes, group, async_op)

        if dist.distributed_c10d._rank_not_in_group(group):
            return transfer([input], [output])
        size = dist.get_world_size(group)
        send, recv = _rows(input_split_sizes, input, size), _rows(output_split_sizes, output, size)
        if sum(send) != (input.shape[0] if input.dim() else 0) or sum(recv) != (output.shape[0] if output.dim() else 0):
            return transfer([input], [output])  # torch refuses the splits, with its own message
        return self._run("all_to_all", group, [input], [output], False, transfer, async_op, send=send, recv=recv)

    def _all_gather(self, tensor_list, tensor, group=None, async_op=False):
        real = self._real["all_gather"]

        def transfer(i, o):
            if (dist.distributed_c10d._rank_not_in_group(group) or dist.get_backend(group) != "gloo"
                    or len(o) != dist.get_world_size(group)):
                return real(o, i[0], group, async_op)  # torch's own errors included
            received = _gather_by_all_to_all(self._real["all_to_all_single"], i[0], group, len(o))
            for out, row in zip(o, received):
                out.copy_(row.view(i[0].dtype).view_as(out))
            return _Done() if async_op else None

        return self._run("all_gather", group, [tensor], tensor_list, False, transfer, async_op)

    def _all_gather_into_tensor(self, output_tensor, input_tensor, group=None, async_op=False):
        real = self._real["all_gather_into_tensor"]
        return self._run("all_gather", group, [input_tensor], [output_tensor], False,
                         lambda i, o: real(o[0], i[0], group, async_op), async_op)

    def _reduce_scatter(self, output, input_list, op=dist.ReduceOp.SUM, group=None, async_op=False):
        real = self._real["reduce_scatter"]
        return self._run("reduce_scatter", group, input_list, [output], False,
                         lambda i, o: real(o[0], i, op, group, async_op), async_op)

    def _reduce_scatter_tensor(self, output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
        real = self._real["reduce_scatter_tensor"]
        return self._run("reduce_scatter", group, [input], [output], False,
                         lambda i, o: real(o[0], i[0], op, group, async_op), async_op)

    def _reduce(self, tensor, dst, op=dist.ReduceOp.SUM, group=None, async_op=False):
        real = self._real["reduce"]
        return self._run("reduce", group, [tensor], [tensor], True, lambda i, o: real(o[0], dst, op, group, async_op),
                         async_op, root=_group_rank(group, dst))

    def _barrier(self, group=None, async_op=False, device_ids=None):
        real = self._real["barrier"]
        return self._run("barrier", group, [], [], False, lambda i, o: real(group, async_op, device_ids), async_op)

    # send and recv: the pair of world ranks is their group ("p2p:<lo>,<hi>",
    # group rank 0 the lower), with its own sequence, so that ranks outside
    # the pair keep the same sequence in the process group.
    def _send(self, tensor, dst, group=None, tag=0):
        real = self._real["send"]
        me = dist.get_rank()
        return self._run("send", group, [tensor], [], False, lambda i, o: real(i[0], dst, group, tag), False,
                         root=int(me > dst), pair=(me, dst))

    def _recv(self, tensor, src=None, group=None, tag=0):
        real = self._real["recv"]
        if src is None:
            raise RuntimeError("torch.distributed.recv from any source inside moerr.record: name the sender (src=)")
        me = dist.get_rank()
        return self._run("recv", group, [], [tensor], False, lambda i, o: real(o[0], src, group, tag), False,
                         root=int(src > me), pair=(me, src))

"""moerr.record under torch.distributed: the run directory and the
collectives (docs/DISTRIBUTED.md, "Python").

With torch.distributed initialised, `moerr.record(RUN)` writes rank K's
bundle to RUN/rank<K>.moerr and rank 0 writes RUN/world.json. While it
records, each collective of a process group is recorded from the dispatcher
as the op c10d::<kind>, with what this rank sent and what arrived, under
the group's name here (`group_name`); what the dispatcher does not show is
wrapped (`Collectives`) and restored when the recording closes.
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


def _waited(work):
    """`work`, waited for (None stays None)."""
    if work is not None:
        work.wait()
    return work


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
    """torch.distributed during one recording. The collectives of a process
    group (all_reduce, all_to_all_single, all_gather[_into_tensor],
    reduce_scatter[_tensor], broadcast, reduce, barrier) are recorded by the
    recorder from the dispatcher, whoever calls them and however they were
    imported, asynchronous work staying asynchronous; `install` only tells
    it each group's name (`group_name`). What it cannot see from there is
    wrapped here, wherever a loaded module binds it under its name
    (torch.distributed, distributed_c10d, a module that imported it): send,
    recv, reduce_scatter, reduce_scatter_tensor and all_reduce_coalesced,
    whose Gloo work has no future, are handed to the recorder
    (`PyRecorder.collective`) and waited on at once, send and recv with the
    pair of ranks as their group; the
    object collectives run in the untraced scope; the calls whose results
    the recorder cannot see (gather, scatter and their object forms, the
    list all_to_all, isend, irecv, batch_isend_irecv, recv from any source)
    raise RuntimeError while recording rather than leave a wrong record.
    torch's functional collectives are replaced by ones that call
    torch.distributed's (`_functional.py`)."""

    NAMES = ("send", "recv", "reduce_scatter", "reduce_scatter_tensor", "all_reduce_coalesced")
    REFUSED = ("gather", "scatter", "all_to_all", "isend", "irecv", "batch_isend_irecv", "gather_object",
               "scatter_object_list")
    # Python objects, pickled through all_gather and broadcast: no tensor of
    # the step, so not recorded (their ops run in the untraced scope).
    OBJECTS = ("all_gather_object", "broadcast_object_list")

    def __init__(self, recorder):
        self._rec = recorder
        self._real = {}
        self._names, self._torch, self._ours = [], [], []  # each name, torch's function and its wrapper
        self._inside = False  # in a transfer: a collective it calls is part of it

    def install(self):
        """Names the process groups for the recorder, and replaces the
        functions above and the functional collectives
        (`_functional.functions()`) wherever a loaded module binds them
        under their names."""
        from . import _functional
        self._rec.name_groups([(g.group_name, group_name(g)) for g in dist.distributed_c10d._pg_group_ranks
                               if isinstance(g, dist.ProcessGroup)])  # not the marker of a group this rank is not in
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

    def _run(self, kind, group, inputs, outputs, transfer, peer=None, in_place=False):
        """`transfer()` runs the call and waits for it; the recorder hears
        of it around it. Point to point (`peer`, the other world rank): the
        pair of world ranks is the group ("p2p:<lo>,<hi>", group rank 0 the
        lower), with a sequence of its own, so that ranks outside the pair
        keep the same sequence in the process group."""
        if self._inside or dist.distributed_c10d._rank_not_in_group(group):
            return transfer()
        if peer is None:
            name, group_rank, size, root = group_name(group), dist.get_rank(group), dist.get_world_size(group), -1
        else:
            me = dist.get_rank()
            sender = me if kind == "send" else peer
            name, group_rank, size = "p2p:%d,%d" % tuple(sorted((me, peer))), int(me > peer), 2
            root = int(sender > min(me, peer))
        # Numbered with the collectives the recorder sees from the dispatcher.
        call = CollectiveCall(kind, name, self._rec.next_collective(name), group_rank, size, root)

        def waited():
            self._inside = True
            try:
                return transfer()
            finally:
                self._inside = False

        return self._rec.collective(call, inputs, outputs, in_place, waited)

    # reduce_scatter and all_reduce_coalesced: Gloo's work for them has no
    # future, so the dispatcher's op cannot tell when they complete; waited
    # on at once.
    def _all_reduce_coalesced(self, tensors, op=dist.ReduceOp.SUM, group=None, async_op=False):
        real = self._real["all_reduce_coalesced"]
        return self._run("all_reduce", group, list(tensors), list(tensors),
                         lambda: _waited(real(tensors, op, group, async_op)), in_place=True)

    def _reduce_scatter(self, output, input_list, op=dist.ReduceOp.SUM, group=None, async_op=False):
        real = self._real["reduce_scatter"]
        return self._run("reduce_scatter", group, list(input_list), [output],
                         lambda: _waited(real(output, input_list, op, group, async_op)))

    def _reduce_scatter_tensor(self, output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
        real = self._real["reduce_scatter_tensor"]
        return self._run("reduce_scatter", group, [input], [output],
                         lambda: _waited(real(output, input, op, group, async_op)))

    def _send(self, tensor, dst, group=None, tag=0):
        real = self._real["send"]
        return self._run("send", group, [tensor], [], lambda: real(tensor, dst, group, tag), dst)

    def _recv(self, tensor, src=None, group=None, tag=0):
        real = self._real["recv"]
        if src is None:
            raise RuntimeError("torch.distributed.recv from any source inside moerr.record: name the sender (src=)")
        return self._run("recv", group, [], [tensor], lambda: real(tensor, src, group, tag), src)

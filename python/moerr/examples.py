"""A small MoE in HF's layout (a `gate` Linear next to an `experts`
ModuleList, with `top_k`), written in plain PyTorch: for examples, the
binding's tests and its benchmark."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Expert(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.gate_proj = nn.Linear(d, h, bias=False)
        self.up_proj = nn.Linear(d, h, bias=False)
        self.down_proj = nn.Linear(h, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoeBlock(nn.Module):
    """HF's layout: a `gate` Linear, an `experts` ModuleList, `top_k`."""

    def __init__(self, d, h, experts, top_k):
        super().__init__()
        self.top_k, self.norm_topk_prob = top_k, True
        self.gate = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList(Expert(d, h) for _ in range(experts))

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        probs = torch.softmax(self.gate(flat).float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(flat.dtype)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = (ids == e).nonzero(as_tuple=True)
            if len(token):
                out = out.index_add(0, token, expert(flat[token]) * weights[token, slot].unsqueeze(1))
        return out.view_as(x)


class Layer(nn.Module):
    def __init__(self, d, experts=4):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.mix = nn.Linear(d, d)
        self.mlp = MoeBlock(d, 2 * d, experts=experts, top_k=2)

    def forward(self, x):
        x = x + self.mix(self.norm(x))
        return x + self.mlp(self.norm(x))


class TinyMoe(nn.Module):
    def __init__(self, vocab=16, d=16, experts=4, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Layer(d, experts) for _ in range(layers))
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.lm_head(h)


# A two-rank (any world size) expert-parallel step over torch.distributed, the
# Megatron-Core way: each rank hosts experts [r*L, (r+1)*L) (L = experts /
# world) and trains on its own tokens; the routed slots, sorted by expert,
# travel to their experts' ranks through an all_to_all, come back through
# the reverse one, and are combined with the routing weights; dense
# gradients are averaged by all_reduce. Run it as N processes with RANK,
# WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (`expert_parallel_main`).


class AllToAll(torch.autograd.Function):
    """Rows of `x` to the group ranks by `send` (rows per rank), received by
    `recv`; the backward sends each gradient row back to its sender."""

    @staticmethod
    def forward(ctx, x, send, recv):
        import torch.distributed as dist
        ctx.send, ctx.recv = send, recv
        out = x.new_empty((sum(recv),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv, send)
        return out

    @staticmethod
    def backward(ctx, grad):
        return AllToAll.apply(grad, ctx.recv, ctx.send), None, None


class ExpertParallelMoe(nn.Module):
    """A MoE block whose experts are spread over the ranks of the default
    group: this rank holds `experts / world` of them (`local`)."""

    def __init__(self, d, h, experts, top_k, rank, world):
        super().__init__()
        self.top_k, self.experts_total, self.world = top_k, experts, world
        self.per_rank = experts // world
        self.gate = nn.Linear(d, experts, bias=False)
        every = [Expert(d, h) for _ in range(experts)]  # the same weights on every rank (same seed)
        self.local = nn.ModuleList(every[rank * self.per_rank:(rank + 1) * self.per_rank])

    def forward(self, x):
        import torch.distributed as dist
        flat = x.reshape(-1, x.shape[-1])
        probs = torch.softmax(self.gate(flat), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        slot_expert = ids.reshape(-1)
        order = torch.argsort(slot_expert, stable=True)  # slots by expert, so by destination rank
        slot_token = torch.arange(flat.shape[0]).repeat_interleave(self.top_k)[order]
        # Slots per (destination rank, its local expert); what each sender sends me.
        counts = torch.bincount(slot_expert, minlength=self.experts_total).view(self.world, self.per_rank)
        arrived = torch.empty_like(counts)
        dist.all_to_all_single(arrived, counts)
        send, recv = counts.sum(1).tolist(), arrived.sum(1).tolist()
        rows = AllToAll.apply(flat[slot_token], send, recv)
        # Received rows: sender by sender, each sender's rows by local expert.
        local_ids = torch.arange(self.per_rank).repeat(self.world).repeat_interleave(arrived.reshape(-1))
        out = torch.zeros_like(rows)
        for e, expert in enumerate(self.local):
            row = (local_ids == e).nonzero(as_tuple=True)[0]
            if len(row):
                out = out.index_add(0, row, expert(rows[row]))
        back = AllToAll.apply(out, recv, send)
        combined = torch.zeros_like(flat)
        combined = combined.index_add(0, slot_token, back * weights.reshape(-1)[order].unsqueeze(1))
        return combined.view_as(x)


class ExpertParallelMoeModel(nn.Module):
    def __init__(self, rank, world, vocab=16, d=16, experts=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.norm = nn.LayerNorm(d)
        self.mlp = ExpertParallelMoe(d, 2 * d, experts, 2, rank, world)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens):
        h = self.embed(tokens)
        h = h + self.mlp(self.norm(h))
        return self.lm_head(h)


def expert_parallel_step(model, opt, tokens):
    """One training step on this rank's `tokens` [B, S]: forward, backward,
    dense gradients averaged over the world, optimizer step. Returns the
    world's mean loss (an all_gather of each rank's)."""
    import torch.distributed as dist
    from moerr import scope
    world = dist.get_world_size()
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    loss.backward()
    for name, p in model.named_parameters():
        if p.grad is not None and ".local." not in name:  # experts live on one rank
            dist.all_reduce(p.grad)
            p.grad.div_(world)
    losses = [torch.empty_like(loss) for _ in range(world)]
    dist.all_gather(losses, loss.detach())
    with scope("optimizer"):
        opt.step()
        opt.zero_grad(set_to_none=True)
    return float(sum(losses)) / world


def expert_parallel_main(run_dir, steps=1, experts=4, init_method=None):
    """The step in one rank process (RANK and WORLD_SIZE in the
    environment; MASTER_ADDR and MASTER_PORT too unless `init_method` names
    the rendezvous, e.g. "file:///tmp/store"), recorded into the run
    directory `run_dir`. Prints the world's loss of each step on rank 0."""
    import os
    import torch.distributed as dist
    import moerr
    if init_method is None:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", init_method=init_method, rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(0)  # one model on every rank
        model = ExpertParallelMoeModel(rank, world, experts=experts)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        gen = torch.Generator().manual_seed(100 + rank)  # each rank its own tokens
        with moerr.record(run_dir, ep_size=world, experts=experts, overwrite=True) as rec:
            for p in model.parameters():
                dist.broadcast(p.data, 0)  # as DDP does at construction
            for step in range(steps):
                tokens = torch.randint(0, 16, (4, 9), generator=gen)
                with rec.step():
                    loss = expert_parallel_step(model, opt, tokens)
                    rec.outcome(loss=loss)
                if rank == 0:
                    print(f"step {step}: loss {loss:.6f}", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    import sys
    expert_parallel_main(sys.argv[1] if len(sys.argv) > 1 else "ep_run")

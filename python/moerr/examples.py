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



def _init_gloo(init_method):
    """torch.distributed's gloo group for this rank process: from RANK,
    WORLD_SIZE, MASTER_ADDR and MASTER_PORT, or at `init_method` (e.g.
    "file:///tmp/store") with RANK and WORLD_SIZE."""
    import os
    import torch.distributed as dist
    if init_method is None:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", init_method=init_method, rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))


def expert_parallel_main(run_dir, steps=1, experts=4, init_method=None, explode=None):
    """The step in one rank process (RANK and WORLD_SIZE in the
    environment; MASTER_ADDR and MASTER_PORT too unless `init_method` names
    the rendezvous, e.g. "file:///tmp/store"), recorded into the run
    directory `run_dir`. Prints the world's loss of each step on rank 0.
    `explode`: the global index of an expert whose down projection is
    scaled by 1e37 (fp32) on the rank that holds it."""
    import torch.distributed as dist
    import moerr
    _init_gloo(init_method)
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(0)  # one model on every rank
        model = ExpertParallelMoeModel(rank, world, experts=experts)
        per_rank = experts // world
        if explode is not None and explode // per_rank == rank:
            with torch.no_grad():
                model.mlp.local[explode % per_rank].down_proj.weight.mul_(1e37)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        gen = torch.Generator().manual_seed(100 + rank)  # each rank its own tokens
        with moerr.record(run_dir, ep_size=world, experts=experts, overwrite=True) as rec:
            for name, p in model.named_parameters():
                if ".local." not in name:  # experts live on one rank
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



# An HF-layout model moerr rebuilds: Mixtral's names and numerics (HF
# MixtralForCausalLM: RMSNorm, GQA attention with rotary embeddings, a
# softmax top-k router renormalised over the top k, SwiGLU experts w1/w3/w2),
# tiny, with its experts spread over the ranks of the default group.
# `moerr.record(RUN, model=..., hf_config=MIXTRAL_TINY)` makes its run one
# `moerr replay RUN --ranks M` rebuilds (docs/DISTRIBUTED.md, "Python").

MIXTRAL_TINY = {"model_type": "mixtral", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 16,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4,
                "num_local_experts": 8, "num_experts_per_tok": 2, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                "max_position_embeddings": 64, "sliding_window": None, "hidden_act": "silu",
                "tie_word_embeddings": False}


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(d))

    def forward(self, x):
        xf = x.float()
        return (self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps))).to(x.dtype)


def rotary(x, theta):
    """HF's rotate-half rotary embedding of x [B, heads, S, head_dim]."""
    seq, dim = x.shape[2], x.shape[3]
    inv_freq = 1.0 / theta ** (torch.arange(0, dim // 2, dtype=torch.float) * 2.0 / dim)
    emb = torch.cat([torch.outer(torch.arange(seq, dtype=torch.float), inv_freq)] * 2, -1)
    rotated = torch.cat([-x[..., dim // 2:], x[..., :dim // 2]], -1)
    return x * emb.cos().to(x.dtype) + rotated * emb.sin().to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.theta = (c["num_attention_heads"], c["num_key_value_heads"],
                                                                c["head_dim"], c["rope_theta"])
        d = c["hidden_size"]
        self.q_proj = nn.Linear(d, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, d, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotary(q, self.theta), rotary(k, self.theta)
        groups = self.heads // self.kv_heads
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        scores = q @ k.transpose(-2, -1) / self.head_dim ** 0.5
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        out = torch.softmax(scores.float(), -1).to(v.dtype) @ v
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MixtralExpert(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.w1, self.w3 = nn.Linear(d, h, bias=False), nn.Linear(d, h, bias=False)
        self.w2 = nn.Linear(h, d, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class SparseMoeBlock(nn.Module):
    """Mixtral's block_sparse_moe, expert-parallel over the default group's
    `world` ranks: this rank holds experts [expert_offset, expert_offset +
    experts / world) as `experts` (the HF layout moerr.instrument and
    moerr.record read; expert_offset maps a local index to the global one).
    Dispatch as ExpertParallelMoe's; with world 1, no collective."""

    def __init__(self, c, rank, world):
        super().__init__()
        d, self.total, self.top_k, self.world = c["hidden_size"], c["num_local_experts"], c["num_experts_per_tok"], world
        self.norm_topk_prob = True
        self.per_rank = self.total // world
        self.expert_offset = rank * self.per_rank
        self.gate = nn.Linear(d, self.total, bias=False)
        every = [MixtralExpert(d, c["intermediate_size"]) for _ in range(self.total)]  # same seed, same weights
        self.experts = nn.ModuleList(every[self.expert_offset:self.expert_offset + self.per_rank])

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        probs = torch.softmax(self.gate(flat).float(), -1)  # through the module: moerr.instrument sees the routing
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        weights = (weights / (weights.sum(-1, keepdim=True) + 1e-20)).to(flat.dtype)
        slot_expert = ids.reshape(-1)
        order = torch.argsort(slot_expert, stable=True)
        slot_token = torch.arange(flat.shape[0]).repeat_interleave(self.top_k)[order]
        counts = torch.bincount(slot_expert, minlength=self.total).view(self.world, self.per_rank)
        if self.world > 1:
            import torch.distributed as dist
            arrived = torch.empty_like(counts)
            dist.all_to_all_single(arrived, counts)
            send, recv = counts.sum(1).tolist(), arrived.sum(1).tolist()
            rows = AllToAll.apply(flat[slot_token], send, recv)
        else:
            arrived, rows = counts, flat[slot_token]
        local_ids = torch.arange(self.per_rank).repeat(self.world).repeat_interleave(arrived.reshape(-1))
        out = torch.zeros_like(rows)
        for e, expert in enumerate(self.experts):
            row = (local_ids == e).nonzero(as_tuple=True)[0]
            if len(row):
                out = out.index_add(0, row, expert(rows[row]))
        back = AllToAll.apply(out, recv, send) if self.world > 1 else out
        combined = torch.zeros_like(flat).index_add(0, slot_token, back * weights.reshape(-1)[order].unsqueeze(1))
        return combined.view_as(x)


class MixtralLayer(nn.Module):
    def __init__(self, c, rank, world):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.block_sparse_moe = SparseMoeBlock(c, rank, world)

    def forward(self, x):
        h = x + self.self_attn(self.input_layernorm(x))
        return h + self.block_sparse_moe(self.post_attention_layernorm(h))


class MixtralModel(nn.Module):
    def __init__(self, c, rank, world):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(MixtralLayer(c, rank, world) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class MixtralForCausalLM(nn.Module):
    """Parameters named as HF's (model.layers.0.block_sparse_moe.experts.<j>.w1.weight, ...)."""

    def __init__(self, c=MIXTRAL_TINY, rank=0, world=1):
        super().__init__()
        self.model = MixtralModel(c, rank, world)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)

    def forward(self, input_ids):
        h = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            h = layer(h)
        return self.lm_head(self.model.norm(h))


def causal_lm_loss(logits, input_ids):
    """Next-token cross entropy, the mean over the B*(S-1) predictions."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), input_ids[:, 1:].reshape(-1))


def hf_expert_parallel_step(model, opt, tokens):
    """One training step of MixtralForCausalLM on this rank's `tokens`:
    causal_lm_loss, dense gradients averaged over the world (an expert's
    summed over the ranks whose tokens reached it, by the all_to_all's
    backward), the optimizer step. Returns the loss."""
    import torch.distributed as dist
    import moerr
    world = dist.get_world_size()
    loss = causal_lm_loss(model(tokens), tokens)
    loss.backward()
    for name, p in model.named_parameters():
        if p.grad is not None and ".experts." not in name:
            dist.all_reduce(p.grad)
            p.grad.div_(world)
    with moerr.scope("optimizer"):
        opt.step()
        opt.zero_grad(set_to_none=True)
    return loss


def hf_expert_parallel_main(run_dir, steps=1, config=MIXTRAL_TINY, init_method=None, batch=(2, 8), instrument=True):
    """MixtralForCausalLM's expert-parallel training step in one rank
    process (as expert_parallel_main), recorded with model= and hf_config=,
    so that `moerr replay run_dir --ranks M` rebuilds it. The loss is the
    objective moerr replays (causal_lm_loss); dense gradients are averaged
    over the world, an expert's summed over the ranks whose tokens reached
    it (the all_to_all's backward). `instrument`: moerr.instrument(model),
    which records the routing the replay serves. Prints each rank's loss of
    each step."""
    import torch.distributed as dist
    import moerr
    _init_gloo(init_method)
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(0)
        model = MixtralForCausalLM(config, rank, world)
        if instrument:
            moerr.instrument(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        gen = torch.Generator().manual_seed(100 + rank)
        with moerr.record(run_dir, ep_size=world, experts=config["num_local_experts"], overwrite=True,
                          model=model, hf_config=config) as rec:
            for step in range(steps):
                tokens = torch.randint(0, config["vocab_size"], batch, generator=gen)
                with rec.step():
                    loss = hf_expert_parallel_step(model, opt, tokens)
                    rec.outcome(loss=loss.item())
                print(f"rank {rank} step {step}: loss {loss.item():.6f}", flush=True)
    finally:
        dist.destroy_process_group()

# A transformers MoE model made expert-parallel the way ExpertParallelMoe is:
# transformers 5's Qwen2MoeForCausalLM (fused experts: mlp.experts.gate_up_proj
# [E, 2I, H], mlp.experts.down_proj [E, H, I]), each rank keeping experts
# [r*E/N, (r+1)*E/N) of every block, the block's experts module routing its
# slots through all_to_all to the ranks that hold them. transformers' own
# expert parallelism (DistributedConfig(ep_size=...), its AllToAllEP) is not
# used: from_pretrained(distributed_config=) needs accelerate, and applied by
# hand it makes the experts DTensor parameters, which a replayable recording
# cannot capture (docs/DISTRIBUTED.md, "transformers' own expert
# parallelism": with them made plain, it records).

QWEN2_MOE_TINY = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 16,
                  "shared_expert_intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": 2,
                  "max_position_embeddings": 64, "tie_word_embeddings": False}


def _expert_parallel_experts_forward(local_forward, total, world):
    """The forward of a transformers fused experts module holding `total /
    world` of the `total` experts: the slots (token, expert) sorted by
    expert go to the experts' ranks by all_to_all, `local_forward` (the
    module's own, on the local expert ids, unit weights) runs the rows that
    arrived, the reverse all_to_all brings them back, combined with the
    routing weights."""
    def forward(hidden_states, top_k_index, top_k_weights):
        import torch.distributed as dist
        per, top_k = total // world, top_k_index.shape[-1]
        slot_expert = top_k_index.reshape(-1)
        order = torch.argsort(slot_expert, stable=True)
        slot_token = torch.arange(hidden_states.shape[0]).repeat_interleave(top_k)[order]
        counts = torch.bincount(slot_expert, minlength=total).view(world, per)
        arrived = torch.empty_like(counts)
        dist.all_to_all_single(arrived, counts)
        send, recv = counts.sum(1).tolist(), arrived.sum(1).tolist()
        rows = AllToAll.apply(hidden_states[slot_token], send, recv)
        local_ids = torch.arange(per).repeat(world).repeat_interleave(arrived.reshape(-1))
        out = local_forward(rows, local_ids.unsqueeze(1), torch.ones(len(local_ids), 1, dtype=rows.dtype))
        back = AllToAll.apply(out, recv, send)
        weights = top_k_weights.reshape(-1)[order].unsqueeze(1).to(back.dtype)
        return torch.zeros_like(hidden_states).index_add(0, slot_token, back * weights)
    return forward


def shard_transformers_experts(model, rank, world):
    """Keeps this rank's experts of each MoE block of a transformers 5 model
    with fused experts (`model.model.layers[i].mlp.experts`), sets the
    block's `expert_offset` (what moerr.record(model=) names them by) and
    makes the experts module dispatch over the default group."""
    for layer in model.model.layers:
        block, experts = layer.mlp, layer.mlp.experts
        total = experts.num_experts
        per = total // world
        lo = rank * per
        with torch.no_grad():
            experts.gate_up_proj = nn.Parameter(experts.gate_up_proj[lo:lo + per].clone())
            experts.down_proj = nn.Parameter(experts.down_proj[lo:lo + per].clone())
        experts.num_experts, block.expert_offset = per, lo
        experts.forward = _expert_parallel_experts_forward(experts.forward, total, world)
    return model


def transformers_expert_parallel_main(run_dir, steps=1, init_method=None, explode=None, batch=(2, 8)):
    """A transformers Qwen2MoeForCausalLM (QWEN2_MOE_TINY, eager experts)
    trained expert-parallel in one rank process (as expert_parallel_main),
    recorded with model= and hf_config= (`moerr replay run_dir --ranks M`
    rebuilds it). The loss is the model's own (labels=input_ids); dense
    gradients averaged over the world. `explode`: (layer, global expert)
    whose down projection is scaled by 1e37 (fp32) on the rank holding it.
    Prints each rank's loss of each step."""
    import json
    import torch.distributed as dist
    import transformers
    import moerr
    _init_gloo(init_method)
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        config = transformers.Qwen2MoeConfig(**QWEN2_MOE_TINY)
        config._experts_implementation = "eager"  # a loop of F.linear per expert: bisect can name the expert
        torch.manual_seed(0)  # one model on every rank
        model = shard_transformers_experts(transformers.Qwen2MoeForCausalLM(config).float(), rank, world)
        per = config.num_experts // world
        if explode is not None and explode[1] // per == rank:
            with torch.no_grad():
                model.model.layers[explode[0]].mlp.experts.down_proj[explode[1] % per].mul_(1e37)
        moerr.instrument(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        gen = torch.Generator().manual_seed(100 + rank)  # each rank its own tokens
        with moerr.record(run_dir, ep_size=world, experts=config.num_experts, overwrite=True, model=model,
                          hf_config=json.loads(config.to_json_string())) as rec:
            for step in range(steps):
                ids = torch.randint(0, config.vocab_size, batch, generator=gen)
                with rec.step():
                    loss = model(input_ids=ids, labels=ids).loss
                    loss.backward()
                    for name, p in model.named_parameters():
                        if p.grad is not None and ".experts." not in name:  # experts live on one rank
                            dist.all_reduce(p.grad)
                            p.grad.div_(world)
                    with moerr.scope("optimizer"):
                        opt.step()
                        opt.zero_grad(set_to_none=True)
                    rec.outcome(loss=loss.item())
                print(f"rank {rank} step {step}: loss {loss.item():.6f}", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    import sys
    if len(sys.argv) > 2 and sys.argv[2] == "mixtral":
        hf_expert_parallel_main(sys.argv[1])
    elif len(sys.argv) > 2 and sys.argv[2] == "qwen2_moe":
        transformers_expert_parallel_main(sys.argv[1])
    else:
        expert_parallel_main(sys.argv[1] if len(sys.argv) > 1 else "ep_run")

"""Live PyTorch programs on a chosen CUDA allocator, one process per run, for comparing
allocators program by program: per-step value (loss, or an output checksum), per-step time from
CUDA events, the allocator's peaks and its reserved bytes after every step, and the process's
device memory as the driver sees it (cuMemGetInfo through torch.cuda.mem_get_info) after every
step. The companion of ../shared/bench/torch_live.py (its five workloads are run with it, not
here), with the same allocator choice, seeding and JSON line.

usage: python3 live_programs.py WORKLOAD [--allocator A] [--steps N] [--record OUTDIR]
       python3 live_programs.py list
  A         default | expandable | backend:cudaMallocAsync | berth:<policy> (berth_torch's
            use_allocator(policy) before CUDA starts; stats from berth_torch.memory_stats())
  --record  also writes OUTDIR/WORKLOAD.trace.json.gz, PyTorch's memory history in the format
            of ../traces/record_traces.py (default allocator only)
Prints one JSON line. Same seeds and inputs for every allocator, so values must agree.
LIVE_SMOKE=cpu runs the program's Python on the CPU at about 1/8 of its sizes (no memory
figures), to catch errors where there is no GPU.

The programs of ../traces/record_traces.py, step by step, with the same models, sizes, seeds and
step counts, so they allocate as their recorded traces did (but for cuDNN's deterministic
algorithms, set here as in torch_live.py, and embedding_recsys_train's tables, made on the device):
  segmentation_varsize_train     FCN-ResNet50, batch 4-8 at 256-512 px, 8 steps
  detection_varsize_train        Faster R-CNN MobileNetV3-FPN, 4 images of 320-800 px, 6 steps
  unet_diffusion_train           diffusion UNet, 16 x 4x64x64 latents, bf16 autocast, 8 steps
  llm_ckpt_varlen_train          GPT-2 1024-wide, activation checkpointing, 4 x 128-1024 tokens, 8 steps
  llm_kvcache_varbatch_generate  GPT-2 greedy generation, batch 1/16/4, 48 new tokens, 3 steps
  vit_bf16_amp_train             ViT-B/16, batch 32, bf16 autocast, 6 steps
  three_stream_overlap           copies in, compute, copies out on three streams, 6 steps of 8 batches
  embedding_recsys_train         DLRM-style, 3.6 GB of sparse-gradient embedding tables, 16 steps
  finetune_reload_weights        BERT-base loaded to the GPU, trained and dropped, 3 rounds of 3 steps
  lstm_varlen_train              2-layer LSTM LM over packed sequences of 20-400 tokens, 12 steps
  t5_seq2seq_train               T5 (small config), encoder 64-512 / decoder 16-128 tokens, 10 steps
Five more:
  diffusion_varres_train         the same UNet with weight EMA, latents 32-96 px and batch 4-32 per step
  moe_uneven_train               top-2 mixture-of-experts decoder, expert loads skewed anew every step
  longctx_sdpa_train             causal decoder with FlashAttention (SDPA, bf16), 1k-16k tokens a step
  speculative_decode_generate    greedy speculative decoding, GPT-2 medium target, its first 4 layers as draft
  growing_batch_train            ResNet-18 with a batch-size warm-up, batch 8 -> 128
"""
import argparse, hashlib, json, os, random, sys, time

p = argparse.ArgumentParser()
p.add_argument("workload")
p.add_argument("--allocator", default="default")
p.add_argument("--steps", type=int, default=0)
p.add_argument("--record", metavar="OUTDIR")
a = p.parse_args()
if a.record and a.allocator != "default":
    p.error("--record records PyTorch's default allocator: leave --allocator out")

if a.allocator == "expandable":
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
elif a.allocator.startswith("backend:"):
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = a.allocator
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

berth = None
if a.allocator.startswith("berth:"):
    import berth_torch as berth  # noqa: E402
    berth.use_allocator(a.allocator.split(":", 1)[1])

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "traces"))
import record_traces  # noqa: E402  (the UNet, the stats subset and the trace writer)

CUDA = os.environ.get("LIVE_SMOKE") != "cpu"
DEV = "cuda" if CUDA else "cpu"
SHRINK = 1 if CUDA else 8


def scaled(n, multiple=1):
    """n on the GPU; about n / SHRINK (at least `multiple`, a multiple of it) in the CPU smoke run."""
    return max(multiple, n // SHRINK // multiple * multiple)


def digest(*tensors):
    """A short checksum of tensors' contents, for outputs compared across allocators."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


# ---- measurement (as torch_live.py) ----

def memory_stats():
    if berth:
        return berth.memory_stats()
    return torch.cuda.memory_stats() if CUDA else {}


def driver_used():
    """Device memory in use as the driver sees it (every process on the device), or None on the CPU."""
    if not CUDA:
        return None
    free, total = torch.cuda.mem_get_info()
    return total - free


def sample():
    """Reads the driver's used bytes and keeps the peak; returns the reading."""
    global peak_used
    used = driver_used()
    if used is not None:
        peak_used = max(peak_used, used)
    return used


def clock():
    if not CUDA:
        return time.perf_counter()
    start = torch.cuda.Event(enable_timing=True)
    start.record()
    return start


def ms_since(start):
    """Milliseconds since clock() returned start; waits for the GPU to get there."""
    if not CUDA:
        return (time.perf_counter() - start) * 1e3
    end = torch.cuda.Event(enable_timing=True)
    end.record(); end.synchronize()
    return start.elapsed_time(end)


def timed(steps, body):
    """Runs body(i) for each step; per step: its ms, its value, and after it the driver's used bytes
    (less those at the start) and the allocator's reserved bytes."""
    ms, vals, used, reserved = [], [], [], []
    for i in range(steps):
        start = clock()
        vals.append(body(i))
        ms.append(ms_since(start))
        now = sample()
        used.append(None if now is None else now - base_used)
        reserved.append(memory_stats().get("reserved_bytes.all.current"))
    return dict(step_ms=ms, values=vals, driver_used_per_step=used, reserved_per_step=reserved)


def train_step(opt, loss):
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    return float(loss.detach())


# ---- the programs of record_traces.py, one step at a time ----

def segmentation_varsize_train(steps):
    """FCN-ResNet50 semantic segmentation, batch 4-8 at 256-512 px (varies every step)."""
    import torchvision
    m = torchvision.models.segmentation.fcn_resnet50(weights=None, weights_backbone=None,
                                                     num_classes=21, aux_loss=False).to(DEV)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    rng = random.Random(1)

    def body(i):
        b, h, w = rng.choice([4, 6, 8]), rng.randrange(256, 513, 32), rng.randrange(256, 513, 32)
        x = torch.randn(scaled(b), 3, scaled(h), scaled(w), device=DEV)
        y = torch.randint(0, 21, (scaled(b), scaled(h), scaled(w)), device=DEV)
        return train_step(opt, F.cross_entropy(m(x)["out"], y))
    return timed(steps or 8, body)


def detection_varsize_train(steps):
    """Faster R-CNN (MobileNetV3-FPN) detection training on images of varying sizes and box counts."""
    import torchvision
    m = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_fpn(
        weights=None, weights_backbone=None, num_classes=10).to(DEV).train()
    opt = torch.optim.SGD(m.parameters(), lr=0.005, momentum=0.9)
    rng = random.Random(2)

    def body(i):
        imgs, targets = [], []
        for _ in range(scaled(4)):
            h, w = rng.randrange(320, 801, 16), rng.randrange(320, 801, 16)
            imgs.append(torch.rand(3, h, w, device=DEV))
            n = rng.randrange(1, 12)
            xy = torch.rand(n, 2, device=DEV) * torch.tensor([w * 0.6, h * 0.6], device=DEV)
            wh = torch.rand(n, 2, device=DEV) * 100 + 16
            targets.append(dict(boxes=torch.cat([xy, xy + wh], 1),
                                labels=torch.randint(1, 10, (n,), device=DEV)))
        return train_step(opt, sum(m(imgs, targets).values()))
    return timed(steps or 6, body)


def unet_diffusion_train(steps):
    """A latent-diffusion-style UNet (noise prediction), batch 16 of 4x64x64 latents, AdamW, bf16 autocast."""
    m = record_traces._UNet().to(DEV)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)

    def body(i):
        x0 = torch.randn(scaled(16), 4, scaled(64, 4), scaled(64, 4), device=DEV)
        t = torch.rand(scaled(16), device=DEV) * 1000
        noise = torch.randn_like(x0)
        with torch.autocast(DEV, dtype=torch.bfloat16):
            loss = F.mse_loss(m(x0 + noise, t).float(), noise)
        return train_step(opt, loss)
    return timed(steps or 8, body)


def llm_ckpt_varlen_train(steps):
    """GPT-2 medium-width LM with activation checkpointing, batch 4 x 128-1024 tokens (varies), AdamW."""
    from transformers import GPT2Config, GPT2LMHeadModel
    m = GPT2LMHeadModel(GPT2Config(n_embd=1024, n_head=16, n_layer=12, n_positions=1024)).to(DEV)
    m.gradient_checkpointing_enable()
    m.config.use_cache = False
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    rng = random.Random(4)

    def body(i):
        ids = torch.randint(0, 50257, (scaled(4), scaled(rng.randrange(128, 1025, 64))), device=DEV)
        return train_step(opt, m(input_ids=ids, labels=ids).loss)
    return timed(steps or 8, body)


def llm_kvcache_varbatch_generate(steps):
    """GPT-2 greedy generation with a growing KV cache, three requests of batch 1, 16 and 4 and
    prompts of 32-256 tokens, 48 new tokens each (the driver is sampled at every token)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LogitsProcessor, LogitsProcessorList

    class SampleEveryToken(LogitsProcessor):
        def __call__(self, input_ids, scores):
            sample()
            return scores

    m = GPT2LMHeadModel(GPT2Config()).to(DEV).eval()
    requests = ((1, 256), (16, 32), (4, 128))
    new = scaled(48)

    def body(i):
        b, L = requests[i % len(requests)]
        ids = torch.randint(0, 50257, (scaled(b), scaled(L)), device=DEV)
        with torch.no_grad():
            out = m.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
                             logits_processor=LogitsProcessorList([SampleEveryToken()]))
        return digest(out)
    return timed(steps or 3, body)


def vit_bf16_amp_train(steps):
    """torchvision ViT-B/16, batch 32 at 224x224, bf16 autocast, AdamW."""
    import torchvision
    m = torchvision.models.vit_b_16(weights=None).to(DEV)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)

    def body(i):
        x = torch.randn(scaled(32), 3, 224, 224, device=DEV)
        y = torch.randint(0, 1000, (scaled(32),), device=DEV)
        with torch.autocast(DEV, dtype=torch.bfloat16):
            loss = F.cross_entropy(m(x), y)
        return train_step(opt, loss)
    return timed(steps or 6, body)


def three_stream_overlap(steps):
    """Host-to-device copies, compute and device-to-host copies on three streams, overlapped,
    with record_stream on the buffers that cross streams; batch sizes vary. A step is 8 batches,
    ending where the recorded program waited for its copies out."""
    backend = torch.get_device_module(DEV)
    h2d, d2h, main = backend.Stream(), backend.Stream(), backend.current_stream()
    pinned = (lambda t: t.pin_memory()) if CUDA else (lambda t: t)
    net = nn.Sequential(nn.Linear(2048, 8192), nn.GELU(), nn.Linear(8192, 2048)).to(DEV)
    rng = random.Random(5)
    host_in = [pinned(torch.randn(scaled(rng.choice([64, 256, 1024, 2048])), 2048)) for _ in range(6)]
    host_out = [pinned(torch.empty(2048, 2048)) for _ in range(2)]
    per_step = scaled(8)

    def body(step):
        with torch.no_grad():
            for i in range(step * per_step, (step + 1) * per_step):
                with backend.stream(h2d):
                    xb = host_in[i % 6].to(DEV, non_blocking=True)
                main.wait_stream(h2d)
                if CUDA:
                    xb.record_stream(main)
                y = net(xb)
                d2h.wait_stream(main)
                with backend.stream(d2h):
                    host_out[i % 2][: y.shape[0]].copy_(y, non_blocking=True)
                if CUDA:
                    y.record_stream(d2h)
                del xb, y
        if CUDA:
            d2h.synchronize()
        return digest(*(h[::16] for h in host_out))
    return timed(steps or 6, body)


def embedding_recsys_train(steps):
    """A DLRM-style recommender: eight embedding tables of 500k-2M rows x 64 (3.6 GB), sparse
    gradients (EmbeddingBag, sparse=True) with SGD, a dense MLP with Adam; bags of varying size.
    The tables are initialised on the device, under a forked RNG, so the index draws match the
    recorded program's (which spent seconds initialising them on the host)."""
    rows = [scaled(r) for r in (2_000_000, 1_000_000, 1_500_000, 500_000, 2_000_000, 800_000, 1_200_000, 600_000)]
    with torch.random.fork_rng():
        tables = nn.ModuleList([nn.EmbeddingBag(r, 64, mode="sum", sparse=True, device=DEV) for r in rows])
    mlp = nn.Sequential(nn.Linear(64 * 8 + 13, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                        nn.Linear(256, 1)).to(DEV)
    opt_s = torch.optim.SGD(tables.parameters(), lr=0.01)
    opt_d = torch.optim.Adam(mlp.parameters(), lr=1e-3)
    rng = random.Random(6)

    def body(i):
        b = scaled(rng.choice([2048, 4096, 8192]))
        embs = []
        for r, t in zip(rows, tables):
            lens = torch.randint(1, rng.randrange(2, 40), (b,), device=DEV)
            idx = torch.randint(0, r, (int(lens.sum()),), device=DEV)
            offsets = torch.cat([torch.zeros(1, dtype=torch.long, device=DEV), lens.cumsum(0)[:-1]])
            embs.append(t(idx, offsets))
        x = torch.cat(embs + [torch.randn(b, 13, device=DEV)], 1)
        loss = F.binary_cross_entropy_with_logits(mlp(x).squeeze(1), torch.rand(b, device=DEV))
        opt_s.zero_grad(set_to_none=True); opt_d.zero_grad(set_to_none=True)
        loss.backward(); opt_s.step(); opt_d.step()
        return float(loss.detach())
    return timed(steps or 16, body)


def finetune_reload_weights(steps):
    """Three fine-tuning rounds that each load BERT-base weights from host memory onto the GPU,
    train a new classification head for 3 steps, then drop the model and optimiser (as a
    hyper-parameter sweep does), with a different batch and length each round."""
    from transformers import BertConfig, BertForSequenceClassification
    cfg = BertConfig()
    host_state = {k: v.clone() for k, v in BertForSequenceClassification(cfg).state_dict().items()}
    rng = random.Random(7)
    run = {}  # this round's model, optimiser, labels, batch and length

    def body(i):
        if i % 3 == 0:
            cfg.num_labels = (2, 5, 20)[i // 3 % 3]
            m = BertForSequenceClassification(cfg)
            m.load_state_dict({k: v for k, v in host_state.items() if not k.startswith("classifier")},
                              strict=False)
            m = m.to(DEV)
            run.update(m=m, opt=torch.optim.AdamW(m.parameters(), lr=2e-5), labels=cfg.num_labels,
                       b=scaled(rng.choice([16, 32])), L=scaled(rng.choice([128, 256])))
        ids = torch.randint(0, 30522, (run["b"], run["L"]), device=DEV)
        y = torch.randint(0, run["labels"], (run["b"],), device=DEV)
        loss = train_step(run["opt"], run["m"](input_ids=ids, labels=y).loss)
        if i % 3 == 2:
            run.clear()
        return loss
    return timed(steps or 9, body)


def lstm_varlen_train(steps):
    """A 2-layer LSTM language model (cuDNN) over packed batches of 32 sequences of 20-400 tokens."""
    emb, lstm, head = nn.Embedding(32000, 512).to(DEV), nn.LSTM(512, 1024, 2, batch_first=True).to(DEV), \
        nn.Linear(1024, 32000).to(DEV)
    params = list(emb.parameters()) + list(lstm.parameters()) + list(head.parameters())
    opt = torch.optim.Adam(params, lr=1e-3)
    rng = random.Random(8)

    def body(i):
        lens = sorted((scaled(rng.randrange(20, 401)) for _ in range(scaled(32))), reverse=True)
        ids = torch.randint(0, 32000, (len(lens), lens[0]), device=DEV)
        packed = nn.utils.rnn.pack_padded_sequence(emb(ids), lens, batch_first=True)
        out, _ = lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        return train_step(opt, F.cross_entropy(head(out).flatten(0, 1), ids.flatten(), reduction="mean"))
    return timed(steps or 12, body)


def t5_seq2seq_train(steps):
    """transformers T5 (small config) seq2seq training, encoder 64-512 and decoder 16-128 tokens (vary)."""
    from transformers import T5Config, T5ForConditionalGeneration
    m = T5ForConditionalGeneration(T5Config(
        d_model=512, d_ff=2048, num_layers=6, num_heads=8, decoder_start_token_id=0, pad_token_id=0)).to(DEV)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    rng = random.Random(9)

    def body(i):
        b = scaled(rng.choice([8, 16, 32]))
        src = torch.randint(0, 32000, (b, scaled(rng.randrange(64, 513, 32))), device=DEV)
        tgt = torch.randint(0, 32000, (b, scaled(rng.randrange(16, 129, 16))), device=DEV)
        return train_step(opt, m(input_ids=src, labels=tgt).loss)
    return timed(steps or 10, body)


# ---- five more ----

def diffusion_varres_train(steps):
    """Latent-diffusion UNet training with multi-resolution buckets: each step a new latent side
    (32-96) and batch (4-32), so activations range over 70x; AdamW, bf16 autocast, an EMA of the
    weights updated every step."""
    m = record_traces._UNet().to(DEV)
    params = list(m.parameters())
    ema = [q.detach().clone() for q in params]
    opt = torch.optim.AdamW(params, lr=1e-4)
    rng = random.Random(10); g = torch.Generator(device=DEV).manual_seed(10)

    def body(i):
        b, side = scaled(rng.choice([4, 8, 16, 24, 32])), scaled(rng.choice([32, 48, 64, 80, 96]), 4)
        x0 = torch.randn(b, 4, side, side, device=DEV, generator=g)
        t = torch.rand(b, device=DEV, generator=g) * 1000
        noise = torch.randn(x0.shape, device=DEV, generator=g)
        with torch.autocast(DEV, dtype=torch.bfloat16):
            loss = F.mse_loss(m(x0 + noise, t).float(), noise)
        value = train_step(opt, loss)
        with torch.no_grad():
            torch._foreach_lerp_(ema, params, 1e-3)
        return value
    return timed(steps or 12, body)


class _SelfAttention(nn.Module):
    """Causal multi-head self-attention through scaled_dot_product_attention."""
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, L, d = x.shape
        q, k, v = self.qkv(x).view(b, L, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, L, d))


class _MoE(nn.Module):
    """Top-k routed MLP experts. Tokens are sorted by expert so each expert runs on one slice of
    its own length; a per-expert routing bias (as in bias-based load balancing) sets the skew.
    The load-balancing loss of the last forward is left in `aux`."""
    def __init__(self, d, ff, experts, k):
        super().__init__()
        self.k = k
        self.router = nn.Linear(d, experts, bias=False)
        self.register_buffer("route_bias", torch.zeros(experts))
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, ff), nn.GELU(), nn.Linear(ff, d))
                                     for _ in range(experts))
        self.aux = None

    def forward(self, x):
        shape, x = x.shape, x.reshape(-1, x.shape[-1])
        probs = (self.router(x).float() + self.route_bias).softmax(-1)
        w, chosen = probs.topk(self.k, -1)
        w = w / w.sum(-1, keepdim=True)
        chosen = chosen.flatten()
        order = chosen.argsort(stable=True)
        counts = torch.bincount(chosen, minlength=len(self.experts))
        slices = x[order // self.k].split(counts.tolist())
        y = torch.cat([f(s) for f, s in zip(self.experts, slices)])[order.argsort()]
        y = (y.view(x.shape[0], self.k, -1) * w[..., None].to(y.dtype)).sum(1)
        self.aux = len(self.experts) * (probs.mean(0) * counts / chosen.numel()).sum()
        return y.view(shape)


class _Layer(nn.Module):
    """A pre-norm decoder layer: causal self-attention, then `ffn`."""
    def __init__(self, d, heads, ffn):
        super().__init__()
        self.n1, self.attn, self.n2, self.ffn = nn.LayerNorm(d), _SelfAttention(d, heads), nn.LayerNorm(d), ffn

    def forward(self, x):
        x = x + self.attn(self.n1(x))
        return x + self.ffn(self.n2(x))


class _Decoder(nn.Module):
    """A causal language model over _Layer(d, heads, ffn()) layers, with tied embeddings."""
    def __init__(self, vocab, d, heads, layers, ffn):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        nn.init.normal_(self.emb.weight, std=0.02)
        self.layers = nn.ModuleList(_Layer(d, heads, ffn()) for _ in range(layers))
        self.norm = nn.LayerNorm(d)

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x) @ self.emb.weight.T


def next_token_loss(logits, ids):
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())


def moe_uneven_train(steps):
    """A 6-layer mixture-of-experts decoder (8 experts of 1024->4096->1024, top-2, 460M parameters),
    bf16 autocast, AdamW; batch 2-8 of 256-2048 tokens, and a routing skew drawn anew every step,
    so each expert's share of the tokens, and its activations' sizes, change every step."""
    with torch.device(DEV):
        m = _Decoder(32000, 1024, 16, 6, lambda: _MoE(1024, 4096, experts=8, k=2))
    moes = [layer.ffn for layer in m.layers]
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    rng = random.Random(11); g = torch.Generator(device=DEV).manual_seed(11)

    def body(i):
        b, L = scaled(rng.choice([2, 4, 8])), scaled(rng.randrange(256, 2049, 128), 16)
        spread = rng.choice([0.0, 0.5, 1.0, 2.0])
        for moe in moes:
            moe.route_bias.copy_(torch.tensor([rng.gauss(0, spread) for _ in range(8)]))
        ids = torch.randint(0, 32000, (b, L), device=DEV, generator=g)
        with torch.autocast(DEV, dtype=torch.bfloat16):
            loss = next_token_loss(m(ids), ids) + 0.01 * sum(moe.aux for moe in moes)
        return train_step(opt, loss)
    return timed(steps or 10, body)


def longctx_sdpa_train(steps):
    """A long-context causal decoder (8 layers, 1024 wide, 16 heads, 135M parameters) trained on
    one sequence of 1k-16k tokens a step (varies), SDPA in bf16 autocast (FlashAttention), AdamW."""
    with torch.device(DEV):
        m = _Decoder(32000, 1024, 16, 8, lambda: nn.Sequential(nn.Linear(1024, 4096), nn.GELU(),
                                                               nn.Linear(4096, 1024)))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    rng = random.Random(12); g = torch.Generator(device=DEV).manual_seed(12)

    def body(i):
        ids = torch.randint(0, 32000, (1, scaled(rng.randrange(1024, 16385, 256), 16)), device=DEV, generator=g)
        with torch.autocast(DEV, dtype=torch.bfloat16):
            loss = next_token_loss(m(ids), ids)
        return train_step(opt, loss)
    return timed(steps or 12, body)


def speculative_decode_generate(steps):
    """Greedy self-speculative decoding in bf16: a draft made of the first 4 of the 24 layers of a
    GPT-2 medium target proposes 4 tokens, the target checks them in one pass, the longest prefix
    that the target agrees with for every sequence is kept (plus the target's next token), and
    both KV caches are cut back to it; requests of batch 1-8 and prompts of 64-512 tokens, 64 new
    tokens each (the driver is sampled every round)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    with torch.device(DEV):
        target = GPT2LMHeadModel(GPT2Config(n_embd=1024, n_layer=24, n_head=16))
        draft = GPT2LMHeadModel(GPT2Config(n_embd=1024, n_layer=4, n_head=16))
    draft.load_state_dict(target.state_dict(), strict=False)  # all but the target's layers 4-23
    target, draft = target.to(torch.bfloat16).eval(), draft.to(torch.bfloat16).eval()
    rng = random.Random(13); g = torch.Generator(device=DEV).manual_seed(13)
    k, new = 4, scaled(64)

    def forward(model, cache, ids, keep=1):
        """Runs ids through model after what its cache holds; greedy picks at the last `keep` places."""
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=keep)
        return out.past_key_values, out.logits.argmax(-1)

    def body(i):
        b, L = scaled(rng.choice([1, 2, 4, 8])), scaled(rng.randrange(64, 513, 32))
        seq = torch.randint(0, 50257, (b, L), device=DEV, generator=g)
        with torch.no_grad():
            t_cache, picks = forward(target, None, seq)
            d_cache, _ = forward(draft, None, seq)
            seq = torch.cat([seq, picks], 1)
            while seq.shape[1] < L + 1 + new:
                feed, guesses = seq[:, d_cache.get_seq_length():], []
                for _ in range(k):
                    d_cache, feed = forward(draft, d_cache, feed)
                    guesses.append(feed)
                proposal = torch.cat(guesses, 1)
                t_cache, checks = forward(target, t_cache, torch.cat([seq[:, -1:], proposal], 1), keep=k + 1)
                agree = (proposal == checks[:, :k]).all(0).long().cumprod(0).sum().item()
                seq = torch.cat([seq, proposal[:, :agree], checks[:, agree:agree + 1]], 1)
                for cache in (t_cache, d_cache):
                    extra = cache.get_seq_length() - (seq.shape[1] - 1)
                    if extra > 0:
                        cache.crop(-extra)
                sample()
        return digest(seq)
    return timed(steps or 4, body)


def growing_batch_train(steps):
    """ResNet-18 training at 224x224 with a batch-size warm-up: batch 8, 16, ... 128 (the
    learning rate scaled with it), so every step needs more memory than the one before."""
    import torchvision
    m = torchvision.models.resnet18(weights=None).to(DEV)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator(device=DEV).manual_seed(14)

    def body(i):
        b = scaled(8 * (i % 16 + 1))
        for group in opt.param_groups:
            group["lr"] = 0.1 * b / 128
        x = torch.randn(b, 3, 224, 224, device=DEV, generator=g)
        y = torch.randint(0, 1000, (b,), device=DEV, generator=g)
        return train_step(opt, F.cross_entropy(m(x), y))
    return timed(steps or 16, body)


W = {f.__name__: f for f in (
    segmentation_varsize_train, detection_varsize_train, unet_diffusion_train, llm_ckpt_varlen_train,
    llm_kvcache_varbatch_generate, vit_bf16_amp_train, three_stream_overlap, embedding_recsys_train,
    finetune_reload_weights, lstm_varlen_train, t5_seq2seq_train,
    diffusion_varres_train, moe_uneven_train, longctx_sdpa_train, speculative_decode_generate,
    growing_batch_train)}


if a.workload == "list":
    print("\n".join(W))
    sys.exit(0)
if a.workload not in W:
    p.error(f"unknown workload {a.workload!r}: `list` names them")

torch.backends.cudnn.benchmark = False
torch.backends.cudnn.deterministic = True
torch.manual_seed(0)
base_used = peak_used = driver_used()  # the CUDA context's bytes (context_bytes); steps count from here
if a.record:
    torch.cuda.memory._record_memory_history(max_entries=4_000_000, context=None, stacks="python")
program = " ".join(W[a.workload].__doc__.split())
t0 = time.time()
run = W[a.workload](a.steps)
if CUDA:
    torch.cuda.synchronize()
sample()
wall = time.time() - t0
if a.record:
    os.makedirs(a.record, exist_ok=True)
    record_traces.write_trace(
        os.path.join(a.record, f"{a.workload}.trace.json.gz"),
        dict(workload=a.workload, torch=torch.__version__,
             alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), wall_s=wall, program=program,
             stats=record_traces.stats_subset()))
stats = memory_stats()
ms = run["step_ms"]
warm = sorted(ms[2:] or ms)
out = dict(workload=a.workload, allocator=a.allocator, torch=torch.__version__, steps=len(ms),
           values=run["values"], step_ms=ms, first_step_ms=ms[0], median_step_ms=warm[len(warm) // 2],
           wall_s=wall, peak_reserved=stats.get("reserved_bytes.all.peak"),
           peak_allocated=stats.get("allocated_bytes.all.peak"), num_device_alloc=stats.get("num_device_alloc"),
           driver_peak_used_bytes=None if base_used is None else peak_used - base_used,
           context_bytes=base_used, driver_used_per_step=run["driver_used_per_step"],
           reserved_per_step=run["reserved_per_step"], program=program,
           # True: berth's full CUDAAllocator; False: the CUDAPluggableAllocator fallback.
           full_allocator=berth.full_allocator() if berth and hasattr(berth, "full_allocator") else None)
print(json.dumps(out), flush=True)

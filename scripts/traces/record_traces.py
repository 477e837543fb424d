"""Records allocator traces of ten PyTorch programs unlike the five bundled ones, the way
PyTorch's memory history sees them, in the bundled traces' format (see
crates/berth-alloc/tests/data/README.md): gzip JSON with `workload`, `torch`, `alloc_conf`,
`wall_s`, `stats` (a subset of torch.cuda.memory_stats() at the end), `action_counts`, `columns`
and `events` rows [action, addr, size, stream, time_us].

usage: python3 record_traces.py WORKLOAD OUTDIR [record]
  Without `record`, only the JSON line of figures is printed (for PYTORCH_CUDA_ALLOC_CONF
  modes other than the default: expandable_segments:True, backend:cudaMallocAsync).
  WORKLOAD is one of the names in W below, or `list`.

Every model is built from a config with random weights (no downloads); inputs are random with
fixed seeds, so a program asks for the same sizes in every mode.
"""
import gzip, json, os, random, sys, time
import torch
import torch.nn as nn
import torch.nn.functional as F


def stats_subset():
    s = torch.cuda.memory_stats()
    keep = {k: v for k, v in s.items()
            if k.endswith(('.all.peak', '.all.current')) or k.startswith(('num_', 'oversize'))}
    keep['max_memory_allocated'] = torch.cuda.max_memory_allocated()
    keep['max_memory_reserved'] = torch.cuda.max_memory_reserved()
    return keep


def write_trace(path, header):
    """Stops PyTorch's memory history and writes device 0's trace to `path` in the format above:
    `header` (workload, torch, alloc_conf, wall_s, program, stats) with `action_counts`,
    `columns` and `events`. Returns the action counts."""
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    codes, ev = {}, []
    for e in snap['device_traces'][0]:
        a = e['action']
        ev.append([a, e.get('addr', 0), e.get('size', 0), e.get('stream', 0), e.get('time_us', 0)])
        codes[a] = codes.get(a, 0) + 1
    trace = dict(header, action_counts=codes, columns=['action', 'addr', 'size', 'stream', 'time_us'], events=ev)
    with gzip.open(path, 'wt') as f:
        json.dump(trace, f)
    return codes


def segmentation_varsize_train():
    """FCN-ResNet50 semantic segmentation, batch 4-8 at 256-512 px (varies every step)."""
    import torchvision
    m = torchvision.models.segmentation.fcn_resnet50(weights=None, weights_backbone=None,
                                                     num_classes=21, aux_loss=False).cuda()
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    rng = random.Random(1)
    for _ in range(8):
        b, h, w = rng.choice([4, 6, 8]), rng.randrange(256, 513, 32), rng.randrange(256, 513, 32)
        x = torch.randn(b, 3, h, w, device='cuda')
        y = torch.randint(0, 21, (b, h, w), device='cuda')
        loss = F.cross_entropy(m(x)['out'], y)
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step()


def detection_varsize_train():
    """Faster R-CNN (MobileNetV3-FPN) detection training on images of varying sizes and box counts."""
    import torchvision
    m = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_fpn(
        weights=None, weights_backbone=None, num_classes=10).cuda().train()
    opt = torch.optim.SGD(m.parameters(), lr=0.005, momentum=0.9)
    rng = random.Random(2)
    for _ in range(6):
        imgs, targets = [], []
        for _ in range(4):
            h, w = rng.randrange(320, 801, 16), rng.randrange(320, 801, 16)
            imgs.append(torch.rand(3, h, w, device='cuda'))
            n = rng.randrange(1, 12)
            xy = torch.rand(n, 2, device='cuda') * torch.tensor([w * 0.6, h * 0.6], device='cuda')
            wh = torch.rand(n, 2, device='cuda') * 100 + 16
            targets.append(dict(boxes=torch.cat([xy, xy + wh], 1),
                                labels=torch.randint(1, 10, (n,), device='cuda')))
        loss = sum(m(imgs, targets).values())
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step()


class _Block(nn.Module):
    def __init__(self, cin, cout, tdim):
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(8, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.t = nn.Linear(tdim, cout)
        self.n2, self.c2 = nn.GroupNorm(8, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, t):
        h = self.c1(F.silu(self.n1(x))) + self.t(t)[:, :, None, None]
        return self.c2(F.silu(self.n2(h))) + self.skip(x)


class _UNet(nn.Module):
    """A diffusion-style UNet: time embedding, residual blocks, attention at the bottom."""
    def __init__(self, ch=(128, 256, 512), tdim=512):
        super().__init__()
        self.tdim = tdim
        self.temb = nn.Sequential(nn.Linear(tdim, tdim), nn.SiLU(), nn.Linear(tdim, tdim))
        self.inp = nn.Conv2d(4, ch[0], 3, padding=1)
        self.down = nn.ModuleList([_Block(a, b, tdim) for a, b in zip(ch, ch[1:])])
        self.mid = _Block(ch[-1], ch[-1], tdim)
        self.attn = nn.MultiheadAttention(ch[-1], 8, batch_first=True)
        self.up = nn.ModuleList([_Block(b * 2, a, tdim) for a, b in reversed(list(zip(ch, ch[1:])))])
        self.out = nn.Conv2d(ch[0], 4, 3, padding=1)

    def forward(self, x, t):
        half = self.tdim // 2
        f = torch.exp(-torch.arange(half, device=x.device) * (9.2 / half))
        t = self.temb(torch.cat([torch.sin(t[:, None] * f), torch.cos(t[:, None] * f)], 1))
        h, skips = self.inp(x), []
        for b in self.down:
            h = b(h, t); skips.append(h); h = F.avg_pool2d(h, 2)
        h = self.mid(h, t)
        n, c, hh, ww = h.shape
        s = h.flatten(2).transpose(1, 2)
        h = h + self.attn(s, s, s, need_weights=False)[0].transpose(1, 2).reshape(n, c, hh, ww)
        for b in self.up:
            h = F.interpolate(h, scale_factor=2)
            h = b(torch.cat([h, skips.pop()], 1), t)
        return self.out(h)


def unet_diffusion_train():
    """A latent-diffusion-style UNet (noise prediction), batch 16 of 4x64x64 latents, AdamW, bf16 autocast."""
    m = _UNet().cuda()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    for _ in range(8):
        x0 = torch.randn(16, 4, 64, 64, device='cuda')
        t = torch.rand(16, device='cuda') * 1000
        noise = torch.randn_like(x0)
        with torch.autocast('cuda', dtype=torch.bfloat16):
            loss = F.mse_loss(m(x0 + noise, t).float(), noise)
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step()


def llm_ckpt_varlen_train():
    """GPT-2 medium-width LM with activation checkpointing, batch 4 x 128-1024 tokens (varies), AdamW."""
    from transformers import GPT2Config, GPT2LMHeadModel
    m = GPT2LMHeadModel(GPT2Config(n_embd=1024, n_head=16, n_layer=12, n_positions=1024)).cuda()
    m.gradient_checkpointing_enable()
    m.config.use_cache = False
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    rng = random.Random(4)
    for _ in range(8):
        ids = torch.randint(0, 50257, (4, rng.randrange(128, 1025, 64)), device='cuda')
        loss = m(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step()


def llm_kvcache_varbatch_generate():
    """GPT-2 greedy generation with a growing KV cache, three requests of batch 1, 16 and 4 and
    prompts of 32-256 tokens, 48 new tokens each."""
    from transformers import GPT2Config, GPT2LMHeadModel
    m = GPT2LMHeadModel(GPT2Config()).cuda().eval()
    with torch.no_grad():
        for b, L in ((1, 256), (16, 32), (4, 128)):
            ids = torch.randint(0, 50257, (b, L), device='cuda')
            m.generate(ids, max_new_tokens=48, min_new_tokens=48, do_sample=False, pad_token_id=0)


def vit_bf16_amp_train():
    """torchvision ViT-B/16, batch 32 at 224x224, bf16 autocast, AdamW."""
    import torchvision
    m = torchvision.models.vit_b_16(weights=None).cuda()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    for _ in range(6):
        x = torch.randn(32, 3, 224, 224, device='cuda'); y = torch.randint(0, 1000, (32,), device='cuda')
        with torch.autocast('cuda', dtype=torch.bfloat16):
            loss = F.cross_entropy(m(x), y)
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step()


def three_stream_overlap():
    """Host-to-device copies, compute and device-to-host copies on three streams, overlapped,
    with record_stream on the buffers that cross streams; batch sizes vary."""
    h2d, d2h, main = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.current_stream()
    net = nn.Sequential(nn.Linear(2048, 8192), nn.GELU(), nn.Linear(8192, 2048)).cuda()
    rng = random.Random(5)
    host_in = [torch.randn(rng.choice([64, 256, 1024, 2048]), 2048).pin_memory() for _ in range(6)]
    host_out = [torch.empty(2048, 2048).pin_memory() for _ in range(2)]
    with torch.no_grad():
        for i in range(48):
            with torch.cuda.stream(h2d):
                xb = host_in[i % 6].to('cuda', non_blocking=True)
            main.wait_stream(h2d); xb.record_stream(main)
            y = net(xb)
            d2h.wait_stream(main)
            with torch.cuda.stream(d2h):
                host_out[i % 2][: y.shape[0]].copy_(y, non_blocking=True)
            y.record_stream(d2h)
            del xb, y
            if i % 8 == 7:
                d2h.synchronize()


def embedding_recsys_train():
    """A DLRM-style recommender: eight embedding tables of 500k-2M rows x 64 (3.6 GB), sparse
    gradients (EmbeddingBag, sparse=True) with SGD, a dense MLP with Adam; bags of varying size."""
    rows = [2_000_000, 1_000_000, 1_500_000, 500_000, 2_000_000, 800_000, 1_200_000, 600_000]
    tables = nn.ModuleList([nn.EmbeddingBag(r, 64, mode='sum', sparse=True) for r in rows]).cuda()
    mlp = nn.Sequential(nn.Linear(64 * 8 + 13, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                        nn.Linear(256, 1)).cuda()
    opt_s = torch.optim.SGD(tables.parameters(), lr=0.01)
    opt_d = torch.optim.Adam(mlp.parameters(), lr=1e-3)
    rng = random.Random(6)
    for _ in range(16):
        b = rng.choice([2048, 4096, 8192])
        embs = []
        for r, t in zip(rows, tables):
            lens = torch.randint(1, rng.randrange(2, 40), (b,), device='cuda')
            idx = torch.randint(0, r, (int(lens.sum()),), device='cuda')
            offsets = torch.cat([torch.zeros(1, dtype=torch.long, device='cuda'), lens.cumsum(0)[:-1]])
            embs.append(t(idx, offsets))
        x = torch.cat(embs + [torch.randn(b, 13, device='cuda')], 1)
        loss = F.binary_cross_entropy_with_logits(mlp(x).squeeze(1), torch.rand(b, device='cuda'))
        opt_s.zero_grad(set_to_none=True); opt_d.zero_grad(set_to_none=True)
        loss.backward(); opt_s.step(); opt_d.step()


def finetune_reload_weights():
    """Three fine-tuning rounds that each load BERT-base weights from host memory onto the GPU,
    train a new classification head for 3 steps, then drop the model and optimiser (as a
    hyper-parameter sweep does), with a different batch and length each round."""
    from transformers import BertConfig, BertForSequenceClassification
    cfg = BertConfig()
    host_state = {k: v.clone() for k, v in BertForSequenceClassification(cfg).state_dict().items()}
    rng = random.Random(7)
    for labels in (2, 5, 20):
        cfg.num_labels = labels
        m = BertForSequenceClassification(cfg)
        state = {k: v for k, v in host_state.items() if not k.startswith('classifier')}
        m.load_state_dict(state, strict=False)
        m = m.cuda()
        opt = torch.optim.AdamW(m.parameters(), lr=2e-5)
        b, L = rng.choice([16, 32]), rng.choice([128, 256])
        for _ in range(3):
            ids = torch.randint(0, 30522, (b, L), device='cuda')
            y = torch.randint(0, labels, (b,), device='cuda')
            loss = m(input_ids=ids, labels=y).loss
            opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
        del m, opt, loss
        torch.cuda.synchronize()


def lstm_varlen_train():
    """A 2-layer LSTM language model (cuDNN) over packed batches of 32 sequences of 20-400 tokens."""
    emb, lstm, head = nn.Embedding(32000, 512).cuda(), nn.LSTM(512, 1024, 2, batch_first=True).cuda(), \
        nn.Linear(1024, 32000).cuda()
    params = list(emb.parameters()) + list(lstm.parameters()) + list(head.parameters())
    opt = torch.optim.Adam(params, lr=1e-3)
    rng = random.Random(8)
    for _ in range(12):
        lens = sorted((rng.randrange(20, 401) for _ in range(32)), reverse=True)
        ids = torch.randint(0, 32000, (32, lens[0]), device='cuda')
        packed = nn.utils.rnn.pack_padded_sequence(emb(ids), lens, batch_first=True)
        out, _ = lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        loss = F.cross_entropy(head(out).flatten(0, 1), ids.flatten(), reduction='mean')
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step()


def t5_seq2seq_train():
    """transformers T5 (small config) seq2seq training, encoder 64-512 and decoder 16-128 tokens (vary)."""
    from transformers import T5Config, T5ForConditionalGeneration
    m = T5ForConditionalGeneration(T5Config(
        d_model=512, d_ff=2048, num_layers=6, num_heads=8, decoder_start_token_id=0, pad_token_id=0)).cuda()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    rng = random.Random(9)
    for _ in range(10):
        b = rng.choice([8, 16, 32])
        src = torch.randint(0, 32000, (b, rng.randrange(64, 513, 32)), device='cuda')
        tgt = torch.randint(0, 32000, (b, rng.randrange(16, 129, 16)), device='cuda')
        loss = m(input_ids=src, labels=tgt).loss
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step()


W = {f.__name__: f for f in (segmentation_varsize_train, detection_varsize_train, unet_diffusion_train,
                             llm_ckpt_varlen_train, llm_kvcache_varbatch_generate, vit_bf16_amp_train,
                             three_stream_overlap, embedding_recsys_train, finetune_reload_weights,
                             lstm_varlen_train, t5_seq2seq_train)}

if __name__ == '__main__':
    name = sys.argv[1]
    if name == 'list':
        print(' '.join(W)); sys.exit(0)
    outdir, record = sys.argv[2], len(sys.argv) > 3
    torch.manual_seed(0)
    torch.cuda.init()
    if record:
        torch.cuda.memory._record_memory_history(max_entries=4_000_000, context=None, stacks='python')
    t = time.time()
    W[name]()
    torch.cuda.synchronize()
    wall = time.time() - t
    out = dict(workload=name, torch=torch.__version__, alloc_conf=os.environ.get('PYTORCH_CUDA_ALLOC_CONF', ''),
               wall_s=wall, program=W[name].__doc__.strip(), stats=stats_subset())
    if record:
        out['action_counts'] = write_trace(os.path.join(outdir, f'{name}.trace.json.gz'), out)
    print(json.dumps(out))

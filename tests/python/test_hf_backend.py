"""raggedattn as a transformers attention backend (raggedattn.hf): small randomly initialized models
on packed documents give, document by document, the logits of the same model run on each document
alone with transformers' eager attention; padded batches and Gemma-2's sliding window and soft cap
too, and gpt-oss's learnable attention sinks (`s_aux`); parameter gradients match each document
alone (sdpa; eager for Gemma-2's soft cap and gpt-oss's sinks, whose gradients are compared too),
and 50 training steps track sdpa's loss on the same packed batches;
what the backend cannot take raises. Float32 on the CPU (the library's CPU backend) and
bfloat16 on CUDA where there is a GPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("raggedattn.hf")

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DOCS = [13, 20, 1, 7]


@pytest.fixture(scope="module", autouse=True)
def registered():
    hf.register()


def dtype_for(device):
    return torch.float32 if device == "cpu" else torch.bfloat16


def tolerance(dtype):
    return 2e-4 if dtype == torch.float32 else 5e-2


def llama(device, dtype, seed=0):
    config = transformers.LlamaConfig(
        vocab_size=97, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=256)
    return model_of(transformers.LlamaForCausalLM, config, device, dtype, seed)


def gemma2(device, dtype, seed=0):
    config = transformers.Gemma2Config(
        vocab_size=97, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, head_dim=64, sliding_window=6,
        attn_logit_softcapping=20.0, final_logit_softcapping=None, query_pre_attn_scalar=64,
        max_position_embeddings=256)
    return model_of(transformers.Gemma2ForCausalLM, config, device, dtype, seed)


def gpt_oss(device, dtype, seed=0):
    """A tiny gpt-oss: sinks in every layer, sliding and full attention layers, GQA, MoE."""
    if not hasattr(transformers, "GptOssConfig"):
        pytest.skip(f"transformers {transformers.__version__} has no gpt-oss")
    config = transformers.GptOssConfig(
        vocab_size=97, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_local_experts=4,
        num_experts_per_tok=2, sliding_window=6, max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    model = model_of(transformers.GptOssForCausalLM, config, device, dtype, seed)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():  # sinks that take a real share of each row (their init is ~0)
        for layer in model.model.layers:
            sinks = layer.self_attn.sinks
            sinks.copy_((torch.rand(sinks.shape, generator=g) * 4 - 1).to(sinks))
    return model


def model_of(cls, config, device, dtype, seed):
    torch.manual_seed(seed)
    model = cls(config).to(device=device, dtype=dtype).eval()
    return model


def logits(model, implementation, **inputs):
    model.config._attn_implementation = implementation
    with torch.no_grad():
        return model(**inputs).logits


def documents(device, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 97, (n,), generator=g).to(device) for n in DOCS]


def per_document(model, docs):
    return [logits(model, "eager", input_ids=d[None])[0] for d in docs]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("make", [llama, gemma2, gpt_oss], ids=["llama", "gemma2", "gpt_oss"])
def test_packed_by_position_ids_matches_each_document_alone(make, device):
    dtype = dtype_for(device)
    model = make(device, dtype)
    docs = documents(device)
    ids = torch.cat(docs)[None]
    positions = torch.cat([torch.arange(len(d), device=device) for d in docs])[None]
    got = logits(model, hf.NAME, input_ids=ids, position_ids=positions)[0]
    want = per_document(model, docs)
    torch.testing.assert_close(got, torch.cat(want), atol=tolerance(dtype), rtol=tolerance(dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_flattening_collator_kwargs(device):
    dtype = dtype_for(device)
    model = llama(device, dtype)
    docs = documents(device, seed=2)
    collator = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    batch = collator([{"input_ids": d.tolist()} for d in docs])
    inputs = {name: (t.to(device) if torch.is_tensor(t) else t) for name, t in batch.items()
              if name != "labels"}
    assert "cu_seq_lens_q" in inputs
    got = logits(model, hf.NAME, **inputs)[0]
    torch.testing.assert_close(got, torch.cat(per_document(model, docs)),
                               atol=tolerance(dtype), rtol=tolerance(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("make", [llama, gpt_oss], ids=["llama", "gpt_oss"])
def test_padded_batch_matches_eager(make, device):
    dtype = dtype_for(device)
    model = make(device, dtype)
    docs = documents(device, seed=3)[:2]
    width = max(len(d) for d in docs)
    ids = torch.zeros(len(docs), width, dtype=torch.long, device=device)
    mask = torch.zeros(len(docs), width, dtype=torch.long, device=device)
    for row, d in enumerate(docs):
        ids[row, :len(d)] = d
        mask[row, :len(d)] = 1
    got = logits(model, hf.NAME, input_ids=ids, attention_mask=mask)
    for row, want in enumerate(per_document(model, docs)):
        torch.testing.assert_close(got[row, :len(docs[row])], want, atol=tolerance(dtype),
                                   rtol=tolerance(dtype))


def test_dense_mask_and_dropout_raise():
    q = torch.zeros(1, 2, 4, 64)
    module = torch.nn.Module()
    with pytest.raises(ValueError, match="2D padding mask"):
        hf.attention_forward(module, q, q, q, torch.zeros(1, 1, 4, 4))
    with pytest.raises(NotImplementedError, match="dropout"):
        hf.attention_forward(module, q, q, q, None, dropout=0.1)


def packed_inputs(docs, device):
    ids = torch.cat(docs)[None]
    positions = torch.cat([torch.arange(len(d), device=device) for d in docs])[None]
    return ids, positions


def packed_loss(model, implementation, docs, device):
    """The sum over documents of each one's next-token loss, the documents packed in one row."""
    model.config._attn_implementation = implementation
    ids, positions = packed_inputs(docs, device)
    # No KV cache: with one, transformers does not read packed documents from position_ids for
    # sdpa and eager, and their reference would attend across documents.
    out = model(input_ids=ids, position_ids=positions, use_cache=False)
    logp = torch.log_softmax(out.logits[0].float(), -1)
    loss, start = 0.0, 0
    for d in docs:
        n = len(d)
        if n > 1:
            loss = loss - logp[start:start + n - 1].gather(1, d[1:, None]).sum()
        start += n
    return loss


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("make, reference",
                         [(llama, "sdpa"), (gemma2, "eager"), (gpt_oss, "eager")],
                         ids=["llama", "gemma2", "gpt_oss"])  # soft caps and sinks: against eager
def test_parameter_gradients_match_per_document(make, reference, device):
    dtype = dtype_for(device)
    model = make(device, dtype).train()
    docs = documents(device, seed=4)
    packed_loss(model, hf.NAME, docs, device).backward()
    got = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    for d in docs:  # each document alone (one token has no next-token loss)
        if len(d) > 1:
            packed_loss(model, reference, [d], device).backward()
    tol = 20 * tolerance(dtype)
    for name, p in model.named_parameters():
        torch.testing.assert_close(got[name], p.grad, atol=tol, rtol=tol, msg=name)


def test_training_tracks_sdpa():
    """50 AdamW steps on packed random documents: the loss curve of raggedattn and of sdpa (on its
    block-diagonal mask from the same position_ids), from the same initial weights."""
    curves = {}
    for implementation in (hf.NAME, "sdpa"):
        model = llama("cpu", torch.float32, seed=5).train()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        g = torch.Generator().manual_seed(6)
        curve = []
        for _ in range(50):
            lengths = torch.randint(1, 40, (5,), generator=g).tolist()
            docs = [torch.randint(0, 97, (n,), generator=g) for n in lengths]
            loss = packed_loss(model, implementation, docs, "cpu") / sum(lengths)
            opt.zero_grad()
            loss.backward()
            opt.step()
            curve.append(loss.item())
        curves[implementation] = curve
    ours, ref = torch.tensor(curves[hf.NAME]), torch.tensor(curves["sdpa"])
    assert ref[-10:].mean() < ref[:10].mean()  # it trains
    torch.testing.assert_close(ours, ref, atol=2e-3, rtol=0)

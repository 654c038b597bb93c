"""The --hf mode's model: a transformers Llama (GQA) of the example's size behind the example's
own forward signature, its attention chosen by name: "raggedattn" (raggedattn.hf, fed the
keyword arguments DataCollatorWithFlattening gives a packed batch) or "sdpa" (transformers' own,
which reads the documents from position_ids)."""
import torch
from torch import nn


class HFDecoder(nn.Module):
    def __init__(self, vocab, dim=256, layers=4, n_heads=4, n_kv_heads=2, attention="sdpa"):
        super().__init__()
        import transformers

        if attention == "raggedattn":
            import raggedattn.hf

            raggedattn.hf.register()
        config = transformers.LlamaConfig(
            vocab_size=vocab, hidden_size=dim, intermediate_size=int(8 * dim / 3 / 64 + 0.999) * 64,
            num_hidden_layers=layers, num_attention_heads=n_heads, num_key_value_heads=n_kv_heads,
            head_dim=dim // n_heads, max_position_embeddings=1 << 16, tie_word_embeddings=False)
        config._attn_implementation = attention
        self.attention = attention
        self.model = transformers.LlamaForCausalLM(config)

    def forward(self, toks, positions, cu, max_seqlen):
        kwargs = {}
        if self.attention == "raggedattn":  # the flattening collator's keyword arguments
            cu32 = cu.to(torch.int32)
            kwargs = dict(cu_seq_lens_q=cu32, cu_seq_lens_k=cu32, max_length_q=int(max_seqlen),
                          max_length_k=int(max_seqlen))
        # No KV cache: with one, transformers does not read packed documents from position_ids.
        out = self.model(input_ids=toks[None], position_ids=positions[None], use_cache=False,
                         **kwargs)
        return out.logits[0]

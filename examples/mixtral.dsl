# Mixtral 8x7B: Llama-style attention (32 heads, 8 KV heads, RoPE theta 1e6)
# with a sparse MoE in place of the MLP: 8 SwiGLU experts of width 14336,
# top-2 routing.  Names match Hugging Face's Mixtral.
model mixtral {
  config {
    vocab = 32000
    seq = 4096
    d = 4096
    heads = 32
    kv_heads = 8
    ffn = 14336
    experts = 8
    top_k = 2
    layers = 32
    theta = 1000000.0
    eps = 1e-5
    aux_loss = 0.02
  }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]

  x = embed(tokens, vocab, d) as model.embed_tokens
  repeat layers as model.layers {
    x = x + gqa_attention(rmsnorm(x, eps) as input_layernorm, heads, kv_heads, theta) as self_attn
    x = x + moe(rmsnorm(x, eps) as post_attention_layernorm, experts, top_k, ffn, aux_loss) as block_sparse_moe
  }
  logits = lm_head(rmsnorm(x, eps) as model.norm, vocab) as lm_head
  loss = cross_entropy(logits, targets)
}

train {
  batch = 8
  microbatches = 4
  steps = 1000
  lr = 3e-4
  optimizer = adamw(beta1 = 0.9, beta2 = 0.95, wd = 0.1)
  schedule = cosine(warmup = 100, min_lr = 3e-5)
  clip = 1.0
  precision = bf16
  seed = 1337
}

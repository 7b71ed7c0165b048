# Llama 3 8B: RMSNorm, SwiGLU, rotary positions (theta 500000), grouped-query
# attention with 8 KV heads, untied LM head.  Names match Hugging Face's Llama.
model llama {
  config {
    vocab = 128256
    seq = 8192
    d = 4096
    heads = 32
    kv_heads = 8
    ffn = 14336
    layers = 32
    theta = 500000.0
    eps = 1e-5
  }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]

  x = embed(tokens, vocab, d) as model.embed_tokens
  repeat layers as model.layers {
    x = x + gqa_attention(rmsnorm(x, eps) as input_layernorm, heads, kv_heads, theta) as self_attn
    x = x + swiglu(rmsnorm(x, eps) as post_attention_layernorm, ffn) as mlp
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

# Llama tiny: Llama's architecture (RMSNorm, SwiGLU, RoPE, GQA, untied head)
# at a size that trains in seconds on a CPU, on bytes (vocab 256).
model llama_tiny {
  config {
    vocab = 256
    seq = 64
    d = 64
    heads = 4
    kv_heads = 2
    ffn = 176
    layers = 4
    theta = 10000.0
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
  batch = 4
  microbatches = 1
  steps = 200
  lr = 1e-3
  optimizer = adamw(beta1 = 0.9, beta2 = 0.95, wd = 0.1)
  schedule = cosine(warmup = 10, min_lr = 1e-4)
  clip = 1.0
  precision = fp32
  seed = 1337
}

# ARGS: -D layers=1 -D theta=500000.0
# Llama-style: RMSNorm, GQA with RoPE, SwiGLU, untied head; -D overrides.
model llama {
  config { vocab = 16  seq = 4  d = 8  heads = 4  kv_heads = 2  ffn = 12  layers = 3  theta = 10000.0 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  x = embed(tokens, vocab, d) as model.embed_tokens
  repeat layers as model.layers {
    x = x + gqa_attention(rmsnorm(x) as input_layernorm, heads, kv_heads, theta) as self_attn
    x = x + swiglu(rmsnorm(x) as post_attention_layernorm, ffn) as mlp
  }
  loss = cross_entropy(lm_head(rmsnorm(x) as model.norm, vocab) as lm_head, targets)
}
train { batch = 2 }

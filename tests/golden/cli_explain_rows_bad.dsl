# ARGS: --explain step --explain-rows 0
# --explain-rows takes a number of rows from 1, or all
model llama_tp {
  config { vocab = 256  seq = 64  d = 64  heads = 4  kv_heads = 2  ffn = 176  layers = 2
           theta = 10000.0  eps = 1e-5 }
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
train { batch = 4  precision = bf16 }

# ARGS: --pp 2 --explain all
# --explain for a pipeline (bf16, 2 stages, 1f1b over 2 microbatches): a slot of
# each arena (one plan for every stage, each stage's slot holding its own
# values), each stage's peak in it and what the largest holds; and each
# stage's calls a step by op and line
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

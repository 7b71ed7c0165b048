# ARGS: --tp 2
# bf16 at tp 2: the residual stream is the sum of the ranks' partials, an
# all-reduce's result, which the GPU trainer stores as bf16 too (the sum in
# f32, rounded once: rt_cuda_all_reduce_bf16) -- so its arena holds every
# layer's residual at 2 bytes an element, and the report adds the f32 scratch
# of the largest all-reduce's piece (4 x 64 x 64 / 2 floats, 32 KiB).  The
# column-parallel GEMMs' inputs pass through group_copy (identity forward, the
# all-reduce its gradient): the copy is stored as bf16 with its value, so those
# GEMMs convert no operand and the copy moves 2 bytes an element.
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

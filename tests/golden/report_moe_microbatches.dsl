# ARGS: --pp 2 --dp 2 --ep 2
# The MoE section of a pipelined layout: capacity (factor 1.25) and buffers are
# those of one microbatch (batch 8 / 2 microbatches / dp 2 = 2 sequences a
# rank), a rank's buffer capped at its own tokens, and the all-to-alls a step
# count every microbatch.
model moe {
  config { vocab = 16  seq = 8  d = 8  experts = 4  top_k = 2  ffn = 6  layers = 2 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  x = embed(tokens, vocab, d)
  repeat layers {
    x = x + moe(rmsnorm(x), experts, top_k, ffn, aux_loss = 0.01, capacity_factor = 1.25) as moe
  }
  loss = cross_entropy(lm_head(x, vocab), targets)
}
train { batch = 8  microbatches = 2 }

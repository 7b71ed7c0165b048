# ARGS: --dp 2 --ep 2
# The MoE section of the report with a capacity factor under dp 2, ep 2: the
# capacity for the whole batch (0.5 x the balanced load), the dispatch buffer a
# rank holds against the dropless worst case, the slots it can fill, and the
# expert all-to-alls a step (dispatch, combine and their gradients), which add
# up to the ep group's line above them.
model moe {
  config { vocab = 16  seq = 8  d = 8  experts = 4  top_k = 2  ffn = 6  layers = 2 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  x = embed(tokens, vocab, d)
  repeat layers {
    x = x + moe(rmsnorm(x), experts, top_k, ffn, aux_loss = 0.01, capacity_factor = 0.5) as moe
  }
  loss = cross_entropy(lm_head(x, vocab), targets)
}
train { batch = 4 }

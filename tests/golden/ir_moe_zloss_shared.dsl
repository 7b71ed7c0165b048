# Mixture of experts with the optional parts on: router z-loss, shared expert.
model moe {
  config { vocab = 16  seq = 4  d = 8  experts = 4  top_k = 2  ffn = 6  shared = 4 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  x = embed(tokens, vocab, d)
  x = x + moe(rmsnorm(x), experts, top_k, ffn, aux_loss = 0.01, z_loss = 0.001,
              shared_hidden = shared) as moe
  loss = cross_entropy(lm_head(x, vocab), targets)
}
train { batch = 2 }

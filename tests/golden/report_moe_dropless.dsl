# The MoE section on one rank, dropless: the dispatch buffer is the worst case
# (every token may pick any expert), a quarter of its slots at most filled
# (top-1 of 4), and no all-to-all (ep 1).  The layer outside a repeat is named.
model moe {
  config { vocab = 16  seq = 8  d = 8  experts = 4  top_k = 1  ffn = 6 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  x = embed(tokens, vocab, d)
  x = x + moe(rmsnorm(x), experts, top_k, ffn) as moe
  loss = cross_entropy(lm_head(x, vocab), targets)
}
train { batch = 2 }

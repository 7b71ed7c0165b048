model m {
  config { d = 8  seq = 4 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  x = embed(tokens, 16, d)
  q = split_heads(x, 4)
  k = split_heads(slice(x, -1, 0, 6), 3)
  y = sdpa(q, k, k)
  loss = cross_entropy(lm_head(x, 16), targets)

}
train { batch = 2 }

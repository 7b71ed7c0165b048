# The optimizer's ops are made by passes only: the DSL cannot call them.
model m {
  config { d = 8  seq = 4 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  x = embed(tokens, 16, d)
  param b : [d]
  y = adam_moment(x, x, b)
  loss = cross_entropy(lm_head(y, 16), targets)
}
train { batch = 2 }

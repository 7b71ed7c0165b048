block b(x) {
  param exp_avg : [dim(x, -1)]
  return x
}
model m {
  config { d = 8  seq = 4 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  x = embed(tokens, 16, d)

  x = embed(tokens, 16, d)
  x = b(x) as w
  loss = cross_entropy(lm_head(x, 16), targets)
}
train { batch = 2 }

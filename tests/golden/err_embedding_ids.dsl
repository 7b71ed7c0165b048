model m {
  config { d = 8  seq = 4 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  param t : [16, d]
  x = embedding(t, t)
  loss = cross_entropy(lm_head(x, 16), targets)

}
train { batch = 2 }

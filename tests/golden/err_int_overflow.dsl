model m {
  config { d = 8  seq = 4 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  x = embed(tokens, 16, d)
  n = 4611686018427387904 * 4
  loss = cross_entropy(lm_head(x, 16), targets)

}
train { batch = 2 }

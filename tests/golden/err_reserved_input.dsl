model m {
  config { d = 8  seq = 4 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  input lr : f32[]
  x = embed(tokens, 16, d)

  x = embed(tokens, 16, d)
  loss = cross_entropy(lm_head(x, 16), targets)
}
train { batch = 2 }

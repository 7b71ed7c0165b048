model m {
  config { d = 8  seq = 4 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  x = embed(tokens, 16, d)

}
train { batch = 2 }

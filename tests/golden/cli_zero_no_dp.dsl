# ARGS: --tp 2 --zero 1
# EXIT: 0
model m {
  config { d = 8  seq = 4 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  x = embed(tokens, 16, d)
  repeat 2 as h {
    x = x + mlp(layernorm(x) as ln, 4 * d) as mlp
  }
  loss = cross_entropy(lm_head(x, 16), targets)

}
train { batch = 4 }

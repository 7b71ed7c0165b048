# ARGS: --bf16-store fp16
# --bf16-store takes on, off or round
model m {
  config { d = 8  seq = 4 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  x = embed(tokens, 17, d)
  loss = cross_entropy(lm_head(x, 17), targets)

}
train { batch = 2 }

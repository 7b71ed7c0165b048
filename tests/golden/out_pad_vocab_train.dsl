# ARGS: --tp 2
# the train section's pad_vocab: 17 rows padded to 32 at tp 2 (each rank's 16 a multiple of 8)
model m {
  config { d = 8  seq = 4 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  x = embed(tokens, 17, d)
  loss = cross_entropy(lm_head(x, 17), targets)

}
train { batch = 2  pad_vocab = 8 }

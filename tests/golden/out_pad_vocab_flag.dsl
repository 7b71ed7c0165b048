# ARGS: --tp 2 --pad-vocab 1
# --pad-vocab overrides the train section: 1 pads only what tp 2 needs (17 -> 18)
model m {
  config { d = 8  seq = 4 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  x = embed(tokens, 17, d)
  loss = cross_entropy(lm_head(x, 17), targets)

}
train { batch = 2  pad_vocab = 8 }

# ARGS: --pad-vocab 64 -o parc-out-not-written
# an explicit --pad-vocab the model cannot take stays an error (the default is dropped)
model m {
  config { d = 8  seq = 4 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  x = embed(tokens, 17, d)
  logits = lm_head(x, 17)
  z = logsumexp(logits)
  add_loss(mean(mean(sum(z * z, -1), 1), 0), 0.001)
  loss = cross_entropy(logits, targets)
}
train { batch = 2 }

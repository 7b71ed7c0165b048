# ARGS: --machine machine_bad_device.json
# --machine file: bad_device
model m {
  config { d = 8  seq = 4 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  logits = lm_head(embed(tokens, 16, d), 16)
  loss = cross_entropy(logits, targets)
}
train { batch = 2 }

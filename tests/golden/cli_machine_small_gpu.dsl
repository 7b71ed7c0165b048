# ARGS: --machine machine_small_gpu.json
# --machine file with a GPU of 16 MB: the plan does not fit it (report line "GPU trainer")
model m {
  config { d = 8  seq = 4 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  logits = lm_head(embed(tokens, 16, d), 16)
  loss = cross_entropy(logits, targets)
}
train { batch = 2 }

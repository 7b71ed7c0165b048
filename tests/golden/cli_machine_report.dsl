# ARGS: --machine machine_report.json --tp 2 --dp 2
# the predicted step time on a machine file based on a preset: tp within a
# node of 2 ranks, dp between nodes, the dp part partly hidden behind the backward
model m {
  config { d = 64  seq = 32  heads = 4 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  x = embed(tokens, 128, d)
  x = x + attention(layernorm(x), heads)
  x = x + mlp(layernorm(x), 4 * d)
  logits = lm_head(layernorm(x), 128)
  loss = cross_entropy(logits, targets)
}
train { batch = 8 }

# ARGS: --pp 4 --stage-layers memory
# --stage-layers memory: the split chosen for the largest rank, said against the split by FLOPs.
model pp {
  config { vocab = 16  seq = 512  d = 1024  heads = 16  layers = 8 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  x = embed(tokens, vocab, d) as wte
  repeat layers as h {
    x = x + attention(layernorm(x) as ln_1, heads) as attn
    x = x + mlp(layernorm(x) as ln_2, 4 * d) as mlp
  }
  loss = cross_entropy(lm_head(layernorm(x) as ln_f, vocab), targets)
}
train { batch = 16 }

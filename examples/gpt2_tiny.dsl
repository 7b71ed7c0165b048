# GPT-2 tiny: GPT-2's architecture at a size that trains in seconds on a CPU,
# on bytes (vocab 256).  Same names as examples/gpt2.dsl, so -D works alike.
model gpt2_tiny {
  config {
    vocab = 256
    seq = 64
    d = 64
    heads = 4
    layers = 4
    ffn = 4 * d
  }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]

  x = embed(tokens, vocab, d) as wte + positions(seq, d) as wpe
  repeat layers as h {
    x = x + attention(layernorm(x) as ln_1, heads, proj_std = 0.02 / sqrt(2 * layers)) as attn
    x = x + mlp(layernorm(x) as ln_2, ffn, proj_std = 0.02 / sqrt(2 * layers)) as mlp
  }
  logits = tied_head(layernorm(x) as ln_f, wte.weight)
  loss = cross_entropy(logits, targets)
}

train {
  batch = 4
  microbatches = 1
  steps = 200
  lr = 1e-3
  optimizer = adamw(beta1 = 0.9, beta2 = 0.95, wd = 0.1)
  schedule = cosine(warmup = 10, min_lr = 1e-4)
  clip = 1.0
  precision = fp32
  seed = 1337
}

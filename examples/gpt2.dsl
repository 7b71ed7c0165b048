# GPT-2 small (124M): learned positions, pre-LayerNorm blocks, tanh GELU,
# LM head tied to the token embedding.  Names match Hugging Face's gpt2.
model gpt2 {
  config {
    vocab = 50257
    seq = 1024
    d = 768
    heads = 12
    layers = 12
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
  batch = 8
  microbatches = 4
  steps = 1000
  lr = 6e-4
  optimizer = adamw(beta1 = 0.9, beta2 = 0.95, wd = 0.1)
  schedule = cosine(warmup = 100, min_lr = 6e-5)
  clip = 1.0
  precision = bf16
  seed = 1337
}

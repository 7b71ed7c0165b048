# A one-layer GPT with the prelude's blocks; tied head.
model gpt {
  config { vocab = 16  seq = 4  d = 8  heads = 2  layers = 1 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  x = embed(tokens, vocab, d) as wte + positions(seq, d) as wpe
  repeat layers as h {
    x = x + attention(layernorm(x) as ln_1, heads) as attn
    x = x + mlp(layernorm(x) as ln_2, 4 * d) as mlp
  }
  loss = cross_entropy(tied_head(layernorm(x) as ln_f, wte.weight), targets)
}
train { batch = 2  lr = 1e-3  optimizer = adamw(wd = 0.1)  schedule = cosine(warmup = 2, min_lr = 1e-4) }

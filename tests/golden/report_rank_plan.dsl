# ARGS: --tp 2 --dp 2 --sp --zero 1 -D vocab=259
# The report without -o: per-rank figures of the sharded module (vocabulary padded
# for tp 2, sequence parallel, optimizer state over dp), its communication by group
# and collective, and the planned activation arena.
model tiny {
  config { vocab = 256  seq = 8  d = 16  heads = 2  layers = 2 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  x = embed(tokens, vocab, d) as wte + positions(seq, d) as wpe
  repeat layers as h {
    x = x + attention(layernorm(x) as ln_1, heads) as attn
    x = x + mlp(layernorm(x) as ln_2, 4 * d) as mlp
  }
  loss = cross_entropy(tied_head(layernorm(x) as ln_f, wte.weight), targets)
}
train { batch = 4  steps = 10  lr = 1e-3 }

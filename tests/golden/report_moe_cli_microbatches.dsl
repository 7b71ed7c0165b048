# ARGS: --dp 2 --ep 2 --microbatches 2
# examples/moe_tiny.dsl (batch 4, microbatches = 1 in its train section) at pp 1
# with --microbatches 2 on the command line: a routed model trains them as a
# one-stage pipeline, so the MoE section's capacity, dispatch buffers and
# all-to-all count are those of one microbatch (4 / 2 / dp 2 = 1 sequence a
# rank, 64 tokens), 2 microbatches a step.
# MoE tiny: the Mixtral family (GQA attention, top-2 of 4 SwiGLU experts,
# load-balancing loss) at a size that trains in seconds on a CPU, on bytes.
# -D z_loss=1e-3 adds the router z-loss, -D shared_ffn=128 a shared expert,
# -D gelu_experts=1 makes the experts GELU MLPs instead of SwiGLU.
model moe_tiny {
  config {
    vocab = 256
    seq = 64
    d = 64
    heads = 4
    kv_heads = 2
    ffn = 128
    experts = 4
    top_k = 2
    layers = 4
    theta = 10000.0
    eps = 1e-5
    aux_loss = 0.02
    capacity = 0.0   # capacity factor: 0 is dropless
    z_loss = 0.0     # router z-loss coefficient (ST-MoE; 1e-3 is usual): 0 is off
    shared_ffn = 0   # width of a shared SwiGLU expert every token takes (DeepSeek): 0 is none
    gelu_experts = 0 # 1: GELU MLP experts (w1, w2) instead of SwiGLU (w1, w3, w2)
  }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]

  x = embed(tokens, vocab, d) as model.embed_tokens
  repeat layers as model.layers {
    x = x + gqa_attention(rmsnorm(x, eps) as input_layernorm, heads, kv_heads, theta) as self_attn
    x = x + moe(rmsnorm(x, eps) as post_attention_layernorm, experts, top_k, ffn, aux_loss,
                capacity, z_loss, shared_ffn, gelu_experts) as block_sparse_moe
  }
  logits = lm_head(rmsnorm(x, eps) as model.norm, vocab) as lm_head
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

"""Small configs of transformers' architectures, as a Hub config.json names
them (no weights): what tests/pytorch/hf_trace_test.py traces and holds
against the CPU step, and what scripts/pytorch-validate runs under PyTorch's
data parallelism as `--models hf:<Architecture>` (pytorch/hf_models.py
builds the class from one; nothing is downloaded)."""

# GPT-2 (tied head, Conv1D, LayerNorm, dropout), Llama
# (GQA, RMSNorm, SwiGLU, rotary, untied), Qwen2 (Llama's with q/k/v
# biases), Mistral (a sliding window longer than the sequence), BERT
# (bidirectional, masked-LM head, token types).
SMALL = {
    "GPT2LMHeadModel": dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_embd=64, n_layer=2, n_head=4,
                            vocab_size=512, n_positions=128, bos_token_id=0, eos_token_id=0),
    "LlamaForCausalLM": dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                             intermediate_size=176, vocab_size=512, max_position_embeddings=128,
                             tie_word_embeddings=False, bos_token_id=0, eos_token_id=0),
    "Qwen2ForCausalLM": dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=64,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             intermediate_size=176, vocab_size=512, max_position_embeddings=128,
                             tie_word_embeddings=False, bos_token_id=0, eos_token_id=0),
    "MistralForCausalLM": dict(model_type="mistral", architectures=["MistralForCausalLM"], hidden_size=64,
                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                               intermediate_size=176, vocab_size=512, max_position_embeddings=128,
                               sliding_window=4096, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0),
    "BertForMaskedLM": dict(model_type="bert", architectures=["BertForMaskedLM"], hidden_size=64,
                            num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, vocab_size=512,
                            max_position_embeddings=128, type_vocab_size=2, pad_token_id=0),
    # No built-in C++ model: Gemma-2 (sliding-window layers shorter than the
    # sequence, logit soft-capping, a tied head), Phi-3 (fused qkv and
    # gate_up projections), Mixtral (4 experts, top 2, by transformers'
    # default grouped_mm experts kernel; batched_mm too), and Qwen2-MoE.
    "Gemma2ForCausalLM": dict(model_type="gemma2", architectures=["Gemma2ForCausalLM"], hidden_size=64,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                              intermediate_size=176, vocab_size=512, max_position_embeddings=128, sliding_window=32,
                              bos_token_id=2, eos_token_id=1, pad_token_id=0),
    "Phi3ForCausalLM": dict(model_type="phi3", architectures=["Phi3ForCausalLM"], hidden_size=64,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                            intermediate_size=176, vocab_size=512, max_position_embeddings=128,
                            original_max_position_embeddings=128, tie_word_embeddings=False, bos_token_id=1,
                            eos_token_id=2, pad_token_id=0),
    "MixtralForCausalLM": dict(model_type="mixtral", architectures=["MixtralForCausalLM"], hidden_size=64,
                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                               intermediate_size=96, num_local_experts=4, num_experts_per_tok=2, vocab_size=512,
                               max_position_embeddings=128, tie_word_embeddings=False, bos_token_id=1,
                               eos_token_id=2),
    # Gemma-3's text model: sliding and global layers, q/k norms.
    "Gemma3ForCausalLM": dict(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], hidden_size=64,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                              intermediate_size=176, vocab_size=512, max_position_embeddings=128, sliding_window=32,
                              bos_token_id=2, eos_token_id=1, pad_token_id=0),
    # Qwen2-MoE: 4 routed experts, top 2, beside a gated shared expert.
    "Qwen2MoeForCausalLM": dict(model_type="qwen2_moe", architectures=["Qwen2MoeForCausalLM"], hidden_size=64,
                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=64,
                                num_experts=4, num_experts_per_tok=2, vocab_size=512, max_position_embeddings=128,
                                tie_word_embeddings=False),
}

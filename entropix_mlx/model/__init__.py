"""The model: an MLX port of six families (Llama, Mistral, Qwen2, Qwen3, Phi-3,
Gemma 3; `transformer` with each family's switches) that returns each layer's
attention scores, its KV caches (`cache`), and loading from GGUF files, Hugging
Face or MLX directories (`loading`, `gguf`, `gguf_check`)."""

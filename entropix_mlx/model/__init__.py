"""The model: an MLX Llama port that returns each layer's attention scores
(`llama`), its KV caches (`cache`), and loading from GGUF files, Hugging Face
or MLX directories (`loading`, `gguf`, `gguf_check`)."""
